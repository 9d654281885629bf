// Chat templates: the checkpoint's own Jinja template rendered the way Hugging Face renders it
// (trim_blocks, lstrip_blocks), by lilac's Jinja subset interpreter (text/jinja.h).
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace lilac {

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  // DIR/chat_template.jinja if present, else tokenizer_config.json's "chat_template"
  // (bos_token / eos_token for the template come from tokenizer_config.json). Throws lilac::Error.
  static std::unique_ptr<ChatTemplate> load(const std::string& dir);
  static std::unique_ptr<ChatTemplate> from_source(const std::string& source, const std::string& origin,
                                                   const std::string& bos_token = "",
                                                   const std::string& eos_token = "");

  // Render with the given variables (messages, tools, add_generation_prompt, any kwargs).
  // Throws lilac::Error with template line and column on template errors / raise_exception.
  virtual std::string render(const nlohmann::ordered_json& variables) const = 0;
  // The template's Jinja source (what the tokenizer endpoints give clients that render it themselves).
  virtual const std::string& source() const = 0;
};

// Render an OpenAI chat request body: messages, tools, add_generation_prompt (default true),
// every chat_template_kwargs entry as a variable. Normalises messages first (content null -> "",
// an array of text parts -> their concatenation as one string, tool-call arguments given as a JSON
// string -> object, parsed with text/bounded_json.h). Throws lilac::InputError on bad requests,
// including requests the template rejects while rendering (raise_exception and other template errors;
// the message keeps the template's origin, line and column).
std::string render_chat_request(const ChatTemplate& tmpl, const nlohmann::ordered_json& request);

}  // namespace lilac
