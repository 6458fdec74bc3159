#pragma once
// The log levels every part of slurm-ckpt reads from its settings (CKPT_LOG, the controller's log_level): one
// vocabulary, "error", "warning", "info", "debug", where "warning" is the canonical spelling and "warn" is accepted
// for it.
#include <optional>
#include <string_view>

namespace ckpt {

// Ordered: a level lets through the lines at it and above it (Error the fewest).
enum class LogLevel { Error = 0, Warning = 1, Info = 2, Debug = 3 };

// "error", "warning" or "warn", "info", "debug"; nullopt for anything else (case matters, no spaces).
inline std::optional<LogLevel> parse_log_level(std::string_view text) {
  if (text == "error") return LogLevel::Error;
  if (text == "warning" || text == "warn") return LogLevel::Warning;
  if (text == "info") return LogLevel::Info;
  if (text == "debug") return LogLevel::Debug;
  return std::nullopt;
}

// The canonical spelling: "error", "warning", "info" or "debug".
inline const char* to_string(LogLevel level) {
  switch (level) {
    case LogLevel::Error: return "error";
    case LogLevel::Warning: return "warning";
    case LogLevel::Info: return "info";
    case LogLevel::Debug: return "debug";
  }
  return "info";
}

// What the parsers' error messages list.
inline constexpr const char* kLogLevelsAccepted = "error, warning (or warn), info or debug";

}  // namespace ckpt
