#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "ckpt/straggler.hpp"

using namespace ckpt::straggler;

namespace {

Pace rank_pace(std::uint64_t window, int rank, double s) { return Pace{window, s, rank, s, rank, 1}; }

// The job's pace of one window: each rank's median over `steps` noisy steps of `base * slowdown[rank]`, merged in
// rank order as the tree would (merge is associative and commutative).
Pace job_window(std::uint64_t window, const std::vector<double>& slowdown, std::mt19937& rng, double sigma,
                int steps) {
  std::lognormal_distribution<double> noise(0, sigma);
  Pace job;
  for (int r = 0; r < static_cast<int>(slowdown.size()); ++r) {
    PaceMeter m(steps);
    std::optional<Pace> p;
    for (int s = 0; s < steps; ++s) {
      m.on_work(0.05 * slowdown[static_cast<std::size_t>(r)] * noise(rng));
      p = m.on_step(window * static_cast<std::uint64_t>(steps) + static_cast<std::uint64_t>(s), r);
    }
    REQUIRE(p);
    job = merge(job, *p);
  }
  return job;
}

}  // namespace

TEST_CASE("straggler policy: thresholds and actions", "[straggler]") {
  SECTION("good inputs") {
    CHECK(parse_policy("0.7").value().threshold == Approx(0.7));
    CHECK(parse_policy("0.7").value().action == Action::Report);
    CHECK(parse_policy("0.95").value().enabled);
    CHECK_FALSE(parse_policy("off").value().enabled);
    CHECK(parse_policy("0.6,report").value().action == Action::Report);
    auto p = parse_policy("0.6,exclude").value();
    CHECK(p.action == Action::Exclude);
    CHECK(p.threshold == Approx(0.6));
    CHECK(format_policy(p) == "0.60,exclude");
    CHECK(format_policy(parse_policy("off").value()) == "off");
    CHECK(parse_policy("0.5,swap").value().action == Action::Swap);
    CHECK(format_policy(parse_policy("0.5,swap").value()) == "0.50,swap");
    for (const char* text : {"0.7", "0.55,exclude", "off", "0.9,report"}) {
      auto once = parse_policy(text).value();
      auto again = parse_policy(format_policy(once)).value();
      CHECK(again.enabled == once.enabled);
      CHECK(again.threshold == Approx(once.threshold));
      CHECK(again.action == once.action);
    }
  }
  SECTION("bad inputs") {
    for (const char* bad : {"", "0", "1", "1.5", "-0.5", ".7", "7.", "0.7x", " 0.7", "nan", "inf", "0.7.1", "1e-1",
                            "0.0000001", "0.7,", "0.7,evict", "exclude", ",exclude", "0.7,exclude,x", "Off"}) {
      INFO(bad);
      auto r = parse_policy(bad);
      REQUIRE_FALSE(r);
      CHECK(r.error().find("'" + std::string(bad) + "': expected off, or a fraction") == 0);
    }
  }
}

TEST_CASE("straggler pace: one rank's window median", "[straggler]") {
  PaceMeter m(5);
  const double works[] = {0.10, 0.11, 0.90, 0.09, 0.10};  // one slow step (a checkpoint's copy) moves nothing
  std::optional<Pace> p;
  for (int s = 0; s < 5; ++s) {
    m.on_work(works[s] / 2);
    m.on_work(works[s] / 2);  // two sections of one step add up
    p = m.on_step(static_cast<std::uint64_t>(10 + s), 3);
    if (s < 4) CHECK_FALSE(p);
  }
  REQUIRE(p);
  CHECK(p->window == 2);
  CHECK(p->best_s == Approx(0.10));
  CHECK(p->worst_rank == 3);
  CHECK(p->ranks == 1);

  // Steps with no timed work (a program that marks nothing) give no pace.
  PaceMeter idle(4);
  for (std::uint64_t s = 0; s < 4; ++s) CHECK_FALSE(idle.on_step(s, 0));
  // Negative or non-finite times are not work.
  PaceMeter odd(2);
  odd.on_work(-1);
  odd.on_work(NAN);
  CHECK_FALSE(odd.on_step(0, 0));
  CHECK_FALSE(odd.on_step(1, 0));
}

TEST_CASE("straggler merge: subtrees add up in any order", "[straggler]") {
  Pace a = merge(rank_pace(4, 0, 0.10), rank_pace(4, 1, 0.20));
  Pace b = merge(rank_pace(4, 2, 0.05), rank_pace(4, 3, 0.12));
  Pace ab = merge(a, b), ba = merge(b, a);
  CHECK(ab.best_rank == 2);
  CHECK(ab.worst_rank == 1);
  CHECK(ab.ranks == 4);
  CHECK(ba.best_rank == ab.best_rank);
  CHECK(ba.worst_rank == ab.worst_rank);
  CHECK(score(ab) == Approx(0.25));
  CHECK(score(merge(Pace{}, a)) == score(a));
  // Equal times name the lower rank, whichever subtree came first.
  CHECK(merge(rank_pace(1, 5, 0.1), rank_pace(1, 2, 0.1)).worst_rank == 2);
  CHECK(merge(rank_pace(1, 2, 0.1), rank_pace(1, 5, 0.1)).worst_rank == 2);
  // One rank, or nothing to compare: no one is slow.
  CHECK(score(rank_pace(1, 0, 0.3)) == 1);
  CHECK(score(Pace{}) == 1);
}

TEST_CASE("straggler detector: flags a rank slow for K windows in a row, once a spell", "[straggler]") {
  Policy policy;
  policy.threshold = 0.7;
  policy.windows = 3;
  Detector d(policy);
  auto job = [](std::uint64_t w, double slow_s, int slow_rank) {
    return merge(rank_pace(w, 0, 0.1), rank_pace(w, slow_rank, slow_s));
  };
  CHECK_FALSE(d.on_window(job(0, 0.1, 1)));
  CHECK_FALSE(d.on_window(job(1, 0.2, 1)));
  CHECK_FALSE(d.on_window(job(2, 0.2, 1)));
  auto f = d.on_window(job(3, 0.25, 1));
  REQUIRE(f);
  CHECK(f->rank == 1);
  CHECK(f->windows == 3);
  CHECK(f->first_window == 1);
  CHECK(f->last_window == 3);
  CHECK(f->score == Approx(0.4));
  CHECK(f->worst_score == Approx(0.4));
  CHECK(f->describe(5) == "0.40 of the job's best for 3 windows, steps 5-19 (rank 1)");
  CHECK_FALSE(d.on_window(job(4, 0.2, 1)));  // still slow: flagged once
  CHECK_FALSE(d.on_window(job(5, 0.1, 1)));  // recovered
  CHECK_FALSE(d.on_window(job(6, 0.2, 1)));
  CHECK_FALSE(d.on_window(job(7, 0.2, 1)));
  CHECK(d.on_window(job(8, 0.2, 1)));  // a new spell, flagged again

  SECTION("a repeated or older window changes nothing") {
    Detector e(policy);
    for (int i = 0; i < 5; ++i) CHECK_FALSE(e.on_window(job(1, 0.5, 1)));
    CHECK_FALSE(e.on_window(job(0, 0.5, 1)));
  }
  SECTION("a gap or another rank starts the count again") {
    Detector e(policy);
    CHECK_FALSE(e.on_window(job(0, 0.2, 1)));
    CHECK_FALSE(e.on_window(job(1, 0.2, 1)));
    CHECK_FALSE(e.on_window(job(3, 0.2, 1)));  // window 2 missing
    CHECK_FALSE(e.on_window(job(4, 0.2, 2)));  // now rank 2 is the slowest
    CHECK_FALSE(e.on_window(job(5, 0.2, 2)));
    CHECK(e.on_window(job(6, 0.2, 2)));
  }
  SECTION("off flags nothing") {
    Detector e(parse_policy("off").value());
    for (std::uint64_t w = 0; w < 10; ++w) CHECK_FALSE(e.on_window(job(w, 1.0, 1)));
  }
}

TEST_CASE("straggler detector under noise: a half-speed rank in 3 windows, no false flag in 10,000", "[straggler]") {
  std::mt19937 rng(12345);
  const double sigma = 0.12;  // each step's time varies by about 12%: a noisy shared host
  Policy policy;
  std::vector<double> even(64, 1.0);

  Detector quiet(policy);
  int flags = 0, single_window_flags = 0;
  for (std::uint64_t w = 0; w < 10000; ++w) {
    Pace job = job_window(w, even, rng, sigma, policy.window_steps);
    if (quiet.on_window(job)) ++flags;
    if (single_window_rule(job, policy.threshold)) ++single_window_flags;
  }
  CHECK(flags == 0);
  INFO("the single-window rule flagged " << single_window_flags << " of 10,000 windows");
  CHECK(single_window_flags > flags);  // the rule it is compared with is noisier on the same data

  std::vector<double> one_slow = even;
  one_slow[37] = 2.0;
  Detector slow(policy);
  std::optional<Flag> f;
  std::uint64_t w = 0;
  for (; w < 20 && !f; ++w) f = slow.on_window(job_window(w, one_slow, rng, sigma, policy.window_steps));
  REQUIRE(f);
  CHECK(f->rank == 37);
  CHECK(w == static_cast<std::uint64_t>(policy.windows));
  CHECK(f->score < policy.threshold);
}
