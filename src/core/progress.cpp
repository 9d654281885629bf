#include "core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace lilac {

Progress::Progress(std::string label, uint64_t total_bytes, bool enabled, uint64_t min_bytes)
    : label_(std::move(label)), total_(total_bytes) {
  active_ = enabled && total_bytes >= min_bytes && ::isatty(STDERR_FILENO);
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

std::string Progress::format_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000.0 && u < 4) {
    b /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

void Progress::add(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ += bytes;
  if (!active_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ >= std::chrono::milliseconds(250)) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (active_) draw(true);
}

void Progress::draw(bool final_line) {
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = secs > 0 ? done_ / secs : 0;
  char eta[32] = "?";
  if (final_line) {
    std::snprintf(eta, sizeof eta, "done in %.1fs", secs);
  } else if (rate > 0 && total_ > done_) {
    std::snprintf(eta, sizeof eta, "ETA %.0fs", (total_ - done_) / rate);
  }
  double pct = total_ ? 100.0 * done_ / total_ : 100.0;
  std::fprintf(stderr, "\r%s: %s / %s (%.0f%%), %s/s, %s   ", label_.c_str(),
               format_bytes(double(done_)).c_str(), format_bytes(double(total_)).c_str(), pct,
               format_bytes(rate).c_str(), eta);
  if (final_line) std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace lilac
