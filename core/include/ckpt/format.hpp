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

// User text made safe for one log line: control characters (newlines, ANSI escapes) as \xNN, cut after 300
// bytes with "...". Every log line, history row or error message that quotes what a user wrote goes through it.
inline std::string printable(const std::string& value) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : value) {
    if (out.size() > 300) return out.substr(0, 300) + "...";
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

}  // namespace ckpt
