// The Responses routes for a response the router passed on from the upstream (fixtures: fake_upstream.h): GET,
// input_items, cancel and DELETE of such an id are forwarded there; the id is remembered from a whole answer or from a
// stream's response.created, in either SSE data form; an id lilac never handed out stays lilac's 404.
#include <gtest/gtest.h>
#include <httplib.h>

#include <mutex>
#include <string>

#include "router/fake_upstream.h"

using namespace lilac::router;
using namespace lilac::router::testing;

namespace {

// A background Responses stream routed to the fake upstream, then a GET of the id its first event named, through lilac:
// that id, the GET's answer, and how many GETs reached the upstream.
struct StreamedThenFetched {
  std::string id;
  int status = 0;
  std::string body;
  int upstream_gets = 0;
};
StreamedThenFetched stream_then_fetch(FakeUpstream& up) {
  RoutedServer rs(up.port, R"({"default_route": "cloud"})");
  StreamedThenFetched out;
  out.id = first_streamed_response_id(rs.cli, json{{"input", "hello"}, {"background", true}, {"stream", true}});
  if (auto r = rs.cli.Get("/v1/responses/" + out.id)) {
    out.status = r->status;
    out.body = r->body;
  }
  std::lock_guard lk(up.mu);
  out.upstream_gets = up.response_gets;
  return out;
}

}  // namespace

// A background Responses request the router sends to the cloud is held upstream, under the upstream's id: the client
// cancels it and polls it through lilac as one lilac served (cancel: "cancelled"; GET: the object), whether it was
// answered whole or streamed and the client left the stream. lilac answered 404 ("not stored here") to both, for a
// response it had accepted and answered with that id. An id lilac never handed out is still 404, never asked upstream.
TEST(HybridUpstream, ARoutedBackgroundResponseIsCancelledAndFetchedThroughLilac) {
  FakeUpstream up;
  RoutedServer rs(up.port, R"({"default_route": "cloud"})");
  httplib::Client& cli = rs.cli;
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    const json body = {{"input", "hello"}, {"background", true}, {"stream", stream}};
    std::string id;
    if (!stream) {
      auto r = cli.Post("/v1/responses", body.dump(), "application/json");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "cloud");
      id = json::parse(r->body)["id"].get<std::string>();
    } else {
      id = first_streamed_response_id(cli, body);
    }
    ASSERT_EQ(id.rfind("resp_up_", 0), 0u) << id;
    auto r = cli.Post("/v1/responses/" + id + "/cancel", "", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j.value("id", ""), id) << r->body;
    EXPECT_EQ(j.value("status", ""), "cancelled") << r->body;
    r = cli.Get("/v1/responses/" + id);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j.value("id", ""), id) << r->body;
    EXPECT_EQ(j.value("status", ""), "cancelled") << r->body;
  }
  {
    std::lock_guard lk(up.mu);
    EXPECT_EQ(up.response_cancels, 2);
    EXPECT_EQ(up.response_gets, 2);
  }
  // Its events are not streamed again through lilac: 400 naming "stream", as for a local one whose events are not held.
  {
    auto r = cli.Get("/v1/responses/resp_up_0?stream=true");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_EQ(json::parse(r->body, nullptr, false)["error"]["param"], "stream") << r->body;
  }
  // An id lilac never answered with: lilac's own 404, and the upstream is not asked.
  auto r = cli.Get("/v1/responses/resp_never_seen");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  r = cli.Post("/v1/responses/resp_never_seen/cancel", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  std::lock_guard lk(up.mu);
  EXPECT_EQ(up.response_cancels, 2);
  EXPECT_EQ(up.response_gets, 2);
}

// SSE's data field is "data:" and one optional space. An upstream that streams `data:{...}` has its response.created id
// remembered as one that streams `data: {...}`: the client GETs it through lilac. The router read the id only from
// "data: " lines (while it added lilac_route to both forms), so lilac answered its own 404 for an id it had handed out.
TEST(HybridUpstream, AStreamWrittenAsDataColonBraceRemembersItsResponseId) {
  FakeUpstream up;
  up.data_colon_only = true;
  const StreamedThenFetched f = stream_then_fetch(up);
  ASSERT_EQ(f.id, "resp_up_0");
  EXPECT_EQ(f.status, 200) << f.body;
  EXPECT_EQ(json::parse(f.body, nullptr, false).value("id", ""), f.id) << f.body;
  EXPECT_EQ(f.upstream_gets, 1);
}

// An upstream event that names response.created but whose "type" is not a string is passed on as it came and
// remembers nothing: reading it (nlohmann's value("type", "") throws type_error for a non-string) threw out of the
// stream's pump.
TEST(HybridUpstream, ACreatedEventWhoseTypeIsNotAStringIsPassedOnAndRemembersNothing) {
  FakeUpstream up;
  up.created_type_not_string = true;
  const StreamedThenFetched f = stream_then_fetch(up);
  EXPECT_EQ(f.id, "resp_up_0");
  EXPECT_EQ(f.status, 404) << f.body;  // not remembered: lilac's own answer
  EXPECT_EQ(f.upstream_gets, 0);
}
