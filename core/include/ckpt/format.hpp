#pragma once
// Numbers as text, two ways: short for what people read (messages, reports), exact for what programs read back
// (Prometheus samples). Everything that prints a bare double uses one of these, so one kind of output prints alike.
// And user text made safe to quote (core/src/format.cpp).
#include <cstdio>
#include <cstdint>
#include <string>

namespace ckpt {

// printf "%g": six significant digits, trailing zeros dropped ("0.5", "3600", "1e+06", "inf", "nan").
inline std::string format_number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", value);
  return buf;
}

// printf "%.17g": every digit a double has, so the text parses back to the same double ("0.10000000000000001").
inline std::string format_number_exact(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  return buf;
}

// A size in binary units with one decimal ("512 B", "1.5 MiB", "3.0 GiB"): enough to compare a need with a limit.
std::string format_bytes(std::uint64_t bytes);

// Text made safe for one log line: control characters (newlines, ANSI escapes, DEL) as \xNN. Every log writer
// passes its lines through it, so no user text can start a line of its own or drive a terminal.
std::string escape_controls(const std::string& value);

// A user's value quoted in a message: escape_controls(), cut after 300 bytes with "...".
std::string printable(const std::string& value);

}  // namespace ckpt
