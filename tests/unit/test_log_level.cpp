// One log-level vocabulary: "warning" is canonical and "warn" is read as it, in the hooks' CKPT_LOG and in the
// controller's log_level alike.
#include <catch2/catch.hpp>

#include <string>

#include "ckpt/log_level.hpp"
#include "ckpt/recovery.hpp"

using ckpt::LogLevel;
using ckpt::parse_log_level;

TEST_CASE("log levels: one vocabulary", "[log][config]") {
  SECTION("good inputs") {
    CHECK(parse_log_level("error") == LogLevel::Error);
    CHECK(parse_log_level("warning") == LogLevel::Warning);
    CHECK(parse_log_level("warn") == LogLevel::Warning);
    CHECK(parse_log_level("info") == LogLevel::Info);
    CHECK(parse_log_level("debug") == LogLevel::Debug);
    for (LogLevel l : {LogLevel::Error, LogLevel::Warning, LogLevel::Info, LogLevel::Debug}) {
      CHECK(parse_log_level(ckpt::to_string(l)) == l);
    }
    CHECK(std::string(ckpt::to_string(LogLevel::Warning)) == "warning");
  }
  SECTION("bad inputs") {
    for (const char* bad : {"", "WARN", "Warning", "warnings", "warn ", " info", "verbose", "loud", "0"}) {
      INFO(bad);
      CHECK_FALSE(parse_log_level(bad));
    }
  }
}

TEST_CASE("controller config: log_level takes both spellings of warning", "[controller][config][log]") {
  using ckpt::recovery::parse_controller_config;
  SECTION("good inputs") {
    for (const char* level : {"warn", "warning"}) {
      auto cfg = parse_controller_config(std::string("log_level = ") + level + "\n");
      REQUIRE(cfg);
      CHECK(cfg->log_level == "warning");
    }
    auto debug = parse_controller_config("log_level = debug\n");
    REQUIRE(debug);
    CHECK(debug->log_level == "debug");
    auto none = parse_controller_config("");
    REQUIRE(none);
    CHECK(none->log_level == "info");
  }
  SECTION("bad inputs") {
    CHECK(parse_controller_config("log_level = loud\n").error() ==
          "controller.conf:1: log_level: invalid value 'loud' (expected error, warning (or warn), info or debug)");
    CHECK_FALSE(parse_controller_config("log_level = WARN\n"));
  }
}
