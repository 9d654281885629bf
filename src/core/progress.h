// Progress of a long byte-oriented job (loading, converting) on stderr: bytes done / total,
// rate and ETA, redrawn at most a few times a second, only when stderr is a terminal and the
// job is large enough to be worth it.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace lilac {

class Progress {
 public:
  // Shows nothing unless `enabled`, stderr is a terminal and total_bytes >= min_bytes.
  Progress(std::string label, uint64_t total_bytes, bool enabled = true,
           uint64_t min_bytes = uint64_t(1) << 30);
  ~Progress();
  void add(uint64_t bytes);  // thread-safe
  void finish();
  bool active() const { return active_; }
  uint64_t done() const { return done_; }

  // "1.50 GB", "12.0 MB", ... (for messages).
  static std::string format_bytes(double bytes);

 private:
  void draw(bool final_line);
  std::string label_;
  uint64_t total_ = 0, done_ = 0;
  bool active_ = false, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::mutex mu_;
};

}  // namespace lilac
