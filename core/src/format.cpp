// User text in messages and log lines (ckpt/format.hpp).
#include "ckpt/format.hpp"

#include <cstdio>
#include <iterator>

namespace ckpt {

std::string escape_controls(const std::string& value) {
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

std::string printable(const std::string& value) {
  std::string out = escape_controls(value.size() > 1200 ? value.substr(0, 1200) : value);
  if (out.size() > 300) {
    out.resize(300);
    out += "...";
  }
  return out;
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  auto value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

}  // namespace ckpt
