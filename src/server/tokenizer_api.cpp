#include "server/tokenizer_api.h"

#include <httplib.h>

#include "core/error.h"
#include "server/api_error.h"
#include "server/http_response.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "server/request_fields.h"
#include "server/parse_budget.h"
#include "server/request_json.h"
#include "server/server_context.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lilac::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// Runs `answer` with the tokenizer once the model is loaded; errors become OpenAI error bodies: ApiErrors as they
// are, an InputError (input the tokenizer refused) 400 naming `param`, anything else 500.
template <typename F>
void with_tokenizer(ServerContext& C, const char* path, const char* param, httplib::Response& res, F answer) {
  int status = 200;
  try {
    if (!C.ready.load() || !C.tok) throw ApiError(503, "The model is still loading; retry shortly.", "", "model_not_loaded");
    res.set_content(dump_json(answer(*C.tok)), "application/json");
  } catch (const ApiError& e) {
    status = e.status;
    send_error(res, e);
  } catch (const InputError& e) {
    status = 400;
    send_error(res, 400, e.what(), param, "invalid_value");
  } catch (const std::exception& e) {
    status = 500;
    send_error(res, 500, std::string("Internal server error: ") + e.what(), "", "internal_error");
  }
  C.metrics.count_request(path, status);
}

json or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

}  // namespace

void add_tokenizer_routes(HttpServer& http, ServerContext& ctx) {
  ServerContext* C = &ctx;
  http.Get("/tokenizer_info", [C](const httplib::Request&, httplib::Response& res) {
    with_tokenizer(*C, "/tokenizer_info", "", res, [C](const Tokenizer& tok) {
      return json{{"tokenizer_class", "lilac"},
                  {"eos_token", or_null(tok.eos_token())},
                  {"bos_token", or_null(tok.bos_token())},
                  {"pad_token", nullptr},
                  {"vocab_size", tok.vocab_size()},
                  {"model_max_length", C->opts.max_seq},
                  {"model", C->opts.model_id},
                  {"chat_template", C->core->chat_template().source()}};
    });
  });
  http.Post("/tokenize", [C](const httplib::Request& req, httplib::Response& res) {
    with_tokenizer(*C, "/tokenize", "prompt", res, [C, &req](const Tokenizer& tok) {
      const ParseBudget::Lease lease = C->parse.acquire(req.body.size());
      const ojson body = parse_request_body(req.body);
      if (!body.is_object()) throw ApiError(400, "The request body must be a JSON object.", "", "invalid_json");
      fields::get_bool(body, "add_special_tokens");  // checked; the Qwen tokenizers add none
      std::vector<int32_t> ids;
      if (fields::field(body, "messages")) {  // a chat: the prompt /v1/chat/completions would feed for this body
        if (fields::field(body, "prompt")) fields::bad("prompt", "Give either 'prompt' or 'messages', not both.");
        ids = C->core->prompt_ids(openai_chat_spec(*C, body));
      } else {
        ids = tok.encode(fields::need_string(body, "prompt", "prompt"), /*parse_special=*/true);
      }
      return json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", C->opts.max_seq}};
    });
  });
  http.Post("/detokenize", [C](const httplib::Request& req, httplib::Response& res) {
    with_tokenizer(*C, "/detokenize", "tokens", res, [C, &req](const Tokenizer& tok) {
      const ParseBudget::Lease lease = C->parse.acquire(req.body.size());
      const ojson body = parse_request_body(req.body);
      if (!body.is_object()) throw ApiError(400, "The request body must be a JSON object.", "", "invalid_json");
      const ojson* t = fields::field(body, "tokens");
      if (!t) fields::missing("tokens");
      if (!t->is_array()) fields::wrong_type("tokens", "an array of token ids", *t);
      std::vector<int32_t> ids;
      for (const auto& x : *t) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok.vocab_size())
          fields::bad("tokens", "Invalid 'tokens': token ids must be integers in [0, " + std::to_string(tok.vocab_size()) + ").");
        ids.push_back(int32_t(x.get<int64_t>()));
      }
      return json{{"prompt", tok.decode(ids, /*skip_special=*/false)}};
    });
  });
}

}  // namespace lilac::server
