// `lilac render-chat --tokenizer DIR < request.json`: renders an OpenAI chat request with the model's
// chat template and writes the prompt text to stdout exactly (no added newline).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "text/chat_template.h"

namespace lilac::cli {
namespace {

const bool registered = register_command(Command{
    "render-chat",
    "Render an OpenAI chat request (JSON on stdin) with the model's chat template",
    [](CLI::App& sub) -> std::function<int()> {
      auto dir = std::make_shared<std::string>();
      sub.add_option("--tokenizer", *dir,
                     "Folder with chat_template.jinja or tokenizer_config.json (usually the model folder)")
          ->required();
      return [dir]() {
        std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
        nlohmann::ordered_json request;
        try {
          request = nlohmann::ordered_json::parse(input);
        } catch (const nlohmann::ordered_json::parse_error& e) {
          throw InputError(std::string("stdin: invalid JSON request: ") + e.what());
        }
        auto tmpl = ChatTemplate::load(*dir);
        std::string out = render_chat_request(*tmpl, request);
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fflush(stdout);
        return 0;
      };
    }});

}  // namespace
}  // namespace lilac::cli
