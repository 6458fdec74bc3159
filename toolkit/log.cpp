#include "log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "ckpt/clock.hpp"
#include "ckpt/controller_limits.hpp"
#include "ckpt/format.hpp"

namespace ckpt::toolkit {

namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};
std::mutex g_mutex;
std::string& program() {
  static std::string name = "ckpt-controller";
  return name;
}

}  // namespace

void set_log_level(const std::string& level) {
  if (auto parsed = parse_log_level(level)) g_level = static_cast<int>(*parsed);
}

void set_log_program(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  program() = name;
}

void log(LogLevel level, const std::string& line) {
  if (static_cast<int>(level) > g_level.load()) return;
  static const char* const names[] = {"error: ", "warning: ", "", "debug: "};
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "%s: %s%s\n", program().c_str(), names[static_cast<int>(level)], escape_controls(line).c_str());
  std::fflush(stderr);
}

void log_limited(LogLevel level, const std::string& kind, const std::string& line) {
  static std::mutex mutex;
  static ckpt::recovery::LogLimiter limiter(5, 10.0);
  std::uint64_t suppressed = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!limiter.allow(kind, unix_seconds(), suppressed)) return;
  }
  log(level, suppressed == 0 ? line : line + " (" + std::to_string(suppressed) + " similar lines held back)");
}

}  // namespace ckpt::toolkit
