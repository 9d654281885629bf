// An httplib server of a router test (a fake upstream, a front, a TLS peer) listening on a loopback port in a thread
// of its own: serve_in_thread binds, starts and waits until it runs; stop_serving stops it and joins the thread.
#pragma once
#include <httplib.h>

#include <chrono>
#include <thread>

namespace lilac::router::testing {

inline int serve_in_thread(httplib::Server& http, std::thread& th) {
  const int port = http.bind_to_any_port("127.0.0.1");
  th = std::thread([&http] { http.listen_after_bind(); });
  for (int i = 0; i < 500 && !http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return port;
}

inline void stop_serving(httplib::Server& http, std::thread& th) {
  http.stop();
  th.join();
}

}  // namespace lilac::router::testing
