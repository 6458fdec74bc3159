#include "ckpt/parse.hpp"

#include <array>
#include <charconv>
#include <limits>

namespace ckpt {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The units a duration is written in, largest first: the order parse_duration wants its groups in.
struct Unit {
  char name;
  std::uint64_t seconds;
};
constexpr std::array<Unit, 4> kUnits{{{'d', 86400}, {'h', 3600}, {'m', 60}, {'s', 1}}};

}  // namespace

Result<std::uint64_t> parse_uint(std::string_view text) {
  if (text.empty()) return Error{"empty value"};
  for (char c : text) {
    if (!is_digit(c)) return Error{"not a non-negative integer"};
  }
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) return Error{"number too large"};
  if (ec != std::errc() || end != text.data() + text.size()) return Error{"not a non-negative integer"};
  return value;
}

Result<std::uint64_t> parse_bytes(std::string_view text) {
  struct Unit {
    std::string_view name;
    std::uint64_t bytes;
  };
  static constexpr std::array<Unit, 14> kByteUnits{{{"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000'000},
      {"GB", 1000'000'000}, {"TB", 1000'000'000'000}, {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30},
      {"TiB", 1ull << 40}, {"K", 1ull << 10}, {"M", 1ull << 20}, {"G", 1ull << 30}, {"T", 1ull << 40}}};
  std::size_t digits = 0;
  while (digits < text.size() && is_digit(text[digits])) ++digits;
  if (digits == 0) return Error{text.empty() ? "empty value" : "expected a number of bytes"};
  auto number = parse_uint(text.substr(0, digits));
  if (!number) return Error{number.error()};
  std::string_view unit = text.substr(digits);
  std::uint64_t scale = 0;
  for (const Unit& u : kByteUnits) {
    if (u.name == unit) scale = u.bytes;
  }
  if (scale == 0) return Error{"unknown unit '" + std::string(unit) + "' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"};
  if (*number > std::numeric_limits<std::uint64_t>::max() / scale) return Error{"size too large"};
  return *number * scale;
}

Result<std::uint64_t> parse_duration(std::string_view text) {
  if (text.empty()) return Error{"empty value"};
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();

  std::uint64_t total = 0;
  std::size_t next_unit = 0;  // units must appear in order d, h, m, s, each at most once
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t start = pos;
    while (pos < text.size() && is_digit(text[pos])) ++pos;
    if (pos == start) return Error{"expected a number"};
    auto number = parse_uint(text.substr(start, pos - start));
    if (!number) return Error{number.error()};
    std::uint64_t scale = 1;
    if (pos == text.size()) {
      if (start != 0) return Error{"missing unit after the last number"};
    } else {
      char unit = text[pos++];
      std::size_t i = next_unit;
      while (i < kUnits.size() && kUnits[i].name != unit) ++i;
      if (i == kUnits.size()) {
        bool known = unit == 'd' || unit == 'h' || unit == 'm' || unit == 's';
        return Error{known ? "units out of order or repeated" : std::string("unknown unit '") + unit + "'"};
      }
      next_unit = i + 1;
      scale = kUnits[i].seconds;
    }
    if (*number > max / scale) return Error{"duration too large"};
    std::uint64_t part = *number * scale;
    if (part > max - total) return Error{"duration too large"};
    total += part;
  }
  return total;
}

Result<std::uint64_t> parse_positive_uint(std::string_view text) {
  auto n = parse_uint(text);
  if (n && *n == 0) return Error{"must be at least 1"};
  return n;
}

Result<std::uint64_t> parse_positive_duration(std::string_view text) {
  auto d = parse_duration(text);
  if (d && *d == 0) return Error{"must be positive"};
  return d;
}

Result<double> parse_seconds(std::string_view text) {
  if (auto whole = parse_duration(text)) return static_cast<double>(*whole);
  // One decimal number and one unit: "0.25s", "120ms", "1.5m", "1.8h", "0.5d"; bare digits are seconds.
  std::string_view number = text;
  double scale = 1;
  if (number.ends_with("ms")) {
    number.remove_suffix(2);
    scale = 1e-3;
  } else if (!number.empty()) {
    for (const Unit& unit : kUnits) {
      if (number.back() != unit.name) continue;
      number.remove_suffix(1);
      scale = static_cast<double>(unit.seconds);
      break;
    }
  }
  const auto dot = number.find('.');
  std::string_view integer = number.substr(0, dot);
  std::string_view fraction = dot == std::string_view::npos ? std::string_view{} : number.substr(dot + 1);
  auto all_digits = [](std::string_view s) {
    return !s.empty() && s.size() <= 15 && s.find_first_not_of("0123456789") == std::string_view::npos;
  };
  if (!all_digits(integer) || (dot != std::string_view::npos && !all_digits(fraction))) {
    return Error{"not a duration (like 30s, 1h30m, 1.8h, 0.25s or 120ms)"};
  }
  double value = 0;
  for (char c : integer) value = value * 10 + (c - '0');
  double place = 0.1;
  for (char c : fraction) {
    value += (c - '0') * place;
    place /= 10;
  }
  return value * scale;
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(sep, start);
    if (end == std::string_view::npos) end = text.size();
    out.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string format_duration(std::uint64_t seconds) {
  if (seconds == 0) return "0s";
  std::string out;
  for (auto [unit, size] : {std::pair{'d', 86400ULL}, {'h', 3600ULL}, {'m', 60ULL}, {'s', 1ULL}}) {
    if (seconds >= size) {
      out += std::to_string(seconds / size);
      out += unit;
      seconds %= size;
    }
  }
  return out;
}

std::string authinfo_socket(std::string_view authinfo) {
  for (const std::string& item : split(authinfo, ',')) {
    if (item.rfind("socket=", 0) == 0) return item.substr(7);
  }
  return {};
}

Result<bool> parse_on_off(std::string_view text) {
  if (text == "on" || text == "yes" || text == "true" || text == "1") return true;
  if (text == "off" || text == "no" || text == "false" || text == "0") return false;
  return Error{"expected on or off"};
}

}  // namespace ckpt
