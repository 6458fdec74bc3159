#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/last_words.hpp"
#include "ckpt/store.hpp"

using namespace ckpt;
using last_words::Plan;
using last_words::RankReport;
using store::Layout;

namespace {

// Megatron's order: tensor-parallel ranks are adjacent, then data-parallel, then pipeline stages.
int rank_of(const Layout& l, int dp, int tp, int pp) { return tp + l.tp * (dp + l.dp * pp); }

// A whole job, every rank alive and idle at `step`.
std::vector<RankReport> healthy(const Layout& l, std::uint64_t step = 100) {
  std::vector<RankReport> out;
  for (int p = 0; p < l.pp; ++p) {
    for (int d = 0; d < l.dp; ++d) {
      for (int t = 0; t < l.tp; ++t) {
        RankReport r;
        r.coord = {rank_of(l, d, t, p), d, t, p};
        r.alive = true;
        r.step = step;
        out.push_back(r);
      }
    }
  }
  return out;
}

RankReport& at(std::vector<RankReport>& reports, int dp, int tp, int pp) {
  for (RankReport& r : reports) {
    if (r.coord.dp == dp && r.coord.tp == tp && r.coord.pp == pp) return r;
  }
  FAIL("no report for " << last_words::format_coord(dp, tp, pp));
  return reports.front();
}

bool has_reason(const Plan& plan, const std::string& part) {
  return std::any_of(plan.reasons.begin(), plan.reasons.end(),
                     [&](const std::string& r) { return r.find(part) != std::string::npos; });
}

std::string all_reasons(const Plan& plan) {
  std::string out = plan.summary;
  for (const auto& r : plan.reasons) out += "\n  " + r;
  return out;
}

// The plan must be exactly what the store would commit as a terminal checkpoint, or nothing.
void check_against_store(const Layout& l, const Plan& plan) {
  INFO(all_reasons(plan));
  auto decision = store::decide_commit(store::Kind::Terminal, l, l.world_size(), last_words::planned_records(plan));
  INFO("store: " << decision.reason);
  CHECK(decision.complete == plan.write);
  if (!plan.write) {
    CHECK(plan.writers.empty());
    CHECK(plan.summary.starts_with("last words: not writing a terminal checkpoint: "));
  } else {
    CHECK(plan.summary.starts_with("last words: writing a terminal checkpoint at step " + std::to_string(plan.step)));
  }
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::string model(int pp, int tp) { return "model/pp" + std::to_string(pp) + "/tp" + std::to_string(tp); }
std::string optim(int pp, int tp) { return "optim/pp" + std::to_string(pp) + "/tp" + std::to_string(tp); }
std::string optim(int pp, int tp, int dp) { return optim(pp, tp) + "/dp" + std::to_string(dp); }

// What each rank writes when stage p's model comes from replica replica[p].
std::map<int, std::vector<std::string>> expected_writers(const Layout& l, const std::vector<int>& replica) {
  std::map<int, std::vector<std::string>> w;
  for (int p = 0; p < l.pp; ++p) {
    for (int t = 0; t < l.tp; ++t) {
      int writer = rank_of(l, replica[static_cast<std::size_t>(p)], t, p);
      w[writer].push_back(model(p, t));
      if (!l.zero1) {
        w[writer].push_back(optim(p, t));
        continue;
      }
      for (int d = 0; d < l.dp; ++d) w[rank_of(l, d, t, p)].push_back(optim(p, t, d));
    }
  }
  for (auto& [rank, keys] : w) keys = sorted(keys);
  return w;
}

std::map<int, std::vector<std::string>> sorted_writers(const Plan& plan) {
  auto w = plan.writers;
  for (auto& [rank, keys] : w) keys = sorted(keys);
  return w;
}

}  // namespace

TEST_CASE("last words: DP2xTP2xPP2 without ZeRO-1", "[last_words]") {
  const Layout l{2, 2, 2, false};
  auto reports = healthy(l);

  SECTION("everyone alive: replica dp0 writes every stage") {
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.step == 100);
    CHECK(plan.replica_of_stage == std::vector<int>{0, 0});
    CHECK(sorted_writers(plan) == expected_writers(l, {0, 0}));
    CHECK(plan.writers.size() == 4);
    CHECK(plan.summary ==
          "last words: writing a terminal checkpoint at step 100: 4 writers cover 8 state keys (pp0 from dp0, pp1 "
          "from dp0)");
  }
  SECTION("one death moves that stage to the other replica") {
    at(reports, 0, 1, 0).alive = false;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.replica_of_stage == std::vector<int>{1, 0});
    CHECK(sorted_writers(plan) == expected_writers(l, {1, 0}));
    CHECK(has_reason(plan, "replica dp0 of stage pp0 disqualified: rank 1 (dp0/tp1/pp0) is dead"));
    CHECK(has_reason(plan, "stage pp0: replica dp1 of stage pp0 writes the model"));
  }
  SECTION("deaths in different replicas of different stages still leave a copy") {
    at(reports, 0, 0, 0).alive = false;
    at(reports, 1, 1, 1).alive = false;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.replica_of_stage == std::vector<int>{1, 0});
  }
  SECTION("both replicas of one stage broken: nothing is written") {
    at(reports, 0, 1, 0).alive = false;
    at(reports, 1, 0, 0).alive = false;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    CHECK_FALSE(plan.write);
    CHECK(has_reason(plan,
                     "stage pp0 has no replica whose whole tensor-parallel group is alive and consistent at "
                     "step 100"));
    CHECK(plan.summary ==
          "last words: not writing a terminal checkpoint: 4 of 8 state keys cannot be covered at step 100 (stage pp0 "
          "has no replica whose whole tensor-parallel group is alive and consistent at step 100)");
  }
  SECTION("a rank caught mid-update disqualifies its replica") {
    at(reports, 0, 0, 1).mid_update = true;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.replica_of_stage == std::vector<int>{0, 1});
    CHECK(has_reason(plan,
                     "replica dp0 of stage pp1 disqualified: rank 4 (dp0/tp0/pp1) was caught mid-update at "
                     "step 100"));

    at(reports, 1, 1, 1).mid_update = true;
    Plan none = last_words::plan(l, reports);
    check_against_store(l, none);
    CHECK_FALSE(none.write);
  }
  SECTION("ranks of one group that disagree on the step disqualify it") {
    at(reports, 0, 1, 0).step = 101;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.step == 100);
    CHECK(plan.replica_of_stage == std::vector<int>{1, 0});
    CHECK(has_reason(plan,
                     "replica dp0 of stage pp0 disqualified: its ranks disagree on the step (1 at step 100; 1 "
                     "at step 101)"));
  }
  SECTION("the newest common step wins; replicas at another step are disqualified") {
    for (int t = 0; t < 2; ++t) {
      for (int p = 0; p < 2; ++p) at(reports, 1, t, p).step = 101;
    }
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.step == 101);
    CHECK(plan.replica_of_stage == std::vector<int>{1, 1});
    CHECK(has_reason(plan, "replica dp0 of stage pp0 disqualified: at step 100, not the agreed step 101"));
  }
  SECTION("stages intact only at different steps: nothing is written") {
    at(reports, 1, 0, 0).alive = false;  // stage 0: only dp0 is intact, at step 100
    at(reports, 0, 0, 1).alive = false;  // stage 1: only dp1 is intact, at step 101
    at(reports, 1, 0, 1).step = 101;
    at(reports, 1, 1, 1).step = 101;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    CHECK_FALSE(plan.write);
  }
  SECTION("a rank that sent no report counts as dead") {
    reports.erase(reports.begin());  // dp0/tp0/pp0
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.replica_of_stage == std::vector<int>{1, 0});
    CHECK(has_reason(plan, "dp0/tp0/pp0 did not report"));
  }
  SECTION("everyone dead") {
    for (auto& r : reports) r.alive = false;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    CHECK_FALSE(plan.write);
    CHECK(plan.reasons.size() == 5);  // four groups and the decision
  }
}

TEST_CASE("last words: DP2xTP2xPP2 with ZeRO-1", "[last_words]") {
  const Layout l{2, 2, 2, true};
  auto reports = healthy(l);

  SECTION("everyone alive: every rank writes its optimizer shard, dp0 the model") {
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.writers.size() == 8);
    CHECK(sorted_writers(plan) == expected_writers(l, {0, 0}));
    CHECK(plan.writers.at(rank_of(l, 1, 0, 0)) == std::vector<std::string>{"optim/pp0/tp0/dp1"});
  }
  SECTION("one death loses an optimizer shard nobody else holds") {
    at(reports, 1, 1, 0).alive = false;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    CHECK_FALSE(plan.write);
    CHECK(has_reason(plan, "optim/pp0/tp1/dp1: its only holder rank 3 (dp1/tp1/pp0) is dead"));
  }
  SECTION("a shard holder caught mid-update, or at another step") {
    at(reports, 1, 0, 1).mid_update = true;
    Plan mid = last_words::plan(l, reports);
    check_against_store(l, mid);
    CHECK_FALSE(mid.write);
    at(reports, 1, 0, 1).mid_update = false;
    at(reports, 1, 0, 1).step = 99;
    Plan behind = last_words::plan(l, reports);
    check_against_store(l, behind);
    CHECK_FALSE(behind.write);
    CHECK(has_reason(behind, "replica dp1 of stage pp1 disqualified: its ranks disagree on the step"));
  }
}

TEST_CASE("last words: other layouts", "[last_words]") {
  SECTION("a single rank") {
    const Layout l{1, 1, 1, false};
    auto reports = healthy(l, 7);
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.step == 7);
    CHECK(plan.writers.at(0) == std::vector<std::string>{"model/pp0/tp0", "optim/pp0/tp0"});
    reports[0].mid_update = true;
    CHECK_FALSE(last_words::plan(l, reports).write);
  }
  SECTION("pure data parallelism survives all but one death") {
    const Layout l{4, 1, 1, false};
    auto reports = healthy(l);
    for (int d = 0; d < 3; ++d) at(reports, d, 0, 0).alive = false;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.writers.size() == 1);
    CHECK(plan.writers.count(rank_of(l, 3, 0, 0)) == 1);
  }
  SECTION("without data parallelism any death is fatal") {
    const Layout l{1, 2, 2, false};
    auto reports = healthy(l);
    at(reports, 0, 1, 1).alive = false;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    CHECK_FALSE(plan.write);
  }
  SECTION("DP3xTP2 with ZeRO-1") {
    const Layout l{3, 2, 1, true};
    Plan plan = last_words::plan(l, healthy(l));
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(sorted_writers(plan) == expected_writers(l, {0}));
  }
  SECTION("a rank numbering other than Megatron's") {
    const Layout l{2, 2, 2, false};
    auto reports = healthy(l);
    for (auto& r : reports) r.coord.rank = 7 - r.coord.rank;
    at(reports, 0, 0, 0).alive = false;
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    REQUIRE(plan.write);
    CHECK(plan.writers.count(7 - rank_of(l, 1, 0, 0)) == 1);
  }
  SECTION("a mass failure is summarized, not listed in full") {
    const Layout l{100, 1, 1, false};
    auto reports = healthy(l);
    for (auto& r : reports) r.alive = false;
    Plan plan = last_words::plan(l, reports);
    CHECK_FALSE(plan.write);
    CHECK(plan.reasons.size() == 32 + 2);  // 32 listed, one "and 68 more", the decision
    CHECK(has_reason(plan, "and 68 more disqualified replicas"));
  }
}

TEST_CASE("last words: an update ends alone only under pure data parallelism", "[last_words]") {
  CHECK(last_words::update_finishes_alone({4, 1, 1, false}));
  CHECK(last_words::update_finishes_alone({1, 1, 1, false}));
  CHECK_FALSE(last_words::update_finishes_alone({2, 2, 1, false}));  // a global gradient norm may span the TP group
  CHECK_FALSE(last_words::update_finishes_alone({2, 1, 2, false}));  // or the stages
  CHECK_FALSE(last_words::update_finishes_alone({4, 1, 1, true}));   // ZeRO-1 all-gathers the updated shards
  CHECK_FALSE(last_words::update_finishes_alone({0, 1, 1, false}));
}

TEST_CASE("last words: bad reports write nothing", "[last_words]") {
  const Layout l{2, 2, 2, false};
  SECTION("good inputs") { CHECK(last_words::plan(l, healthy(l)).write); }
  SECTION("bad inputs") {
    auto reports = healthy(l);
    reports[1].coord.rank = reports[0].coord.rank;
    Plan twice = last_words::plan(l, reports);
    CHECK_FALSE(twice.write);
    CHECK(twice.summary ==
          "last words: not writing a terminal checkpoint: invalid report from rank 0: rank reported "
          "twice");

    reports = healthy(l);
    reports[1].coord.dp = reports[0].coord.dp;
    reports[1].coord.tp = reports[0].coord.tp;
    reports[1].coord.pp = reports[0].coord.pp;
    CHECK(last_words::plan(l, reports).summary.find("already reported by rank 0") != std::string::npos);

    reports = healthy(l);
    reports[3].coord.tp = 2;
    CHECK(last_words::plan(l, reports).summary.find("coordinate dp1/tp2/pp0 outside the layout") != std::string::npos);

    reports = healthy(l);
    reports[3].coord.rank = 8;
    CHECK(last_words::plan(l, reports).summary.find("rank outside a world of 8") != std::string::npos);

    reports = healthy(l);
    reports[3].coord.rank = -1;
    CHECK_FALSE(last_words::plan(l, reports).write);

    CHECK(last_words::plan(Layout{0, 1, 1, false}, {}).summary ==
          "last words: not writing a terminal checkpoint: layout sizes must be at least 1 (dp 0, tp 1, pp 1)");
    CHECK_FALSE(last_words::plan(l, {}).write);
  }
}

// ---- property test: every failure set, checked against a brute-force search --------------------------------------

namespace {

enum class RankState { Dead, At100, At101, MidUpdate };
constexpr RankState kStates[] = {RankState::Dead, RankState::At100, RankState::At101, RankState::MidUpdate};

struct Expected {
  bool write = false;
  std::uint64_t step = 0;
  std::vector<int> replica;
};

// Straight from the definition: the newest step s for which some choice of one replica per stage has every rank
// of the chosen TP groups alive, idle and at s, and (ZeRO-1) every rank of the job alive, idle and at s. The
// choice is the first valid one in lexicographic order, i.e. the lowest dp index per stage.
Expected brute_force(const Layout& l, const std::vector<RankState>& state) {
  auto ready = [&](int d, int t, int p, std::uint64_t s) {
    RankState st = state[static_cast<std::size_t>(rank_of(l, d, t, p))];
    return (st == RankState::At100 && s == 100) || (st == RankState::At101 && s == 101);
  };
  for (std::uint64_t s : {101ULL, 100ULL}) {
    if (l.zero1) {
      bool all = true;
      for (int r = 0; r < l.world_size(); ++r) {
        all = all && (state[static_cast<std::size_t>(r)] == (s == 100 ? RankState::At100 : RankState::At101));
      }
      if (!all) continue;
    }
    std::vector<int> choice(static_cast<std::size_t>(l.pp), 0);
    while (true) {
      bool valid = true;
      for (int p = 0; p < l.pp && valid; ++p) {
        for (int t = 0; t < l.tp && valid; ++t) valid = ready(choice[static_cast<std::size_t>(p)], t, p, s);
      }
      if (valid) return {true, s, choice};
      // Next choice in lexicographic order (the last stage varies fastest).
      int p = l.pp - 1;
      while (p >= 0 && ++choice[static_cast<std::size_t>(p)] == l.dp) choice[static_cast<std::size_t>(p--)] = 0;
      if (p < 0) break;
    }
  }
  return {};
}

std::vector<RankReport> reports_for(const Layout& l, const std::vector<RankState>& state) {
  std::vector<RankReport> out;
  for (int p = 0; p < l.pp; ++p) {
    for (int d = 0; d < l.dp; ++d) {
      for (int t = 0; t < l.tp; ++t) {
        const int rank = rank_of(l, d, t, p);
        const RankState st = state[static_cast<std::size_t>(rank)];
        RankReport r;
        r.coord = {rank, d, t, p};
        r.alive = st != RankState::Dead;
        r.mid_update = st == RankState::MidUpdate;
        r.step = st == RankState::At101 ? 101 : 100;
        // Half the dead ranks report themselves dead, the other half say nothing.
        if (st == RankState::Dead && rank % 2 == 1) continue;
        out.push_back(r);
      }
    }
  }
  return out;
}

// Runs plan() on every assignment of the four rank states and compares with brute_force().
std::size_t check_every_failure_set(const Layout& l, bool steps_and_updates) {
  const std::size_t n = static_cast<std::size_t>(l.world_size());
  const std::size_t per_rank = steps_and_updates ? 4 : 2;
  std::size_t cases = 1;
  for (std::size_t i = 0; i < n; ++i) cases *= per_rank;
  std::size_t writes = 0;
  std::vector<RankState> state(n);
  for (std::size_t code = 0; code < cases; ++code) {
    std::size_t c = code;
    for (std::size_t r = 0; r < n; ++r) {
      state[r] = kStates[c % per_rank];
      c /= per_rank;
    }
    const Expected want = brute_force(l, state);
    const Plan got = last_words::plan(l, reports_for(l, state));
    INFO("layout dp" << l.dp << " tp" << l.tp << " pp" << l.pp << (l.zero1 ? " zero1" : "") << ", case " << code);
    INFO(all_reasons(got));
    REQUIRE(got.write == want.write);
    const auto decision =
        store::decide_commit(store::Kind::Terminal, l, l.world_size(), last_words::planned_records(got));
    REQUIRE(decision.complete == got.write);
    if (!want.write) {
      REQUIRE(got.writers.empty());
      continue;
    }
    ++writes;
    REQUIRE(got.step == want.step);
    REQUIRE(got.replica_of_stage == want.replica);
    REQUIRE(sorted_writers(got) == expected_writers(l, want.replica));
    // Every writer is alive, idle and at the agreed step.
    for (const auto& [rank, keys] : got.writers) {
      REQUIRE(state[static_cast<std::size_t>(rank)] == (want.step == 100 ? RankState::At100 : RankState::At101));
    }
    // What each rank learns from the stages alone (the root sends only those) is exactly its part of the plan.
    for (int r = 0; r < l.world_size(); ++r) {
      auto it = got.writers.find(r);
      const std::vector<std::string> mine = it == got.writers.end() ? std::vector<std::string>{} : it->second;
      REQUIRE(last_words::writer_keys(l, got.replica_of_stage, l.coord_of(r)) == mine);
    }
  }
  return writes;
}

}  // namespace

TEST_CASE("last words: every failure set of small layouts matches a brute-force search", "[last_words][property]") {
  SECTION("DP2xTP2xPP2: all 2^8 alive sets") {
    CHECK(check_every_failure_set({2, 2, 2, false}, false) > 0);
    CHECK(check_every_failure_set({2, 2, 2, true}, false) == 1);  // ZeRO-1: only with nobody dead
  }
  SECTION("DP2xTP2xPP2: all 4^8 combinations of dead, step 100, step 101 and mid-update") {
    CHECK(check_every_failure_set({2, 2, 2, false}, true) > 0);
    CHECK(check_every_failure_set({2, 2, 2, true}, true) == 2);  // everyone at 100, or everyone at 101
  }
  SECTION("other shapes") {
    for (Layout l : {Layout{3, 1, 2, false}, Layout{3, 1, 2, true}, Layout{1, 2, 2, false}, Layout{2, 1, 1, false},
                     Layout{3, 2, 1, false}, Layout{3, 2, 1, true}, Layout{1, 1, 3, false}, Layout{2, 1, 3, false}}) {
      CHECK(check_every_failure_set(l, true) > 0);
    }
  }
}

// ---- the memory tier: snapshots in staging, partner copies ---------------------------------------------------------

namespace {

using last_words::WriteSource;

const RankReport& of_rank(const std::vector<RankReport>& reports, int rank) {
  for (const RankReport& r : reports) {
    if (r.coord.rank == rank) return r;
  }
  FAIL("no report from rank " << rank);
  return reports.front();
}

// What must hold of any plan that writes with the memory tier: each shard comes from its own rank by the one rule
// (source_for) or from a live holder of its copy at the step, never both; from_memory is exactly the shards whose
// rank writes from staging; and each shard's keys are what writer_keys() gives its rank's (the ward's) coordinate.
void check_sources(const Layout& l, const std::vector<RankReport>& reports, const Plan& plan) {
  INFO(all_reasons(plan));
  check_against_store(l, plan);
  REQUIRE(plan.write);
  std::set<int> staging;
  for (const auto& [rank, keys] : plan.writers) {
    const RankReport& r = of_rank(reports, rank);
    const WriteSource own = last_words::source_for(r, plan.step);
    auto stand_in = plan.stand_ins.find(rank);
    if (stand_in == plan.stand_ins.end()) {
      CHECK(own != WriteSource::None);
    } else {
      CHECK(own == WriteSource::None);
      const RankReport& holder = of_rank(reports, stand_in->second);
      CHECK(holder.alive);
      CHECK(std::count(holder.held.begin(), holder.held.end(), std::make_pair(rank, plan.step)) == 1);
    }
    if (own == WriteSource::Staging) staging.insert(rank);
    CHECK(last_words::writer_keys(l, plan.replica_of_stage, r.coord) == keys);
  }
  CHECK(plan.from_memory == staging);
  for (const auto& [ward, holder] : plan.stand_ins) CHECK(plan.writers.count(ward) == 1);
}

}  // namespace

TEST_CASE("last words: source_for, the one rule for a rank's own shard", "[last_words]") {
  RankReport r;
  r.alive = true;
  r.step = 12;
  CHECK(last_words::source_for(r, 12) == WriteSource::Live);
  CHECK(last_words::source_for(r, 11) == WriteSource::None);
  r.memory_steps = {11};
  CHECK(last_words::source_for(r, 11) == WriteSource::Staging);
  r.memory_steps = {12};
  CHECK(last_words::source_for(r, 12) == WriteSource::Live);  // live state first: no copy out of staging
  r.mid_update = true;
  CHECK(last_words::source_for(r, 12) == WriteSource::Staging);
  r.memory_steps.clear();
  CHECK(last_words::source_for(r, 12) == WriteSource::None);
  r.mid_update = false;
  r.memory_steps = {12};
  r.alive = false;
  CHECK(last_words::source_for(r, 12) == WriteSource::None);
}

TEST_CASE("last words: ZeRO-1 with the memory tier", "[last_words]") {
  const Layout l{3, 1, 1, true};  // ranks 0, 1, 2 = dp0, dp1, dp2; each alone holds its optimizer shard
  auto reports = healthy(l);
  at(reports, 1, 0, 0).alive = false;

  SECTION("a dead rank's shard from its partner copy") {
    at(reports, 2, 0, 0).held = {{1, 100}};
    Plan plan = last_words::plan(l, reports);
    check_sources(l, reports, plan);
    CHECK(plan.step == 100);
    CHECK(plan.stand_ins == std::map<int, int>{{1, 2}});
    CHECK(plan.from_memory.empty());
    CHECK(sorted_writers(plan) == expected_writers(l, {0}));
    CHECK(plan.writers.at(1) == std::vector<std::string>{"optim/pp0/tp0/dp1"});
    CHECK(has_reason(plan,
                     "rank 1 (dp1/tp0/pp0) is dead: its shard of step 100 comes from its partner copy on rank 2"));
    CHECK(plan.summary ==
          "last words: writing a terminal checkpoint at step 100: 3 writers cover 4 state keys (pp0 from dp0); 1 "
          "shard from a partner copy");

    // The stand-in writes under the ward's rank: the record the store sees is rank 1's.
    const auto records = last_words::planned_records(plan);
    auto ward = std::find_if(records.begin(), records.end(), [](const store::ShardRecord& r) { return r.rank == 1; });
    REQUIRE(ward != records.end());
    CHECK(ward->file == store::shard_file_name(1));
    CHECK(ward->covers == std::vector<std::string>{"optim/pp0/tp0/dp1"});
    CHECK(std::none_of(records.begin(), records.end(), [](const store::ShardRecord& r) {
      return r.rank == 2 && r.covers == std::vector<std::string>{"optim/pp0/tp0/dp1"};
    }));
    CHECK(store::decide_commit(store::Kind::Terminal, l, l.world_size(), records).complete);
  }
  SECTION("without the copy: today's rule, nothing is written") {
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    CHECK_FALSE(plan.write);
    CHECK(has_reason(plan, "optim/pp0/tp0/dp1: its only holder rank 1 (dp1/tp0/pp0) is dead"));
    CHECK(plan.stand_ins.empty());

    at(reports, 0, 0, 0).held = {{2, 100}};  // the tier runs, but nobody holds rank 1's copy
    Plan tier = last_words::plan(l, reports);
    check_against_store(l, tier);
    CHECK_FALSE(tier.write);
    CHECK(has_reason(tier,
                     "optim/pp0/tp0/dp1: its only holder rank 1 (dp1/tp0/pp0) is dead; no live rank holds a copy of "
                     "its shard"));
  }
  SECTION("a survivor caught mid-update writes the step its snapshot holds") {
    at(reports, 2, 0, 0).held = {{1, 100}};
    at(reports, 2, 0, 0).mid_update = true;
    at(reports, 2, 0, 0).step = 101;
    at(reports, 2, 0, 0).memory_steps = {100};
    Plan plan = last_words::plan(l, reports);
    check_sources(l, reports, plan);
    CHECK(plan.step == 100);
    CHECK(plan.stand_ins == std::map<int, int>{{1, 2}});
    CHECK(plan.from_memory == std::set<int>{2});
    CHECK(has_reason(plan, "rank 2 (dp2/tp0/pp0) writes step 100 from its snapshot (it was caught mid-update at step "
                           "101)"));
    CHECK(plan.summary.ends_with("; 1 shard from a partner copy, 1 shard from a snapshot"));
  }
  SECTION("an older copy takes the plan back only when the newer step is incomplete") {
    for (RankReport& r : reports) {
      r.step = 101;
      r.memory_steps = {100};
    }
    at(reports, 2, 0, 0).held = {{1, 100}};
    Plan older = last_words::plan(l, reports);
    check_sources(l, reports, older);
    CHECK(older.step == 100);
    CHECK(older.stand_ins == std::map<int, int>{{1, 2}});
    CHECK(older.from_memory == std::set<int>{0, 2});
    CHECK(has_reason(older, "rank 0 (dp0/tp0/pp0) writes step 100 from its snapshot (its live state is at step 101)"));

    at(reports, 1, 0, 0).alive = true;  // step 101 is complete now: live state, no copy, no snapshot
    Plan newer = last_words::plan(l, reports);
    check_sources(l, reports, newer);
    CHECK(newer.step == 101);
    CHECK(newer.stand_ins.empty());
    CHECK(newer.from_memory.empty());
    CHECK(sorted_writers(newer) == expected_writers(l, {0}));
  }
  SECTION("the dead rank's copy is a step behind the survivors' last snapshot: their snapshot before it counts") {
    // The crash came while the last memory checkpoint's copies travelled: the survivors' staging holds step 101
    // and, kept until the next one begins, step 100; the dead rank's copy of step 101 never arrived.
    for (RankReport& r : reports) {
      r.step = 102;
      r.memory_steps = {101, 100};
    }
    at(reports, 2, 0, 0).held = {{1, 100}};
    at(reports, 0, 0, 0).held = {{2, 100}};
    Plan plan = last_words::plan(l, reports);
    check_sources(l, reports, plan);
    CHECK(plan.step == 100);
    CHECK(plan.stand_ins == std::map<int, int>{{1, 2}});
    CHECK(plan.from_memory == std::set<int>{0, 2});
    at(reports, 2, 0, 0).memory_steps = {101};  // one snapshot only: step 100 is gone from rank 2...
    at(reports, 0, 0, 0).held.clear();           // ... and no copy of it is left
    Plan without = last_words::plan(l, reports);
    check_against_store(l, without);
    CHECK_FALSE(without.write);
    std::string reasons;
    for (const std::string& r : without.reasons) reasons += r + "\n";
    CHECK_THAT(reasons, Catch::Contains("1 of 4 state keys cannot be covered at step 102 (optim/pp0/tp0/dp1: its "
                                        "only holder rank 1 (dp1/tp0/pp0) is dead; a partner copy of step 100 on "
                                        "rank 2)"));
  }
  SECTION("a copy of an older step without the survivors' snapshots of it: nothing is written") {
    for (RankReport& r : reports) r.step = 101;
    at(reports, 2, 0, 0).held = {{1, 100}};
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    CHECK_FALSE(plan.write);
    CHECK(has_reason(plan, "optim/pp0/tp0/dp1: its only holder rank 1 (dp1/tp0/pp0) is dead; a partner copy of step "
                           "100 on rank 2"));
  }
  SECTION("two holders: the lowest rank stands in") {
    at(reports, 2, 0, 0).held = {{1, 100}};
    at(reports, 0, 0, 0).held = {{1, 100}};
    Plan plan = last_words::plan(l, reports);
    check_sources(l, reports, plan);
    CHECK(plan.stand_ins == std::map<int, int>{{1, 0}});
  }
  SECTION("the rank itself before any holder") {
    at(reports, 1, 0, 0).alive = true;
    at(reports, 2, 0, 0).held = {{1, 100}};
    Plan plan = last_words::plan(l, reports);
    check_sources(l, reports, plan);
    CHECK(plan.stand_ins.empty());
  }
  SECTION("a live rank caught mid-update without a snapshot: its partner copy stands in") {
    at(reports, 1, 0, 0).alive = true;
    at(reports, 1, 0, 0).mid_update = true;
    at(reports, 0, 0, 0).held = {{1, 100}};
    Plan plan = last_words::plan(l, reports);
    check_sources(l, reports, plan);
    CHECK(plan.stand_ins == std::map<int, int>{{1, 0}});
    CHECK(has_reason(plan, "rank 1 (dp1/tp0/pp0) was caught mid-update at step 100: its shard of step 100 comes "
                           "from its partner copy on rank 0"));
  }
}

TEST_CASE("last words: a dead node's ranks whose copies straddle a step are covered by their holders' older copies",
          "[last_words]") {
  // ZeRO-1 over 3 nodes of 2 ranks (0, 1 | 2, 3 | 4, 5), each rank's copy on the rank 2 on. The node of ranks 4
  // and 5 died while the copies of step 101 travelled: rank 4's arrived on rank 0, rank 5's did not reach rank 1.
  // Rank 1's staging began the snapshot of step 101 and holds step 100 alone; every other survivor holds both.
  const Layout l{6, 1, 1, true};
  auto reports = healthy(l);
  for (RankReport& r : reports) {
    r.step = 101;
    r.memory_steps = {101, 100};
  }
  at(reports, 4, 0, 0).alive = false;
  at(reports, 5, 0, 0).alive = false;
  at(reports, 1, 0, 0).memory_steps = {100};
  at(reports, 1, 0, 0).mid_update = true;
  at(reports, 1, 0, 0).held = {{5, 100}};

  SECTION("with the newest copy alone on each holder, no step covers both dead ranks: nothing is written") {
    at(reports, 0, 0, 0).held = {{4, 101}};
    Plan plan = last_words::plan(l, reports);
    check_against_store(l, plan);
    CHECK_FALSE(plan.write);
  }
  SECTION("with the copy before it still whole on rank 0, step 100 is written, both dead shards from copies") {
    at(reports, 0, 0, 0).held = {{4, 101}, {4, 100}};
    Plan plan = last_words::plan(l, reports);
    check_sources(l, reports, plan);
    CHECK(plan.step == 100);
    CHECK(plan.stand_ins == std::map<int, int>{{4, 0}, {5, 1}});
    CHECK(plan.from_memory == std::set<int>{0, 1, 2, 3});
    CHECK(plan.summary.ends_with("; 2 shards from partner copies, 4 shards from snapshots"));
  }
}

TEST_CASE("last words: no terminal checkpoint before the dir's newest committed one", "[last_words]") {
  // A periodic checkpoint of step 20 is committed; the survivors' staging holds steps 20 and 10, and the copy of
  // the dead rank's step 20 failed its checksums: only its copy of step 10 is left.
  const Layout l{3, 1, 1, true};
  auto reports = healthy(l, 22);
  for (RankReport& r : reports) r.memory_steps = {20, 10};
  at(reports, 2, 0, 0).alive = false;
  at(reports, 0, 0, 0).held = {{2, 10}};
  Plan older = last_words::plan(l, reports);  // the dir not consulted: step 10 is written
  check_sources(l, reports, older);
  CHECK(older.step == 10);
  Plan none = last_words::plan(l, reports, 20);
  check_against_store(l, none);
  CHECK_FALSE(none.write);
  CHECK(none.stand_ins.empty());
  at(reports, 0, 0, 0).held = {{2, 20}, {2, 10}};  // the copy of step 20 is whole: step 20, the committed one
  Plan same = last_words::plan(l, reports, 20);
  check_sources(l, reports, same);
  CHECK(same.step == 20);
}

TEST_CASE("last words: a dead holder cannot stand in", "[last_words]") {
  const Layout l{4, 1, 1, true};
  auto reports = healthy(l);
  at(reports, 1, 0, 0).alive = false;
  at(reports, 2, 0, 0).alive = false;
  at(reports, 2, 0, 0).held = {{1, 100}};  // died with its holder
  at(reports, 3, 0, 0).held = {{2, 100}};
  Plan plan = last_words::plan(l, reports);
  check_against_store(l, plan);
  CHECK_FALSE(plan.write);
  CHECK(has_reason(plan,
                   "optim/pp0/tp0/dp1: its only holder rank 1 (dp1/tp0/pp0) is dead; no live rank holds a copy of its "
                   "shard"));

  at(reports, 0, 0, 0).held = {{1, 100}};
  Plan both = last_words::plan(l, reports);
  check_sources(l, reports, both);
  CHECK(both.stand_ins == std::map<int, int>{{1, 0}, {2, 3}});
  CHECK(both.summary.ends_with("; 2 shards from partner copies"));
}

TEST_CASE("last words: a writer that dies after the plan gets the lowest live holder of its copy as stand-in",
          "[last_words]") {
  // ZeRO-1 over 4 ranks; the plan has every rank write its own shard of step 100. Rank 1 dies in its write.
  const Layout l{4, 1, 1, true};
  auto reports = healthy(l);
  at(reports, 3, 0, 0).held = {{1, 99}, {1, 100}};
  at(reports, 2, 0, 0).held = {{1, 100}};
  at(reports, 0, 0, 0).held = {{3, 100}};
  REQUIRE(last_words::plan(l, reports).write);
  CHECK(last_words::late_stand_in(reports, {1}, 1, 100) == 2);   // the lowest of the two holders of step 100
  CHECK(last_words::late_stand_in(reports, {1, 2}, 1, 100) == 3);  // its copy died with rank 2: rank 3's
  CHECK(last_words::late_stand_in(reports, {1}, 1, 99) == 3);    // only rank 3 holds step 99
  CHECK_FALSE(last_words::late_stand_in(reports, {1}, 1, 101));   // nobody holds a copy of step 101
  CHECK_FALSE(last_words::late_stand_in(reports, {1, 2, 3}, 1, 100));  // every holder gone
  at(reports, 2, 0, 0).alive = false;  // dead before the plan (no report): its copies are no source
  CHECK(last_words::late_stand_in(reports, {1}, 1, 100) == 3);
  CHECK_FALSE(last_words::late_stand_in(reports, {}, 0, 100));  // nobody holds rank 0's shard
}

TEST_CASE("last words: a tensor-parallel group completed by a partner copy", "[last_words]") {
  const Layout l{2, 2, 1, false};  // dp0 = ranks 0, 1; dp1 = ranks 2, 3
  auto reports = healthy(l);
  at(reports, 0, 1, 0).alive = false;  // rank 1
  at(reports, 1, 1, 0).alive = false;  // rank 3: neither replica is whole
  at(reports, 1, 0, 0).held = {{3, 99}};
  Plan none = last_words::plan(l, reports);
  check_against_store(l, none);
  CHECK_FALSE(none.write);
  CHECK(has_reason(none, "replica dp0 of stage pp0 disqualified: rank 1 (dp0/tp1/pp0) is dead; no live rank holds a "
                         "copy of its shard"));
  CHECK(has_reason(none, "replica dp1 of stage pp0 disqualified: rank 3 (dp1/tp1/pp0) is dead; a partner copy of "
                         "step 99 on rank 2"));

  at(reports, 1, 0, 0).held = {{3, 99}, {1, 100}};
  Plan plan = last_words::plan(l, reports);
  check_sources(l, reports, plan);
  CHECK(plan.step == 100);
  CHECK(plan.replica_of_stage == std::vector<int>{0});
  CHECK(plan.stand_ins == std::map<int, int>{{1, 2}});
  CHECK(sorted_writers(plan) == expected_writers(l, {0}));
  CHECK(plan.writers.at(1) == std::vector<std::string>{"model/pp0/tp1", "optim/pp0/tp1"});
}

TEST_CASE("last words: pure data parallelism needs no copy", "[last_words]") {
  const Layout l{4, 1, 1, false};
  auto reports = healthy(l);
  at(reports, 0, 0, 0).alive = false;
  const Plan plain = last_words::plan(l, reports);

  at(reports, 1, 0, 0).held = {{0, 100}};
  for (RankReport& r : reports) r.memory_steps = {99};
  Plan plan = last_words::plan(l, reports);
  check_sources(l, reports, plan);
  CHECK(plan.step == 100);
  CHECK(plan.replica_of_stage == plain.replica_of_stage);
  CHECK(plan.writers == plain.writers);
  CHECK(plan.summary == plain.summary);
  CHECK(plan.stand_ins.empty());  // dp1 is whole; rank 0's shard is not needed
  CHECK(plan.from_memory.empty());
}

TEST_CASE("last words: bad partner copies write nothing", "[last_words]") {
  const Layout l{2, 1, 1, false};
  auto reports = healthy(l);
  reports[0].held = {{2, 100}};
  CHECK(last_words::plan(l, reports).summary ==
        "last words: not writing a terminal checkpoint: invalid report from rank 0: holds a copy of rank 2, outside a "
        "world of 2");
  reports[0].held = {{0, 100}};
  CHECK(last_words::plan(l, reports).summary ==
        "last words: not writing a terminal checkpoint: invalid report from rank 0: holds a copy of its own shard");
  reports[0].held = {{-1, 100}};
  CHECK_FALSE(last_words::plan(l, reports).write);
  reports[0].held = {{1, 100}};
  CHECK(last_words::plan(l, reports).write);
}

TEST_CASE("last words: behind, the survivors that hold no state of the agreed step", "[last_words]") {
  const Layout l{4, 1, 1, false};
  auto reports = healthy(l);
  at(reports, 3, 0, 0).alive = false;
  at(reports, 1, 0, 0).step = 99;  // its last all-reduce failed where dp0's and dp2's had ended
  Plan plan = last_words::plan(l, reports);
  REQUIRE(plan.write);
  CHECK(plan.step == 100);
  CHECK(last_words::behind(plan, reports) == std::vector<int>{1});  // the dead rank is not behind: it is lost

  SECTION("caught mid-update: behind, unless its staging holds the step") {
    at(reports, 2, 0, 0).mid_update = true;
    plan = last_words::plan(l, reports);
    REQUIRE(plan.write);
    CHECK(last_words::behind(plan, reports) == std::vector<int>{1, 2});
    at(reports, 2, 0, 0).memory_steps = {100};
    at(reports, 1, 0, 0).memory_steps = {99};  // a snapshot of another step does not help
    plan = last_words::plan(l, reports);
    CHECK(last_words::behind(plan, reports) == std::vector<int>{1});
  }
  SECTION("a plan that writes nothing leaves nobody behind") {
    for (RankReport& r : reports) r.mid_update = true;
    plan = last_words::plan(l, reports);
    REQUIRE_FALSE(plan.write);
    CHECK(last_words::behind(plan, reports).empty());
  }
}
