// Background Responses (POST /v1/responses with background: true) while they run and when they end: the input items
// of a running one, a follow-up to one that has not ended, a final object too large for the response store (or whose
// store threw), a streamed one's single terminal event (response.cancelled when it is cancelled; also when the response
// store throws, made to by ServerOptions::response_store_put_fault) and contiguous sequence numbers, its failed object's
// output and error as its client got them and GET shows them, a failure whose
// error is not UTF-8; a foreground stream whose store throws, a foreground response too large for that store; and a
// conversation whose new metadata would not fit that store.
// The scripted backend (server_test_util.h): "slow" -> " x" forever, 20 ms per token; "big" -> 400 " word"s at once;
// "breaks" -> JSON that breaks its grammar after a few tokens; "trailing" -> "the answer\n" (with tools, its newline
// comes with the generation's Done event); "astral" -> JSON broken by a character whose first
// token is a lone byte (its error message is not UTF-8).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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
  // "breaks": JSON whose end breaks a text.format json_object request's grammar: the generation fails midway.
  return {{"rules",
           {{{"match", "slow"}, {"reply", " x"}, {"repeat", true}, {"delay_ms", 20}},
            {{"match", "big"}, {"reply", big}},
            {{"match", "breaks"}, {"reply", "{\"answer\": \"one two three four\" oops}"}, {"delay_ms", 10}},
            // A trailing newline: with tools, the output parser holds it (a tool call's markup could follow) until
            // the end, whose Done event carries it as the answer's last delta.
            {{"match", "trailing"}, {"reply", "the answer\n"}},
            // U+10FFFD after ", ": its first token, the lone byte 0xF4, breaks the grammar (expected: a key).
            lilac::test::astral_rule()}},
          {"default", {{"reply", "ok"}}}};
}

const json kOff = {{"effort", "none"}};

bool terminal(const json& ev) {
  static const std::set<std::string> kTerminal = {"response.completed", "response.incomplete", "response.failed",
                                                  "response.cancelled"};
  return ev.contains("type") && kTerminal.count(ev["type"].get<std::string>()) != 0;
}

size_t terminals(const std::vector<json>& evs) {
  size_t n = 0;
  for (const json& e : evs) n += terminal(e) ? 1 : 0;
  return n;
}

// The stream of a background response to the scripted backend's slow answer, read to its end: its events (`raw`: the
// stream as sent).
std::vector<json> stream_slow_background(httplib::Client& cli, std::string& raw) {
  cli.set_read_timeout(10, 0);
  const json body = {{"input", "slow please"}, {"background", true}, {"stream", true}, {"max_output_tokens", 2000},
                     {"reasoning", kOff}};
  auto r = cli.Post("/v1/responses", body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << "no response";
    return {};
  }
  EXPECT_EQ(r->status, 200) << r->body;
  raw = r->body;
  return lilac::test::sse_events(raw);
}

// The server's options with the store's test seam throwing at the first `times` puts of an object of `status` ("test:
// storing <status> threw"); `puts` counts those puts.
auto store_throws(const std::string& status, std::atomic<int>& puts, int times) {
  auto o = lilac::test::LocalServer::options();
  o.response_store_put_fault = [status, &puts, times](const std::string&, const json& r) {
    if (r.value("status", "") == status && puts++ < times) throw std::runtime_error("test: storing " + status + " threw");
  };
  return o;
}
auto first_completed_store_throws(std::atomic<int>& puts) { return store_throws("completed", puts, 1); }

// A stream as its client got it (`body`, parsed as `evs`): numbered 0, 1, 2, ... without a gap, one terminal event
// and it last, of type `type`, whole.
void expect_numbered_to_one_end(const std::vector<json>& evs, const std::string& body, const std::string& type) {
  ASSERT_FALSE(evs.empty()) << body;
  for (size_t i = 0; i < evs.size(); ++i) EXPECT_EQ(evs[i]["sequence_number"], i) << body;
  EXPECT_EQ(terminals(evs), 1u) << body;
  EXPECT_EQ(evs.back()["type"], type) << body;
  EXPECT_EQ(body.substr(body.size() - 2), "\n\n") << body;  // the last event whole
}

// The stream of response `id` resumed after its event `after`: the events after it, numbered on, to the same one end.
void expect_resumed_to_the_same_end(httplib::Client& cli, const std::string& id, size_t after,
                                    const std::vector<json>& evs) {
  auto again = cli.Get("/v1/responses/" + id + "?stream=true&starting_after=" + std::to_string(after));
  ASSERT_TRUE(again);
  const std::vector<json> resumed = lilac::test::sse_events(again->body);
  ASSERT_EQ(resumed.size(), evs.size() - after - 1) << again->body;
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i]["sequence_number"], after + 1 + i) << again->body;
  EXPECT_EQ(terminals(resumed), 1u) << again->body;
  EXPECT_EQ(resumed.back(), evs.back()) << again->body;
}

// A background stream `evs` that ended with response.failed, as its stored object keeps it: GET says "failed" with the
// stream's error, and the stream resumed after event 0 ends the same. Returns the stored object.
json expect_stored_as_its_failed_end(int port, httplib::Client& cli, const std::vector<json>& evs) {
  const std::string id = evs.front()["response"]["id"];
  const json got = get_json(port, "/v1/responses/" + id);
  EXPECT_EQ(got["status"], "failed") << got.dump();
  EXPECT_EQ(got["error"], evs.back()["response"]["error"]) << got.dump();
  expect_resumed_to_the_same_end(cli, id, 0, evs);
  return got;
}

// The text of a response object's message items (their output_text parts, in order).
std::string output_text(const json& response) {
  std::string t;
  for (const json& item : response["output"])
    if (item.value("type", "") == "message")
      for (const json& part : item["content"]) t += part.value("text", "");
  return t;
}

// The text a stream's client got: its response.output_text.delta events' deltas, in order.
std::string streamed_text(const std::vector<json>& evs) {
  std::string t;
  for (const json& e : evs)
    if (e.value("type", "") == "response.output_text.delta") t += e.value("delta", "");
  return t;
}

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

// A background response whose every store of its end threw (the completed object, then the failure's) ended with the
// run's end's fallback, which always said the response was too large for the store (--responses-mb): a store that
// threw is not that. The stored error says what happened now: it could not be stored, and why. (Too large: the test
// above.)
TEST(BackgroundResponses, AFinalObjectThatCouldNotBeStoredEndsFailedSayingWhy) {
  std::atomic<int> failed_puts{0};
  auto o = lilac::test::LocalServer::options();
  o.response_store_put_fault = [&](const std::string&, const json& r) {
    const std::string status = r.value("status", "");
    if (status == "completed") throw std::runtime_error("test: storing completed threw");
    if (status == "failed" && failed_puts++ == 0) throw std::runtime_error("test: storing failed threw");
  };
  lilac::test::LocalServer srv(o, nullptr, script());
  const json bg = post_json(srv.port, "/v1/responses", {{"input", "hello"}, {"background", true}, {"reasoning", kOff}});
  ASSERT_EQ(bg["status"], "queued") << bg.dump();
  const json r = poll(srv.port, bg["id"].get<std::string>(), [](const json& r) {
    const std::string st = r.value("status", "");
    return !st.empty() && st != "queued" && st != "in_progress";
  });
  EXPECT_EQ(failed_puts.load(), 2);  // fail()'s store (threw), the run's end's
  EXPECT_EQ(r["status"], "failed") << r.dump();
  EXPECT_EQ(r["error"]["code"], "server_error") << r.dump();
  const std::string message = r["error"].value("message", "");
  EXPECT_EQ(message.find("--responses-mb"), std::string::npos) << message;
  EXPECT_NE(message.find("could not be stored: test: storing failed threw"), std::string::npos) << message;
  EXPECT_NE(message.find("test: storing completed threw"), std::string::npos) << message;  // why it had failed
}

// A streamed background response whose generation failed ended its stream with an `error` event and no terminal
// event (a client waits for response.completed / .incomplete / .failed). It ends with response.failed now, carrying
// the failed response and its error, as GET shows it; a resumed stream and a foreground stream end the same way.
TEST(BackgroundResponses, AStreamedOneThatFailsEndsWithResponseFailed) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script());
  httplib::Client cli("127.0.0.1", srv.port);
  cli.set_read_timeout(10, 0);
  json body = {{"input", "breaks"}, {"background", true}, {"stream", true}, {"max_output_tokens", 200},
               {"reasoning", kOff}, {"text", {{"format", {{"type", "json_object"}}}}}};
  auto r = cli.Post("/v1/responses", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::vector<json> evs = lilac::test::sse_events(r->body);
  ASSERT_GE(evs.size(), 4u) << r->body;
  EXPECT_EQ(evs.front()["type"], "response.created");
  const std::string id = evs.front()["response"]["id"];
  bool text = false;  // it failed during generation, after some of its output
  for (size_t i = 0; i < evs.size(); ++i) {
    EXPECT_EQ(evs[i]["sequence_number"], i) << r->body;
    text |= evs[i]["type"] == "response.output_text.delta";
  }
  EXPECT_TRUE(text) << r->body;
  EXPECT_EQ(evs[evs.size() - 2]["type"], "error") << r->body;
  const json& last = evs.back();
  EXPECT_EQ(last["type"], "response.failed") << r->body;
  EXPECT_EQ(last["response"]["id"], id);
  EXPECT_EQ(last["response"]["status"], "failed");
  EXPECT_EQ(last["response"]["error"]["code"], "server_error");
  EXPECT_NE(last["response"]["error"].value("message", "").find("not allowed by the token mask"), std::string::npos)
      << last.dump();
  EXPECT_EQ(r->body.substr(r->body.size() - 2), "\n\n");  // the last event whole
  const json got = get_json(srv.port, "/v1/responses/" + id);
  EXPECT_EQ(got["status"], "failed") << got.dump();
  EXPECT_EQ(got["error"], last["response"]["error"]);
  // Resumed after event 0: the same events, to the same end.
  auto again = cli.Get("/v1/responses/" + id + "?stream=true&starting_after=0");
  ASSERT_TRUE(again);
  const std::vector<json> resumed = lilac::test::sse_events(again->body);
  ASSERT_EQ(resumed.size(), evs.size() - 1) << again->body;
  EXPECT_EQ(resumed.back(), last);
  // A foreground stream that fails ends the same way.
  body.erase("background");
  r = cli.Post("/v1/responses", body.dump(), "application/json");
  ASSERT_TRUE(r);
  const std::vector<json> fg = lilac::test::sse_events(r->body);
  ASSERT_GE(fg.size(), 2u) << r->body;
  EXPECT_EQ(fg[fg.size() - 2]["type"], "error") << r->body;
  EXPECT_EQ(fg.back()["type"], "response.failed") << r->body;
  EXPECT_EQ(fg.back()["response"]["status"], "failed");
  EXPECT_EQ(fg.back()["response"]["error"]["code"], "server_error");
}

// A streamed background response whose failure could not be stored after its response.failed was published (the
// error message holds a lone byte 0xF4, which the store's strict JSON dump rejected) got a second terminal event: the
// thread's catch published another response.failed. Exactly one terminal event ends the stream now, live and resumed.
// That store no longer throws on such bytes (dump_json replaces them), so the test seam makes it throw: the store of
// the run's "failed" object throws once, which reaches the thread's catch (fail()) after the stream ended. The catch
// stores "failed" again, with the error the stream ended with (it stored the store's exception instead, so GET and the
// stream disagreed: AFailedStreamAndGetShowOneErrorWhenStoringTheFailureThrows), and publishes nothing more.
TEST(BackgroundResponses, AStreamHasOneTerminalEventWhenStoringItsEndThrows) {
  std::atomic<int> failed_puts{0};
  lilac::test::LocalServer srv(store_throws("failed", failed_puts, 1), nullptr, script());
  httplib::Client cli("127.0.0.1", srv.port);
  cli.set_read_timeout(10, 0);
  const json body = {{"input", "astral"}, {"background", true}, {"stream", true}, {"max_output_tokens", 200},
                     {"reasoning", kOff}, {"text", {{"format", {{"type", "json_object"}}}}}};
  auto r = cli.Post("/v1/responses", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::vector<json> evs = lilac::test::sse_events(r->body);
  ASSERT_GE(evs.size(), 4u) << r->body;
  const std::string id = evs.front()["response"]["id"];
  expect_numbered_to_one_end(evs, r->body, "response.failed");
  EXPECT_EQ(evs[evs.size() - 2]["type"], "error") << r->body;
  EXPECT_EQ(evs.back()["response"]["status"], "failed");
  EXPECT_EQ(evs.back()["response"]["error"]["code"], "server_error");
  const std::string message = evs.back()["response"]["error"].value("message", "");
  EXPECT_NE(message.find("('\xEF\xBF\xBD') is not allowed by the token mask"), std::string::npos) << message;
  expect_stored_as_its_failed_end(srv.port, cli, evs);
  EXPECT_EQ(failed_puts.load(), 2);  // the run's store (threw), the catch's (the catch was reached)
}

// The thread's catch (fail()) stored the failure and published the stream's response.failed in one try: when storing
// the failure threw too, response.failed was skipped and the stream ended with no terminal event. The test seam makes
// every store of "in_progress" throw (the run's first one reaches the catch) and the catch's store of "failed" throw:
// the stream still ends with one response.failed, carrying the run's error, live and resumed, and the run's end
// (finish()) stores "failed".
TEST(BackgroundResponses, AStreamEndsWithResponseFailedWhenStoringItsFailureThrows) {
  std::atomic<int> in_progress_puts{0}, failed_puts{0};
  auto o = lilac::test::LocalServer::options();
  o.response_store_put_fault = [&](const std::string&, const json& r) {
    const std::string status = r.value("status", "");
    if (status == "in_progress") {
      ++in_progress_puts;
      throw std::runtime_error("test: storing in_progress threw");
    }
    if (status == "failed" && failed_puts++ == 0) throw std::runtime_error("test: storing failed threw");
  };
  lilac::test::LocalServer srv(o, nullptr, script());
  httplib::Client cli("127.0.0.1", srv.port);
  std::string raw;
  const std::vector<json> evs = stream_slow_background(cli, raw);
  ASSERT_GE(evs.size(), 2u) << raw;
  EXPECT_EQ(in_progress_puts.load(), 1);
  EXPECT_EQ(failed_puts.load(), 2);  // the catch's store (threw), finish()'s
  const std::string id = evs.front()["response"]["id"];
  expect_numbered_to_one_end(evs, raw, "response.failed");
  EXPECT_EQ(evs.back()["response"]["status"], "failed");
  EXPECT_EQ(evs.back()["response"]["error"]["message"], "test: storing in_progress threw");
  EXPECT_EQ(get_json(srv.port, "/v1/responses/" + id)["status"], "failed");
  expect_resumed_to_the_same_end(cli, id, 0, evs);
}

// A store that throws on every put after the "queued" one: the run's end (finish()) stored without a guard, so its
// throw left the response's thread (std::terminate: the whole server ended). The stream ends with its one
// response.failed, and the server goes on serving. The stored object, which no store could end, is dropped: it said
// "queued" forever (a poller never ended).
TEST(BackgroundResponses, AStreamEndsAndTheServerLivesWhenTheStoreAlwaysThrows) {
  auto o = lilac::test::LocalServer::options();
  std::atomic<bool> broken{true};
  o.response_store_put_fault = [&](const std::string&, const json& r) {
    if (broken && r.value("status", "") != "queued") throw std::runtime_error("test: the store threw");
  };
  lilac::test::LocalServer srv(o, nullptr, script());
  httplib::Client cli("127.0.0.1", srv.port);
  std::string raw;
  const std::vector<json> evs = stream_slow_background(cli, raw);
  ASSERT_GE(evs.size(), 2u) << raw;
  expect_numbered_to_one_end(evs, raw, "response.failed");
  const std::string id = evs.front()["response"]["id"];
  const json last = poll(srv.port, id, [](const json& r) { return r.is_null(); });  // 404
  EXPECT_TRUE(last.is_null()) << last.dump();
  broken = false;
  EXPECT_EQ(post_json(srv.port, "/v1/responses", {{"input", "hello"}, {"reasoning", kOff}})["status"], "completed");
}

// The formatter numbered a completed stream's last events (the open item's .done events) before its on_done stored
// the completed object; when that store threw, those events were never sent but their sequence numbers were spent,
// and the response.failed that ended the stream came after a gap. The test seam makes the store of "completed" throw
// once: the events the client gets are numbered 0, 1, 2, ... to the response.failed.
TEST(BackgroundResponses, AStreamHasNoSequenceGapWhenStoringItsCompletionThrows) {
  std::atomic<int> completed_puts{0};
  lilac::test::LocalServer srv(first_completed_store_throws(completed_puts), nullptr, script());
  httplib::Client cli("127.0.0.1", srv.port);
  cli.set_read_timeout(10, 0);
  const json body = {{"input", "hello"}, {"background", true}, {"stream", true}, {"reasoning", kOff}};
  auto r = cli.Post("/v1/responses", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::vector<json> evs = lilac::test::sse_events(r->body);
  ASSERT_GE(evs.size(), 3u) << r->body;
  EXPECT_EQ(completed_puts.load(), 1);
  bool text = false;  // the answer's text was streamed before its end
  for (size_t i = 0; i < evs.size(); ++i) {
    EXPECT_EQ(evs[i]["sequence_number"], i) << r->body;
    text |= evs[i]["type"] == "response.output_text.delta";
  }
  EXPECT_TRUE(text) << r->body;
  expect_numbered_to_one_end(evs, r->body, "response.failed");
  EXPECT_EQ(evs.back()["response"]["error"]["message"], "test: storing completed threw");
  expect_stored_as_its_failed_end(srv.port, cli, evs);
}

// A foreground stream (stream: true, not background) stores its completed object in the formatter's on_done, inside the
// HTTP worker's send loop, where nothing caught a throw: a store that threw ended the whole server (std::terminate;
// the test binary aborted, rc 134). The test seam makes the store of "completed" throw once: the stream ends as a
// failed one does, its `error` event then one response.failed carrying the store's error, numbered without a gap, and
// the server goes on serving (nothing was stored: GET finds no such response).
TEST(BackgroundResponses, AForegroundStreamEndsWithResponseFailedWhenStoringItsCompletionThrows) {
  std::atomic<int> completed_puts{0};
  lilac::test::LocalServer srv(first_completed_store_throws(completed_puts), nullptr, script());
  httplib::Client cli("127.0.0.1", srv.port);
  cli.set_read_timeout(10, 0);
  const json body = {{"input", "hello"}, {"stream", true}, {"reasoning", kOff}};
  auto r = cli.Post("/v1/responses", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::vector<json> evs = lilac::test::sse_events(r->body);
  ASSERT_GE(evs.size(), 4u) << r->body;
  EXPECT_EQ(completed_puts.load(), 1);
  expect_numbered_to_one_end(evs, r->body, "response.failed");
  bool text = false;  // the answer's text was streamed before its end
  for (const json& e : evs) text |= e["type"] == "response.output_text.delta";
  EXPECT_TRUE(text) << r->body;
  EXPECT_EQ(evs[evs.size() - 2]["type"], "error") << r->body;
  EXPECT_EQ(evs[evs.size() - 2]["message"], "test: storing completed threw") << r->body;
  const json& last = evs.back();
  EXPECT_EQ(last["response"]["status"], "failed");
  EXPECT_EQ(last["response"]["error"]["code"], "server_error");
  EXPECT_EQ(last["response"]["error"]["message"], "test: storing completed threw");
  const std::string id = evs.front()["response"]["id"];
  EXPECT_EQ(httplib::Client("127.0.0.1", srv.port).Get("/v1/responses/" + id)->status, 404);
  // The server lives: the next stream completes (and is stored).
  r = cli.Post("/v1/responses", body.dump(), "application/json");
  ASSERT_TRUE(r);
  const std::vector<json> next = lilac::test::sse_events(r->body);
  expect_numbered_to_one_end(next, r->body, "response.completed");
  EXPECT_EQ(get_json(srv.port, "/v1/responses/" + next.front()["response"]["id"].get<std::string>())["status"],
            "completed");
}

// A response continuing a conversation whose store of the completed object throws: the stream fails and nothing is
// stored, and the conversation stays as it was. It got the response's input and output first (on_done added them
// before storing), so it held an answer whose response had failed and could not be fetched.
TEST(BackgroundResponses, AConversationIsUnchangedWhenItsResponsesStoreThrows) {
  std::atomic<int> completed_puts{0};
  lilac::test::LocalServer srv(first_completed_store_throws(completed_puts), nullptr, script());
  const json first = {{"type", "message"}, {"role", "user"}, {"content", "a"}};
  const std::string conv = post_json(srv.port, "/v1/conversations", {{"items", {first}}})["id"];
  const std::string items = "/v1/conversations/" + conv + "/items";
  httplib::Client cli("127.0.0.1", srv.port);
  cli.set_read_timeout(10, 0);
  const json body = {{"input", "hello"}, {"conversation", conv}, {"stream", true}, {"reasoning", kOff}};
  auto r = cli.Post("/v1/responses", body.dump(), "application/json");
  ASSERT_TRUE(r);
  const std::vector<json> evs = lilac::test::sse_events(r->body);
  expect_numbered_to_one_end(evs, r->body, "response.failed");
  EXPECT_EQ(completed_puts.load(), 1);
  const json kept = get_json(srv.port, items);
  EXPECT_EQ(kept["data"].size(), 1u) << kept.dump();  // the first item only
  // The next response continues it as usual: its input and its answer are added.
  r = cli.Post("/v1/responses", body.dump(), "application/json");
  ASSERT_TRUE(r);
  expect_numbered_to_one_end(lilac::test::sse_events(r->body), r->body, "response.completed");
  EXPECT_EQ(get_json(srv.port, items)["data"].size(), 3u);
}

// A background response (not streamed) whose generation failed with an error quoting the lone byte 0xF4: storing
// "failed" with that error threw inside the response's thread (the store's strict JSON dump), and the thread's catch
// stored the exception's text instead ("[json.exception.type_error.316] invalid UTF-8 byte ..."). GET shows the
// generation's own error now, the byte as U+FFFD.
TEST(BackgroundResponses, OneThatFailsWithBytesThatAreNotUtf8KeepsItsOwnError) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script());
  const json bg = post_json(srv.port, "/v1/responses",
                            {{"input", "astral"}, {"background", true}, {"max_output_tokens", 200}, {"reasoning", kOff},
                             {"text", {{"format", {{"type", "json_object"}}}}}});
  ASSERT_EQ(bg["status"], "queued") << bg.dump();
  const json r = poll(srv.port, bg["id"].get<std::string>(), [](const json& r) {
    const std::string st = r.value("status", "");
    return !st.empty() && st != "queued" && st != "in_progress";
  });
  EXPECT_EQ(r["status"], "failed") << r.dump();
  EXPECT_EQ(r["error"]["code"], "server_error") << r.dump();
  const std::string message = r["error"].value("message", "");
  EXPECT_NE(message.find("scripted backend: the script's token"), std::string::npos) << message;
  EXPECT_NE(message.find("('\xEF\xBF\xBD') is not allowed by the token mask"), std::string::npos) << message;
  EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
}

// A streamed background response cancelled while it streams (POST /v1/responses/{id}/cancel) ended its stream with no
// terminal event: a client waiting for one never learned how it ended. It ends with response.cancelled now, carrying
// the response as the cancel answered it and GET shows it (status "cancelled", what was generated), live and resumed.
TEST(BackgroundResponses, ACancelledStreamEndsWithResponseCancelled) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options(), nullptr, script());
  const json body = {{"input", "slow please"}, {"background", true}, {"stream", true}, {"max_output_tokens", 2000},
                     {"reasoning", kOff}};
  httplib::Client cli("127.0.0.1", srv.port);
  cli.set_read_timeout(10, 0);
  std::string live, id;
  json cancelled;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/responses";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    live.append(data, n);
    if (id.empty() && live.find("response.output_text.delta") != std::string::npos) {  // cancelled while it streams
      const size_t at = live.find("\"id\":\"resp_") + 6;
      id = live.substr(at, live.find('"', at) - at);
      cancelled = post_json(srv.port, "/v1/responses/" + id + "/cancel", json::object());
    }
    return true;
  };
  auto r = cli.send(req);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << live;
  ASSERT_EQ(cancelled["status"], "cancelled") << cancelled.dump();
  const std::vector<json> evs = lilac::test::sse_events(live);
  ASSERT_GE(evs.size(), 4u) << live;
  EXPECT_EQ(evs.front()["response"]["id"], id);
  expect_numbered_to_one_end(evs, live, "response.cancelled");
  EXPECT_EQ(evs.back()["response"]["status"], "cancelled");
  EXPECT_EQ(evs.back()["response"], cancelled);
  EXPECT_EQ(get_json(srv.port, "/v1/responses/" + id), cancelled);
  expect_resumed_to_the_same_end(cli, id, 2, evs);  // after event 2: the same events, to the same end
}

// A foreground response (not background) with store: true whose completed object the response store refused as larger
// than it holds (--responses-mb) answered "completed" with "store": true, and GET /v1/responses/{id} then found no
// such response: the client was told nothing. The answer it gets now says "store": false (it was not stored), with
// the whole answer in it, not streamed and streamed (the stream's response.completed); GET still finds nothing. A
// response that fits is stored and says "store": true, as before.
TEST(BackgroundResponses, AForegroundResponseTooLargeForTheStoreSaysItWasNotStored) {
  auto o = lilac::test::LocalServer::options();
  o.responses_bytes = 5000;
  lilac::test::LocalServer srv(o, nullptr, script());
  std::string big;
  for (int i = 0; i < 400; ++i) big += " word";
  const json body = {{"input", "big"}, {"max_output_tokens", 1000}, {"reasoning", kOff}};
  const json r = post_json(srv.port, "/v1/responses", body);
  EXPECT_EQ(r["status"], "completed") << r.dump().substr(0, 400);
  EXPECT_EQ(r["store"], false) << r.dump().substr(0, 400);
  EXPECT_EQ(output_text(r), big);  // the answer is all there
  EXPECT_EQ(httplib::Client("127.0.0.1", srv.port).Get("/v1/responses/" + r["id"].get<std::string>())->status, 404);
  // Streamed: the stream's response.completed says so too.
  httplib::Client cli("127.0.0.1", srv.port);
  cli.set_read_timeout(10, 0);
  json streamed = body;
  streamed["stream"] = true;
  auto s = cli.Post("/v1/responses", streamed.dump(), "application/json");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200) << s->body.substr(0, 400);
  const std::vector<json> evs = lilac::test::sse_events(s->body);
  expect_numbered_to_one_end(evs, s->body, "response.completed");
  EXPECT_EQ(evs.front()["response"]["store"], true);  // response.created: it was to be stored
  const json& done = evs.back()["response"];
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["store"], false);
  EXPECT_EQ(output_text(done), big);
  EXPECT_EQ(streamed_text(evs), big);
  EXPECT_EQ(cli.Get("/v1/responses/" + done["id"].get<std::string>())->status, 404);
  // One that fits is stored, and says so.
  const json small = post_json(srv.port, "/v1/responses", {{"input", "hello"}, {"reasoning", kOff}});
  EXPECT_EQ(small["store"], true) << small.dump();
  EXPECT_EQ(get_json(srv.port, "/v1/responses/" + small["id"].get<std::string>()), small);
}

// When the store of a completed stream's object threw (in the formatter's on_done), the response.failed that ended the
// stream carried output with the generation's last text (the Done event's deltas, here the answer's trailing newline,
// which the output parser holds until the end), which the client never got: the events that sent it were made but
// dropped with the throw. The stream sends them first now: the client gets the whole answer, its item closed (the
// .done events), then the failure, and the failed object's output is what it got. Foreground and background.
TEST(BackgroundResponses, AFailedStreamsOutputIsWhatItsClientGotWhenStoringItsCompletionThrows) {
  for (const bool background : {false, true}) {
    SCOPED_TRACE(background ? "background" : "foreground");
    std::atomic<int> completed_puts{0};
    lilac::test::LocalServer srv(first_completed_store_throws(completed_puts), nullptr, script());
    httplib::Client cli("127.0.0.1", srv.port);
    cli.set_read_timeout(10, 0);
    // A tool: markup (<tool_call>) could follow the newline, so the parser holds it.
    const json tool = {{"type", "function"}, {"name", "lookup"}, {"parameters", {{"type", "object"}}}};
    json body = {{"input", "trailing"}, {"stream", true}, {"reasoning", kOff}, {"tools", {tool}}};
    if (background) body["background"] = true;
    auto r = cli.Post("/v1/responses", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::vector<json> evs = lilac::test::sse_events(r->body);
    EXPECT_EQ(completed_puts.load(), 1);
    expect_numbered_to_one_end(evs, r->body, "response.failed");
    EXPECT_EQ(evs.back()["response"]["error"]["message"], "test: storing completed threw");
    EXPECT_EQ(streamed_text(evs), "the answer\n") << r->body;
    EXPECT_EQ(output_text(evs.back()["response"]), streamed_text(evs)) << r->body;
    // Every item the stream opened it closed, before its end.
    std::vector<std::string> added, done;
    for (const json& e : evs) {
      if (e["type"] == "response.output_item.added") added.push_back(e["item"]["id"]);
      if (e["type"] == "response.output_item.done") done.push_back(e["item"]["id"]);
    }
    EXPECT_FALSE(added.empty()) << r->body;
    EXPECT_EQ(added, done) << r->body;
    if (background) {
      const json got = expect_stored_as_its_failed_end(srv.port, cli, evs);
      EXPECT_EQ(got["output"], evs.back()["response"]["output"]) << got.dump();
    }
  }
}

// A streamed background response that failed (its generation broke its grammar: `error`, then response.failed with
// that error), whose stores of "failed" threw: the run's store of the failure threw, and the thread's catch (fail())
// stored its own error instead, the store's exception, so GET said something else than the stream for the same
// failure; when the catch's store threw too, the run's end (finish()) stored "could not be stored: ..." (it had
// failed: ...)", again not the stream's error. GET shows the error the stream ended with now, both ways.
TEST(BackgroundResponses, AFailedStreamAndGetShowOneErrorWhenStoringTheFailureThrows) {
  for (const int throws : {1, 2}) {
    SCOPED_TRACE(std::to_string(throws) + " stores of \"failed\" throw");
    std::atomic<int> failed_puts{0};
    lilac::test::LocalServer srv(store_throws("failed", failed_puts, throws), nullptr, script());
    httplib::Client cli("127.0.0.1", srv.port);
    cli.set_read_timeout(10, 0);
    const json body = {{"input", "breaks"}, {"background", true}, {"stream", true}, {"max_output_tokens", 200},
                       {"reasoning", kOff}, {"text", {{"format", {{"type", "json_object"}}}}}};
    auto r = cli.Post("/v1/responses", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::vector<json> evs = lilac::test::sse_events(r->body);
    expect_numbered_to_one_end(evs, r->body, "response.failed");
    const json& error = evs.back()["response"]["error"];
    EXPECT_NE(error.value("message", "").find("not allowed by the token mask"), std::string::npos) << error.dump();
    const std::string id = evs.front()["response"]["id"];
    const json got = poll(srv.port, id, [](const json& r) { return r.value("status", "") == "failed"; });
    EXPECT_EQ(got["status"], "failed") << got.dump();
    EXPECT_EQ(got["error"], error) << got.dump();
    EXPECT_EQ(failed_puts.load(), throws + 1);  // the last store of "failed" kept it
  }
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
