// The number formats (ckpt/format.hpp) and the clock helpers (ckpt/clock.hpp).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <limits>

#include "ckpt/clock.hpp"
#include "ckpt/format.hpp"

using namespace ckpt;

TEST_CASE("format_number: short, for people", "[format]") {
  CHECK(format_number(0) == "0");
  CHECK(format_number(0.5) == "0.5");
  CHECK(format_number(3600) == "3600");
  CHECK(format_number(-2.25) == "-2.25");
  CHECK(format_number(1e6) == "1e+06");
  CHECK(format_number(1.0 / 3) == "0.333333");
  CHECK(format_number(std::numeric_limits<double>::infinity()) == "inf");
}

TEST_CASE("format_number_exact: every digit, for programs", "[format]") {
  CHECK(format_number_exact(0) == "0");
  CHECK(format_number_exact(3600) == "3600");
  CHECK(format_number_exact(0.1) == "0.10000000000000001");
  CHECK(format_number_exact(std::numeric_limits<double>::infinity()) == "inf");
  for (double v : {0.1, 1.0 / 3, 123456.789, 1e-300, std::numeric_limits<double>::max()}) {
    CHECK(std::strtod(format_number_exact(v).c_str(), nullptr) == v);
  }
}

TEST_CASE("clock helpers", "[clock]") {
  const double wall = unix_seconds();
  CHECK(wall > 1.6e9);  // after 2020
  const double system =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  CHECK(system - wall >= 0);
  CHECK(system - wall < 5);
  const auto t0 = std::chrono::steady_clock::now();
  const double elapsed = seconds_since(t0);
  CHECK(elapsed >= 0);
  CHECK(elapsed < 5);
}

// User text in the controller's log and history (job events, request paths, reasons) cannot forge a line of its own
// or drive an operator's terminal.
TEST_CASE("user text in a log line", "[format][security]") {
  CHECK(escape_controls("job 7: ok") == "job 7: ok");
  CHECK(escape_controls("a\nfake: job 8 DOWN") == "a\\x0afake: job 8 DOWN");
  CHECK(escape_controls("\x1b[31mred\x1b[0m\r\x7f") == "\\x1b[31mred\\x1b[0m\\x0d\\x7f");
  CHECK(escape_controls(std::string(5000, 'x')).size() == 5000);  // a log line keeps its length
  CHECK(printable(std::string(5000, 'x')) == std::string(300, 'x') + "...");
  CHECK(printable("tab\there") == "tab\\x09here");
  CHECK(escape_controls("gr\xc3\xbc\xc3\x9f") == "gr\xc3\xbc\xc3\x9f");  // UTF-8 stays as it is
}
