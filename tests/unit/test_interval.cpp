#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "ckpt/interval.hpp"

using namespace ckpt::interval;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

TEST_CASE("young and daly against hand-computed values", "[interval]") {
  SECTION("good inputs") {
    // δ = 50 s, M = 10000 s: √(2·50·10000) = 1000 exactly.
    CHECK(young(50, 10000) == Approx(1000).epsilon(1e-12));
    // δ/2M = 0.0025, √ = 0.05: 1000·(1 + 0.05/3 + 0.0025/9) − 50 = 1016.9444… − 50.
    CHECK(daly(50, 10000) == Approx(1000 * (1 + 0.05 / 3 + 0.0025 / 9) - 50).epsilon(1e-12));
    CHECK(daly(50, 10000) == Approx(966.9444).margin(1e-4));
    // The issue's example: δ = 30 s, M = 6 h.
    CHECK(young(30, 21600) == Approx(1138.41996).margin(1e-4));
    CHECK(daly(30, 21600) == Approx(1118.50780).margin(1e-4));
    // δ = 2 s, M = 1 h: √14400 = 120.
    CHECK(young(2, 3600) == Approx(120));
  }
  SECTION("limit: δ >= 2M gives τ = M") {
    CHECK(daly(100, 50) == 50);
    CHECK(daly(2 * 3600, 3600) == 3600);  // exactly at the boundary
    // Just below the boundary Daly's expression is used: √(2δM)·(1 + 1/3 + 1/9) − δ with δ = 2M, i.e. 8M/9.
    // Daly's piecewise result jumps there; the test pins that down rather than smoothing it.
    double m = 3600, d = 2 * m * (1 - 1e-12);
    CHECK(daly(d, m) == Approx(8 * m / 9).epsilon(1e-6));
  }
  SECTION("limit: M -> infinity") {
    CHECK(std::isinf(young(30, kInf)));
    CHECK(std::isinf(daly(30, kInf)));
    // Daly's correction vanishes relative to Young as δ/M -> 0.
    CHECK(daly(30, 1e12) / young(30, 1e12) == Approx(1).epsilon(1e-4));
    CHECK(waste_fraction({30, 120, kInf}, kInf) == 0);
    CHECK(waste_fraction({30, 120, kInf}, 3600) == Approx(30.0 / 3600));
  }
  SECTION("limit: zero cost") {
    CHECK(young(0, 21600) == 0);
    CHECK(daly(0, 21600) == 0);
    CHECK(young(0, kInf) == 0);
    CHECK(daly(0, kInf) == 0);
    // Checkpointing for free and continuously: only the restart is lost.
    CHECK(waste_fraction({0, 120, 21600}, 0) == Approx(120.0 / 21600));
    CHECK(waste_fraction({0, 0, 21600}, 0) == 0);
  }
}

TEST_CASE("waste fraction and goodput", "[interval]") {
  SECTION("good inputs") {
    // δ/τ + (τ/2 + R)/M = 50/1000 + (500 + 100)/10000.
    CHECK(waste_fraction({50, 100, 10000}, 1000) == Approx(0.11));
    CHECK(goodput({50, 100, 10000}, 1000) == Approx(0.89));
    CHECK(waste_fraction({30, 120, 21600}, young(30, 21600)) == Approx(0.0582602).margin(1e-6));
    // Young minimizes the first-order waste: moving either way costs more.
    Params p{30, 120, 21600};
    double y = young(p.cost_s, p.mtbf_s);
    CHECK(waste_fraction(p, y) < waste_fraction(p, y * 0.9));
    CHECK(waste_fraction(p, y) < waste_fraction(p, y * 1.1));
    // The restart cost does not move the optimum, only the loss.
    CHECK(waste_fraction({30, 0, 21600}, y) + 120.0 / 21600 == Approx(waste_fraction(p, y)));
  }
  SECTION("bad intervals") {
    CHECK(std::isinf(waste_fraction({30, 0, 21600}, 0)));
    CHECK(std::isinf(waste_fraction({30, 0, 21600}, -5)));
    CHECK(goodput({30, 0, 21600}, 0) == 0);
    CHECK(goodput({30, 0, 100}, 1e6) == 0);  // clamped: the model says more than everything is lost
  }
}

TEST_CASE("optimize and check", "[interval]") {
  SECTION("good inputs") {
    auto o = optimize({30, 120, 21600});
    REQUIRE(o.ok());
    CHECK(o->young_s == Approx(1138.41996).margin(1e-4));
    CHECK(o->daly_s == Approx(1118.50780).margin(1e-4));
    CHECK(o->daly_waste == Approx(0.0582684).margin(1e-6));
    CHECK(optimize({0, 0, 1}).ok());
    CHECK(optimize({30, 0, kInf}).ok());
  }
  SECTION("bad inputs") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (Params p : {Params{30, 0, 0}, Params{30, 0, -1}, Params{30, 0, nan}, Params{-1, 0, 3600}, Params{nan, 0, 3600},
                     Params{kInf, 0, 3600}, Params{30, -1, 3600}, Params{30, kInf, 3600}}) {
      INFO(p.cost_s << " " << p.restart_s << " " << p.mtbf_s);
      CHECK_FALSE(check(p).ok());
      CHECK_FALSE(optimize(p).ok());
    }
    CHECK(check({30, 0, 0}).error() == "MTBF must be a positive duration (got 0s)");
    CHECK(check({-2, 0, 10}).error() == "checkpoint cost must be a finite duration >= 0 (got -2s)");
    CHECK(check({2, -3, 10}).error() == "restart cost must be a finite duration >= 0 (got -3s)");
  }
}

TEST_CASE("job_mtbf divides the node MTBF by the node count", "[interval]") {
  SECTION("good inputs") {
    CHECK(*job_mtbf(86400 * 1000.0, 1000) == Approx(86400));
    CHECK(*job_mtbf(3600, 1) == 3600);
  }
  SECTION("bad inputs") {
    CHECK(job_mtbf(3600, 0).error() == "node count must be at least 1");
    CHECK_FALSE(job_mtbf(0, 4).ok());
    CHECK_FALSE(job_mtbf(-1, 4).ok());
  }
}

TEST_CASE("format_seconds", "[interval]") {
  CHECK(format_seconds(1118.5) == "18m39s");
  CHECK(format_seconds(1138.42) == "18m58s");
  CHECK(format_seconds(0) == "0s");
  CHECK(format_seconds(0.5) == "0.5s");
  CHECK(format_seconds(kInf) == "inf");
  CHECK(format_seconds(90000) == "1d1h");
}

TEST_CASE("AutoInterval", "[interval]") {
  AutoInterval::Config config;
  config.mtbf_s = 21600;
  auto created = AutoInterval::create(config);
  REQUIRE(created.ok());
  AutoInterval a = *created;

  SECTION("uses the initial interval until a checkpoint is measured") {
    CHECK(a.interval_s() == 1800);
    CHECK(a.inputs().source == AutoInterval::Source::Initial);
    CHECK(a.describe().find("no checkpoint measured yet") != std::string::npos);
  }

  SECTION("δ is stall plus interference, and Daly's τ follows it") {
    REQUIRE(a.observe_checkpoint(12, 18, 5).ok());
    CHECK(a.inputs().cost_s == 30);
    CHECK(a.inputs().stall_s == 12);
    CHECK(a.inputs().interference_s == 18);
    CHECK(a.inputs().source == AutoInterval::Source::Daly);
    CHECK(a.interval_s() == Approx(daly(30, 21600)));
    CHECK(a.inputs().young_s == Approx(young(30, 21600)));
    CHECK(a.inputs().waste_fraction == Approx(waste_fraction({30, 0, 21600}, daly(30, 21600))));
    CHECK(a.describe().starts_with("interval 18m39s (daly); daly 18m39s, young 18m58s; cost 30s"));

    SECTION("a slower file system raises δ and τ once it is the majority") {
      for (int i = 0; i < 4; ++i) REQUIRE(a.observe_checkpoint(30, 30, 5).ok());
      CHECK(a.inputs().cost_s == 60);
      CHECK(a.interval_s() == Approx(daly(60, 21600)));
    }
    SECTION("the restart cost is reported but does not move τ") {
      double before = a.interval_s();
      REQUIRE(a.observe_restart(120).ok());
      CHECK(a.inputs().restart_s == 120);
      CHECK(a.interval_s() == before);
      CHECK(a.inputs().waste_fraction == Approx(waste_fraction({30, 120, 21600}, before)));
    }
    SECTION("a new MTBF recomputes τ") {
      REQUIRE(a.set_mtbf(3600).ok());
      CHECK(a.interval_s() == Approx(daly(30, 3600)));
      REQUIRE(a.set_mtbf(kInf).ok());
      CHECK(std::isinf(a.interval_s()));
    }
  }

  SECTION("one outlier does not move the estimate") {
    for (int i = 0; i < 8; ++i) REQUIRE(a.observe_checkpoint(10, 20, 5).ok());
    REQUIRE(a.observe_checkpoint(3000, 0, 5).ok());
    CHECK(a.inputs().cost_s == 30);
    CHECK(a.interval_s() == Approx(daly(30, 21600)));
  }

  SECTION("the window forgets old measurements") {
    for (int i = 0; i < 9; ++i) REQUIRE(a.observe_checkpoint(10, 20, 5).ok());
    for (int i = 0; i < 9; ++i) REQUIRE(a.observe_checkpoint(5, 5, 5).ok());
    CHECK(a.inputs().cost_s == 10);
    CHECK(a.inputs().checkpoints == 18);
  }

  SECTION("the persist time is a floor") {
    REQUIRE(a.observe_checkpoint(10, 20, 2500).ok());
    CHECK(a.interval_s() == 2500);
    CHECK(a.inputs().source == AutoInterval::Source::PersistFloor);
    CHECK(a.inputs().persist_floor_s == 2500);
    // The slowest persist in the window counts, until it leaves the window.
    for (int i = 0; i < 8; ++i) REQUIRE(a.observe_checkpoint(10, 20, 100).ok());
    CHECK(a.interval_s() == 2500);
    REQUIRE(a.observe_checkpoint(10, 20, 100).ok());
    CHECK(a.inputs().source == AutoInterval::Source::Daly);
    CHECK(a.interval_s() == Approx(daly(30, 21600)));
  }

  SECTION("a tiny δ is held at the minimum") {
    REQUIRE(a.observe_checkpoint(0.01, 0, 0.5).ok());
    CHECK(a.interval_s() == 60);
    CHECK(a.inputs().source == AutoInterval::Source::Minimum);
    REQUIRE(a.observe_checkpoint(0, 0, 0).ok());
    REQUIRE(a.observe_checkpoint(0, 0, 0).ok());
    CHECK(a.inputs().cost_s == 0);
    CHECK(a.interval_s() == 60);
  }

  SECTION("bad inputs are rejected and change nothing") {
    REQUIRE(a.observe_checkpoint(12, 18, 5).ok());
    const double before = a.interval_s();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    CHECK(a.observe_checkpoint(-1, 0, 0).error() == "stall must be a finite number of seconds >= 0 (got -1)");
    CHECK_FALSE(a.observe_checkpoint(1, nan, 0).ok());
    CHECK_FALSE(a.observe_checkpoint(1, 0, kInf).ok());
    CHECK_FALSE(a.observe_restart(-5).ok());
    CHECK(a.set_mtbf(0).error() == "MTBF must be positive (got 0s)");
    CHECK_FALSE(a.set_mtbf(-3600).ok());
    CHECK_FALSE(a.set_mtbf(nan).ok());
    CHECK(a.inputs().checkpoints == 1);
    CHECK(a.inputs().mtbf_s == 21600);
    CHECK(a.interval_s() == before);
  }
}

TEST_CASE("AutoInterval bounds and config", "[interval]") {
  SECTION("good inputs") {
    AutoInterval::Config config;
    config.mtbf_s = 21600;
    config.max_interval_s = 600;
    auto a = AutoInterval::create(config);
    REQUIRE(a.ok());
    REQUIRE(a->observe_checkpoint(30, 0, 10).ok());
    CHECK(a->interval_s() == 600);
    CHECK(a->inputs().source == AutoInterval::Source::Maximum);
    // The persist floor wins over the maximum: overlapping persists would only queue.
    REQUIRE(a->observe_checkpoint(30, 0, 900).ok());
    CHECK(a->interval_s() == 900);
    CHECK(a->inputs().source == AutoInterval::Source::PersistFloor);

    AutoInterval defaults;
    CHECK(defaults.inputs().mtbf_s == 86400);
    CHECK(defaults.interval_s() == 1800);
  }
  SECTION("bad inputs") {
    auto bad = [](auto edit) {
      AutoInterval::Config c;
      edit(c);
      return AutoInterval::create(c);
    };
    CHECK(bad([](auto& c) { c.min_interval_s = 0; }).error() ==
          "min_interval_s must be a positive finite duration (got 0)");
    CHECK_FALSE(bad([](auto& c) { c.initial_interval_s = -1; }).ok());
    CHECK_FALSE(bad([](auto& c) { c.max_interval_s = 30; }).ok());  // below the minimum
    CHECK_FALSE(bad([](auto& c) { c.mtbf_s = 0; }).ok());
    CHECK_FALSE(bad([](auto& c) { c.window = 0; }).ok());
  }
}

TEST_CASE("AutoInterval measurements round-trip through JSON; bad input changes nothing", "[interval]") {
  AutoInterval first;
  REQUIRE(first.set_mtbf(1e9).ok());
  REQUIRE(first.observe_checkpoint(0.02, 0.01, 0.5).ok());
  REQUIRE(first.observe_checkpoint(0.04, 0.00, 0.7).ok());
  REQUIRE(first.observe_restart(12).ok());

  AutoInterval next;
  REQUIRE(next.set_mtbf(1e9).ok());
  auto replayed = next.replay_measurements(first.measurements_json());
  REQUIRE(replayed.ok());
  CHECK(*replayed == 2);
  CHECK(next.interval_s() == Approx(first.interval_s()));
  CHECK(next.inputs().cost_s == Approx(first.inputs().cost_s));
  CHECK(next.inputs().persist_floor_s == Approx(0.7));
  CHECK(next.inputs().restart_s == Approx(12));
  CHECK(next.inputs().checkpoints == 2);

  AutoInterval fresh;
  const double initial = fresh.interval_s();
  for (const char* bad : {"", "[]", "not json", R"({"version": 2, "checkpoints": []})",
                          R"({"version": 1, "checkpoints": [[0.1, 0.2]]})",
                          R"({"version": 1, "checkpoints": [[0.1, 0.2, 0.3], [0.1, -1, 0.3]]})",
                          R"({"version": 1, "checkpoints": [[0.1, "x", 0.3]]})",
                          R"({"version": 1, "checkpoints": {}})",
                          R"({"version": 1, "checkpoints": [[0.1, 0.2, 0.3]], "restarts": ["soon"]})"}) {
    CAPTURE(bad);
    CHECK_FALSE(fresh.replay_measurements(bad).ok());
    CHECK(fresh.inputs().checkpoints == 0);  // nothing recorded, not even the good entries before the bad one
    CHECK(fresh.interval_s() == Approx(initial));
  }
}

TEST_CASE("StepMeter: a checkpoint's interference is its steps' excess over the quiet median", "[interval]") {
  using ckpt::interval::StepMeter;
  StepMeter meter(0);
  StepMeter::Worker idle;
  double t = 0;
  for (int i = 0; i < 5; ++i) CHECK_FALSE(meter.on_step(t += 1.0, idle));  // quiet steps of 1 s
  meter.on_guard(0.5);  // the guard stalled half a second: not step time
  CHECK_FALSE(meter.on_step(t += 1.5, idle));
  meter.on_snapshot(t += 0.2, /*persisted=*/0, /*failed=*/0);
  StepMeter::Worker busy;
  busy.pending = 1;
  CHECK_FALSE(meter.on_step(t += 1.3, busy));  // 0.3 s over the median
  CHECK_FALSE(meter.on_step(t += 1.1, busy));  // 0.1 s over
  StepMeter::Worker done;
  done.persisted = 1;
  done.last_stall_s = 0.2;
  done.last_persist_s = 2.5;
  auto m = meter.on_step(t += 1.0, done);
  REQUIRE(m);
  CHECK(m->interference_s == Approx(0.4));
  CHECK(m->stall_s == Approx(0.2));
  CHECK(m->persist_s == Approx(2.5));
  CHECK_FALSE(meter.on_step(t += 1.0, done));  // measured once

  SECTION("a persist shorter than a step: the step it ended in is its interference, not a quiet step") {
    meter.on_snapshot(t += 0.1, 1, 0);
    StepMeter::Worker again = done;
    again.persisted = 2;
    auto short_one = meter.on_step(t += 1.25, again);
    REQUIRE(short_one);
    CHECK(short_one->interference_s == Approx(0.25));
    // The quiet median is still 1 s: the slow step did not join the baseline.
    meter.on_snapshot(t += 0.1, 2, 0);
    again.persisted = 3;
    auto next = meter.on_step(t += 1.5, again);
    REQUIRE(next);
    CHECK(next->interference_s == Approx(0.5));
  }

  SECTION("a persist that failed measured nothing") {
    meter.on_snapshot(t += 0.1, 1, 0);
    StepMeter::Worker failed = done;
    failed.failed = 1;
    CHECK_FALSE(meter.on_step(t += 1.0, failed));
  }
}
