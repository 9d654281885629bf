// Anthropic Message Batches (POST /v1/messages/batches) on the scripted backend (server_test_util.h).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "server_test_util.h"
#include "text/chat_template.h"

using json = nlohmann::json;
using lilac::test::post_json;

// A batch sent while the model is still loading waits for it: every request errored at once with the 503 "still
// loading" (only a full queue was waited out).
TEST(MessageBatches, ABatchSentWhileTheModelLoadsWaitsForIt) {
  using namespace lilac;
  auto o = test::LocalServer::options();
  o.port = 0;
  o.log_requests = false;
  server::Server srv(o);
  const int port = srv.bind();
  srv.start();
  json reqs = json::array();
  for (const char* id : {"a", "b"})
    reqs.push_back({{"custom_id", id},
                    {"params", {{"max_tokens", 20}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}}});
  const json batch = post_json(port, "/v1/messages/batches", {{"requests", reqs}});
  const std::string id = batch["id"];
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the batch's thread tries while the model loads
  auto tok = test::qwen3_tokenizer();
  auto tmpl = std::shared_ptr<const ChatTemplate>(ChatTemplate::from_source(
      read_text_file(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3.6-template/chat_template.jinja"), "qwen3.6"));
  srv.set_model(std::shared_ptr<Backend>(server::make_scripted_backend(test::default_script(), tok)), tok, tmpl);
  json b;
  for (int i = 0; i < 250; ++i) {
    auto r = httplib::Client("127.0.0.1", port).Get("/v1/messages/batches/" + id);
    ASSERT_TRUE(r);
    b = json::parse(r->body);
    if (b["processing_status"] == "ended") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(b["processing_status"], "ended") << b.dump();
  EXPECT_EQ(b["request_counts"]["succeeded"], 2) << b.dump();
  EXPECT_EQ(b["request_counts"]["errored"], 0) << b.dump();
  srv.stop();
}
