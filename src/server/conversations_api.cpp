#include "server/conversations_api.h"

#include <httplib.h>

#include <algorithm>
#include <ctime>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/http_response.h"
#include "server/http_server.h"
#include "server/json_route.h"
#include "server/request_fields.h"
#include "server/parse_budget.h"
#include "server/request_json.h"
#include "server/responses_schema.h"
#include "server/server_context.h"

namespace lilac::server {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace fields;

namespace {

constexpr size_t kMaxItemsPerCall = 20;

ojson conversation_object(const ConversationStore::Conversation& c) {
  return ojson{{"id", c.id}, {"object", "conversation"}, {"created_at", c.created_at}, {"metadata", c.metadata}};
}

ojson checked_items(ServerContext& C, const ojson& body, bool required) {
  const ojson* it = field(body, "items");
  if (!it || it->is_null()) {
    if (required) missing("items");
    return ojson::array();
  }
  if (!it->is_array()) wrong_type("items", "an array of items", *it);
  if (it->size() > kMaxItemsPerCall) bad("items", "Invalid 'items': at most 20 items at a time.", "array_above_max_length");
  return conversation_items(*it, "items", [&C](const char* prefix) { return C.new_id(prefix); });
}

ojson list_page(const ojson& data, bool has_more) {
  ojson l{{"object", "list"}, {"data", data}, {"has_more", has_more}};
  l["first_id"] = data.empty() ? ojson(nullptr) : data.front()["id"];
  l["last_id"] = data.empty() ? ojson(nullptr) : data.back()["id"];
  return l;
}

ApiError not_found(const std::string& what, const std::string& id) {
  return ApiError(404, "No " + what + " with id '" + quoted_id(id) + "' is held here.", what == "item" ? "item_id" : "conversation_id",
                  "not_found");
}

// Answers with the JSON `answer` returns or the ApiError it throws (OpenAI's shape), counted under `route`.
template <typename F>
void answer(ServerContext& C, const char* route, httplib::Response& res, F f) {
  answer_json(C.metrics, route, res, [](httplib::Response& r, const ApiError& e) { send_error(r, e); },
              [&] { return dump_json(f()); });
}

ConversationStore::Conversation held(ServerContext& C, const std::string& id) {
  std::optional<ConversationStore::Conversation> c = C.conversations.get(id);
  if (!c) throw not_found("conversation", id);
  return std::move(*c);
}

ojson items_page(const ConversationStore::Conversation& c, const httplib::Request& req) {
  const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
  if (order != "asc" && order != "desc") bad("order", "Invalid value for 'order': '" + order.substr(0, 16) + "' (asc or desc).");
  const int64_t limit = query_int(req, "limit", 1, 100).value_or(20);
  ojson all = c.items;
  if (order == "desc") std::reverse(all.begin(), all.end());
  size_t i = 0;
  if (req.has_param("after")) {
    const std::string after = req.get_param_value("after");
    while (i < all.size() && all[i]["id"] != after) ++i;
    if (i == all.size()) throw ApiError(404, "No item with id '" + quoted_id(after) + "' in this conversation.", "after", "not_found");
    ++i;
  }
  ojson data = ojson::array();
  for (; i < all.size() && int64_t(data.size()) < limit; ++i) data.push_back(all[i]);
  return list_page(data, i < all.size());
}

}  // namespace

void add_conversations_routes(HttpServer& http, ServerContext& ctx) {
  ServerContext* C = &ctx;
  const std::string one = "/v1/conversations/([A-Za-z0-9_-]{1,128})";
  const std::string item = one + "/items/([A-Za-z0-9_-]{1,128})";
  http.Post("/v1/conversations", [C](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/conversations", res, [&] {
      const ParseBudget::Lease lease = C->parse.acquire(req.body.size());
      const ojson body = parse_request_body(req.body.empty() ? std::string_view("{}") : std::string_view(req.body));
      if (!body.is_object()) wrong_type("body", "a JSON object", body);
      ConversationStore::Conversation c;
      c.metadata = checked_metadata(body);
      c.items = checked_items(*C, body, false);
      c.id = C->new_id("conv_");
      c.created_at = int64_t(std::time(nullptr));
      if (!C->conversations.put(c)) bad("items", "The conversation is larger than this server keeps (--responses-mb).");
      return conversation_object(c);
    });
  });
  http.Get(one, [C](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/conversations/{id}", res, [&] { return conversation_object(held(*C, req.matches[1])); });
  });
  http.Post(one, [C](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/conversations/{id}", res, [&] {
      const std::string id = req.matches[1];
      const ParseBudget::Lease lease = C->parse.acquire(req.body.size());
      const ojson body = parse_request_body(req.body);
      if (!body.is_object()) wrong_type("body", "a JSON object", body);
      if (!field(body, "metadata")) missing("metadata");
      const ojson m = checked_metadata(body);
      ojson updated;
      if (!C->conversations.update(id, [&](ConversationStore::Conversation& c) {
            c.metadata = m;
            updated = conversation_object(c);
          })) {
        if (!C->conversations.contains(id)) throw not_found("conversation", id);
        // held, but the result alone would not fit the store (a 404 said it did not exist)
        throw ApiError(400, "The metadata does not fit the conversation's memory (--responses-mb).", "metadata");
      }
      return updated;
    });
  });
  http.route("DELETE", one, [C](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/conversations/{id}", res, [&] {
      const std::string id = req.matches[1];
      if (!C->conversations.erase(id)) throw not_found("conversation", id);
      return ojson{{"id", id}, {"object", "conversation.deleted"}, {"deleted", true}};
    });
  });
  http.Get(one + "/items", [C](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/conversations/{id}/items", res, [&] { return items_page(held(*C, req.matches[1]), req); });
  });
  http.Post(one + "/items", [C](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/conversations/{id}/items", res, [&] {
      const std::string id = req.matches[1];
      if (!C->conversations.contains(id)) throw not_found("conversation", id);  // before the body's errors
      const ParseBudget::Lease lease = C->parse.acquire(req.body.size());
      const ojson body = parse_request_body(req.body);
      if (!body.is_object()) wrong_type("body", "a JSON object", body);
      const ojson added = checked_items(*C, body, true);
      std::string taken;  // an added id the conversation holds already (GET / DELETE by id would find two)
      if (!C->conversations.update(id, [&](ConversationStore::Conversation& c) {
            for (const auto& it : added)
              if (c.holds(it["id"])) taken = it["id"].get<std::string>();
            if (taken.empty())
              for (const auto& it : added) c.items.push_back(it);
          }))
        throw ApiError(C->conversations.contains(id) ? 400 : 404,
                       "The items do not fit the conversation's memory (--responses-mb).", "items");
      if (!taken.empty())
        throw ApiError(400, "The conversation already holds an item with id '" + quoted_id(taken) + "'.", "items");
      return list_page(added, false);
    });
  });
  http.Get(item, [C](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/conversations/{id}/items/{item_id}", res, [&] {
      const ConversationStore::Conversation c = held(*C, req.matches[1]);
      for (const auto& it : c.items)
        if (it["id"] == req.matches[2].str()) return it;
      throw not_found("item", req.matches[2]);
    });
  });
  http.route("DELETE", item, [C](const httplib::Request& req, httplib::Response& res) {
    answer(*C, "/v1/conversations/{id}/items/{item_id}", res, [&] {
      const std::string id = req.matches[1], item_id = req.matches[2];
      bool found = false;
      ojson updated;
      if (!C->conversations.update(id, [&](ConversationStore::Conversation& c) {
            ojson kept = ojson::array();
            for (auto& it : c.items) {
              if (it["id"] == item_id) {
                found = true;
                continue;
              }
              kept.push_back(std::move(it));
            }
            c.items = std::move(kept);
            updated = conversation_object(c);
          }))
        throw not_found("conversation", id);
      if (!found) throw not_found("item", item_id);
      return updated;
    });
  });
}

}  // namespace lilac::server
