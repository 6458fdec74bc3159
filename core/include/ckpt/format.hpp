#pragma once
// Numbers as text, two ways: short for what people read (messages, reports), exact for what programs read back
// (Prometheus samples). Everything that prints a bare double uses one of these, so one kind of output prints alike.
#include <cstdio>
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

// Text made safe for one log line: control characters (newlines, ANSI escapes, DEL) as \xNN. Every log writer
// passes its lines through it, so no user text can start a line of its own or drive a terminal.
inline std::string escape_controls(const std::string& value) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(value.size());
  for (unsigned char c : value) {
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// A user's value quoted in a message: escape_controls(), cut after 300 bytes with "...".
inline std::string printable(const std::string& value) {
  std::string out = escape_controls(value.size() > 1200 ? value.substr(0, 1200) : value);
  return out.size() > 300 ? out.substr(0, 300) + "..." : out;
}

}  // namespace ckpt
