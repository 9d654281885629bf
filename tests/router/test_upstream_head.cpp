// The head of an upstream's answer (status line and headers) read within router/upstream_http.h's bounds, over http://
// from a raw socket that sends any bytes, and over https:// from a TLS server with a certificate made here. Found by
// review: cpp-httplib reads a head whole and unbounded before it hands anything back (200,000 header lines were
// read; a line without an end grew until the connection ended), and a 50 KB status line overflowed the reading
// thread's stack in its std::regex (the server died of SIGSEGV).
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "router/upstream.h"
#include "router/upstream_http.h"
#include "serve_thread.h"

using namespace lilac::router;
using lilac::router::testing::serve_in_thread;
using lilac::router::testing::stop_serving;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

// A loopback server that answers every connection with what `answer` writes to its socket (after reading the request).
struct RawUpstream {
  int fd = -1, port = 0;
  std::atomic<bool> stop{false};
  std::function<void(int)> answer;
  std::thread th;

  explicit RawUpstream(std::function<void(int)> a) : answer(std::move(a)) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 8) != 0) return;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    th = std::thread([this] {
      while (!stop) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        const int c = ::accept(fd, nullptr, nullptr);
        if (c < 0) continue;
        char buf[65536];
        (void)::recv(c, buf, sizeof buf, 0);  // the request (small: one read takes it)
        answer(c);
        ::shutdown(c, SHUT_RDWR);
        ::close(c);
      }
    });
  }
  ~RawUpstream() {
    stop = true;
    if (th.joinable()) th.join();
    ::close(fd);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

// Writes all of `s`; false once the peer is gone.
bool send_all(int c, const std::string& s) {
  for (size_t at = 0; at < s.size();) {
    const ssize_t n = ::send(c, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += size_t(n);
  }
  return true;
}

std::string headers(int n, size_t value_bytes = 20) {
  std::string h;
  for (int i = 0; i < n; ++i) h += "X-H" + std::to_string(i) + ": " + std::string(value_bytes, 'v') + "\r\n";
  return h;
}

const std::string kBody = R"({"id":"up","object":"chat.completion","choices":[]})";

// An answer with `extra` header lines (and Content-Type, Content-Length: 2 + extra in all).
std::string answer_with(const std::string& extra) {
  return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(kBody.size()) +
         "\r\n" + extra + "\r\n" + kBody;
}

UpstreamClient client(const std::string& url, const std::string& ca = "") {
  UpstreamOptions o;
  o.url = parse_upstream_url(url);
  o.connect_timeout_ms = 2000;
  o.read_timeout_ms = 5000;
  o.ca_cert_file = ca;
  return UpstreamClient(o);
}

// forward()s a chat body, streamed or not; the failure ("" when answered).
std::string forward_failure(UpstreamClient& up, bool stream, httplib::Response& res) {
  const std::string body = json{{"model", "m"}, {"stream", stream}, {"messages", json::array()}}.dump();
  ForwardResult fr = up.forward("/chat/completions", body, stream, res);
  return fr.answered ? "" : fr.failure;
}

// A server that passes a streamed forward() on, as lilac's endpoints do: what a client of the stream reads.
struct StreamFront {
  httplib::Server http;
  std::thread th;
  int port = 0;
  explicit StreamFront(UpstreamClient& up) {
    http.Post("/v1/chat/completions", [&up](const httplib::Request&, httplib::Response& res) {
      const std::string f = forward_failure(up, true, res);
      if (!f.empty()) res.set_content("failed: " + f, "text/plain");
    });
    port = serve_in_thread(http, th);
  }
  ~StreamFront() {
    stop_serving(http, th);
  }
  std::string read() {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(10s);
    auto r = cli.Post("/v1/chat/completions", "{}", "application/json");
    return r ? r->body : "<no answer>";
  }
};

// A self-signed certificate for 127.0.0.1 (its own CA), in memory and as a PEM file.
struct TestCert {
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
  std::string pem_path;
  TestCert() {
    key = EVP_EC_gen("P-256");
    cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    const auto* cn = reinterpret_cast<const unsigned char*>("127.0.0.1");
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, cn, -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
    for (auto [nid, value] :
         {std::pair{NID_subject_alt_name, "IP:127.0.0.1"}, {NID_basic_constraints, "critical,CA:TRUE"}}) {
      X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
      X509_add_ext(cert, ext, -1);
      X509_EXTENSION_free(ext);
    }
    X509_sign(cert, key, EVP_sha256());
    const std::string file = "lilac-upstream-head-" + std::to_string(::getpid()) + ".pem";
    pem_path = (std::filesystem::temp_directory_path() / file).string();
    if (FILE* f = std::fopen(pem_path.c_str(), "w")) {
      PEM_write_X509(f, cert);
      std::fclose(f);
    }
  }
  ~TestCert() {
    std::filesystem::remove(pem_path);
    X509_free(cert);
    EVP_PKEY_free(key);
  }
};

}  // namespace

// The status line is bounded at 1 KiB (kMaxStatusLineBytes), below the other lines' 8 KiB: the library's std::regex
// needs ~1 MiB of stack for an 8 KiB one (a review measured it), and 60 KB killed the process.
TEST(UpstreamHead, ALongStatusLineFailsTheRequestInsteadOfCrashing) {
  std::atomic<size_t> reason{60000};
  RawUpstream raw([&](int c) {
    send_all(c, "HTTP/1.1 200 " + std::string(reason.load(), 'v') + "\r\nContent-Length: 2\r\n\r\nok");
  });
  ASSERT_GT(raw.port, 0);
  UpstreamClient up = client(raw.url());
  for (size_t n : {size_t(60000), size_t(2000), size_t(1010)}) {  // 1,010: "HTTP/1.1 200 " + reason + CR = 1,024
    reason = n;
    for (bool stream : {false, true}) {
      httplib::Response res;
      const std::string f = forward_failure(up, stream, res);
      if (n > 1010)
        EXPECT_NE(f.find("the upstream's status line is longer than 1 KiB"), std::string::npos) << n << ": " << f;
      else
        EXPECT_EQ(f.find("status line"), std::string::npos) << n << ": " << f;
    }
  }
}

TEST(UpstreamHead, HeadersAreCountedAndBounded) {
  std::mutex mu;
  std::string head;  // what the next connection gets
  RawUpstream raw([&](int c) {
    std::string h;
    {
      std::lock_guard lk(mu);
      h = head;
    }
    send_all(c, h);
  });
  ASSERT_GT(raw.port, 0);
  UpstreamClient up = client(raw.url());
  struct Case {
    std::string head, failure;  // failure "": answered
  };
  const std::vector<Case> cases = {
      {answer_with(headers(98)), ""},  // 100 header lines: the bound, answered
      {answer_with(headers(99)), "the upstream's answer has more than 100 header lines"},
      {answer_with(headers(200000)), "the upstream's answer has more than 100 header lines"},
      // lines without a CR, which the library skips, count too
      {"HTTP/1.1 200 OK\r\n" + std::string(1000, 'x') + std::string(5000, '\n'), "more than 100 header lines"},
      {answer_with("X-Big: " + std::string(9000, 'v') + "\r\n"),
       "a line of the upstream's answer head is longer than 8 KiB"},
      {answer_with(headers(20, 4000)), "the upstream's answer head (status line and headers) is longer than 64 KiB"},
      // an interim 100 answer, then the answer: watched as one head
      {"HTTP/1.1 100 Continue\r\n\r\n" + answer_with(headers(10)), ""},
      {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 " + std::string(60000, 'v') + "\r\n\r\n",
       "the upstream's status line is longer than 1 KiB"},
      {"HTTP/1.1 100 Continue\r\n\r\n" + answer_with(headers(99)), "the upstream's answer has more than 100 header lines"},
      // a 103 is the library's answer (it loops on 100 only), its body a body: the watch ends with its head
      {"HTTP/1.1 103 Early Hints\r\nContent-Length: 100000\r\n\r\n" + std::string(100000, 'x'), "not a final answer"},
  };
  for (const Case& c : cases) {
    {
      std::lock_guard lk(mu);
      head = c.head;
    }
    for (bool stream : {false, true}) {
      httplib::Response res;
      const std::string f = forward_failure(up, stream, res);
      const std::string what = c.head.substr(0, 60) + (stream ? " (streamed)" : "");
      if (c.failure.empty()) {
        EXPECT_EQ(f, "") << what;
        EXPECT_EQ(res.status, 200) << what;
        EXPECT_EQ(json::parse(res.body, nullptr, false).value("id", ""), "up") << what << ": " << res.body;
      } else {
        EXPECT_NE(f.find(c.failure), std::string::npos) << what << ": " << f;
      }
    }
  }
}

// A line that never ends, of the head or of a chunked body's framing (a chunk size): the read stops at 8 KiB (the
// library read it whole, one byte at a time, until the connection ended), and the upstream sees the connection
// closed long before it sent its 256 MiB. A stream that breaks so ends with its error event saying why.
TEST(UpstreamHead, ALineThatNeverEndsIsCutEarly) {
  std::mutex mu;
  std::string prefix;
  std::atomic<size_t> sent{0};
  RawUpstream raw([&](int c) {
    std::string p;
    {
      std::lock_guard lk(mu);
      p = prefix;
    }
    if (!send_all(c, p)) return;
    const std::string chunk(size_t(1) << 20, 'f');
    for (int i = 0; i < 256 && send_all(c, chunk); ++i) sent += chunk.size();
  });
  ASSERT_GT(raw.port, 0);
  UpstreamClient up = client(raw.url());
  const std::string chunked = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"HTTP/1.1 200 OK\r\nX-Endless: ", "a line of the upstream's answer head is longer than 8 KiB"},
      {chunked + "4\r\n{\"a\"\r\n1", "a line of the upstream's chunked body framing is longer than 8 KiB"}};
  for (const auto& [p, failure] : cases) {
    {
      std::lock_guard lk(mu);
      prefix = p;
    }
    sent = 0;
    httplib::Response res;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string f = forward_failure(up, false, res);
    EXPECT_NE(f.find(failure), std::string::npos) << f;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
    EXPECT_LT(sent.load(), size_t(64) << 20);
  }
  {
    std::lock_guard lk(mu);
    prefix = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
             "a\r\ndata: {}\n\n\r\n1";
  }
  StreamFront front(up);
  const std::string body = front.read();
  EXPECT_EQ(body.rfind("data: {\"lilac_route\":\"cloud\"}\n\n", 0), 0u) << body.substr(0, 300);
  EXPECT_NE(body.find("broke off (a line of the upstream's chunked body framing is longer than 8 KiB)"),
            std::string::npos) << body.substr(0, 300);
  EXPECT_LT(body.size(), size_t(4096));
}

// Over TLS (lilac's own stream over the connection's SSL object): answers, whole and streamed, pass as before, and
// their heads are bounded the same way.
TEST(UpstreamHead, TlsAnswersPassAndTheirHeadsAreBounded) {
  TestCert cert;
  httplib::SSLServer tls(cert.cert, cert.key);
  ASSERT_TRUE(tls.is_valid());
  std::atomic<int> extra_headers{0};
  tls.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    for (int i = 0; i < extra_headers; ++i) res.set_header("X-H" + std::to_string(i), "v");
    if (!json::parse(req.body).value("stream", false)) return res.set_content(kBody, "application/json");
    res.set_chunked_content_provider("text/event-stream", [n = 0](size_t, httplib::DataSink& sink) mutable {
      const std::string s = n < 3 ? "data: {\"n\":" + std::to_string(n) + "}\n\n" : "data: [DONE]\n\n";
      if (!sink.write(s.data(), s.size())) return false;
      if (++n > 3) sink.done();
      return true;
    });
  });
  std::thread th;
  const int port = serve_in_thread(tls, th);
  const std::string url = "https://127.0.0.1:" + std::to_string(port);
  UpstreamClient up = client(url, cert.pem_path);
  {
    httplib::Response res;
    EXPECT_EQ(forward_failure(up, false, res), "");
    EXPECT_EQ(json::parse(res.body, nullptr, false).value("id", ""), "up") << res.body;
  }
  {  // streamed (chunked), read through a front server
    StreamFront front(up);
    EXPECT_EQ(front.read(),
              "data: {\"lilac_route\":\"cloud\",\"n\":0}\n\ndata: {\"lilac_route\":\"cloud\",\"n\":1}\n\n"
              "data: {\"lilac_route\":\"cloud\",\"n\":2}\n\ndata: [DONE]\n\n");
  }
  extra_headers = 150;
  for (bool stream : {false, true}) {
    httplib::Response res;
    const std::string f = forward_failure(up, stream, res);
    EXPECT_NE(f.find("more than 100 header lines"), std::string::npos) << f;
  }
  // The certificate is checked: without its CA the upstream is not trusted.
  UpstreamClient untrusted = client(url);
  httplib::Response res;
  EXPECT_NE(forward_failure(untrusted, false, res).find("cannot reach the upstream"), std::string::npos);
  stop_serving(tls, th);
}

namespace {
// A raw upstream that answers with `head`, then sends `filler` bytes of body until `limit` bytes or the client
// goes; counts what it managed to send.
struct EndlessBody {
  std::atomic<size_t> sent{0};
  RawUpstream raw;
  EndlessBody(std::string head, char filler, size_t limit)
      : raw([this, head = std::move(head), filler, limit](int c) {
          if (!send_all(c, head)) return;
          const std::string chunk(size_t(1) << 16, filler);
          while (sent < limit && send_all(c, chunk)) sent += chunk.size();
        }) {}
};
}  // namespace

// Found by review: the body of an error answer to a stream request was drained to its end (past 1 MiB the receiver
// kept reading and dropping), so an endless one held the request's thread for good; the model list's body was read
// whole into memory. Both reads now end at their bound: the upstream gets to send little more than it (the socket
// buffers), where it sent all 64 MiB before.
TEST(UpstreamBodies, AnErrorBodyOrAModelListPastItsBoundEndsTheRead) {
  constexpr size_t kLimit = size_t(64) << 20;
  {
    EndlessBody up_err("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n\r\n", ' ', kLimit);
    ASSERT_GT(up_err.raw.port, 0);
    UpstreamClient up = client(up_err.raw.url());
    httplib::Response res;
    EXPECT_EQ(forward_failure(up, true, res), "");  // the 400 is passed on, its body cut
    EXPECT_EQ(res.status, 400);
    EXPECT_LT(up_err.sent.load(), size_t(16) << 20);
  }
  {
    EndlessBody up_models("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"data\":[", ' ', kLimit);
    ASSERT_GT(up_models.raw.port, 0);
    UpstreamClient up = client(up_models.raw.url());
    EXPECT_FALSE(up.list_models(5000).has_value());
    EXPECT_LT(up_models.sent.load(), size_t(16) << 20);
  }
}
