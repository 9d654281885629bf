#include "core/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace lilac {

namespace {

LogLevel initial_level() {
  const char* env = std::getenv("LILAC_LOG");
  if (env && *env) {
    try {
      return parse_log_level(env);
    } catch (const Error&) {
      std::fprintf(stderr, "lilac: ignoring unknown LILAC_LOG=%s\n", env);
    }
  }
  return LogLevel::Info;
}

std::atomic<int>& level_ref() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

std::mutex& log_mutex() {
  static std::mutex m;
  return m;
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::Debug: return "debug";
    case LogLevel::Info: return "info";
    case LogLevel::Warn: return "warn";
    case LogLevel::Error: return "error";
    default: return "";
  }
}

}  // namespace

LogLevel parse_log_level(const std::string& s) {
  if (s == "debug") return LogLevel::Debug;
  if (s == "info") return LogLevel::Info;
  if (s == "warn" || s == "warning") return LogLevel::Warn;
  if (s == "error") return LogLevel::Error;
  if (s == "off" || s == "none") return LogLevel::Off;
  throw InputError("unknown log level '" + s + "' (expected debug, info, warn, error or off)");
}

void set_log_level(LogLevel level) { level_ref().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_ref().load()); }
bool log_enabled(LogLevel level) {
  return level != LogLevel::Off && static_cast<int>(level) >= level_ref().load();
}

void log_printf(LogLevel level, const char* fmt, ...) {
  if (!log_enabled(level)) return;
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(log_mutex());
  std::fprintf(stderr, "lilac [%s] %s\n", level_name(level), buf);
}

}  // namespace lilac
