// CKPT_INTERVAL=auto in the hooks: rank 0 measures each checkpoint (stall, interference, persist) and recomputes
// the interval with AutoInterval; the stats and the log show the choice and its inputs.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "ckpt/interval.hpp"
#include "hooks_test_util.hpp"

using namespace ckpt;
using namespace ckpt::hooks;
using namespace std::chrono_literals;

namespace {

// Runs steps (a short sleep each) until `checkpoints` checkpoints were measured or `max_steps` passed.
std::uint64_t run_until_measured(Checkpointer& cp, std::uint64_t first, std::uint64_t checkpoints,
                                 std::uint64_t max_steps) {
  std::uint64_t step = first;
  for (; step < first + max_steps && cp.stats().auto_checkpoints < checkpoints; ++step) {
    std::this_thread::sleep_for(2ms);
    REQUIRE(cp.before_update().ok());
    auto stop = cp.after_step(step);
    REQUIRE(stop.ok());
  }
  return step;
}

}  // namespace

TEST_CASE("auto interval follows the measured checkpoints on rank 0", "[hooks][auto]") {
  test::TempDir dir;
  test::LogCapture log;
  // A large M keeps Daly's τ above the 60 s minimum for a millisecond δ, so the interval follows δ.
  auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "auto"}, {"mtbf", "1000000000s"}}));
  std::vector<std::uint64_t> state(1u << 20, 7);  // 8 MiB
  REQUIRE(cp->register_region({"w", state.data(), state.size() * 8}).ok());

  Stats before = cp->stats();
  CHECK(before.auto_interval_s == Approx(1800));  // δ unknown: the initial interval
  CHECK(before.auto_mtbf_s == Approx(1e9));
  CHECK(before.auto_checkpoints == 0);
  CHECK(log.has("CKPT_INTERVAL=auto: "));

  std::uint64_t step = run_until_measured(*cp, 1, 0, 5);
  for (std::uint64_t n = 1; n <= 2; ++n) {
    REQUIRE(cp->save(step).ok());
    step = run_until_measured(*cp, step + 1, n, 5000);
    Stats s = cp->stats();
    REQUIRE(s.auto_checkpoints == n);
    // The same measurements fed to AutoInterval give the same choice.
    interval::AutoInterval expected;
    REQUIRE(expected.set_mtbf(1e9).ok());
    CHECK(s.auto_interference_s >= 0);
    CHECK(s.auto_persist_floor_s > 0);
    CHECK(s.auto_cost_s == Approx(s.auto_stall_s + s.auto_interference_s).margin(1e-9));
    if (n == 1) {  // one sample: the medians are that checkpoint's own figures
      CHECK(s.auto_stall_s == Approx(s.last_stall_s));
      CHECK(s.auto_persist_floor_s == Approx(s.last_persist_s));
      REQUIRE(expected.observe_checkpoint(s.auto_stall_s, s.auto_interference_s, s.last_persist_s).ok());
      CHECK(s.auto_interval_s == Approx(expected.interval_s()));
      CHECK(s.auto_interval_s != Approx(1800));
      CHECK(expected.inputs().source == interval::AutoInterval::Source::Daly);
    }
    // The persist is a floor, and the log line names every input.
    CHECK(s.auto_interval_s >= s.auto_persist_floor_s);
    CHECK(s.auto_interval_inputs.find("persist floor") != std::string::npos);
  }
  CHECK(log.has("CKPT_INTERVAL=auto: interval"));
  REQUIRE(cp->close().ok());
}

TEST_CASE("auto interval stats stay zero for a fixed interval and on other ranks", "[hooks][auto]") {
  test::TempDir dir;
  SECTION("fixed interval") {
    auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "15m"}}));
    CHECK(cp->stats().auto_interval_s == 0);
    CHECK(cp->stats().auto_interval_inputs.empty());
  }
  SECTION("rank 1 of 2 does not decide") {
    test::IdleRank rank0(test::options({{"dir", dir.path()}, {"interval", "auto"}, {"rank", "0"},
                                        {"world_size", "2"}}));
    auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "auto"}, {"rank", "1"},
                                        {"world_size", "2"}}));
    CHECK(cp->stats().auto_interval_s == 0);
    CHECK(rank0.release() == "");
  }
}

TEST_CASE("auto interval respects the site's bounds and measures δ early", "[hooks][auto]") {
  test::TempDir dir;
  SECTION("a short MTBF: the first checkpoint after a tenth of it") {
    auto cp = test::make(test::options(
        {{"dir", dir.path()}, {"interval", "auto"}, {"mtbf", "60s"}, {"min_interval", "1s"}}));
    CHECK(cp->stats().auto_interval_s == Approx(6));
  }
  SECTION("never below the site minimum") {
    auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "auto"}, {"mtbf", "60s"}}));
    CHECK(cp->stats().auto_interval_s == Approx(60));
  }
  SECTION("never above the site maximum") {
    auto cp = test::make(test::options(
        {{"dir", dir.path()}, {"interval", "auto"}, {"min_interval", "1s"}, {"max_interval", "10m"}}));
    CHECK(cp->stats().auto_interval_s == Approx(600));
  }
}

TEST_CASE("auto interval measurements outlive a restart", "[hooks][auto]") {
  test::TempDir dir;
  test::LogCapture log;
  Stats first;
  {
    auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "auto"}, {"mtbf", "1000000000s"}}));
    std::vector<std::uint64_t> state(1u << 16, 7);
    REQUIRE(cp->register_region({"w", state.data(), state.size() * 8}).ok());
    std::uint64_t step = run_until_measured(*cp, 1, 0, 5);
    REQUIRE(cp->save(step).ok());
    run_until_measured(*cp, step + 1, 1, 5000);
    first = cp->stats();
    REQUIRE(first.auto_checkpoints == 1);
    REQUIRE(cp->close().ok());
  }
  CHECK(std::filesystem::exists(dir.sub(".control/auto-interval.json")));
  SECTION("the next run starts from them") {
    auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "auto"}, {"mtbf", "1000000000s"}}));
    Stats s = cp->stats();
    CHECK(s.auto_checkpoints == 1);
    CHECK(s.auto_interval_s == Approx(first.auto_interval_s));
    CHECK(s.auto_interval_s != Approx(1800));
    CHECK(log.has("CKPT_INTERVAL=auto: starting from 1 checkpoint measurements of earlier runs"));
    REQUIRE(cp->close().ok());
  }
  SECTION("a damaged file is named and ignored") {
    std::ofstream(dir.sub(".control/auto-interval.json"), std::ios::trunc) << R"({"version": 1, "checkpoints": [[1, 2]]})";
    auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "auto"}, {"mtbf", "1000000000s"}}));
    CHECK(cp->stats().auto_checkpoints == 0);
    CHECK(cp->stats().auto_interval_s == Approx(1800));
    CHECK(log.has("earlier measurements not used: .control/auto-interval.json: checkpoint 0 is not [stall, "
                  "interference, persist]"));
    REQUIRE(cp->close().ok());
  }
}
