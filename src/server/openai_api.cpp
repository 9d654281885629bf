#include "server/openai_api.h"

#include <httplib.h>

#include <chrono>
#include <ctime>

#include "core/error.h"
#include "core/log.h"
#include "server/endpoint.h"
#include "server/http_response.h"
#include "server/http_server.h"
#include "server/openai_format.h"
#include "server/openai_schema.h"
#include "server/server_context.h"

namespace lilac::server {

using json = nlohmann::json;

namespace {

ResponseMeta response_meta(ServerContext& C, const CommonParams& p, const char* id_prefix) {
  ResponseMeta meta;
  meta.id = C.new_id(id_prefix);
  meta.model = C.opts.model_id;
  meta.created = int64_t(std::time(nullptr));
  meta.include_usage = p.include_usage;
  meta.logprobs = p.logprobs;
  meta.top_logprobs = p.top_logprobs;
  return meta;
}

// What chat and completions requests share after their prompt: the constraint, sampling, limits, the
// response's model / stream and its formatter (`make`: the protocol's chunks, `id_prefix` its ids).
using MakeFormatter = std::shared_ptr<ResponseFormatter> (*)(ResponseMeta, const Tokenizer&);
// `prompts`: completions' prompts (each gets p.n choices; r.more_specs holds prompts 2..); `echo`: completions'.
void finish_request(ServerContext& C, const CommonParams& p, const char* id_prefix, MakeFormatter make,
                    PreparedRequest& r, int prompts = 1, bool echo = false) {
  apply_response_format(p.response_format, p.json_schema, r.spec);
  r.spec.sampling = p.sampling;
  r.spec.max_tokens = p.max_tokens;
  r.spec.stop = p.stop;
  r.model = p.model;
  r.stream = p.stream;
  ResponseMeta meta = response_meta(C, p, id_prefix);
  meta.echo = echo;
  const int total = prompts * p.n;
  // Choice `index` of `total`: only a lone choice ends its own stream (several: the join ends it, once).
  auto choice = [&C, meta, make, total](const Generation& g, bool route_field, int index) mutable {
    meta.route_field = route_field;
    meta.index = index;
    meta.stream_tail = total == 1;
    if (meta.echo) meta.echo_ids = g.prompt_ids();
    return make(meta, *C.tok);
  };
  r.formatter = [choice](const Generation& g, bool route_field) mutable { return choice(g, route_field, 0); };
  r.n = p.n;
  if (total > 1) {
    r.choice_formatter = choice;
    // The join's usage chunk carries the route field when the route hook is set (it marks every answer).
    ResponseMeta joined = meta;
    joined.route_field = C.hook_set;
    r.join = openai_choices_join(joined, make == make_chat_formatter, p.n);
  }
}

// What of a chat request makes its prompt: the conversation, tools, prefill and forced call.
void chat_prompt(ChatParams& p, GenerationSpec& s) {
  apply_chat_prompt(std::move(p.template_request), std::move(p.tools), p.continue_final, p.tool_choice,
                    p.tool_choice_name, s);
  s.prompt_param = "messages";
  s.parallel_tool_calls = p.parallel_tool_calls;
}

PreparedRequest chat_request(ServerContext& C, const ojson& body, const ModelConfig& cfg, uint64_t seed) {
  ChatParams p = parse_chat_request(body, cfg, seed);
  PreparedRequest r;
  chat_prompt(p, r.spec);
  finish_request(C, p, "chatcmpl-", make_chat_formatter, r);
  return r;
}

PreparedRequest completion_request(ServerContext& C, const ojson& body, const ModelConfig& cfg, uint64_t seed) {
  CompletionParams p = parse_completion_request(body, cfg, seed);
  PreparedRequest r;
  r.spec.prompt_param = "prompt";
  // echo: the prompt's scores with logprobs (or to answer max_tokens 0, the prompt alone)
  if (p.echo && (p.logprobs || p.max_tokens == 0)) r.spec.prompt_logprobs = p.logprobs ? p.top_logprobs : 0;
  finish_request(C, p, "cmpl-", make_completion_formatter, r, int(p.prompts.size()), p.echo);
  const GenerationSpec common = r.spec;
  for (size_t k = 0; k < p.prompts.size(); ++k) {
    GenerationSpec& s = k == 0 ? r.spec : r.more_specs.emplace_back(common);
    if (p.prompts[k].ids) {
      s.input = GenerationSpec::Input::Tokens;
      s.tokens = std::move(*p.prompts[k].ids);
    } else {
      s.input = GenerationSpec::Input::Text;
      s.text = std::move(p.prompts[k].text);
    }
  }
  return r;
}

Endpoint openai_endpoint(ServerContext& C, bool chat) {
  Endpoint ep;
  ep.path = chat ? "/v1/chat/completions" : "/v1/completions";
  ep.prepare = [&C, chat](const ojson& body, const ModelConfig& cfg, uint64_t seed) {
    return chat ? chat_request(C, body, cfg, seed) : completion_request(C, body, cfg, seed);
  };
  ep.send_error = [](httplib::Response& res, const ApiError& e) { send_error(res, e); };
  return ep;
}

void list_models(ServerContext& C, const httplib::Request& req, httplib::Response& res) {
  json data = json::array();
  data.push_back(json{{"id", C.opts.model_id}, {"object", "model"}, {"created", int64_t(std::time(nullptr))},
                      {"owned_by", "lilac"}});
  if (C.hook.extra_models) {
    try {
      json extra = C.hook.extra_models();
      if (extra.is_array())
        for (auto& m : extra) data.push_back(m);
    } catch (const std::exception& e) {
      LILAC_LOG_WARN("route hook extra_models failed: %s", e.what());
    }
  }
  if (req.matches.size() > 1) {
    std::string want = req.matches[1];
    for (auto& m : data)
      if (m["id"] == want) {
        res.set_content(dump_json(m), "application/json");
        return;
      }
    send_error(res, 404, "The model '" + want + "' does not exist.", "model", "model_not_found");
    return;
  }
  res.set_content(dump_json(json{{"object", "list"}, {"data", data}}), "application/json");
}

}  // namespace

GenerationSpec openai_chat_spec(ServerContext& C, const ojson& body) {
  ChatParams p = parse_chat_request(body, C.core->config(), 0);  // validated as the endpoint does
  GenerationSpec s;
  chat_prompt(p, s);  // (no response id, formatters or sampling: only the prompt is wanted)
  return s;
}

void add_openai_routes(HttpServer& http, ServerContext& ctx) {
  ServerContext* C = &ctx;
  auto models = [C](const httplib::Request& req, httplib::Response& res) { list_models(*C, req, res); };
  http.Get("/v1/models", models);
  http.Get(R"(/v1/models/(.+))", models);
  for (bool chat : {true, false}) {
    auto ep = std::make_shared<Endpoint>(openai_endpoint(ctx, chat));
    http.Post(ep->path, [C, ep](httplib::Request& req, httplib::Response& res) { serve_generation(*C, *ep, req, res); });
  }
}

}  // namespace lilac::server
