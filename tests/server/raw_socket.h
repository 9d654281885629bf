// A raw TCP client for the HTTP-layer tests: what a hostile or slow client does, byte by byte.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace lilac::test {

using namespace std::chrono_literals;

// Polls f every 5 ms until it holds (true) or t has passed (false): what the tests wait on a server's counters with.
template <class F>
bool wait_for(F f, std::chrono::milliseconds t = 10000ms) {
  const auto end = std::chrono::steady_clock::now() + t;
  while (!f()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// A raw TCP client: what a hostile or slow client does is spelled out byte by byte.
struct Sock {
  int fd = -1;
  // `from`: the client's own address, so that a test can be several clients (on Linux every 127.x.y.z is loopback:
  // "127.0.0.2" is another client of a server on 127.0.0.1).
  explicit Sock(int port, const char* from = nullptr) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (from) {
      sockaddr_in l{};
      l.sin_family = AF_INET;
      if (inet_pton(AF_INET, from, &l.sin_addr) != 1 || bind(fd, reinterpret_cast<sockaddr*>(&l), sizeof l) != 0) {
        ::close(fd);
        fd = -1;
        return;
      }
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~Sock() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  bool send(const std::string& s) { return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size()); }
  // Reads until `until` appears, the peer closes, or `timeout` passes.
  std::string read(std::chrono::milliseconds timeout = 10000ms, const std::string& until = "") {
    std::string out;
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (!until.empty() && out.find(until) != std::string::npos) break;
      pollfd p{fd, POLLIN, 0};
      int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count());
      if (poll(&p, 1, std::max(1, left)) <= 0) break;
      char buf[65536];
      ssize_t r = ::recv(fd, buf, sizeof buf, 0);
      if (r <= 0) break;
      out.append(buf, size_t(r));
    }
    return out;
  }
  // A whole answer with a Content-Length body.
  std::string answer(std::chrono::milliseconds timeout = 10000ms) {
    std::string out = read(timeout, "\r\n\r\n");
    size_t he = out.find("\r\n\r\n");
    if (he == std::string::npos) return out;
    size_t cl = out.find("Content-Length: ");
    if (cl == std::string::npos || cl > he) return out;
    size_t n = std::stoul(out.substr(cl + 16));
    while (out.size() < he + 4 + n) {
      std::string more = read(timeout, "");
      if (more.empty()) break;
      out += more;
    }
    return out;
  }
};

inline int status_of(const std::string& answer) { return answer.size() > 12 ? std::atoi(answer.c_str() + 9) : 0; }

inline std::string get(const std::string& path) { return "GET " + path + " HTTP/1.1\r\nHost: t\r\n\r\n"; }
// A POST's request line and headers for a body of `length` bytes, without the body (`extra`: more header lines, each
// ending in \r\n), for tests that send the body later, slowly or never.
inline std::string post_head(const std::string& path, size_t length, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(length) + "\r\n" + extra + "\r\n";
}
inline std::string post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return post_head(path, body.size(), extra) + body;
}
inline const std::string kExpect100 = "Expect: 100-continue\r\n";          // a header line for post_head
inline const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";  // the interim answer to it

}  // namespace lilac::test
