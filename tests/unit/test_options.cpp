#include <catch2/catch.hpp>

#include <algorithm>

#include "ckpt/options.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/site_keys.hpp"

using namespace ckpt;

TEST_CASE("parse_uint", "[parse]") {
  SECTION("good inputs") {
    CHECK(*parse_uint("0") == 0);
    CHECK(*parse_uint("42") == 42);
    CHECK(*parse_uint("18446744073709551615") == 18446744073709551615ULL);
  }
  SECTION("bad inputs") {
    for (const char* bad : {"", "-1", "+1", " 1", "1 ", "1x", "0x10", "18446744073709551616", "1.5"}) {
      INFO(bad);
      CHECK_FALSE(parse_uint(bad).ok());
    }
    CHECK(parse_uint("99999999999999999999").error() == "number too large");
  }
}

TEST_CASE("split", "[parse]") {
  CHECK(split("a,,b", ',') == std::vector<std::string>{"a", "", "b"});
  CHECK(split("", ',') == std::vector<std::string>{""});
  CHECK(split("dp=2,", ',') == std::vector<std::string>{"dp=2", ""});
}

TEST_CASE("parse_seconds", "[parse]") {
  CHECK(*parse_seconds("1h30m") == 5400);
  CHECK(*parse_seconds("45") == 45);
  CHECK(*parse_seconds("0.25s") == Approx(0.25));
  CHECK(*parse_seconds("1.5") == Approx(1.5));
  CHECK(*parse_seconds("120ms") == Approx(0.12));
  CHECK(*parse_seconds("0ms") == 0);
  CHECK(*parse_seconds("1.8h") == Approx(6480));  // a fraction in any unit
  CHECK(*parse_seconds("1.5m") == Approx(90));
  CHECK(*parse_seconds("0.5d") == Approx(43200));
  for (const char* bad : {"", "-0.5s", ".5s", "5.s", "1.5hm", "1.2.3s", "ms", "s", "h", "0x10s", "1e3s", "5 ms",
                          "1.5x", "1h.5m"}) {
    INFO(bad);
    CHECK_FALSE(parse_seconds(bad).ok());
  }
  CHECK(parse_seconds("abc").error() == "not a duration (like 30s, 1h30m, 1.8h, 0.25s or 120ms)");
}

TEST_CASE("parse_duration", "[parse]") {
  SECTION("good inputs") {
    CHECK(*parse_duration("90s") == 90);
    CHECK(*parse_duration("15m") == 900);
    CHECK(*parse_duration("2h") == 7200);
    CHECK(*parse_duration("1h30m") == 5400);
    CHECK(*parse_duration("1d2h3m4s") == 93784);
    CHECK(*parse_duration("45") == 45);
    CHECK(*parse_duration("0s") == 0);
  }
  SECTION("bad inputs") {
    for (const char* bad : {"", "-5", "+5m", "5m ", " 5m", "5x", "5mm", "m", "1m1h", "1h1h", "1.5h", "10m5",
                            "99999999999999999999s", "9999999999999999999d", "h30m"}) {
      INFO(bad);
      CHECK_FALSE(parse_duration(bad).ok());
    }
    CHECK(parse_duration("5y").error() == "unknown unit 'y'");
    CHECK(parse_duration("").error() == "empty value");
  }
  SECTION("format round-trips") {
    for (std::uint64_t s : {0ULL, 1ULL, 59ULL, 60ULL, 900ULL, 5400ULL, 86400ULL, 93784ULL}) {
      CHECK(*parse_duration(format_duration(s)) == s);
    }
    CHECK(format_duration(5400) == "1h30m");
  }
}

TEST_CASE("authinfo_socket: the MUNGE socket of Slurm's AuthInfo", "[parse]") {
  CHECK(authinfo_socket("socket=/run/munge/munge.socket.2") == "/run/munge/munge.socket.2");
  CHECK(authinfo_socket("cred_expire=120,socket=/tmp/m.sock,ttl=5") == "/tmp/m.sock");
  CHECK(authinfo_socket("cred_expire=120") == "");
  CHECK(authinfo_socket("") == "");
  CHECK(authinfo_socket("xsocket=/nope") == "");
}

TEST_CASE("parse_interval", "[options]") {
  SECTION("good inputs") {
    CHECK(format_interval(*parse_interval("auto")) == "auto");
    CHECK(format_interval(*parse_interval("15m")) == "900s");
    CHECK(format_interval(*parse_interval("1h30m")) == "5400s");
    CHECK(format_interval(*parse_interval("500steps")) == "500steps");
  }
  SECTION("bad inputs") {
    for (const char* bad : {"", "-5", "0", "0s", "0steps", "steps", "-3steps", "5 steps", "5step", "Auto", "15m!",
                            "99999999999999999999steps"}) {
      INFO(bad);
      CHECK_FALSE(parse_interval(bad).ok());
    }
  }
}

TEST_CASE("set_job_option names the option and the value", "[options]") {
  JobOptions o;
  auto st = set_job_option(o, OptionId::Interval, "-5");
  REQUIRE_FALSE(st.ok());
  CHECK(st.error() == "--ckpt-interval: invalid value '-5' (expected auto, a duration like 15m, or N steps)");
  CHECK_FALSE(o.any());  // nothing written on error

  SECTION("same value twice is fine, a different one is not") {
    REQUIRE(set_job_option(o, OptionId::Interval, "15m").ok());
    CHECK(set_job_option(o, OptionId::Interval, "900s").ok());
    auto again = set_job_option(o, OptionId::Interval, "1h");
    REQUIRE_FALSE(again.ok());
    CHECK(again.error().starts_with("--ckpt-interval: given twice with different values"));
    CHECK(format_interval(*o.interval) == "900s");
  }
  SECTION("each option rejects bad values") {
    CHECK_FALSE(set_job_option(o, OptionId::Keep, "0").ok());
    CHECK_FALSE(set_job_option(o, OptionId::Keep, "3x").ok());
    CHECK_FALSE(set_job_option(o, OptionId::LastWords, "maybe").ok());
    CHECK_FALSE(set_job_option(o, OptionId::Mtbf, "0").ok());
    CHECK_FALSE(set_job_option(o, OptionId::MaxRestarts, "-1").ok());
    CHECK_FALSE(set_job_option(o, OptionId::Grace, "5q").ok());
    CHECK_FALSE(set_job_option(o, OptionId::Dir, "relative/path").ok());
    CHECK_FALSE(set_job_option(o, OptionId::Dir, "").ok());
    for (const char* bad : {"", "-1", "+1", "1x", "one", "99999999999999999999"}) {
      INFO(bad);
      CHECK_FALSE(set_job_option(o, OptionId::Spares, bad).ok());
    }
    CHECK_FALSE(o.any());
  }
}

TEST_CASE("set_job_option: --ckpt-spares", "[options]") {
  SECTION("good inputs") {
    JobOptions o;
    REQUIRE(set_job_option(o, OptionId::Spares, "0").ok());
    CHECK(*o.spares == 0);
    CHECK(o.any());  // asking for spares, even none, is asking for checkpointing
    JobOptions two;
    REQUIRE(set_job_option(two, OptionId::Spares, "2").ok());
    CHECK(set_job_option(two, OptionId::Spares, "2").ok());
    CHECK(*two.spares == 2);
  }
  SECTION("bad inputs name the option and the value") {
    JobOptions o;
    auto st = set_job_option(o, OptionId::Spares, "x");
    REQUIRE_FALSE(st.ok());
    CHECK(st.error() == "--ckpt-spares: invalid value 'x' (expected a whole number of spare nodes)");
    REQUIRE(set_job_option(o, OptionId::Spares, "1").ok());
    CHECK(set_job_option(o, OptionId::Spares, "2").error() ==
          "--ckpt-spares: given twice with different values (second: '2')");
    CHECK(*o.spares == 1);
  }
  SECTION("the table names it with its site key") {
    CHECK(std::string(option_spec(OptionId::Spares).name) == "ckpt-spares");
    CHECK(std::string(option_spec(OptionId::Spares).key) == "spares");
    CHECK(option_specs().size() == kOptionCount);
  }
}

TEST_CASE("parse_site_policy", "[options][config]") {
  SECTION("good inputs") {
    auto p = parse_site_policy({"interval=30m", "min_interval=5m", "max_interval=1d", "allowed_dirs=/scratch:/tmp//x/",
                                "enabled_by_default=yes", "keep=2", "node_mtbf=1000h", "last_words=off",
                                "dir=/scratch/%u/%j"});
    REQUIRE(p.ok());
    CHECK(p->min_interval_s == 300);
    CHECK(p->max_interval_s == 86400);
    CHECK(p->allowed_dirs == std::vector<std::string>{"/scratch", "/tmp/x"});
    CHECK(p->enabled_by_default);
    CHECK(*p->defaults.keep == 2);
    CHECK(*p->node_mtbf_s == 3600000);
    CHECK_FALSE(*p->defaults.last_words);
    CHECK(parse_site_policy({}).ok());
    CHECK(parse_site_policy({})->max_spares == 4);
    auto spares = parse_site_policy({"spares=1", "max_spares=2"});
    REQUIRE(spares.ok());
    CHECK(*spares->defaults.spares == 1);
    CHECK(spares->max_spares == 2);
    CHECK(parse_site_policy({"max_spares=0"})->max_spares == 0);
    CHECK(parse_site_policy({"spares=0", "max_spares=0"}).ok());
  }
  SECTION("bad inputs fail closed and name the key") {
    CHECK(parse_site_policy({"intervl=5m"}).error() == "plugstack.conf: unknown key 'intervl'");
    CHECK(parse_site_policy({"interval=-5"}).error() ==
          "plugstack.conf: interval: invalid value '-5' (expected auto, a duration like 15m, or N steps)");
    CHECK(parse_site_policy({"keep"}).error() == "plugstack.conf: malformed argument 'keep' (expected key=value)");
    CHECK_FALSE(parse_site_policy({"=5"}).ok());
    CHECK_FALSE(parse_site_policy({"min_interval=5x"}).ok());
    CHECK_FALSE(parse_site_policy({"allowed_dirs=relative"}).ok());
    CHECK_FALSE(parse_site_policy({"allowed_dirs=/a/../b"}).ok());
    CHECK_FALSE(parse_site_policy({"enabled_by_default=perhaps"}).ok());
    CHECK_FALSE(parse_site_policy({"min_interval=1h", "max_interval=5m"}).ok());
    CHECK_FALSE(parse_site_policy({"keep=2", "keep=3"}).ok());
    CHECK_FALSE(parse_site_policy({"node_mtbf=0"}).ok());
    CHECK(parse_site_policy({"max_spares=-1"}).error() ==
          "plugstack.conf: max_spares: invalid value '-1' (expected a whole number)");
    CHECK(parse_site_policy({"max_spares="}).error() ==
          "plugstack.conf: max_spares: invalid value '' (expected a whole number)");
    CHECK(parse_site_policy({"spares=two"}).error() ==
          "plugstack.conf: spares: invalid value 'two' (expected a whole number of spare nodes)");
    // A site default the site's own limit refuses would refuse every job that gives no --ckpt-spares.
    CHECK(parse_site_policy({"spares=3", "max_spares=2"}).error() == "plugstack.conf: spares=3 is above max_spares=2");
    CHECK(parse_site_policy({"spares=5"}).error() == "plugstack.conf: spares=5 is above max_spares=4");
  }
}

TEST_CASE("the node tier's dir: the site's node_dir, exported to every rank", "[options]") {
  JobContext job{"alice", "1", "train", "", 2};
  auto exported = [&](std::vector<std::string> args) {
    args.push_back("dir=/scratch/%u");
    auto s = resolve_settings(JobOptions{}, *parse_site_policy(args), job);
    REQUIRE(s);
    for (const auto& [name, value] : settings_environment(*s)) {
      if (name == "CKPT_NODE_DIR") return value;
    }
    return std::string("(none)");
  };
  CHECK(exported({}) == "/dev/shm");
  CHECK(exported({"node_dir=/local/ram//"}) == "/local/ram");
  CHECK(exported({"node_dir=off"}) == "off");
  CHECK(parse_site_policy({"node_dir=ram"}).error() ==
        "plugstack.conf: node_dir: invalid value 'ram' (expected an absolute path or off)");
  CHECK(parse_site_policy({"node_dir=/a/../b"}).error().find("node_dir") != std::string::npos);
}

TEST_CASE("site_key_specs: every key parses, with its example", "[options][config]") {
  for (const auto& spec : site_key_specs()) {
    INFO(spec.key);
    CHECK(parse_site_policy({std::string(spec.key) + "=" + spec.example}).ok());
    // A key that is also an option would be parsed as the option, never as site policy.
    for (const auto& option : option_specs()) CHECK(std::string(spec.key) != option.key);
  }
}

TEST_CASE("set_job_option: --ckpt-straggler, and the site's straggler=", "[options]") {
  SECTION("good inputs, kept in one spelling") {
    JobOptions o;
    REQUIRE(set_job_option(o, OptionId::Straggler, "0.6,exclude").ok());
    CHECK(*o.straggler == "0.60,exclude");
    CHECK(o.any());
    CHECK(set_job_option(o, OptionId::Straggler, "0.60,exclude").ok());  // the same value again
    JobOptions off;
    REQUIRE(set_job_option(off, OptionId::Straggler, "off").ok());
    CHECK(*off.straggler == "off");
  }
  SECTION("bad inputs name the option and the value") {
    JobOptions o;
    auto st = set_job_option(o, OptionId::Straggler, "0.7,evict");
    REQUIRE_FALSE(st.ok());
    CHECK(st.error() == "--ckpt-straggler: invalid value '0.7,evict' (expected off, or a fraction between 0 and 1 "
                        "with an optional action: 0.7, 0.7,report, 0.6,exclude or 0.6,swap)");
    REQUIRE(set_job_option(o, OptionId::Straggler, "0.7").ok());
    CHECK_FALSE(set_job_option(o, OptionId::Straggler, "0.8").ok());
  }
  SECTION("user over site over built-in") {
    JobContext job{"alice", "1", "train", "", 2};
    auto site = *parse_site_policy({"dir=/scratch/%u", "straggler=0.8,exclude"});
    auto from_site = resolve_settings(JobOptions{}, site, job);
    REQUIRE(from_site);
    CHECK(from_site->straggler == "0.80,exclude");
    JobOptions user;
    REQUIRE(set_job_option(user, OptionId::Straggler, "off").ok());
    CHECK(resolve_settings(user, site, job)->straggler == "off");
    auto builtin = resolve_settings(JobOptions{}, *parse_site_policy({"dir=/scratch/%u"}), job);
    CHECK(builtin->straggler == "0.70,report");
    auto env = settings_environment(*from_site);
    CHECK(std::count(env.begin(), env.end(), std::pair<std::string, std::string>{"CKPT_STRAGGLER", "0.80,exclude"}) ==
          1);
    CHECK_FALSE(parse_site_policy({"straggler=fast"}));
  }
}

TEST_CASE("set_job_option: --ckpt-shrink, and the site's shrink=", "[options]") {
  JobOptions o;
  REQUIRE(set_job_option(o, OptionId::Shrink, "on").ok());
  CHECK(*o.shrink == "on");
  CHECK(o.any());
  auto bad = set_job_option(o, OptionId::Shrink, "0");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error() == "--ckpt-shrink: invalid value '0' (expected off, on, or the fewest data-parallel replicas to go "
                       "on with)");
  CHECK_FALSE(set_job_option(o, OptionId::Shrink, "2").ok());  // another value than the one given
  JobContext job{"alice", "1", "train", "", 2};
  auto site = *parse_site_policy({"dir=/scratch/%u", "shrink=2"});
  auto from_site = resolve_settings(JobOptions{}, site, job);
  REQUIRE(from_site);
  CHECK(from_site->shrink == "2");
  CHECK(resolve_settings(o, site, job)->shrink == "on");
  CHECK(resolve_settings(JobOptions{}, *parse_site_policy({"dir=/scratch/%u"}), job)->shrink == "off");
  auto env = settings_environment(*from_site);
  CHECK(std::count(env.begin(), env.end(), std::pair<std::string, std::string>{"CKPT_SHRINK", "2"}) == 1);
  CHECK_FALSE(parse_site_policy({"shrink=maybe"}));
}

TEST_CASE("parse_memory and format_memory: the memory tier's size", "[options][parse]") {
  SECTION("good inputs") {
    CHECK(*parse_memory("off") == 0);
    CHECK(*parse_memory("0") == 0);
    CHECK(*parse_memory("0G") == 0);
    CHECK(*parse_memory("4G") == 4ull << 30);
    CHECK(*parse_memory("512M") == 512ull << 20);
    CHECK(*parse_memory("1T") == 1ull << 40);
    CHECK(*parse_memory("64K") == 64ull << 10);
    CHECK(*parse_memory("2GiB") == 2ull << 30);
    CHECK(*parse_memory("5GB") == 5'000'000'000);
    CHECK(*parse_memory("1000") == 1000);
    CHECK(*parse_memory("1000B") == 1000);
    CHECK(*parse_memory("16777215T") == 16777215ull << 40);  // the largest whole number of T (16777216T overflows)
  }
  SECTION("bad inputs") {
    for (const char* bad : {"", "on", "OFF", "none", "-1", "-1G", "+4G", "4 G", " 4G", "4G ", "1.5G", "4X", "4g", "G",
                            "0x10", "16777216T", "99999999999999999999", "18446744073709551616"}) {
      INFO(bad);
      CHECK_FALSE(parse_memory(bad).ok());
    }
  }
  SECTION("format_memory reads back exactly, in the shortest exact unit") {
    CHECK(format_memory(0) == "off");
    CHECK(format_memory(4ull << 30) == "4G");
    CHECK(format_memory(512ull << 20) == "512M");
    CHECK(format_memory(3ull << 40) == "3T");
    CHECK(format_memory(5'000'000'000) == "5GB");
    CHECK(format_memory(1000) == "1KB");
    CHECK(format_memory(1001) == "1001");
    for (std::uint64_t b : {0ull, 1ull, 1023ull, 1024ull, 1536ull << 20, 5'000'000'000ull, 12345678901ull,
                            18446744073709551615ull}) {
      INFO(b);
      CHECK(*parse_memory(format_memory(b)) == b);
    }
  }
}

TEST_CASE("set_job_option: --ckpt-memory and --ckpt-memory-interval", "[options]") {
  SECTION("good inputs") {
    JobOptions o;
    REQUIRE(set_job_option(o, OptionId::Memory, "4G").ok());
    CHECK(*o.memory_bytes == 4ull << 30);
    CHECK(o.any());  // asking for the memory tier is asking for checkpointing
    CHECK(set_job_option(o, OptionId::Memory, "4096M").ok());  // the same size again
    JobOptions off;
    REQUIRE(set_job_option(off, OptionId::Memory, "off").ok());
    CHECK(*off.memory_bytes == 0);
    CHECK(off.any());
    JobOptions every;
    REQUIRE(set_job_option(every, OptionId::MemoryInterval, "10").ok());
    CHECK(*every.memory_interval == 10);
    CHECK(every.any());
    JobOptions automatic;
    REQUIRE(set_job_option(automatic, OptionId::MemoryInterval, "auto").ok());
    CHECK(*automatic.memory_interval == kMemoryIntervalAuto);
    CHECK(format_memory_interval(kMemoryIntervalAuto) == "auto");  // what CKPT_MEMORY_INTERVAL carries
    CHECK(format_memory_interval(10) == "10");
    CHECK(*parse_memory_interval(format_memory_interval(kMemoryIntervalAuto)) == kMemoryIntervalAuto);
  }
  SECTION("bad inputs name the option and the value") {
    JobOptions o;
    CHECK(set_job_option(o, OptionId::Memory, "lots").error() ==
          "--ckpt-memory: invalid value 'lots' (expected off, or a size like 4G, 512M or 1T (K, M, G, T: powers of "
          "1024; bytes without a unit))");
    CHECK(set_job_option(o, OptionId::MemoryInterval, "0").error() ==
          "--ckpt-memory-interval: invalid value '0' (expected a whole number of steps, at least 1, or auto)");
    for (const char* bad : {"", "-1", "1.5", "x", "99999999999999999999"}) {
      INFO(bad);
      CHECK_FALSE(set_job_option(o, OptionId::MemoryInterval, bad).ok());
    }
    CHECK_FALSE(o.any());
    REQUIRE(set_job_option(o, OptionId::Memory, "4G").ok());
    CHECK(set_job_option(o, OptionId::Memory, "8G").error() ==
          "--ckpt-memory: given twice with different values (second: '8G')");
    clear_job_option(o, OptionId::Memory);
    CHECK_FALSE(o.memory_bytes);
  }
  SECTION("the table names them with their site keys") {
    CHECK(std::string(option_spec(OptionId::Memory).name) == "ckpt-memory");
    CHECK(std::string(option_spec(OptionId::Memory).key) == "memory");
    CHECK(std::string(option_spec(OptionId::MemoryInterval).name) == "ckpt-memory-interval");
    CHECK(std::string(option_spec(OptionId::MemoryInterval).key) == "memory_interval");
  }
}

TEST_CASE("the memory tier: user over site over built-in, within the site's max_memory", "[options]") {
  JobContext job{"alice", "1", "train", "", 2};
  const std::string dir = "dir=/scratch/%u";
  auto env_has = [](const Settings& s, const char* name, const char* value) {
    auto env = settings_environment(s);
    return std::count(env.begin(), env.end(), std::pair<std::string, std::string>{name, value}) == 1;
  };
  SECTION("defaults: off, every step") {
    auto s = resolve_settings(JobOptions{}, *parse_site_policy({dir}), job);
    REQUIRE(s);
    CHECK(s->memory_bytes == 0);
    CHECK(s->memory_interval == 1);
    CHECK(s->notices.empty());
    CHECK(env_has(*s, "CKPT_MEMORY", "off"));
    CHECK(env_has(*s, "CKPT_MEMORY_INTERVAL", "1"));
    CHECK_FALSE(parse_site_policy({})->max_memory);  // no maximum
  }
  SECTION("the site's defaults, and the user's over them") {
    auto site = *parse_site_policy({dir, "memory=2G", "memory_interval=5", "max_memory=8G"});
    CHECK(*site.max_memory == 8ull << 30);
    auto from_site = resolve_settings(JobOptions{}, site, job);
    REQUIRE(from_site);
    CHECK(from_site->memory_bytes == 2ull << 30);
    CHECK(from_site->memory_interval == 5);
    CHECK(env_has(*from_site, "CKPT_MEMORY", "2G"));
    CHECK(env_has(*from_site, "CKPT_MEMORY_INTERVAL", "5"));
    JobOptions user;
    REQUIRE(set_job_option(user, OptionId::Memory, "8G").ok());  // at the maximum is fine
    REQUIRE(set_job_option(user, OptionId::MemoryInterval, "20").ok());
    auto s = resolve_settings(user, site, job);
    REQUIRE(s);
    CHECK(s->memory_bytes == 8ull << 30);
    CHECK(s->memory_interval == 20);
    CHECK(s->notices.empty());
    JobOptions off;
    REQUIRE(set_job_option(off, OptionId::Memory, "off").ok());
    CHECK(resolve_settings(off, site, job)->memory_bytes == 0);
  }
  SECTION("a request above max_memory is capped, with one line") {
    auto site = *parse_site_policy({dir, "max_memory=4G"});
    JobOptions user;
    REQUIRE(set_job_option(user, OptionId::Memory, "8G").ok());
    auto s = resolve_settings(user, site, job);
    REQUIRE(s);
    CHECK(s->memory_bytes == 4ull << 30);
    CHECK(s->notices ==
          std::vector<std::string>{"--ckpt-memory: 8G is above the site maximum of 4G: the memory tier uses 4G"});
    CHECK(env_has(*s, "CKPT_MEMORY", "4G"));
  }
  SECTION("max_memory=0: the site has no memory tier") {
    for (const char* none : {"max_memory=0", "max_memory=off"}) {
      INFO(none);
      auto site = *parse_site_policy({dir, none});
      CHECK(*site.max_memory == 0);
      JobOptions user;
      REQUIRE(set_job_option(user, OptionId::Memory, "512M").ok());
      auto s = resolve_settings(user, site, job);
      REQUIRE(s);
      CHECK(s->memory_bytes == 0);
      CHECK(s->notices == std::vector<std::string>{"--ckpt-memory: 512M is above the site maximum of 0 (the site "
                                                   "allows no memory tier): the memory tier is off"});
      CHECK(env_has(*s, "CKPT_MEMORY", "off"));
      JobOptions off;
      REQUIRE(set_job_option(off, OptionId::Memory, "0").ok());
      CHECK(resolve_settings(off, site, job)->notices.empty());
      CHECK(resolve_settings(JobOptions{}, site, job)->notices.empty());
    }
  }
  SECTION("bad site values fail closed and name the key") {
    CHECK(parse_site_policy({"max_memory=lots"}).error() ==
          "plugstack.conf: max_memory: invalid value 'lots' (expected off, or a size like 4G, 512M or 1T (K, M, G, T: "
          "powers of 1024; bytes without a unit))");
    CHECK(parse_site_policy({"max_memory=-1G"}).error().starts_with("plugstack.conf: max_memory: invalid value"));
    CHECK(parse_site_policy({"memory=4 G"}).error().starts_with("plugstack.conf: memory: invalid value '4 G'"));
    CHECK(parse_site_policy({"memory_interval=0"}).error() ==
          "plugstack.conf: memory_interval: invalid value '0' (expected a whole number of steps, at least 1, or auto)");
    // A site default the site's own maximum caps would warn every job that gives no --ckpt-memory.
    CHECK(parse_site_policy({"memory=8G", "max_memory=4G"}).error() ==
          "plugstack.conf: memory=8G is above max_memory=4G");
    CHECK(parse_site_policy({"memory=1G", "max_memory=0"}).error() ==
          "plugstack.conf: memory=1G is above max_memory=0");
    CHECK(parse_site_policy({"memory=off", "max_memory=0"}).ok());
  }
}

TEST_CASE("resolve_settings merges user over site over built-in", "[options]") {
  JobContext job{"alice", "1234", "train", "", 4};
  auto policy = *parse_site_policy({"dir=/scratch/%u/%j", "keep=5", "allowed_dirs=/scratch", "node_mtbf=400h"});
  JobOptions user;
  REQUIRE(set_job_option(user, OptionId::Interval, "15m").ok());
  auto s = resolve_settings(user, policy, job);
  REQUIRE(s.ok());
  CHECK(s->dir == "/scratch/alice/1234");
  CHECK(s->keep == 5);
  CHECK(s->mtbf_s == 100 * 3600);  // node MTBF / node count
  auto env = settings_environment(*s);
  CHECK(env[0] == std::pair<std::string, std::string>{"CKPT_DIR", "/scratch/alice/1234"});
  CHECK(env[1].second == "900s");
  CHECK(std::count(env.begin(), env.end(), std::pair<std::string, std::string>{"CKPT_MIN_INTERVAL", "60s"}) == 1);
  CHECK(std::count(env.begin(), env.end(), std::pair<std::string, std::string>{"CKPT_MAX_INTERVAL", "0s"}) == 1);
  CHECK(s->spares == 0);
  CHECK(std::count(env.begin(), env.end(), std::pair<std::string, std::string>{"CKPT_SPARES", "0"}) == 1);
  CHECK(std::count(env.begin(), env.end(), std::pair<std::string, std::string>{"CKPT_MAX_SPARES", "4"}) == 1);

  SECTION("interval bounds") {
    JobOptions fast;
    REQUIRE(set_job_option(fast, OptionId::Interval, "10s").ok());
    auto r = resolve_settings(fast, policy, job);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error() == "--ckpt-interval: 10s is below the site minimum of 1m");
  }
  SECTION("spares: the user's, else the site's, within the site's limit") {
    JobOptions two;
    REQUIRE(set_job_option(two, OptionId::Spares, "2").ok());
    auto r = resolve_settings(two, policy, job);
    REQUIRE(r.ok());
    CHECK(r->spares == 2);
    CHECK(r->max_spares == 4);
    auto site = *parse_site_policy({"dir=/scratch/%u/%j", "spares=1", "max_spares=2"});
    auto from_site = resolve_settings(user, site, job);
    REQUIRE(from_site.ok());
    CHECK(from_site->spares == 1);
    auto site_env = settings_environment(*from_site);
    CHECK(std::count(site_env.begin(), site_env.end(), std::pair<std::string, std::string>{"CKPT_SPARES", "1"}) == 1);
    CHECK(std::count(site_env.begin(), site_env.end(),
                     std::pair<std::string, std::string>{"CKPT_MAX_SPARES", "2"}) == 1);
    CHECK(resolve_settings(two, site, job)->spares == 2);  // at the limit is fine
  }
  SECTION("spares above the site's limit are refused") {
    JobOptions many;
    REQUIRE(set_job_option(many, OptionId::Spares, "5").ok());
    auto r = resolve_settings(many, policy, job);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error() == "--ckpt-spares: 5 is above the site maximum of 4");
    auto none = *parse_site_policy({"dir=/scratch/%u/%j", "max_spares=0"});
    JobOptions one;
    REQUIRE(set_job_option(one, OptionId::Spares, "1").ok());
    CHECK(resolve_settings(one, none, job).error() ==
          "--ckpt-spares: 1 is above the site maximum of 0 (the site allows no spares)");
    JobOptions zero;
    REQUIRE(set_job_option(zero, OptionId::Spares, "0").ok());
    CHECK(resolve_settings(zero, none, job).ok());
  }
  SECTION("dir outside the allowed prefixes") {
    JobOptions elsewhere;
    REQUIRE(set_job_option(elsewhere, OptionId::Dir, "/scratchy/%u").ok());
    auto r = resolve_settings(elsewhere, policy, job);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error() == "--ckpt-dir: '/scratchy/alice' is outside the allowed checkpoint dirs (/scratch)");
  }
  SECTION("hostile expansions and paths") {
    JobContext evil{"alice", "1", "../../etc", "", 1};
    JobOptions named;
    REQUIRE(set_job_option(named, OptionId::Dir, "/scratch/%x").ok());
    CHECK_FALSE(resolve_settings(named, policy, evil).ok());
    JobOptions climb;
    REQUIRE(set_job_option(climb, OptionId::Dir, "/scratch/../etc").ok());
    CHECK_FALSE(resolve_settings(climb, policy, job).ok());
    JobOptions bad_escape;
    REQUIRE(set_job_option(bad_escape, OptionId::Dir, "/scratch/%q").ok());
    CHECK(resolve_settings(bad_escape, policy, job).error() ==
          "--ckpt-dir: invalid value '/scratch/%q': unknown escape '%q'");
  }
  SECTION("expansions that are not exactly one safe component") {
    JobOptions named;
    REQUIRE(set_job_option(named, OptionId::Dir, "/scratch/%u/%x").ok());
    CHECK(resolve_settings(named, policy, JobContext{"alice", "1", "..", "", 1}).error() ==
          "--ckpt-dir: invalid value '/scratch/%u/%x': %x expands to '..', which is not a path component");
    CHECK(resolve_settings(named, policy, JobContext{"alice", "1", "a\nb", "", 1}).error() ==
          "--ckpt-dir: invalid value '/scratch/%u/%x': %x expands to 'a\\x0ab', which contains a control character");
    CHECK(resolve_settings(named, policy, JobContext{"", "1", "train", "", 1}).error() ==
          "--ckpt-dir: invalid value '/scratch/%u/%x': %u expands to '', which is empty (the dir would be shared "
          "with other jobs)");
    CHECK(resolve_settings(named, policy, JobContext{"alice", "1", "", "", 1}).error().find("%x expands to ''") !=
          std::string::npos);
    CHECK_FALSE(resolve_settings(named, policy, JobContext{"alice", "1", std::string(256, 'n'), "", 1}).ok());
    CHECK(resolve_settings(named, policy, JobContext{"alice", "1", "my job-2.x", "", 1}).ok());
  }
  SECTION("the trusted prefixes of a dir are the allowed dirs that hold it") {
    CHECK(trusted_prefixes_of("/scratch/alice/1", policy) == std::vector<std::string>{"/scratch"});
    CHECK(trusted_prefixes_of("/scratch/alice/1", SitePolicy{}).empty());
  }
  SECTION("no dir anywhere is an error") {
    CHECK_FALSE(resolve_settings(user, SitePolicy{}, job).ok());
  }
}

TEST_CASE("run_spares: ckpt-run's --spares, else CKPT_SPARES, within CKPT_MAX_SPARES", "[options]") {
  using Spares = std::optional<std::uint64_t>;
  using Env = std::optional<std::string_view>;
  const Env unset;
  SECTION("good inputs") {
    CHECK(*run_spares(Spares{}, unset, unset) == Spares{});     // no spares: relaunch, as without the plugin
    CHECK(*run_spares(Spares{2}, unset, unset) == Spares{2});   // --spares alone, as before
    CHECK(*run_spares(Spares{0}, unset, unset) == Spares{0});   // --spares 0: in place, no spare
    CHECK(*run_spares(Spares{}, Env{"1"}, Env{"4"}) == Spares{1});
    CHECK(*run_spares(Spares{}, Env{"0"}, Env{"4"}) == Spares{});  // the plugin's default selects nothing
    CHECK(*run_spares(Spares{3}, Env{"1"}, Env{"4"}) == Spares{3});  // --spares wins over the job's option
    CHECK(*run_spares(Spares{0}, Env{"1"}, Env{"0"}) == Spares{0});
    CHECK(*run_spares(Spares{4}, unset, Env{"4"}) == Spares{4});
  }
  SECTION("above the limit") {
    CHECK(run_spares(Spares{5}, Env{"0"}, Env{"4"}).error() ==
          "--spares: 5 is above the site maximum of 4 (CKPT_MAX_SPARES)");
    CHECK(run_spares(Spares{1}, unset, Env{"0"}).error() ==
          "--spares: 1 is above the site maximum of 0 (CKPT_MAX_SPARES: the site allows no spares)");
    CHECK(run_spares(Spares{}, Env{"3"}, Env{"2"}).error() ==
          "CKPT_SPARES: 3 is above the site maximum of 2 (CKPT_MAX_SPARES)");
  }
  SECTION("bad inputs name the variable and the value") {
    CHECK(run_spares(Spares{}, Env{"x"}, unset).error() ==
          "CKPT_SPARES: invalid value 'x' (expected a whole number)");
    CHECK(run_spares(Spares{}, Env{""}, unset).error() == "CKPT_SPARES: invalid value '' (expected a whole number)");
    CHECK(run_spares(Spares{1}, unset, Env{"-1"}).error() ==
          "CKPT_MAX_SPARES: invalid value '-1' (expected a whole number)");
    CHECK(run_spares(Spares{}, Env{"1"}, Env{"4 "}).error() ==
          "CKPT_MAX_SPARES: invalid value '4 ' (expected a whole number)");
    CHECK_FALSE(run_spares(Spares{}, unset, Env{"many"}).ok());  // even when nothing asks for spares
    CHECK(run_spares(Spares{2}, Env{"2x"}, unset).error() ==     // even when --spares overrides it
          "CKPT_SPARES: invalid value '2x' (expected a whole number)");
    CHECK(run_spares(Spares{}, Env{"1\n2"}, unset).error() ==    // one line
          "CKPT_SPARES: invalid value '1\\x0a2' (expected a whole number)");
  }
}

TEST_CASE("path_within compares whole components", "[options]") {
  CHECK(path_within("/scratch/a", "/scratch"));
  CHECK(path_within("/scratch", "/scratch"));
  CHECK_FALSE(path_within("/scratchy", "/scratch"));
  CHECK(path_within("/anything", "/"));
  CHECK(*normalize_absolute_path("//a/./b/") == "/a/b");
}
