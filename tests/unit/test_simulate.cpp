#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "ckpt/interval.hpp"
#include "ckpt/simulate.hpp"

using namespace ckpt::simulate;

namespace {

// A job long enough for about 20000 failures, so the simulated waste is within about 1% of its expectation.
Config job(double cost_s, double restart_s, double mtbf_s, double catchable = 0, std::uint64_t seed = 1) {
  Config c;
  c.cost_s = cost_s;
  c.restart_s = restart_s;
  c.mtbf_s = mtbf_s;
  c.work_s = 20000 * mtbf_s;
  c.catchable = catchable;
  c.seed = seed;
  return c;
}

std::size_t count(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) ++n;
  return n;
}

// A 100 s job with a replayed trace in mind: 1 s checkpoints, 10 s requeues, 0.5 s restarts in place with one
// spare, failures far apart (MTBF 1000 s).
Config in_place_job(double catchable) {
  Config c;
  c.cost_s = 1;
  c.restart_s = 10;
  c.inplace_restart_s = 0.5;
  c.spares = 1;
  c.mtbf_s = 1000;
  c.work_s = 100;
  c.catchable = catchable;
  return c;
}

struct Case {
  double cost_s, restart_s, mtbf_s, catchable;
};

// Parameter sets where the first-order model is meant to hold: (τ + δ + R) well below M.
const Case kSmallCases[] = {
    {30, 120, 21600, 0.5},    // 30 s checkpoints, 6 h MTBF
    {300, 600, 86400, 0.3},   // a big model on a slow file system
    {10, 60, 3600, 0.8},      // a large job failing hourly
    {5, 30, 7 * 86400, 0.5},  // a small job on a reliable cluster
};

}  // namespace

TEST_CASE("the simulator is deterministic and accounts for every second", "[simulate]") {
  Config c = job(30, 120, 21600, 0.5);
  for (Policy p : {Policy::Young, Policy::Daly, Policy::LastWords}) {
    INFO(to_string(p));
    auto a = run(c, p);
    auto b = run(c, p);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->wall_s == b->wall_s);
    CHECK(a->failures == b->failures);
    CHECK(a->work_s == c.work_s);
    double sum = a->work_s + a->checkpoint_s + a->rework_s + a->restart_s + a->last_words_s;
    CHECK(sum == Approx(a->wall_s).epsilon(1e-9));
    CHECK(a->goodput() + a->waste_fraction() == Approx(1));
  }
  Config other = c;
  other.seed = 2;
  CHECK(run(other, Policy::Daly)->wall_s != run(c, Policy::Daly)->wall_s);
}

TEST_CASE("the simulator agrees with the analytic models", "[simulate]") {
  for (const Case& k : kSmallCases) {
    for (std::uint64_t seed : {1ULL, 7ULL}) {
      Config c = job(k.cost_s, k.restart_s, k.mtbf_s, k.catchable, seed);
      for (Policy p : {Policy::Young, Policy::Daly}) {
        auto o = run(c, p);
        REQUIRE(o.ok());
        const double tau = o->interval_s;
        INFO("cost " << k.cost_s << " restart " << k.restart_s << " mtbf " << k.mtbf_s << " seed " << seed << " "
                     << to_string(p) << " τ " << tau << " simulated " << o->waste_fraction() << " model "
                     << model_waste(c, p, tau) << " exact " << exact_waste(c, tau));
        // The exact expression describes this simulator; only sampling noise separates them.
        CHECK(o->waste_fraction() == Approx(exact_waste(c, tau)).epsilon(0.03));
        // The first-order model is an approximation that overestimates slightly as τ/M grows.
        CHECK(o->waste_fraction() == Approx(model_waste(c, p, tau)).epsilon(0.08));
      }
      // A few fixed intervals on both sides of the optimum.
      const double young_s = ckpt::interval::young(k.cost_s, k.mtbf_s);
      for (double factor : {0.5, 2.0}) {
        auto o = run(c, Policy::Fixed, young_s * factor);
        REQUIRE(o.ok());
        INFO("fixed τ " << young_s * factor << " mtbf " << k.mtbf_s << " seed " << seed);
        CHECK(o->waste_fraction() == Approx(exact_waste(c, young_s * factor)).epsilon(0.03));
      }
      auto lw = run(c, Policy::LastWords);
      REQUIRE(lw.ok());
      INFO("last words: simulated " << lw->waste_fraction() << " model "
                                    << model_waste(c, Policy::LastWords, lw->interval_s));
      CHECK(lw->waste_fraction() == Approx(model_waste(c, Policy::LastWords, lw->interval_s)).epsilon(0.08));
    }
  }
}

TEST_CASE("last words never does worse than Daly", "[simulate]") {
  const Case cases[] = {{30, 120, 21600, 0.5}, {300, 600, 86400, 0.3}, {10, 60, 3600, 0.8},
                        {120, 300, 7200, 0.5}, {30, 120, 21600, 0.05}, {1800, 600, 3600, 0.5}};
  for (const Case& k : cases) {
    for (std::uint64_t seed : {1ULL, 2ULL, 3ULL}) {
      Config c = job(k.cost_s, k.restart_s, k.mtbf_s, k.catchable, seed);
      auto daly = run(c, Policy::Daly);
      auto lw = run(c, Policy::LastWords);
      REQUIRE(daly.ok());
      REQUIRE(lw.ok());
      INFO("cost " << k.cost_s << " mtbf " << k.mtbf_s << " p " << k.catchable << " seed " << seed);
      CHECK(lw->interval_s == daly->interval_s);
      CHECK(lw->goodput() >= daly->goodput());
      CHECK(lw->last_words > 0);
    }
  }
  SECTION("with nothing catchable, last words is Daly, run for run") {
    Config c = job(30, 120, 21600, 0.0);
    auto daly = run(c, Policy::Daly);
    auto lw = run(c, Policy::LastWords);
    CHECK(lw->wall_s == daly->wall_s);
    CHECK(lw->last_words == 0);
  }
  SECTION("with everything catchable, only work worth less than δ is ever redone") {
    Config c = job(30, 120, 21600, 1.0);
    auto lw = run(c, Policy::LastWords);
    REQUIRE(lw.ok());
    // At most δ of compute plus, when the last segment is shorter than δ, its cut-short checkpoint write.
    CHECK(lw->rework_s <= 2 * 30.0 * static_cast<double>(lw->failures));
  }
}

TEST_CASE("simulator limit cases", "[simulate]") {
  SECTION("no failure within the job: goodput is τ/(τ+δ)") {
    Config c = job(30, 120, 1e15);
    c.work_s = 3600 * 100;
    auto o = run(c, Policy::Fixed, 3600);
    REQUIRE(o.ok());
    CHECK(o->failures == 0);
    CHECK(o->checkpoints == 100);
    CHECK(o->goodput() == Approx(3600.0 / 3630));
    CHECK(exact_waste(c, 3600) == Approx(30.0 / 3630).epsilon(1e-6));
  }
  SECTION("zero cost checkpoints: only rework and restarts are lost") {
    Config c = job(0, 60, 3600);
    auto o = run(c, Policy::Fixed, 60);
    REQUIRE(o.ok());
    CHECK(o->checkpoint_s == 0);
    CHECK(o->waste_fraction() == Approx(exact_waste(c, 60)).epsilon(0.03));
    // Young's interval is 0 when checkpoints are free; the simulator cannot run that.
    CHECK(run(c, Policy::Young).error() == "the young interval must be a positive finite duration (got 0s)");
  }
  SECTION("the last segment may be shorter than τ") {
    Config c = job(10, 0, 1e15);
    c.work_s = 250;
    auto o = run(c, Policy::Fixed, 100);
    REQUIRE(o.ok());
    CHECK(o->checkpoints == 3);
    CHECK(o->wall_s == Approx(280));
  }
}

TEST_CASE("model_waste and exact_waste", "[simulate]") {
  Config c = job(30, 120, 21600);
  const double tau = 1000;
  // Without last words the model is interval::waste_fraction.
  CHECK(model_waste(c, Policy::Daly, tau) == Approx(ckpt::interval::waste_fraction({30, 120, 21600}, tau)));
  c.catchable = 0.5;
  CHECK(model_waste(c, Policy::Daly, tau) == Approx(ckpt::interval::waste_fraction({30, 120, 21600}, tau)));
  // Last words: half the failures cost E[min(u, δ)] = δ − δ²/2τ = 29.55 instead of τ/2 = 500.
  CHECK(model_waste(c, Policy::LastWords, tau) ==
        Approx(30.0 / 1000 + (0.5 * 500 + 0.5 * (30 - 900.0 / 2000) + 120) / 21600));
  // When δ exceeds τ, last words is never worth writing.
  c.cost_s = 2000;
  CHECK(model_waste(c, Policy::LastWords, tau) == Approx(model_waste(c, Policy::Daly, tau)));
  // Exact: M·e^{R/M}·(e^{(τ+δ)/M} − 1) per segment of τ.
  Config e = job(30, 120, 21600);
  e.work_s = 1000 * 100;
  double segment = 21600 * std::exp(120.0 / 21600) * std::expm1(1030.0 / 21600);
  CHECK(exact_waste(e, 1000) == Approx(1 - 1000 / segment));
  CHECK(exact_waste(e, 0) == 1);
}

TEST_CASE("simulator inputs", "[simulate]") {
  SECTION("good inputs") {
    CHECK(check(job(30, 120, 21600, 0.5)).ok());
    CHECK(check(job(0, 0, 1, 0)).ok());
    CHECK(check(job(0, 0, 1, 1)).ok());
  }
  SECTION("bad inputs") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    CHECK(check(job(30, 0, 0)).error() == "MTBF must be a positive finite duration (got 0s)");
    CHECK_FALSE(check(job(30, 0, -3600)).ok());
    CHECK_FALSE(check(job(-1, 0, 3600)).ok());
    CHECK_FALSE(check(job(nan, 0, 3600)).ok());
    CHECK_FALSE(check(job(30, -1, 3600)).ok());
    CHECK_FALSE(check(job(30, 0, 3600, -0.1)).ok());
    CHECK(check(job(30, 0, 3600, 1.5)).error() == "catchable fraction must be between 0 and 1 (got 1.5)");
    CHECK_FALSE(check(job(30, 0, 3600, nan)).ok());
    Config c = job(30, 0, 3600);
    c.work_s = 0;
    CHECK(check(c).error() == "work must be a positive finite duration (got 0s)");
    c.work_s = inf;
    CHECK_FALSE(check(c).ok());
    CHECK_FALSE(run(c, Policy::Daly).ok());

    Config ok = job(30, 0, 3600);
    CHECK_FALSE(run(ok, Policy::Fixed, 0).ok());
    CHECK_FALSE(run(ok, Policy::Fixed, -5).ok());
    CHECK_FALSE(run(ok, Policy::Fixed, inf).ok());
  }
  SECTION("a job that cannot finish is stopped, not run forever") {
    Config c = job(30, 0, 60);
    c.work_s = 1e6;
    c.max_events = 100000;
    auto o = run(c, Policy::Fixed, 3600);  // an hour of work between failures a minute apart
    REQUIRE_FALSE(o.ok());
    CHECK(o.error() == "the job cannot finish within 100000 events (interval 1h is far too long for MTBF 1m)");
    // Last words is refused by the guard while running rather than up front; same answer.
    c.catchable = 0.5;
    c.cost_s = 4000;  // so that no failure is caught: the work at risk never exceeds δ
    auto lw = run(c, Policy::LastWords);
    REQUIRE_FALSE(lw.ok());
    CHECK(lw.error().starts_with("the job cannot finish within 100000 events"));
  }
}

TEST_CASE("sweep and SVG", "[simulate]") {
  Config c = job(30, 120, 21600, 0.5);
  c.work_s = 2000 * c.mtbf_s;
  const double young_s = ckpt::interval::young(30, 21600);
  SECTION("good inputs") {
    auto points = sweep(c, young_s / 8, young_s * 8, 13);
    REQUIRE(points.ok());
    REQUIRE(points->size() == 13);
    CHECK(points->front().interval_s == Approx(young_s / 8));
    CHECK(points->back().interval_s == Approx(young_s * 8));
    CHECK((*points)[6].interval_s == Approx(young_s));
    // The simulated curve has its minimum near Young's interval.
    std::size_t best = 0;
    for (std::size_t i = 0; i < points->size(); ++i) {
      if ((*points)[i].simulated < (*points)[best].simulated) best = i;
    }
    CHECK(best >= 5);
    CHECK(best <= 7);

    std::string svg = render_svg(c, *points);
    CHECK(svg.starts_with("<?xml"));
    CHECK(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\"") != std::string::npos);
    CHECK(svg.ends_with("</svg>\n"));
    CHECK(count(svg, "<circle") == 13 + 1);  // the points and the legend's dot
    CHECK(count(svg, "<polyline") == 2);     // model and exact curves
    CHECK(svg.find("Young 18m58s") != std::string::npos);
    CHECK(svg.find("Daly 18m39s") != std::string::npos);
    CHECK(svg == render_svg(c, *sweep(c, young_s / 8, young_s * 8, 13)));  // deterministic
  }
  SECTION("bad inputs") {
    CHECK_FALSE(sweep(c, 0, 100, 10).ok());
    CHECK_FALSE(sweep(c, 100, 100, 10).ok());
    CHECK_FALSE(sweep(c, 100, 50, 10).ok());
    CHECK(sweep(c, 10, 100, 1).error() == "a sweep needs at least 2 points");
  }
}

TEST_CASE("replayed failures: hand-computed timelines", "[simulate]") {
  Config c;
  c.cost_s = 1;
  c.restart_s = 2;
  c.mtbf_s = 60;
  c.work_s = 10;
  SECTION("an empty trace never fails") {
    c.failure_times.emplace();  // replay, with no failure in it
    auto o = run(c, Policy::Fixed, 4);  // segments 4, 4, 2, each plus δ
    REQUIRE(o.ok());
    CHECK(o->failures == 0);
    CHECK(o->wall_s == Approx(13));
  }
  SECTION("one failure inside the second segment") {
    c.failure_times = std::vector<double>{6};
    // [0,4] work, [4,5] checkpoint, [5,6] work lost, [6,8] restart, [8,12]+[12,13], [13,15]+[15,16].
    auto o = run(c, Policy::Fixed, 4);
    REQUIRE(o.ok());
    CHECK(o->failures == 1);
    CHECK(o->rework_s == Approx(1));
    CHECK(o->restart_s == Approx(2));
    CHECK(o->wall_s == Approx(16));
    CHECK(o->goodput() == Approx(10.0 / 16));
  }
  SECTION("a failure due during a restart strikes when the restart ends") {
    c.failure_times = std::vector<double>{6, 7};
    // As above, then the second failure hits at 8 with nothing at risk: one more restart, [8,10].
    auto o = run(c, Policy::Fixed, 4);
    REQUIRE(o.ok());
    CHECK(o->failures == 2);
    CHECK(o->rework_s == Approx(1));
    CHECK(o->restart_s == Approx(4));
    CHECK(o->wall_s == Approx(18));
  }
  SECTION("last words keep the work at risk when it is worth more than δ") {
    c.failure_times = std::vector<double>{3.5};
    c.catchable = 1;
    auto daly = run(c, Policy::Daly);
    auto words = run(c, Policy::LastWords);
    REQUIRE(daly.ok());
    REQUIRE(words.ok());
    CHECK(words->interval_s == daly->interval_s);
    CHECK(words->last_words == 1);
    CHECK(words->rework_s == 0);
    CHECK(daly->rework_s == Approx(3.5));
    // Same trace: last words pay δ instead of redoing 3.5 s.
    CHECK(daly->wall_s - words->wall_s == Approx(3.5 - 1));
  }
  SECTION("bad traces are refused") {
    c.failure_times = std::vector<double>{5, 4};
    CHECK(check(c).error() == "failure time 2 must be finite, >= 0 and not before the one before it (got 4s)");
    c.failure_times = std::vector<double>{-1};
    CHECK_FALSE(check(c).ok());
    c.failure_times = std::vector<double>{std::numeric_limits<double>::infinity()};
    CHECK_FALSE(run(c, Policy::Daly).ok());
  }
}

TEST_CASE("restart in place: cheap restarts while a spare is left, then a requeue", "[simulate]") {
  Config c = in_place_job(1);
  // Three failures, far apart: in place (the spare), requeue (none left), in place (the new allocation's spare).
  c.failure_times = std::vector<double>{20, 60, 100};
  auto in_place = run(c, Policy::InPlace);
  auto last_words = run(c, Policy::LastWords);
  REQUIRE(in_place.ok());
  REQUIRE(last_words.ok());
  CHECK(in_place->failures == 3);
  CHECK(in_place->in_place == 2);
  CHECK(in_place->restart_s == Approx(0.5 + 10 + 0.5));
  CHECK(last_words->restart_s == Approx(30));
  CHECK(in_place->last_words == last_words->last_words);  // the same terminal checkpoints
  CHECK(in_place->goodput() > last_words->goodput());
  CHECK(std::string(to_string(Policy::InPlace)) == "in-place");

  SECTION("the model's restart is the mean over an allocation's life") {
    c.spares = 3;
    const double tau = policy_interval(c, Policy::InPlace);
    Config mean = c;
    mean.restart_s = (3 * 0.5 + 10) / 4;
    CHECK(model_waste(c, Policy::InPlace, tau) == Approx(model_waste(mean, Policy::LastWords, tau)));
  }
  SECTION("a bad in-place restart cost is refused") {
    c.inplace_restart_s = -1;
    CHECK_FALSE(check(c));
  }
}

TEST_CASE("memory tier: failures the live state cannot cover keep the last memory checkpoint's work", "[simulate]") {
  Config c = in_place_job(0);  // the live state never whole (a shard only the dead rank held)
  c.memory_catchable = 1;
  c.memory_interval_s = 2;
  c.failure_times = std::vector<double>{7.5};

  SECTION("the work since the last memory checkpoint is redone, the rest kept") {
    auto tier = run(c, Policy::MemoryTier);
    auto in_place = run(c, Policy::InPlace);
    REQUIRE(tier.ok());
    REQUIRE(in_place.ok());
    CHECK(tier->interval_s == in_place->interval_s);
    CHECK(tier->last_words == 1);
    CHECK(tier->from_memory == 1);
    CHECK(tier->rework_s == Approx(1.5));  // 7.5 s of work, memory checkpoints at 2, 4, 6
    CHECK(in_place->last_words == 0);
    CHECK(in_place->rework_s == Approx(7.5));
    CHECK(in_place->wall_s - tier->wall_s == Approx(6 - 1));  // 6 s kept for the terminal write's 1 s
    CHECK(std::string(to_string(Policy::MemoryTier)) == "memory-tier");
  }
  SECTION("memory checkpoints stall training, and every second is accounted for") {
    c.memory_cost_s = 0.5;  // 1.25 s of wall per second of work
    c.failure_times = std::vector<double>{8};
    auto tier = run(c, Policy::MemoryTier);
    REQUIRE(tier.ok());
    // 8 s of wall hold 6.4 s of work; the last memory checkpoint holds 6 (7.5 s of wall): 0.5 s redone.
    CHECK(tier->rework_s == Approx(0.5));
    CHECK(tier->memory_s == Approx(25));  // the whole job's 100 s of work at a quarter each
    const double sum =
        tier->work_s + tier->checkpoint_s + tier->rework_s + tier->restart_s + tier->last_words_s + tier->memory_s;
    CHECK(sum == Approx(tier->wall_s).epsilon(1e-9));
  }
  SECTION("a caught failure right after a memory checkpoint writes nothing when the work is worth less than δ") {
    c.failure_times = std::vector<double>{2.5};  // 2 s kept would cost 1 s to write: still worth it
    CHECK(run(c, Policy::MemoryTier)->from_memory == 1);
    c.failure_times = std::vector<double>{1.5};  // nothing in a memory checkpoint yet
    auto tier = run(c, Policy::MemoryTier);
    CHECK(tier->last_words == 0);
    CHECK(tier->rework_s == Approx(1.5));
  }
  SECTION("failures the live state covers lose nothing, as in place") {
    c.catchable = 1;
    auto tier = run(c, Policy::MemoryTier);
    CHECK(tier->last_words == 1);
    CHECK(tier->from_memory == 0);
    CHECK(tier->rework_s == 0);
  }
  SECTION("bad memory-tier inputs are refused") {
    c.memory_catchable = 0.5;
    c.catchable = 0.8;
    CHECK(check(c).error() ==
          "the fraction caught with the memory tier must be between the catchable fraction (0.8) and 1 (got 0.5)");
    c.memory_catchable = 0.9;
    c.memory_cost_s = -1;
    CHECK_FALSE(check(c));
    c.memory_cost_s = 0;
    c.memory_interval_s = 0;
    CHECK(check(c));
    CHECK_FALSE(run(c, Policy::MemoryTier).ok());
  }
}

TEST_CASE("memory tier: the simulator agrees with the model, and with in place where the tier adds nothing",
          "[simulate]") {
  for (const Case& k : kSmallCases) {
    for (std::uint64_t seed : {1ULL, 7ULL}) {
      Config c = job(k.cost_s, k.restart_s, k.mtbf_s, k.catchable, seed);
      c.inplace_restart_s = k.restart_s / 10;
      c.spares = 2;
      const double tau = policy_interval(c, Policy::MemoryTier);
      c.memory_interval_s = tau / 20;
      c.memory_cost_s = c.memory_interval_s / 50;  // a 2% stall
      c.memory_catchable = std::min(1.0, k.catchable + 0.4);
      auto tier = run(c, Policy::MemoryTier);
      auto in_place = run(c, Policy::InPlace);
      REQUIRE(tier.ok());
      REQUIRE(in_place.ok());
      INFO("cost " << k.cost_s << " mtbf " << k.mtbf_s << " seed " << seed << " simulated " << tier->waste_fraction()
                   << " model " << model_waste(c, Policy::MemoryTier, tau) << " in place " << in_place->waste_fraction());
      CHECK(tier->waste_fraction() == Approx(model_waste(c, Policy::MemoryTier, tau)).epsilon(0.08));
      CHECK(tier->from_memory > 0);
      const double sum =
          tier->work_s + tier->checkpoint_s + tier->rework_s + tier->restart_s + tier->last_words_s + tier->memory_s;
      CHECK(sum == Approx(tier->wall_s).epsilon(1e-9));

      Config same = c;  // no stall and nothing more caught: the memory tier is in place, run for run
      same.memory_cost_s = 0;
      same.memory_catchable = same.catchable;
      auto plain = run(same, Policy::MemoryTier);
      CHECK(plain->wall_s == in_place->wall_s);
      CHECK(model_waste(same, Policy::MemoryTier, tau) == Approx(model_waste(same, Policy::InPlace, tau)));
    }
  }
}
