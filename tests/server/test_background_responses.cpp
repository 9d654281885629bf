// Background Responses (POST /v1/responses with background: true) while they run and when they end: the input items
// of a running one, a follow-up to one that has not ended, a final object too large for the response store; and a
// conversation whose new metadata would not fit that store.
// The scripted backend (server_test_util.h): "slow" -> " x" forever, 20 ms per token; "big" -> 400 " word"s at once.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "server_test_util.h"

using json = nlohmann::json;
using lilac::test::post_json;

namespace {

json get_json(int port, const std::string& path) {
  auto r = httplib::Client("127.0.0.1", port).Get(path);
  if (!r || r->status != 200) return json();
  return json::parse(r->body, nullptr, false);
}

// Polls the stored response until `done(it)` or ~10 s.
json poll(int port, const std::string& id, const std::function<bool(const json&)>& done) {
  json r;
  for (int i = 0; i < 500; ++i) {
    r = get_json(port, "/v1/responses/" + id);
    if (done(r)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return r;
}

json script() {
  std::string big;
  for (int i = 0; i < 400; ++i) big += " word";
  return {{"rules",
           {{{"match", "slow"}, {"reply", " x"}, {"repeat", true}, {"delay_ms", 20}}, {{"match", "big"}, {"reply", big}}}},
          {"default", {{"reply", "ok"}}}};
}

const json kOff = {{"effort", "none"}};

}  // namespace

// A running background response's input items are its input: they were counted as if its partial output were at
// their end and came out empty. A follow-up to it (previous_response_id) would continue without its answer: a 400.
TEST(BackgroundResponses, WhileRunningTheInputItemsAreTheInputAndNoFollowUpStarts) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script());
  const json bg = post_json(srv.port, "/v1/responses",
                            {{"input", "slow please"}, {"background", true}, {"max_output_tokens", 2000}, {"reasoning", kOff}});
  const std::string id = bg["id"];
  const json running = poll(srv.port, id, [](const json& r) {
    return r.value("status", "") == "in_progress" && r.contains("output") && !r["output"].empty();
  });
  ASSERT_EQ(running["status"], "in_progress") << running.dump();
  const json items = get_json(srv.port, "/v1/responses/" + id + "/input_items");
  ASSERT_EQ(items["data"].size(), 1u) << items.dump();
  EXPECT_EQ(items["data"][0]["role"], "user");
  const json e = post_json(srv.port, "/v1/responses", {{"input", "and then?"}, {"previous_response_id", id}}, 400);
  EXPECT_EQ(e["error"]["param"], "previous_response_id") << e.dump();
  post_json(srv.port, "/v1/responses/" + id + "/cancel", json::object());
  const json ended = poll(srv.port, id, [](const json& r) { return r.value("status", "") == "cancelled"; });
  EXPECT_EQ(ended["status"], "cancelled");
  EXPECT_EQ(post_json(srv.port, "/v1/responses", {{"input", "and then?"}, {"previous_response_id", id}})["status"],
            "completed");
}

// A final object larger than the store (--responses-mb) was not kept, and the "queued" / "in_progress" one stayed:
// a client polling for the end polled forever. It ends as failed, saying why.
TEST(BackgroundResponses, AFinalObjectTooLargeForTheStoreEndsFailed) {
  auto o = lilac::test::LocalServer::options();
  o.responses_bytes = 5000;
  lilac::test::LocalServer srv(o, nullptr, script());
  const json bg = post_json(srv.port, "/v1/responses",
                            {{"input", "big"}, {"background", true}, {"max_output_tokens", 1000}, {"reasoning", kOff}});
  ASSERT_EQ(bg["status"], "queued") << bg.dump();
  const std::string id = bg["id"];
  const json r = poll(srv.port, id, [](const json& r) {
    const std::string st = r.value("status", "");
    return !st.empty() && st != "queued" && st != "in_progress";
  });
  EXPECT_EQ(r["status"], "failed") << r.dump().substr(0, 400);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("--responses-mb"), std::string::npos) << r.dump().substr(0, 400);
}

// New metadata that would take a conversation past the store's budget (--responses-mb) is a 400 naming metadata: it
// was a 404 "no conversation", for a conversation that is there.
TEST(Conversations, MetadataThatDoesNotFitIsA400NotA404) {
  auto o = lilac::test::LocalServer::options();
  o.responses_bytes = 6000;
  lilac::test::LocalServer srv(o, nullptr, script());
  const json c = post_json(srv.port, "/v1/conversations",
                           {{"items", {{{"type", "message"}, {"role", "user"}, {"content", std::string(3000, 'a')}}}}});
  const std::string id = c["id"];
  json meta = json::object();
  for (int i = 0; i < 16; ++i) meta["key" + std::to_string(i)] = std::string(500, 'b');
  const json e = post_json(srv.port, "/v1/conversations/" + id, {{"metadata", meta}}, 400);
  EXPECT_EQ(e["error"]["param"], "metadata") << e.dump();
  EXPECT_EQ(get_json(srv.port, "/v1/conversations/" + id)["id"], id);  // unchanged, still there
  EXPECT_EQ(post_json(srv.port, "/v1/conversations/" + id, {{"metadata", {{"k", "v"}}}})["metadata"]["k"], "v");
}

// A client's item ids are kept: two items with one id were both kept (GET by id found the first, DELETE removed
// both), and an id the item routes cannot address ("a.b") could never be fetched or deleted. Both are 400s now.
TEST(Conversations, ItemIdsAreUniqueAndAddressable) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script());
  auto msg = [](const char* id, const char* text) {
    return json{{"id", id}, {"type", "message"}, {"role", "user"}, {"content", text}};
  };
  const std::string id = post_json(srv.port, "/v1/conversations", {{"items", {msg("x", "a")}}})["id"];
  const std::string items = "/v1/conversations/" + id + "/items";
  EXPECT_EQ(post_json(srv.port, items, {{"items", {msg("y", "b"), msg("y", "c")}}}, 400)["error"]["param"], "items[1].id");
  EXPECT_EQ(post_json(srv.port, items, {{"items", {msg("x", "b")}}}, 400)["error"]["param"], "items");
  EXPECT_EQ(post_json(srv.port, items, {{"items", {msg("a.b", "b")}}}, 400)["error"]["param"], "items[0].id");
  EXPECT_EQ(post_json(srv.port, "/v1/conversations", {{"items", {msg("z", "a"), msg("z", "b")}}}, 400)["error"]["param"],
            "items[1].id");
  EXPECT_EQ(post_json(srv.port, items, {{"items", {msg("y", "b")}}})["data"].size(), 1u);
  const json all = get_json(srv.port, items + "?order=asc");
  ASSERT_EQ(all["data"].size(), 2u) << all.dump();
  EXPECT_EQ(all["data"][0]["id"], "x");
  EXPECT_EQ(all["data"][1]["id"], "y");
  // A response continuing the conversation with an input item that reuses a held id: the item gets a new one.
  post_json(srv.port, "/v1/responses", {{"conversation", id}, {"input", {msg("x", "again")}}, {"reasoning", kOff}});
  const json after = get_json(srv.port, items + "?order=asc");
  ASSERT_EQ(after["data"].size(), 4u) << after.dump();  // x, y, the input again, the answer
  EXPECT_NE(after["data"][2]["id"], "x");
  std::set<std::string> ids;
  for (const auto& it : after["data"]) ids.insert(it["id"].get<std::string>());
  EXPECT_EQ(ids.size(), 4u);
}
