#pragma once
// Strict parsers for the numbers and durations users and admins type.
// Every parser rejects empty input, signs, trailing junk and overflow.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt {

// A non-negative decimal integer; no sign, no spaces, no suffix.
Result<std::uint64_t> parse_uint(std::string_view text);

// parse_uint, and at least 1.
Result<std::uint64_t> parse_positive_uint(std::string_view text);

// A byte count: digits and an optional unit. KB, MB, GB, TB are powers of 1000 (as Hugging Face's shard sizes are
// written: "5GB"); KiB, MiB, GiB, TiB and Slurm's K, M, G, T are powers of 1024. "B" or no unit: bytes.
Result<std::uint64_t> parse_bytes(std::string_view text);

// A duration made of <number><unit> groups, units d, h, m, s in that order, each at most once:
// "90s", "15m", "2h", "1h30m", "1d12h". A bare number is seconds. Returns whole seconds.
Result<std::uint64_t> parse_duration(std::string_view text);

// parse_duration, and more than zero seconds.
Result<std::uint64_t> parse_positive_duration(std::string_view text);

// A duration as parse_duration reads it, or one decimal number with one unit: "0.25s", "120ms", "1.5m", "1.8h",
// "0.5d" (bare digits are seconds). For measured costs and MTBFs, where whole units are too coarse.
Result<double> parse_seconds(std::string_view text);

// The pieces of `text` between separators, empty ones included: "a,,b" -> {"a", "", "b"}, "" -> {""}.
std::vector<std::string> split(std::string_view text, char sep);

// The shortest spelling parse_duration reads back to the same value: 5400 -> "1h30m", 0 -> "0s".
std::string format_duration(std::uint64_t seconds);

// The MUNGE socket Slurm's AuthInfo names ("socket=/path" in its comma-separated list); empty for libmunge's
// default.
std::string authinfo_socket(std::string_view authinfo);

// "on|yes|true|1" or "off|no|false|0".
Result<bool> parse_on_off(std::string_view text);

}  // namespace ckpt
