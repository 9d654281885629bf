// `lilac tokenize --tokenizer DIR [--decode]`: one JSON string per input line -> one JSON array of
// ids per output line; with --decode, JSON arrays of ids -> JSON strings. Blank lines are skipped.
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "text/json_dump.h"
#include "text/tokenizer.h"

namespace lilac::cli {
namespace {

struct TokenizeOptions {
  std::string dir;
  std::string input = "-";
  bool decode = false;
  bool no_special = false;    // encode: special tokens are plain text
  bool skip_special = false;  // decode: drop special tokens
};

int run_tokenize(const TokenizeOptions& o) {
  auto tok = Tokenizer::load(o.dir);
  std::FILE* in = stdin;
  if (o.input != "-") {
    in = std::fopen(o.input.c_str(), "rb");
    if (!in) throw InputError(o.input + ": cannot open file");
  }
  std::string line, out;
  size_t lineno = 0;
  char buf[1 << 16];
  bool eof = false;
  while (!eof) {
    line.clear();
    while (true) {  // read one line of any length
      if (!std::fgets(buf, sizeof buf, in)) {
        eof = true;
        break;
      }
      line += buf;
      if (!line.empty() && line.back() == '\n') break;
    }
    if (eof && line.empty()) break;
    ++lineno;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = (o.input == "-" ? std::string("stdin") : o.input) + ":" + std::to_string(lineno);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw InputError(where + ": not valid JSON");
    if (!o.decode) {
      if (!j.is_string()) throw InputError(where + ": expected a JSON string");
      const auto ids = tok->encode(j.get<std::string>(), !o.no_special);
      out = dump_json(nlohmann::json(ids));
    } else {
      if (!j.is_array()) throw InputError(where + ": expected a JSON array of token ids");
      std::vector<int32_t> ids;
      ids.reserve(j.size());
      for (const auto& v : j) {
        if (!v.is_number_integer()) throw InputError(where + ": expected integer token ids");
        const int64_t id = v.get<int64_t>();
        if (id < 0 || id >= tok->vocab_size())
          throw InputError(where + ": token id " + std::to_string(id) + " out of range [0, " +
                           std::to_string(tok->vocab_size()) + ")");
        ids.push_back(static_cast<int32_t>(id));
      }
      // Bytes that are not valid UTF-8 (a sequence cut mid-character) are written as U+FFFD.
      out = dump_json(nlohmann::json(tok->decode(ids, o.skip_special)));
    }
    out.push_back('\n');
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  if (in != stdin) std::fclose(in);
  std::fflush(stdout);
  return 0;
}

const bool registered = register_command(Command{
    "tokenize", "Encode JSON strings (one per line) to token ids, or decode id arrays with --decode",
    [](CLI::App& sub) -> std::function<int()> {
      auto o = std::make_shared<TokenizeOptions>();
      sub.add_option("--tokenizer", o->dir, "Directory with tokenizer.json (+ tokenizer_config.json)")->required();
      sub.add_option("--input", o->input, "Input file (default: stdin)");
      sub.add_flag("--decode", o->decode, "Read JSON arrays of ids, write JSON strings");
      sub.add_flag("--no-special", o->no_special, "Encode: treat special tokens as plain text");
      sub.add_flag("--skip-special", o->skip_special, "Decode: leave out special tokens");
      return [o] { return run_tokenize(*o); };
    }});

}  // namespace
}  // namespace lilac::cli
