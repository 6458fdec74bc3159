#include "log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

namespace ckpt::hooks {

namespace {

std::mutex& sink_mutex() {
  static std::mutex mu;
  return mu;
}

LogSink& sink_slot() {
  static LogSink sink;
  return sink;
}

std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};

}  // namespace

LogSink set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  LogSink previous = std::move(sink_slot());
  sink_slot() = std::move(sink);
  return previous;
}

namespace log {

void set_level(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

bool enabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed); }

std::string prefixed(std::string_view text) {
  if (text.rfind("ckpt: ", 0) == 0) return std::string(text);
  return "ckpt: " + std::string(text);
}

void write(LogLevel level, int rank, std::string_view text) {
  if (!enabled(level)) return;
  std::string line = "ckpt: ";
  if (rank >= 0) line += "rank " + std::to_string(rank) + ": ";
  line += text;
  // One lock for sink and stderr, so lines from the persist and training threads never interleave.
  std::lock_guard<std::mutex> lock(sink_mutex());
  if (sink_slot()) {
    sink_slot()(level, line);
    return;
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace log

}  // namespace ckpt::hooks
