// Minimal logging to stderr with levels. The level comes from set_log_level() or the
// environment variable LILAC_LOG (debug, info, warn, error, off); default info.
#pragma once
#include <string>

namespace lilac {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);
// Parses "debug" / "info" / "warn" / "error" / "off"; throws lilac::InputError otherwise.
LogLevel parse_log_level(const std::string& s);

// printf-style; a newline is appended. Thread-safe (one line at a time).
void log_printf(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

#define LILAC_LOG_DEBUG(...) ::lilac::log_printf(::lilac::LogLevel::Debug, __VA_ARGS__)
#define LILAC_LOG_INFO(...) ::lilac::log_printf(::lilac::LogLevel::Info, __VA_ARGS__)
#define LILAC_LOG_WARN(...) ::lilac::log_printf(::lilac::LogLevel::Warn, __VA_ARGS__)
#define LILAC_LOG_ERROR(...) ::lilac::log_printf(::lilac::LogLevel::Error, __VA_ARGS__)

}  // namespace lilac
