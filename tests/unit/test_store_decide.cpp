#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "ckpt/store.hpp"

using namespace ckpt::store;

namespace {

ShardRecord rec(int rank, std::vector<std::string> covers = {}) {
  ShardRecord r;
  r.rank = rank;
  r.file = shard_file_name(rank);
  r.covers = std::move(covers);
  return r;
}

std::vector<ShardRecord> ranks(std::initializer_list<int> list) {
  std::vector<ShardRecord> out;
  for (int r : list) out.push_back(rec(r));
  return out;
}

Entry entry(std::uint64_t step, State state) {
  Entry e;
  e.step = step;
  e.state = state;
  return e;
}

using Steps = std::vector<std::uint64_t>;

}  // namespace

TEST_CASE("state keys", "[store][decide]") {
  SECTION("without ZeRO-1: a model and an optimizer key per (pp, tp)") {
    Layout layout{4, 2, 2, false};
    CHECK(required_state_keys(layout) ==
          std::vector<std::string>{"model/pp0/tp0", "model/pp0/tp1", "model/pp1/tp0", "model/pp1/tp1",
                                   "optim/pp0/tp0", "optim/pp0/tp1", "optim/pp1/tp0", "optim/pp1/tp1"});
    CHECK(state_keys_of_rank(layout, {5, 3, 1, 0}) == std::vector<std::string>{"model/pp0/tp1", "optim/pp0/tp1"});
  }
  SECTION("with ZeRO-1: optimizer keys per data-parallel shard") {
    Layout layout{2, 1, 2, true};
    CHECK(required_state_keys(layout) ==
          std::vector<std::string>{"model/pp0/tp0", "model/pp1/tp0", "optim/pp0/tp0/dp0", "optim/pp0/tp0/dp1",
                                   "optim/pp1/tp0/dp0", "optim/pp1/tp0/dp1"});
    CHECK(state_keys_of_rank(layout, {3, 1, 0, 1}) ==
          std::vector<std::string>{"model/pp1/tp0", "optim/pp1/tp0/dp1"});
  }
  SECTION("every rank's keys are required keys, and together they cover them") {
    for (bool zero1 : {false, true}) {
      Layout layout{3, 2, 2, zero1};
      std::vector<std::string> required = required_state_keys(layout);
      std::set<std::string> all(required.begin(), required.end());
      CHECK(all.size() == required.size());
      std::set<std::string> held;
      for (int p = 0; p < 2; ++p) {
        for (int t = 0; t < 2; ++t) {
          for (int d = 0; d < 3; ++d) {
            for (const std::string& k : state_keys_of_rank(layout, {0, d, t, p})) {
              CHECK(all.count(k) == 1);
              held.insert(k);
            }
          }
        }
      }
      CHECK(held == all);
    }
  }
}

TEST_CASE("decide_commit: periodic", "[store][decide]") {
  Layout layout{4, 1, 1, false};
  SECTION("good inputs") {
    auto d = decide_commit(Kind::Periodic, layout, 4, ranks({3, 1, 0, 2}));
    CHECK(d.complete);
    CHECK(d.reason == "all 4 ranks written");
  }
  SECTION("bad inputs") {
    auto missing = decide_commit(Kind::Periodic, layout, 4, ranks({0, 2}));
    CHECK_FALSE(missing.complete);
    CHECK(missing.reason == "missing 2 of 4 ranks: 1, 3");
    CHECK_THAT(decide_commit(Kind::Periodic, layout, 4, ranks({0, 1, 1, 2, 3})).reason,
               Catch::Contains("two records for rank 1"));
    CHECK_THAT(decide_commit(Kind::Periodic, layout, 4, ranks({0, 1, 2, 3, 4})).reason,
               Catch::Contains("rank 4 outside"));
    CHECK_THAT(decide_commit(Kind::Periodic, layout, 4, ranks({0, 1, 2, -1})).reason, Catch::Contains("rank -1"));
    CHECK_FALSE(decide_commit(Kind::Periodic, layout, 4, {}).complete);
    CHECK_FALSE(decide_commit(Kind::Periodic, layout, 0, {}).complete);
    CHECK_THAT(decide_commit(Kind::Periodic, layout, 20, ranks({0})).reason, Catch::Contains("and 13 more"));
  }
}

TEST_CASE("decide_commit: terminal, written by survivors", "[store][decide]") {
  SECTION("good inputs") {
    // dp=2, tp=2: rank 1 died; rank 0 holds tp0 and rank 3 holds tp1 (replicas of the dead rank's state).
    Layout layout{2, 2, 1, false};
    std::vector<ShardRecord> present = {rec(0, {"model/pp0/tp0", "optim/pp0/tp0"}),
                                        rec(3, {"model/pp0/tp1", "optim/pp0/tp1"})};
    CHECK(decide_commit(Kind::Terminal, layout, 4, present).complete);
    // A survivor that wrote nothing coverable does not spoil it.
    present.push_back(rec(2));
    CHECK(decide_commit(Kind::Terminal, layout, 4, present).complete);
  }
  SECTION("bad inputs") {
    Layout layout{2, 2, 1, false};
    auto twice = decide_commit(Kind::Terminal, layout, 4,
                               {rec(0, {"model/pp0/tp0", "optim/pp0/tp0"}), rec(2, {"model/pp0/tp0"}),
                                rec(3, {"model/pp0/tp1", "optim/pp0/tp1"})});
    CHECK_FALSE(twice.complete);
    CHECK(twice.reason == "state key model/pp0/tp0 covered by ranks 0 and 2");
    auto uncovered = decide_commit(Kind::Terminal, layout, 4, {rec(0, {"model/pp0/tp0", "optim/pp0/tp0"})});
    CHECK_FALSE(uncovered.complete);
    CHECK(uncovered.reason == "2 of 4 state keys uncovered: model/pp0/tp1, optim/pp0/tp1");
    auto unknown = decide_commit(Kind::Terminal, layout, 4, {rec(0, {"model/pp9/tp0"})});
    CHECK_THAT(unknown.reason, Catch::Contains("unknown state key 'model/pp9/tp0'"));
    CHECK_FALSE(decide_commit(Kind::Terminal, Layout{0, 1, 1, false}, 4, {}).complete);
    CHECK_FALSE(decide_commit(Kind::Terminal, layout, 4, {rec(5, {"model/pp0/tp0"})}).complete);
  }
  SECTION("ZeRO-1: a dead rank's optimizer shard has no replica") {
    Layout layout{2, 1, 1, true};
    std::vector<ShardRecord> survivor = {rec(0, {"model/pp0/tp0", "optim/pp0/tp0/dp0"})};
    auto d = decide_commit(Kind::Terminal, layout, 2, survivor);
    CHECK_FALSE(d.complete);
    CHECK_THAT(d.reason, Catch::Contains("optim/pp0/tp0/dp1"));
    survivor.push_back(rec(1, {"optim/pp0/tp0/dp1"}));
    CHECK(decide_commit(Kind::Terminal, layout, 2, survivor).complete);
  }
}

TEST_CASE("resume_candidates", "[store][decide]") {
  std::vector<Entry> entries = {entry(100, State::Complete), entry(400, State::Incomplete),
                                entry(300, State::Failed), entry(200, State::Complete), entry(350, State::Corrupt),
                                entry(250, State::Complete)};
  CHECK(resume_candidates(entries) == Steps{250, 200, 100});
  CHECK(resume_candidates({}).empty());
  CHECK(resume_candidates({entry(1, State::Failed), entry(2, State::Corrupt)}).empty());
}

TEST_CASE("plan_gc", "[store][decide]") {
  SECTION("keeps the newest K complete and deletes older ones") {
    std::vector<Entry> e = {entry(100, State::Complete), entry(200, State::Complete), entry(300, State::Complete),
                            entry(400, State::Complete)};
    CHECK(plan_gc(e, 2, 400) == Steps{100, 200});
    CHECK(plan_gc(e, 4, 400).empty());
    CHECK(plan_gc(e, 10, std::nullopt).empty());
  }
  SECTION("never deletes the newest verified one") {
    std::vector<Entry> e = {entry(100, State::Complete), entry(200, State::Complete), entry(300, State::Complete)};
    CHECK(plan_gc(e, 1, 100) == Steps{200});
    CHECK(plan_gc(e, 1, 200) == Steps{100});
  }
  SECTION("keep 0 still keeps the newest complete one") {
    std::vector<Entry> e = {entry(100, State::Complete), entry(200, State::Complete)};
    CHECK(plan_gc(e, 0, std::nullopt) == Steps{100});
  }
  SECTION("deletes nothing while a newer checkpoint is incomplete") {
    std::vector<Entry> e = {entry(100, State::Complete), entry(200, State::Complete), entry(300, State::Incomplete),
                            entry(50, State::Incomplete)};
    CHECK(plan_gc(e, 1, 200).empty());
  }
  SECTION("deletes incomplete leftovers older than the newest complete one") {
    std::vector<Entry> e = {entry(50, State::Incomplete), entry(100, State::Complete), entry(150, State::Incomplete),
                            entry(200, State::Complete)};
    CHECK(plan_gc(e, 2, 200) == Steps{50, 150});
    CHECK(plan_gc(e, 1, 200) == Steps{50, 100, 150});
  }
  SECTION("never deletes FAILED or corrupt ones") {
    std::vector<Entry> e = {entry(50, State::Failed), entry(60, State::Corrupt), entry(100, State::Complete),
                            entry(200, State::Complete), entry(300, State::Failed), entry(400, State::Corrupt)};
    CHECK(plan_gc(e, 1, 200) == Steps{100});
  }
  SECTION("nothing complete: nothing deleted") {
    CHECK(plan_gc({entry(50, State::Incomplete), entry(60, State::Failed)}, 1, std::nullopt).empty());
    CHECK(plan_gc({}, 1, std::nullopt).empty());
  }
}
