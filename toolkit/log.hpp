#pragma once
// The controller's log: one line per message on stderr (systemd's journal takes it from there), every line
// prefixed "ckpt-controller: ". Thread-safe. Never prints a secret: callers pass no tokens or credentials.
#include <string>

#include "ckpt/log_level.hpp"

namespace ckpt::toolkit {

using LogLevel = ckpt::LogLevel;

// Sets the level from "error", "warning" (or "warn"), "info" or "debug"; anything else keeps the current one.
void set_log_level(const std::string& level);
// The program name in the prefix ("ckpt-controller" by default, "ckpt-run" for ckpt-run).
void set_log_program(const std::string& name);
void log(LogLevel level, const std::string& line);
inline void log_error(const std::string& line) { log(LogLevel::Error, line); }
inline void log_warning(const std::string& line) { log(LogLevel::Warning, line); }
inline void log_info(const std::string& line) { log(LogLevel::Info, line); }
inline void log_debug(const std::string& line) { log(LogLevel::Debug, line); }
// For complaints about input anyone can send: at most 5 lines of one `kind` per 10 s; the next line let through
// says how many were held back.
void log_limited(LogLevel level, const std::string& kind, const std::string& line);

}  // namespace ckpt::toolkit
