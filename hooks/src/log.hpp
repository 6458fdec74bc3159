#pragma once
// The hooks' log: one line per event, every line starting with "ckpt: ", to a replaceable sink (stderr by default).
#include <string>
#include <string_view>

#include "ckpt/hooks.hpp"

namespace ckpt::hooks::log {

// Lines above this level are dropped. Process-wide; the last Checkpointer created sets it.
void set_level(LogLevel level);
// True when a line at `level` would be written.
bool enabled(LogLevel level);
// Writes "ckpt: <text>" (or "ckpt: rank <r>: <text>" when rank >= 0) to the sink.
void write(LogLevel level, int rank, std::string_view text);

inline void error(int rank, std::string_view text) { write(LogLevel::Error, rank, text); }
inline void warn(int rank, std::string_view text) { write(LogLevel::Warn, rank, text); }
inline void info(int rank, std::string_view text) { write(LogLevel::Info, rank, text); }
inline void debug(int rank, std::string_view text) { write(LogLevel::Debug, rank, text); }

// "ckpt: " + text, unless it already starts so: for error messages handed to callers.
std::string prefixed(std::string_view text);

}  // namespace ckpt::hooks::log
