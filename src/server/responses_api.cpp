#include "server/responses_api.h"

#include <httplib.h>

#include "server/api_error.h"
#include "server/http_server.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>
#include <ctime>
#include <memory>
#include <optional>

#include "core/log.h"
#include "server/endpoint.h"
#include "server/json_route.h"
#include "server/responses_format.h"
#include "server/responses_schema.h"
#include "server/server_context.h"

namespace lilac::server {

namespace {

// The events of background response `id`'s stream from index `from` (its sequence numbers), as server-sent events
// as they come, until it ends. A client that goes away stops reading; the generation goes on.
void send_background_stream(ServerContext& C, const std::string& id, size_t from, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto next = std::make_shared<size_t>(from);
  res.set_chunked_content_provider("text/event-stream", [&C, id, next](size_t, httplib::DataSink& sink) -> bool {
    std::vector<std::string> evs;
    bool ended = false;
    if (!C.background.events(id, *next, std::chrono::milliseconds(500), evs, ended)) ended = true;
    std::string out;
    for (const std::string& e : evs) out += e;
    *next += evs.size();
    if (out.empty() && !ended) out = ": keep-alive\n\n";
    if (!sink.write(out.data(), out.size())) return false;
    if (ended) sink.done();
    return true;
  });
}

Endpoint responses_endpoint(ServerContext& C) {
  Endpoint ep;
  ep.path = "/v1/responses";
  ep.send_error = [](httplib::Response& res, const ApiError& e) { send_error(res, e); };
  ep.keep_local = [&C](const ojson& body) {  // a conversation held here: only this server has it
    const auto it = body.find("previous_response_id");
    if (it != body.end() && it->is_string() && C.responses.contains(it->get<std::string>())) return true;
    const auto c = body.find("conversation");
    if (c == body.end()) return false;
    const ojson* id = c->is_object() && c->contains("id") ? &(*c)["id"] : &*c;
    return id->is_string() && C.conversations.contains(id->get<std::string>());
  };
  ep.prepare = [&C](const ojson& body, const ModelConfig& cfg, uint64_t seed) {
    ResponsesParams p = parse_responses_request(body, cfg, seed, &C.responses, &C.conversations);
    PreparedRequest r;
    r.model = p.model;
    r.stream = p.stream;
    GenerationSpec& s = r.spec;
    apply_chat_prompt(std::move(p.template_request), p.tools, p.continue_final, p.tool_choice, p.tool_choice_name, s);
    apply_response_format(p.response_format, p.json_schema, s);
    s.sampling = p.sampling;
    s.max_tokens = p.max_output_tokens;
    s.parallel_tool_calls = p.parallel_tool_calls;
    s.prompt_param = "input";
    s.max_tokens_param = "max_output_tokens";
    s.schema_param = "text.format.schema";
    s.tool_schema_field = "parameters";
    ResponsesMeta meta;
    meta.id = C.new_id("resp_");
    meta.model = p.model.empty() ? C.opts.model_id : p.model;
    meta.created_at = int64_t(std::time(nullptr));
    meta.instructions = p.instructions.is_null() ? nlohmann::json(nullptr) : nlohmann::json(p.instructions);
    meta.max_output_tokens = p.max_output_tokens ? nlohmann::json(*p.max_output_tokens) : nlohmann::json(nullptr);
    meta.tools = nlohmann::json(p.echo_tools);
    meta.tool_choice = nlohmann::json(p.echo_tool_choice);
    meta.parallel_tool_calls = p.parallel_tool_calls;
    meta.metadata = nlohmann::json(p.metadata);
    meta.temperature = p.sampling.temperature;
    meta.top_p = p.sampling.top_p;
    meta.text_format = nlohmann::json(p.echo_text_format);
    meta.reasoning_effort = p.effort.empty() ? nlohmann::json(nullptr) : nlohmann::json(p.effort);
    meta.new_id = [&C](const char* prefix) { return C.new_id(prefix); };
    meta.store = p.store;
    meta.background = p.background;
    if (!p.previous_response_id.empty()) meta.previous_response_id = p.previous_response_id;
    std::function<void(const nlohmann::json&)> add_to_conversation;
    if (!p.conversation_id.empty()) {
      meta.conversation = nlohmann::json{{"id", p.conversation_id}};
      // Once it completes, the conversation goes on with this request's input items and the response's output.
      const ojson added = conversation_items(p.request_items, "input", meta.new_id);
      add_to_conversation = [&C, id = p.conversation_id, added](const nlohmann::json& response) {
        C.conversations.update(id, [&](ConversationStore::Conversation& c) {
          for (ojson it : added) {  // an input item resent with an id the conversation holds gets a new one
            if (c.holds(it["id"])) it["id"] = C.new_id(item_id_prefix(it.value("type", std::string("message"))));
            c.items.push_back(std::move(it));
          }
          append_output_items(c.items, response);
        });
      };
      meta.on_done = [add_to_conversation](const nlohmann::json& response) {
        add_to_conversation(response);
        return true;
      };
    }
    if (p.store) {
      // The entry a follow-up continues: the conversation's input items, then this response's output.
      auto items = std::make_shared<const ojson>(std::move(p.input_items));
      if (p.background)
        r.background = [&C, items, id = meta.id, stream = p.stream](std::shared_ptr<Generation> gen,
                                                                    std::shared_ptr<ResponseFormatter> fmt,
                                                                    httplib::Response& res) {
          const nlohmann::json queued = C.background.start(id, std::move(gen), std::move(fmt), *items, stream);
          res.status = 200;
          if (stream)
            send_background_stream(C, id, 0, res);
          else
            res.set_content(dump_json(queued), "application/json");
        };
      // Stored first: a store that throws (the stream then fails) leaves the conversation as it was, not holding an
      // output whose response failed and was not kept. One the store refuses (larger than --responses-mb) is answered
      // whole, saying "store": false (the formatter, from the false returned here); its conversation goes on with it.
      // (A background one's run then ends it failed, saying why: background_responses.cpp.)
      meta.on_done = [&C, items, add_to_conversation](const nlohmann::json& response) {
        ResponseStore::Entry e;
        e.items = *items;
        append_output_items(e.items, response);
        e.response = response;
        const std::string id = response["id"].get<std::string>();
        const bool kept = C.responses.put(id, std::move(e));
        if (!kept)
          LILAC_LOG_WARN("response %s is larger than the response store holds (--responses-mb): it was not stored",
                         id.c_str());
        if (add_to_conversation) add_to_conversation(response);
        return kept;
      };
    }
    r.formatter = [meta](const Generation& gen, bool route_field) mutable {
      meta.input_tokens = gen.prompt_tokens();
      meta.route_field = route_field;
      return make_responses_formatter(meta);
    };
    return r;
  };
  return ep;
}

}  // namespace

void add_responses_routes(HttpServer& http, ServerContext& ctx) {
  ServerContext* C = &ctx;
  auto ep = std::make_shared<Endpoint>(responses_endpoint(ctx));
  http.Post(ep->path, [C, ep](httplib::Request& req, httplib::Response& res) { serve_generation(*C, *ep, req, res); });
  // A stored response, and its removal (OpenAI's shapes; 404 for an id this server does not hold).
  const std::string one = "/v1/responses/([A-Za-z0-9_-]{1,128})";
  auto not_found = [C](const httplib::Request& req, httplib::Response& res, const std::string& id, const char* route) {
    // A response the router created upstream (the client got its id from lilac): the upstream's answer.
    if (C->hook.response_route && C->hook.response_route(req, res, id))
      return C->metrics.count_request(route, res.status);
    send_error(res, 404, "No response with id '" + quoted_id(id) + "' is stored here.", "response_id", "not_found");
    C->metrics.count_request(route, 404);
  };
  // ?stream=true: a streamed background response's events (after `starting_after`), as they come.
  http.Get(one, [C, not_found](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    std::optional<ResponseStore::Entry> e = C->responses.get(id);
    if (!e) return not_found(req, res, id, "/v1/responses/{id}");
    if (req.get_param_value("stream") == "true") {
      try {  // the events after `starting_after` (an event's sequence_number)
        const size_t from = size_t(query_int(req, "starting_after", -1, int64_t(1) << 40).value_or(-1) + 1);
        if (!C->background.has_events(id))
          throw ApiError(400, "The events of response '" + id + "' are not held here: only a background response "
                              "created with 'stream': true can be streamed again (while it runs and shortly after).",
                         "stream", "invalid_request");
        send_background_stream(*C, id, from, res);
      } catch (const ApiError& err) {
        send_error(res, err);
        return C->metrics.count_request("/v1/responses/{id}", err.status);
      }
      return C->metrics.count_request("/v1/responses/{id}", 200);
    }
    res.set_content(dump_json(e->response), "application/json");
    C->metrics.count_request("/v1/responses/{id}", 200);
  });
  // Its conversation's input items (every turn's input and the earlier turns' outputs), newest first as
  // OpenAI lists them (`order=asc`: oldest first); no paging: the whole list, has_more false.
  http.Get(one + "/input_items", [C, not_found](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    std::optional<ResponseStore::Entry> e = C->responses.get(id);
    if (!e) return not_found(req, res, id, "/v1/responses/{id}/input_items");
    nlohmann::json data = nlohmann::json::array();
    // An ended response's items end with its output; a running one's hold its input only.
    const size_t n_out = response_running(e->response) ? 0 : e->response["output"].size();
    const size_t n_in = e->items.size() - std::min(n_out, e->items.size());
    for (size_t i = 0; i < n_in; ++i) data.push_back(nlohmann::json(e->items[i]));
    if (req.get_param_value("order") != "asc") std::reverse(data.begin(), data.end());
    nlohmann::json list{{"object", "list"}, {"data", data}, {"has_more", false}};
    list["first_id"] = data.empty() ? nlohmann::json(nullptr) : data.front().value("id", nlohmann::json(nullptr));
    list["last_id"] = data.empty() ? nlohmann::json(nullptr) : data.back().value("id", nlohmann::json(nullptr));
    res.set_content(dump_json(list), "application/json");
    C->metrics.count_request("/v1/responses/{id}/input_items", 200);
  });
  // Cancels a background response that is still running (its stored object becomes "cancelled", with what was
  // generated); a cancelled one is answered as it is; any other is 400 (not background, or already ended).
  http.Post(one + "/cancel", [C, not_found](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    const char* route = "/v1/responses/{id}/cancel";
    C->background.cancel(id);
    std::optional<ResponseStore::Entry> e = C->responses.get(id);
    if (!e) return not_found(req, res, id, route);
    const std::string status = e->response.value("status", "");
    if (!e->response.value("background", false)) {
      send_error(res, 400, "Only responses created with 'background': true can be cancelled.", "response_id",
                 "invalid_request");
      return C->metrics.count_request(route, 400);
    }
    if (status != "cancelled") {
      send_error(res, 400, "Cannot cancel a response whose status is '" + status + "'.", "response_id",
                 "invalid_request");
      return C->metrics.count_request(route, 400);
    }
    res.set_content(dump_json(e->response), "application/json");
    C->metrics.count_request(route, 200);
  });
  http.route("DELETE", one, [C, not_found](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    C->background.cancel(id);  // a background response still running stops first
    if (!C->responses.erase(id)) return not_found(req, res, id, "/v1/responses/{id}");
    res.set_content(dump_json(nlohmann::json{{"id", id}, {"object", "response"}, {"deleted", true}}), "application/json");
    C->metrics.count_request("/v1/responses/{id}", 200);
  });
}

}  // namespace lilac::server
