#include "server/openai_api.h"

#include <httplib.h>

#include <chrono>
#include <ctime>

#include "core/error.h"
#include "core/log.h"
#include "server/http_response.h"
#include "server/openai_format.h"
#include "server/openai_schema.h"
#include "server/server_context.h"

namespace lilac::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// A validated OpenAI request: what the generation core needs, and what the response needs.
struct OpenAIRequest {
  GenerationSpec spec;
  CommonParams common;
};

OpenAIRequest chat_request(const ojson& body, const ModelConfig& cfg, uint64_t seed) {
  ChatParams p = parse_chat_request(body, cfg, seed);
  OpenAIRequest r;
  r.spec.input = GenerationSpec::Input::Chat;
  r.spec.chat = std::move(p.template_request);
  r.spec.tools = std::move(p.tools);
  r.spec.force_tool_call = p.tool_choice == ToolChoice::Required || p.tool_choice == ToolChoice::Function;
  if (p.tool_choice == ToolChoice::Function) r.spec.forced_function = p.tool_choice_name;
  r.spec.prompt_param = "messages";
  r.spec.parallel_tool_calls = p.parallel_tool_calls;
  r.common = std::move(p);
  return r;
}

OpenAIRequest completion_request(const ojson& body, const ModelConfig& cfg, uint64_t seed) {
  CompletionParams p = parse_completion_request(body, cfg, seed);
  OpenAIRequest r;
  if (p.prompt_ids) {
    r.spec.input = GenerationSpec::Input::Tokens;
    r.spec.tokens = std::move(*p.prompt_ids);
  } else {
    r.spec.input = GenerationSpec::Input::Text;
    r.spec.text = std::move(p.prompt_text);
  }
  r.spec.prompt_param = "prompt";
  r.common = std::move(p);
  return r;
}

void handle_generation(ServerContext& C, const httplib::Request& req, httplib::Response& res, bool chat) {
  const auto t0 = Clock::now();
  const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  auto fail = [&](const ApiError& e) {
    send_error(res, e.status, e.message, e.param, e.code, e.type);
    C.metrics.count_request(endpoint, e.status);
    if (e.status >= 500)
      LILAC_LOG_ERROR("POST %s -> %d: %s", endpoint.c_str(), e.status, e.message.c_str());
    else
      LILAC_LOG_WARN("POST %s -> %d: %s", endpoint.c_str(), e.status, e.message.c_str());
  };
  try {
    const ojson body = ojson::parse(req.body, nullptr, false);
    if (body.is_discarded())
      throw ApiError(400, "We could not parse the JSON body of your request: it is not valid JSON.", "", "invalid_json");
    if (!body.is_object()) throw ApiError(400, "The request body must be a JSON object.", "", "invalid_json");
    if (C.hook.maybe_forward) {
      const bool busy = C.ready.load() && C.core->busy();
      if (C.hook.maybe_forward(req, res, body, busy)) {
        C.metrics.count_request(endpoint, res.status);
        return;
      }
    }
    if (!C.ready.load()) throw ApiError(503, "The model is still loading; retry shortly.", "", "model_not_loaded");
    const ModelConfig& cfg = C.core->config();
    const uint64_t seed = C.random_u64();
    OpenAIRequest r = chat ? chat_request(body, cfg, seed) : completion_request(body, cfg, seed);
    const CommonParams& common = r.common;
    if (!common.model.empty() && common.model != C.opts.model_id)
      throw ApiError(404, "The model '" + common.model + "' does not exist (this server serves '" + C.opts.model_id + "').",
                     "model", "model_not_found");
    r.spec.sampling = common.sampling;
    r.spec.max_tokens = common.max_tokens;
    r.spec.stop = common.stop;
    switch (common.response_format) {
      case ResponseFormat::Text: r.spec.format = GenerationSpec::Format::Text; break;
      case ResponseFormat::JsonObject: r.spec.format = GenerationSpec::Format::JsonObject; break;
      case ResponseFormat::JsonSchema:
        r.spec.format = GenerationSpec::Format::JsonSchema;
        r.spec.schema = common.json_schema;
        break;
    }
    std::shared_ptr<Generation> gen = C.core->start(r.spec);

    if (C.hook_set) {
      res.set_header("x-lilac-route", "local");
      if (C.hook.on_local) {
        try {
          C.hook.on_local(body);
        } catch (const std::exception& e) {
          LILAC_LOG_WARN("route hook on_local failed: %s", e.what());
        }
      }
    }
    ResponseMeta meta;
    meta.id = C.new_id(chat ? "chatcmpl-" : "cmpl-");
    meta.model = C.opts.model_id;
    meta.created = int64_t(std::time(nullptr));
    meta.include_usage = common.include_usage;
    meta.logprobs = common.logprobs;
    meta.top_logprobs = common.top_logprobs;
    meta.route_field = C.hook_set;
    auto fmt = chat ? make_chat_formatter(std::move(meta), *C.tok) : make_completion_formatter(std::move(meta), *C.tok);
    send_generation(res, std::move(gen), std::move(fmt), common.stream, RequestLog{endpoint, t0, C.opts.log_requests, &C.metrics},
                    fail);
  } catch (const ApiError& e) {
    return fail(e);
  } catch (const InputError& e) {
    return fail(ApiError(400, e.what(), "", "invalid_request"));
  } catch (const std::exception& e) {
    return fail(ApiError(500, std::string("Internal server error: ") + e.what(), "", "internal_error"));
  } catch (...) {
    return fail(ApiError(500, "Internal server error", "", "internal_error"));
  }
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

void add_openai_routes(httplib::Server& http, ServerContext& ctx) {
  ServerContext* C = &ctx;
  auto models = [C](const httplib::Request& req, httplib::Response& res) { list_models(*C, req, res); };
  http.Get("/v1/models", models);
  http.Get(R"(/v1/models/(.+))", models);
  http.Post("/v1/chat/completions",
            [C](const httplib::Request& req, httplib::Response& res) { handle_generation(*C, req, res, true); });
  http.Post("/v1/completions",
            [C](const httplib::Request& req, httplib::Response& res) { handle_generation(*C, req, res, false); });
}

}  // namespace lilac::server
