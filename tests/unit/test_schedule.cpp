// When a checkpoint is taken (ckpt/schedule.hpp): the requests of a step and its decision.
#include <catch2/catch.hpp>

#include "ckpt/schedule.hpp"

using namespace ckpt;
using namespace ckpt::schedule;

namespace {

Inputs timed(std::uint64_t step, double since_s, double interval_s = 60) {
  Inputs in;
  in.step = step;
  in.lead = 2;
  in.interval = Interval{Interval::Kind::Seconds, static_cast<std::uint64_t>(interval_s)};
  in.interval_s = interval_s;
  in.since_checkpoint_s = since_s;
  in.now_unix = 1000;
  return in;
}

}  // namespace

TEST_CASE("schedule: a periodic request when the interval ran out, one at a time, rank 0 only", "[schedule]") {
  State state;
  CHECK_FALSE(requests(timed(10, 59), state).periodic);
  auto r = requests(timed(11, 60), state);
  REQUIRE(r.periodic);
  CHECK(*r.periodic == 13);  // step + lead: a step no rank has passed
  CHECK_FALSE(requests(timed(12, 61), state).periodic);  // still pending
  CHECK_FALSE(requests(timed(13, 62), state).periodic);
  CHECK(requests(timed(14, 62), state).periodic == std::optional<std::uint64_t>(16));  // the request passed
  Inputs other = timed(20, 600);
  other.rank = 3;
  State theirs;
  CHECK_FALSE(requests(other, theirs).periodic);
  Inputs steps = timed(20, 600);
  steps.interval = Interval{Interval::Kind::Steps, 5};
  CHECK_FALSE(requests(steps, theirs).periodic);  // an interval in steps needs no request
}

TEST_CASE("schedule: with auto, no request while the previous persist runs (the persist floor)", "[schedule]") {
  State state;
  Inputs in = timed(10, 120);
  in.interval = Interval{Interval::Kind::Auto, 0};
  in.auto_interval = true;
  in.persist_busy = true;
  CHECK_FALSE(requests(in, state).periodic);
  in.persist_busy = false;
  CHECK(requests(in, state).periodic);
  Inputs fixed = timed(10, 120);
  fixed.persist_busy = true;  // a fixed interval asks anyway: back-pressure waits in the snapshot
  State s2;
  CHECK(requests(fixed, s2).periodic);
}

TEST_CASE("schedule: one terminal request, for a signal on any rank or the time limit on rank 0", "[schedule]") {
  SECTION("the time limit within the grace time") {
    State state;
    Inputs in = timed(40, 0);
    in.end_time = 1100;
    in.grace_s = 120;
    auto r = requests(in, state);
    REQUIRE(r.terminal);
    CHECK(*r.terminal == 42);
    CHECK(r.for_time_limit);
    CHECK(r.why == "the job's time limit is within the grace time");
    CHECK_FALSE(requests(timed(41, 0), state).terminal);  // once
    in.grace_s = 50;
    State early;
    CHECK_FALSE(requests(in, early).terminal);  // 100 s left, 50 s of grace
    in.grace_s = 120;
    in.rank = 1;
    State other;
    CHECK_FALSE(requests(in, other).terminal);  // rank 0 alone acts on the time limit
  }
  SECTION("a signal, on any rank") {
    State state;
    Inputs in = timed(7, 0);
    in.rank = 5;
    in.signal = 15;
    auto r = requests(in, state);
    REQUIRE(r.terminal);
    CHECK_FALSE(r.for_time_limit);
    CHECK(r.why == "signal 15");
  }
}

TEST_CASE("schedule: the step's decision", "[schedule]") {
  const Interval steps{Interval::Kind::Steps, 5};
  CHECK(decision(10, steps, std::nullopt).snapshot);
  CHECK_FALSE(decision(11, steps, std::nullopt).snapshot);
  auto periodic = decision(11, Interval{}, store::Kind::Periodic);
  CHECK(periodic.snapshot);
  CHECK_FALSE(periodic.stop);
  auto terminal = decision(11, steps, store::Kind::Terminal);
  CHECK(terminal.snapshot);
  CHECK(terminal.stop);
  CHECK(terminal.kind == store::Kind::Terminal);
  CHECK_FALSE(decision(0, Interval{Interval::Kind::Steps, 0}, std::nullopt).snapshot);  // never divides by zero
}

TEST_CASE("schedule: a terminal step this rank missed stops it at once, with no terminal of its own", "[schedule]") {
  State state;
  Inputs in = timed(5001, 0);
  in.signal = 10;  // its own notice came too: the job's terminal step is known, and asking for another is futile
  in.missed_terminal = 13;
  CHECK_FALSE(requests(in, state).terminal);
  in.missed_terminal.reset();
  CHECK_FALSE(requests(in, state).terminal);  // and never after
  const Interval steps{Interval::Kind::Steps, 5};
  auto missed = decision(5001, steps, std::nullopt, 13);
  CHECK(missed.stop);
  CHECK_FALSE(missed.snapshot);
  missed = decision(5005, steps, store::Kind::Terminal, 13);  // a later terminal (its own, asked before) included
  CHECK(missed.stop);
  CHECK_FALSE(missed.snapshot);
  auto later = decision(13, steps, store::Kind::Terminal, 15);  // a missed step ahead of this one is no reason yet
  CHECK(later.snapshot);
  CHECK(later.kind == store::Kind::Terminal);
}
