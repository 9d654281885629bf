// Byte-level BPE tokenizer from a Hugging Face tokenizer.json.
//
// Pipeline of encode(): invalid UTF-8 -> U+FFFD; added tokens whose `normalized` is false are
// matched on the raw text (leftmost-longest); the remaining pieces are normalized (the file's
// normalizer), then added tokens with `normalized` true are matched; each remaining piece goes
// through the pre-tokenizer (a sequence of regex/string Splits and ByteLevel) and byte-level BPE,
// whose result is cached per pre-token.
#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/unicode.h"

namespace lilac {

namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// A compiled PCRE2 pattern (UTF + UCP, JIT when available).
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
    if (literal) opts = PCRE2_LITERAL | PCRE2_UTF | PCRE2_NO_UTF_CHECK;
    if (!unicode::is_valid_utf8(pattern)) throw Error(where + ": pattern is not valid UTF-8");
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off,
                          nullptr);
    if (!code_) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      throw Error(where + ": cannot compile regex at offset " + std::to_string(off) + ": " +
                  reinterpret_cast<const char*>(buf));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the next match in subject[start..len); returns false when none. Throws on matcher errors.
  bool find(const char* subject, size_t len, size_t start, pcre2_match_data* md, size_t& mb, size_t& me) const {
    int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(subject), len, start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // very long run: the interpreter has a larger (heap) budget
      rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(subject), len, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof buf);
      throw Error(std::string("tokenizer: pre-tokenizer regex failed: ") + reinterpret_cast<const char*>(buf));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    mb = ov[0];
    me = ov[1];
    return true;
  }
  const pcre2_code* code() const { return code_; }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

struct MatchData {
  explicit MatchData(const pcre2_code* c) : md(pcre2_match_data_create_from_pattern(c, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(md); }
  pcre2_match_data* md;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitStep {
  std::unique_ptr<Regex> re;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
};

struct Range {
  size_t b, e;
};

// GPT-2's pre-tokenizer regex, used by ByteLevel with use_regex = true.
const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  int32_t id = 0;
  std::string content;  // raw text (NFC'd when `normalized`, for matching)
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// A piece of text between added tokens, or an added token.
struct Piece {
  bool is_token;
  int32_t id;
  size_t b, e;
};

// Leftmost-longest matcher of a set of added tokens.
class AddedMatcher {
 public:
  void add(const AddedToken& t) {
    if (t.content.empty()) return;
    toks_.push_back(t);
  }
  bool empty() const { return toks_.empty(); }
  void finalize() {
    std::stable_sort(toks_.begin(), toks_.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    first_.fill(false);
    for (auto& t : toks_) first_[static_cast<uint8_t>(t.content[0])] = true;
  }
  // Splits `s` into text pieces and added tokens. Text pieces may be empty (callers skip them).
  void split(std::string_view s, bool parse_special, std::vector<Piece>& out) const {
    size_t text_start = 0, i = 0;
    const size_t n = s.size();
    while (i < n) {
      if (!first_[static_cast<uint8_t>(s[i])]) {
        ++i;
        continue;
      }
      const AddedToken* hit = nullptr;
      for (const auto& t : toks_) {
        if (t.special && !parse_special) continue;
        if (t.content.size() > n - i || s.compare(i, t.content.size(), t.content) != 0) continue;
        if (t.single_word && !single_word_ok(s, i, i + t.content.size())) continue;
        hit = &t;
        break;
      }
      if (!hit) {
        ++i;
        continue;
      }
      size_t mb = i, me = i + hit->content.size();
      if (hit->lstrip)
        while (mb > text_start) {
          size_t k = mb - 1;
          while (k > text_start && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
          auto d = unicode::decode_utf8(s, k);
          if (d.status != unicode::Decoded::Ok || k + d.len != mb || !unicode::is_whitespace(d.cp)) break;
          mb = k;
        }
      if (hit->rstrip)
        while (me < n) {
          auto d = unicode::decode_utf8(s, me);
          if (d.status != unicode::Decoded::Ok || !unicode::is_whitespace(d.cp)) break;
          me += d.len;
        }
      if (mb > text_start) out.push_back({false, 0, text_start, mb});
      out.push_back({true, hit->id, mb, me});
      text_start = i = me;
    }
    if (text_start < n || out.empty()) out.push_back({false, 0, text_start, n});
  }

 private:
  static bool single_word_ok(std::string_view s, size_t b, size_t e) {
    if (b > 0) {
      size_t k = b - 1;
      while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
      auto d = unicode::decode_utf8(s, k);
      if (d.status == unicode::Decoded::Ok && unicode::is_word_char(d.cp)) return false;
    }
    if (e < s.size()) {
      auto d = unicode::decode_utf8(s, e);
      if (d.status == unicode::Decoded::Ok && unicode::is_word_char(d.cp)) return false;
    }
    return true;
  }
  std::vector<AddedToken> toks_;
  std::array<bool, 256> first_{};
};

// ---------------------------------------------------------------------------------------------
// JSON access with errors that name the file and the field.
struct Ctx {
  std::string file;
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(file + ": " + field + ": " + what);
  }
  const json& get(const json& obj, const std::string& key, const std::string& path) const {
    if (!obj.is_object()) fail(path, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(path + "." + key, "missing field");
    return *it;
  }
  std::string str(const json& obj, const std::string& key, const std::string& path) const {
    const json& v = get(obj, key, path);
    if (!v.is_string()) fail(path + "." + key, "expected a string");
    return v.get<std::string>();
  }
  bool boolean(const json& obj, const std::string& key, bool dflt, const std::string& path) const {
    if (!obj.is_object()) fail(path, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) fail(path + "." + key, "expected a boolean");
    return it->get<bool>();
  }
};

json read_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open file");
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw Error(path + ": invalid JSON: " + e.what());
  }
}

// ---------------------------------------------------------------------------------------------
class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const std::string& dir) {
    std::string base = dir;
    if (!base.empty() && base.back() != '/') base.push_back('/');
    const std::string path = base + "tokenizer.json";
    const json root = read_json_file(path);
    Ctx c{path};
    if (!root.is_object()) c.fail("(root)", "expected a JSON object");
    load_model(c, c.get(root, "model", "(root)"));
    load_added(c, root);
    if (auto it = root.find("normalizer"); it != root.end()) load_normalizer(c, *it, "normalizer");
    auto pt = root.find("pre_tokenizer");
    if (pt == root.end() || pt->is_null()) c.fail("pre_tokenizer", "missing (a ByteLevel pre-tokenizer is required)");
    load_pre_tokenizer(c, *pt, "pre_tokenizer");
    if (!have_byte_level_)
      c.fail("pre_tokenizer", "no ByteLevel step: only byte-level BPE tokenizers are supported");
    finalize_added();

    // tokenizer_config.json is optional.
    const std::string cfg_path = base + "tokenizer_config.json";
    if (std::ifstream(cfg_path).good()) {
      const json cfg = read_json_file(cfg_path);
      eos_ = config_token(cfg, "eos_token", cfg_path);
      bos_ = config_token(cfg, "bos_token", cfg_path);
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    std::string clean;
    if (!unicode::is_valid_utf8(text)) {
      clean = unicode::sanitize_utf8(text);
      text = clean;
    }
    Scratch scratch(split_steps_.empty() ? nullptr : split_steps_.front().re->code());
    std::vector<Piece> pieces;
    raw_added_.split(text, parse_special, pieces);
    for (const Piece& p : pieces) {
      if (p.is_token) {
        out.push_back(p.id);
        continue;
      }
      if (p.e == p.b) continue;
      std::string norm = normalize(text.substr(p.b, p.e - p.b));
      if (norm_added_.empty()) {
        encode_plain(norm, out, scratch);
        continue;
      }
      std::vector<Piece> sub;
      norm_added_.split(norm, parse_special, sub);
      for (const Piece& q : sub) {
        if (q.is_token)
          out.push_back(q.id);
        else if (q.e > q.b)
          encode_plain(std::string_view(norm).substr(q.b, q.e - q.b), out, scratch);
      }
    }
    return out;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size())
        throw InputError("decode: token id " + std::to_string(id) + " is out of range [0, " +
                         std::to_string(vocab_size()) + ")");
      if (skip_special && is_special(id)) continue;
      out += tokens_[static_cast<size_t>(id)];
    }
    return out;
  }

  const std::string& token_bytes(int32_t id) const override {
    static const std::string empty;
    if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) return empty;
    return tokens_[static_cast<size_t>(id)];
  }

  std::optional<int32_t> token_id(std::string_view token) const override {
    for (const auto& t : added_)
      if (t.content == token) return t.id;
    if (auto it = vocab_str_.find(std::string(token)); it != vocab_str_.end()) return it->second;
    return std::nullopt;
  }

  bool is_special(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[static_cast<size_t>(id)];
  }
  bool is_added(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < added_flag_.size() && added_flag_[static_cast<size_t>(id)];
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::string eos_token() const override { return eos_; }
  std::string bos_token() const override { return bos_; }

 private:
  struct Scratch {
    explicit Scratch(const pcre2_code* c) : md(c ? pcre2_match_data_create(4, nullptr) : nullptr) {}
    ~Scratch() {
      if (md) pcre2_match_data_free(md);
    }
    pcre2_match_data* md;
    std::vector<Range> a, b;
  };

  // ---- loading -----------------------------------------------------------------------------
  void set_token(int32_t id, std::string bytes) {
    if (static_cast<size_t>(id) >= tokens_.size()) {
      tokens_.resize(static_cast<size_t>(id) + 1);
      special_.resize(static_cast<size_t>(id) + 1, false);
      added_flag_.resize(static_cast<size_t>(id) + 1, false);
    }
    tokens_[static_cast<size_t>(id)] = std::move(bytes);
  }

  void load_model(const Ctx& c, const json& m) {
    std::string type = "BPE";
    if (auto it = m.find("type"); it != m.end() && !it->is_null()) {
      if (!it->is_string()) c.fail("model.type", "expected a string");
      type = it->get<std::string>();
    }
    if (type != "BPE")
      c.fail("model.type", "'" + type + "' is not supported (only byte-level BPE tokenizers are)");
    if (c.boolean(m, "byte_fallback", false, "model"))
      c.fail("model.byte_fallback", "true is not supported (byte-level BPE needs no fallback)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      auto it = m.find(k);
      if (it != m.end() && it->is_string() && !it->get<std::string>().empty())
        c.fail(std::string("model.") + k, "a non-empty value is not supported");
    }
    ignore_merges_ = c.boolean(m, "ignore_merges", false, "model");

    const json& vocab = c.get(m, "vocab", "model");
    if (!vocab.is_object()) c.fail("model.vocab", "expected an object {token: id}");
    if (vocab.empty()) c.fail("model.vocab", "is empty");
    vocab_str_.reserve(vocab.size());
    bytes_to_id_.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer()) c.fail("model.vocab[\"" + it.key() + "\"]", "expected an integer id");
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || id > 100000000) c.fail("model.vocab[\"" + it.key() + "\"]", "id out of range");
      vocab_str_.emplace(it.key(), static_cast<int32_t>(id));
      auto bytes = unicode::byte_level_to_bytes(it.key());
      if (bytes) {
        bytes_to_id_.emplace(*bytes, static_cast<int32_t>(id));
        set_token(static_cast<int32_t>(id), std::move(*bytes));
      } else {
        set_token(static_cast<int32_t>(id), it.key());  // not reachable from bytes; decodes as its text
      }
    }
    for (int b = 0; b < 256; ++b) {
      auto it = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
      if (it == bytes_to_id_.end()) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        c.fail("model.vocab", std::string("no token for byte ") + hex +
                                  " (only byte-level BPE vocabularies are supported)");
      }
      byte_id_[static_cast<size_t>(b)] = it->second;
    }

    const json& merges = c.get(m, "merges", "model");
    if (!merges.is_array()) c.fail("model.merges", "expected an array");
    merges_.reserve(merges.size() * 2);
    int32_t rank = 0;
    for (const json& mg : merges) {
      const std::string where = "model.merges[" + std::to_string(rank) + "]";
      std::string a, b;
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos || sp + 1 >= s.size()) c.fail(where, "expected \"a b\"");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      } else {
        c.fail(where, "expected \"a b\" or [\"a\", \"b\"]");
      }
      auto ia = vocab_str_.find(a), ib = vocab_str_.find(b), im = vocab_str_.find(a + b);
      if (ia == vocab_str_.end() || ib == vocab_str_.end() || im == vocab_str_.end())
        c.fail(where, "token '" + (ia == vocab_str_.end() ? a : ib == vocab_str_.end() ? b : a + b) +
                          "' is not in the vocabulary");
      merges_.emplace(pair_key(ia->second, ib->second), MergeInfo{rank, im->second});
      ++rank;
    }
  }

  void load_added(const Ctx& c, const json& root) {
    auto it = root.find("added_tokens");
    if (it == root.end() || it->is_null()) return;
    if (!it->is_array()) c.fail("added_tokens", "expected an array");
    size_t i = 0;
    for (const json& t : *it) {
      const std::string where = "added_tokens[" + std::to_string(i++) + "]";
      const json& idj = c.get(t, "id", where);
      if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() > 100000000)
        c.fail(where + ".id", "expected a non-negative integer");
      AddedToken a;
      a.id = static_cast<int32_t>(idj.get<int64_t>());
      a.content = c.str(t, "content", where);
      if (a.content.empty()) c.fail(where + ".content", "is empty");
      if (!unicode::is_valid_utf8(a.content)) c.fail(where + ".content", "is not valid UTF-8");
      a.special = c.boolean(t, "special", false, where);
      a.single_word = c.boolean(t, "single_word", false, where);
      a.lstrip = c.boolean(t, "lstrip", false, where);
      a.rstrip = c.boolean(t, "rstrip", false, where);
      a.normalized = c.boolean(t, "normalized", !a.special, where);
      set_token(a.id, a.content);
      special_[static_cast<size_t>(a.id)] = a.special;
      added_flag_[static_cast<size_t>(a.id)] = true;
      added_.push_back(std::move(a));
    }
  }

  void finalize_added() {
    for (const auto& a : added_) {
      if (!a.normalized) {
        raw_added_.add(a);
      } else {
        AddedToken n = a;
        n.content = normalize(a.content);
        norm_added_.add(n);
      }
    }
    raw_added_.finalize();
    norm_added_.finalize();
  }

  void load_normalizer(const Ctx& c, const json& n, const std::string& where) {
    if (n.is_null()) return;
    const std::string type = c.str(n, "type", where);
    if (type == "Sequence") {
      const json& list = c.get(n, "normalizers", where);
      if (!list.is_array()) c.fail(where + ".normalizers", "expected an array");
      for (size_t i = 0; i < list.size(); ++i) load_normalizer(c, list[i], where + ".normalizers[" + std::to_string(i) + "]");
    } else if (type == "NFC") {
      norms_.push_back(unicode::NormForm::NFC);
    } else if (type == "NFD") {
      norms_.push_back(unicode::NormForm::NFD);
    } else if (type == "NFKC") {
      norms_.push_back(unicode::NormForm::NFKC);
    } else if (type == "NFKD") {
      norms_.push_back(unicode::NormForm::NFKD);
    } else {
      c.fail(where + ".type", "normalizer '" + type + "' is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence)");
    }
  }

  void load_pre_tokenizer(const Ctx& c, const json& p, const std::string& where) {
    const std::string type = c.str(p, "type", where);
    if (type == "Sequence") {
      const json& list = c.get(p, "pretokenizers", where);
      if (!list.is_array()) c.fail(where + ".pretokenizers", "expected an array");
      for (size_t i = 0; i < list.size(); ++i)
        load_pre_tokenizer(c, list[i], where + ".pretokenizers[" + std::to_string(i) + "]");
    } else if (type == "Split") {
      if (have_byte_level_) c.fail(where, "a Split after ByteLevel is not supported");
      SplitStep s;
      const json& pat = c.get(p, "pattern", where);
      if (pat.is_object() && pat.contains("Regex")) {
        s.re = std::make_unique<Regex>(c.str(pat, "Regex", where + ".pattern"), false, c.file + ": " + where + ".pattern.Regex");
      } else if (pat.is_object() && pat.contains("String")) {
        const std::string lit = c.str(pat, "String", where + ".pattern");
        if (lit.empty()) c.fail(where + ".pattern.String", "is empty");
        s.re = std::make_unique<Regex>(lit, true, c.file + ": " + where + ".pattern.String");
      } else {
        c.fail(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
      }
      const std::string beh = c.str(p, "behavior", where);
      if (beh == "Removed") s.behavior = SplitBehavior::Removed;
      else if (beh == "Isolated") s.behavior = SplitBehavior::Isolated;
      else if (beh == "MergedWithPrevious") s.behavior = SplitBehavior::MergedWithPrevious;
      else if (beh == "MergedWithNext") s.behavior = SplitBehavior::MergedWithNext;
      else if (beh == "Contiguous") s.behavior = SplitBehavior::Contiguous;
      else c.fail(where + ".behavior", "unknown behavior '" + beh + "'");
      s.invert = c.boolean(p, "invert", false, where);
      split_steps_.push_back(std::move(s));
    } else if (type == "Digits") {
      if (have_byte_level_) c.fail(where, "Digits after ByteLevel is not supported");
      SplitStep s;
      const bool single = c.boolean(p, "individual_digits", false, where);
      s.re = std::make_unique<Regex>(single ? "\\p{N}" : "\\p{N}+", false, c.file + ": " + where);
      s.behavior = SplitBehavior::Isolated;
      split_steps_.push_back(std::move(s));
    } else if (type == "ByteLevel") {
      if (have_byte_level_) c.fail(where, "more than one ByteLevel step");
      have_byte_level_ = true;
      add_prefix_space_ = c.boolean(p, "add_prefix_space", true, where);
      // Hugging Face prepends the space to every piece made by earlier steps; we support it where
      // that is the whole text (ByteLevel first), which is how GPT-2 style tokenizers use it.
      if (add_prefix_space_ && !split_steps_.empty())
        c.fail(where + ".add_prefix_space", "true after a Split/Digits step is not supported");
      if (c.boolean(p, "use_regex", true, where)) {
        SplitStep s;
        s.re = std::make_unique<Regex>(kGpt2Regex, false, "ByteLevel regex");
        s.behavior = SplitBehavior::Isolated;
        split_steps_.push_back(std::move(s));
      }
    } else {
      c.fail(where + ".type", "pre-tokenizer '" + type + "' is not supported (supported: Sequence, Split, Digits, ByteLevel)");
    }
  }

  static std::string config_token(const json& cfg, const char* key, const std::string& path) {
    if (!cfg.is_object()) throw Error(path + ": expected a JSON object");
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return {};
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object()) {
      auto c = it->find("content");
      if (c != it->end() && c->is_string()) return c->get<std::string>();
    }
    throw Error(path + ": " + key + ": expected a string or {\"content\": ...}");
  }

  // ---- encoding ----------------------------------------------------------------------------
  std::string normalize(std::string_view s) const {
    if (norms_.empty()) return std::string(s);
    std::string cur(s);
    for (auto f : norms_) cur = unicode::normalize(cur, f);
    return cur;
  }

  // Applies one Split step to `in` (ranges of s), writing the resulting ranges to `out`.
  static void apply_split(const SplitStep& st, std::string_view s, const std::vector<Range>& in,
                          std::vector<Range>& out, pcre2_match_data* md) {
    out.clear();
    for (const Range& r : in) {
      const char* sub = s.data() + r.b;
      const size_t len = r.e - r.b;
      const size_t first_out = out.size();
      bool prev_match = false;
      // Adds one (non-empty) piece of this range according to the behavior.
      auto emit = [&](size_t b, size_t e, bool is_match) {
        if (e <= b) return;
        if (st.invert) is_match = !is_match;
        const Range piece{r.b + b, r.b + e};
        const bool have_prev = out.size() > first_out;
        switch (st.behavior) {
          case SplitBehavior::Removed:
            if (!is_match) out.push_back(piece);
            break;
          case SplitBehavior::Isolated:
            out.push_back(piece);
            break;
          case SplitBehavior::MergedWithPrevious:
            if (is_match && !prev_match && have_prev) out.back().e = piece.e;  // as HF: one match each
            else out.push_back(piece);
            break;
          case SplitBehavior::MergedWithNext:
            if (prev_match && !is_match && have_prev) out.back().e = piece.e;
            else out.push_back(piece);
            break;
          case SplitBehavior::Contiguous:
            if (is_match && prev_match && have_prev) out.back().e = piece.e;
            else out.push_back(piece);
            break;
        }
        prev_match = is_match;
      };
      size_t pos = 0, last = 0;
      while (pos < len) {
        size_t mb, me;
        if (!st.re->find(sub, len, pos, md, mb, me)) break;
        if (me == mb) {  // empty match: step one character
          if (mb >= len) break;
          pos = mb + unicode::decode_utf8(std::string_view(sub, len), mb).len;
          continue;
        }
        emit(last, mb, false);
        emit(mb, me, true);
        last = pos = me;
      }
      emit(last, len, false);
    }
  }

  void encode_plain(std::string_view s, std::vector<int32_t>& out, Scratch& sc) const {
    std::string prefixed;
    if (add_prefix_space_ && !s.empty() && s.front() != ' ') {
      prefixed = " " + std::string(s);
      s = prefixed;
    }
    sc.a.assign(1, Range{0, s.size()});
    for (const auto& st : split_steps_) {
      apply_split(st, s, sc.a, sc.b, sc.md);
      std::swap(sc.a, sc.b);
    }
    for (const Range& r : sc.a) bpe_cached(s.substr(r.b, r.e - r.b), out);
  }

  struct MergeInfo {
    int32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void bpe_cached(std::string_view w, std::vector<int32_t>& out) const {
    if (w.size() == 1) {
      out.push_back(byte_id_[static_cast<uint8_t>(w[0])]);
      return;
    }
    constexpr size_t kMaxCachedLen = 64;
    const bool cacheable = w.size() <= kMaxCachedLen;
    if (cacheable) {
      std::shared_lock lock(cache_mu_);
      auto it = cache_.find(w);
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t start = out.size();
    bpe(w, out);
    if (cacheable) {
      std::unique_lock lock(cache_mu_);
      if (cache_.size() >= kMaxCacheEntries) cache_.clear();
      cache_.emplace(std::string(w), std::vector<int32_t>(out.begin() + static_cast<ptrdiff_t>(start), out.end()));
    }
  }

  void bpe(std::string_view w, std::vector<int32_t>& out) const {
    if (ignore_merges_) {
      if (auto it = bytes_to_id_.find(std::string(w)); it != bytes_to_id_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const int n = static_cast<int>(w.size());
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      ids[static_cast<size_t>(i)] = byte_id_[static_cast<uint8_t>(w[static_cast<size_t>(i)])];
      prev[static_cast<size_t>(i)] = i - 1;
      next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
      int32_t rank;
      int pos;
      int32_t left, right;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto consider = [&](int l) {
      if (l < 0) return;
      const int r = next[static_cast<size_t>(l)];
      if (r < 0) return;
      auto it = merges_.find(pair_key(ids[static_cast<size_t>(l)], ids[static_cast<size_t>(r)]));
      if (it != merges_.end()) heap.push({it->second.rank, l, ids[static_cast<size_t>(l)], ids[static_cast<size_t>(r)]});
    };
    for (int i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      const size_t l = static_cast<size_t>(c.pos);
      if (ids[l] != c.left) continue;  // stale (merged away or changed)
      const int r = next[l];
      if (r < 0 || ids[static_cast<size_t>(r)] != c.right) continue;
      ids[l] = merges_.at(pair_key(c.left, c.right)).id;
      ids[static_cast<size_t>(r)] = -1;
      next[l] = next[static_cast<size_t>(r)];
      if (next[l] >= 0) prev[static_cast<size_t>(next[l])] = c.pos;
      consider(prev[l]);
      consider(c.pos);
    }
    for (int i = 0; i >= 0; i = next[static_cast<size_t>(i)]) out.push_back(ids[static_cast<size_t>(i)]);
  }

  // ---- data --------------------------------------------------------------------------------
  std::vector<std::string> tokens_;  // id -> bytes
  std::vector<bool> special_;
  std::vector<bool> added_flag_;
  std::unordered_map<std::string, int32_t> vocab_str_;    // byte-level string -> id
  std::unordered_map<std::string, int32_t> bytes_to_id_;  // raw bytes -> id
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::array<int32_t, 256> byte_id_{};
  bool ignore_merges_ = false;
  std::vector<AddedToken> added_;
  AddedMatcher raw_added_, norm_added_;
  std::vector<unicode::NormForm> norms_;
  std::vector<SplitStep> split_steps_;
  bool have_byte_level_ = false;
  bool add_prefix_space_ = false;
  std::string eos_, bos_;

  // Cache of BPE results per pre-token (bounded; cleared when full).
  struct SvHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static constexpr size_t kMaxCacheEntries = 1 << 18;
  mutable std::shared_mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, SvHash, std::equal_to<>> cache_;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& dir) { return std::make_unique<BpeTokenizer>(dir); }

}  // namespace lilac
