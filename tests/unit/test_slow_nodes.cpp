// Slow-node reports: the event's strict parsing, and what the controller's record makes of one (apply_slow_node).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/recovery_plan.hpp"

using namespace ckpt::recovery;

namespace {

// A slow-node report for job 42 as the job's root rank sends it, with one field replaced by `key: value` (JSON
// text), or removed when `value` is empty.
std::string slow_json(const std::string& key = "", const std::string& value = "") {
  nlohmann::json j = nlohmann::json::parse(
      R"json({"v":1,"type":"slow_node","job_id":42,"step_id":0,"restart_count":1,"node":"n1","uid":1000,
          "time":1700000010.0,"slow_node":"n4","score":0.48,"action":"exclude",
          "detail":"0.48 of the job's best for 3 windows up to step 25 (rank 4)"})json");
  if (!key.empty() && value.empty()) j.erase(key);
  if (!key.empty() && !value.empty()) j[key] = nlohmann::json::parse(value);
  return j.dump();
}

Event slow_event(const std::string& node, double score, const char* action, std::uint32_t restart_count = 0) {
  Event e;
  e.type = EventType::SlowNode;
  e.job_id = 7;
  e.step_id = 0;
  e.restart_count = restart_count;
  e.node = "n1";
  e.slow_node = node;
  e.score = score;
  e.action = action;
  e.detail = "0.48 of the job's best for 3 windows up to step 25 (rank 4)";
  return e;
}

JobRecord running_job() {
  JobRecord r;
  r.job_id = 7;
  r.state = JobState::Running;
  r.nodes = {"n1", "n2", "n3", "n4"};
  r.batch_host = "n1";
  return r;
}

}  // namespace

TEST_CASE("slow-node events: round trip and strict parsing", "[recovery][events][slow-nodes][security]") {
  SECTION("good inputs") {
    auto e = parse_event(slow_json());
    REQUIRE(e);
    CHECK(e->type == EventType::SlowNode);
    CHECK(std::string(to_string(e->type)) == "slow_node");
    CHECK(e->slow_node == "n4");
    CHECK(e->score == 0.48);
    CHECK(e->action == kSlowNodeExclude);
    CHECK(e->node == "n1");
    CHECK(e->restart_count == 1);
    CHECK(e->detail == "0.48 of the job's best for 3 windows up to step 25 (rank 4)");
    auto back = parse_event(to_json(*e));
    REQUIRE(back);
    CHECK(to_json(*back) == to_json(*e));
    CHECK(parse_event(slow_json("action", R"("report")"))->action == kSlowNodeReport);
    CHECK(parse_event(slow_json("score", "1"))->score == 1.0);  // as fast as the best: allowed, if odd
    CHECK(parse_event(slow_json("slow_node", R"("gpu-01.x_2")")));
    CHECK(parse_event(slow_json("detail")));  // detail is optional
    // Other types carry no slow-node fields.
    Event start;
    start.type = EventType::JobStart;
    start.job_id = 9;
    start.node = "n1";
    CHECK(to_json(start).find("slow_node") == std::string::npos);
    CHECK(to_json(start).find("score") == std::string::npos);
  }
  SECTION("bad inputs") {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"score", "0"},           {"score", "-0.5"},          {"score", "1.0001"},   {"score", "2"},
        {"score", "1e-400"},      {"score", R"("0.5")"},      {"score", "null"},     {"score", ""},
        {"action", R"("drain")"}, {"action", R"("EXCLUDE")"}, {"action", R"("")"},   {"action", "1"},
        {"action", ""},           {"slow_node", R"("n1;reboot")"}, {"slow_node", R"("n 4")"},
        {"slow_node", R"("n[1-3]")"}, {"slow_node", R"("")"}, {"slow_node", ""},     {"slow_node", "[\"n4\"]"},
        {"slow_node", '"' + std::string(300, 'n') + '"'},     {"detail", '"' + std::string(2000, 'x') + '"'},
        {"detail", R"("a\nb")"},  {"node", R"("n1/x")"},
    };
    for (const auto& [key, value] : bad) {
      auto e = parse_event(slow_json(key, value));
      INFO(key << " = " << value.substr(0, 40));
      CHECK_FALSE(e);
      if (!e) CHECK(e.error().find('\n') == std::string::npos);
    }
    CHECK(parse_event(slow_json("slow_node")).error() == "slow_node event has no slow_node");
    CHECK(parse_event(slow_json("score", "0")).error() == "event score is not a number in (0, 1]");
    CHECK(parse_event(slow_json("action", R"("drain")")).error() == "event action is not 'report' or 'exclude'");
    // An overflowing number is no JSON the parser takes.
    std::string huge = slow_json();
    huge.replace(huge.find("0.48,"), 4, "1e400");
    CHECK_FALSE(parse_event(huge));
    // A NaN score cannot be sent: JSON has none (it is written as null), and null is no score.
    Event nan = *parse_event(slow_json());
    nan.score = std::numeric_limits<double>::quiet_NaN();
    CHECK_FALSE(parse_event(to_json(nan)));
    // The fields are checked on every type: junk is never carried along.
    CHECK_FALSE(parse_event(R"({"v":1,"type":"job_end","job_id":1,"node":"n1","score":7})"));
    CHECK_FALSE(parse_event(R"({"v":1,"type":"job_end","job_id":1,"node":"n1","action":"drain"})"));
    CHECK_FALSE(parse_event(R"({"v":1,"type":"job_end","job_id":1,"node":"n1","slow_node":"a;b"})"));
  }
}

TEST_CASE("slow-node events: a report is recorded without changing the job's state or budget",
          "[recovery][events][slow-nodes]") {
  JobRecord r = running_job();
  r.budget.restarts = 1;
  auto fx = apply_event(r, slow_event("n4", 0.48, kSlowNodeReport), false, 500);
  CHECK(fx.note == "slow_node from n1 (step 0): slow node n4: 0.48 of the job's best (0.48 of the job's best for 3 "
                   "windows up to step 25 (rank 4))");
  CHECK(fx.exclude.empty());
  CHECK_FALSE(fx.to);
  CHECK_FALSE(fx.start_failing);
  CHECK_FALSE(fx.restarted);
  CHECK_FALSE(fx.give_up);
  REQUIRE(fx.slow_node);
  CHECK(fx.slow_node->node == "n4");
  REQUIRE(r.slow_nodes.size() == 1);
  CHECK(r.slow_nodes[0].node == "n4");
  CHECK(r.slow_nodes[0].score == 0.48);
  CHECK(r.slow_nodes[0].time == 500);  // the controller's clock, not the sender's
  CHECK(r.slow_nodes[0].action == kSlowNodeReport);
  CHECK(r.state == JobState::Running);
  CHECK(r.budget.restarts == 1);
  CHECK(r.failures.empty());
  CHECK(r.bad_nodes.empty());
}

TEST_CASE("slow-node events: exclude leaves the node out of the job's next runs, never marks it DOWN",
          "[recovery][events][slow-nodes]") {
  JobRecord r = running_job();
  auto fx = apply_event(r, slow_event("n4", 0.5, kSlowNodeExclude), false, 500);
  CHECK(fx.note.find("slow node n4: 0.5 of the job's best") != std::string::npos);
  CHECK(fx.note.ends_with(", excluding it from the job's next runs"));
  CHECK(fx.exclude == std::vector<std::string>{"n4"});
  CHECK(fx.exclude_reason == "reported slow by job 7 (0.5 of the job's best)");
  CHECK(r.state == JobState::Running);
  CHECK_FALSE(fx.to);

  // What the engine does with it: the bad node for the TTL, and the next requeue's ExcNodeList has it.
  CHECK(exclude_bad_nodes(r.bad_nodes, fx.exclude, fx.exclude_reason, 500, 3600) == fx.exclude);
  CHECK(active_bad_nodes(r.bad_nodes, 600) == std::vector<std::string>{"n4"});
  CHECK(active_bad_nodes(r.bad_nodes, 500 + 3601).empty());
  r.state = JobState::Failing;
  r.failures.push_back(TaskFailure{0, "n2", 1, 1, 0, 700});
  RecoveryFacts f;
  f.ending = Ending::TaskCrash;
  f.slurm.job_id = 7;
  f.slurm.state = SlurmState::Failed;
  f.newest_complete = 10;
  f.now = 700;
  const auto plan = plan_recovery(r, f, RecoveryPolicy{});
  REQUIRE(plan.action == RecoveryPlan::Action::Requeue);
  CHECK(plan.intent.exclude == std::vector<std::string>{"n4"});
  CHECK(plan.intent.mark_down.empty());  // a user's word marks nothing DOWN
  CHECK(plan.intent.drain.empty());
  RecoveryPolicy draining;
  draining.drain_bad_nodes = true;
  CHECK(plan_recovery(r, f, draining).intent.drain.empty());  // nor drains it, even where the site drains
}

TEST_CASE("slow-node events: only the job's own nodes, only a job that is not over",
          "[recovery][events][slow-nodes][security]") {
  JobRecord r = running_job();
  auto fx = apply_event(r, slow_event("gpu9", 0.2, kSlowNodeExclude), false, 500);
  CHECK(fx.note == "slow_node from n1 (step 0): slow node gpu9 is not a node of the job's allocation; ignored");
  CHECK(fx.exclude.empty());
  CHECK_FALSE(fx.slow_node);
  CHECK(r.slow_nodes.empty());

  JobRecord unknown = running_job();
  unknown.nodes.clear();  // an allocation the controller does not know yet: nothing is taken on the owner's word
  CHECK(apply_event(unknown, slow_event("n4", 0.2, kSlowNodeExclude), false, 500).exclude.empty());
  CHECK(unknown.slow_nodes.empty());

  JobRecord done = running_job();
  done.state = JobState::GaveUp;
  fx = apply_event(done, slow_event("n4", 0.2, kSlowNodeExclude), false, 500);
  CHECK(fx.note.find("the job is gave-up, not recorded") != std::string::npos);
  CHECK(fx.exclude.empty());
  CHECK(done.slow_nodes.empty());

  // Root's word about another job's node is refused the same way: the record speaks of its own allocation.
  CHECK(apply_event(r, slow_event("gpu9", 0.2, kSlowNodeExclude), true, 500).exclude.empty());
}

TEST_CASE("slow-node events: a stale run's report is not of this run", "[recovery][events][slow-nodes]") {
  JobRecord r = running_job();
  r.restart_count = 2;
  CHECK(run_of_event(r, slow_event("n4", 0.3, kSlowNodeExclude, 1)) == EventRun::Stale);
  CHECK(run_of_event(r, slow_event("n4", 0.3, kSlowNodeExclude, 2)) == EventRun::Current);
}

TEST_CASE("slow-node events: the newest report per node, at most 64 kept", "[recovery][events][slow-nodes][security]") {
  JobRecord r = running_job();
  apply_event(r, slow_event("n2", 0.6, kSlowNodeReport), false, 100);
  apply_event(r, slow_event("n3", 0.7, kSlowNodeReport), false, 110);
  apply_event(r, slow_event("n2", 0.4, kSlowNodeExclude), false, 120);
  REQUIRE(r.slow_nodes.size() == 2);
  CHECK(r.slow_nodes[0].node == "n3");
  CHECK(r.slow_nodes[1].node == "n2");  // replaced, and now the newest
  CHECK(r.slow_nodes[1].score == 0.4);
  CHECK(r.slow_nodes[1].time == 120);
  CHECK(r.slow_nodes[1].action == kSlowNodeExclude);

  std::vector<SlowNode> many;
  for (int i = 0; i < 100; ++i) record_slow_node(many, SlowNode{"x" + std::to_string(i), 0.5, 1.0 * i, "report"});
  REQUIRE(many.size() == kMaxSlowNodesPerRecord);
  CHECK(many.front().node == "x36");  // the oldest went first
  CHECK(many.back().node == "x99");
}

TEST_CASE("slow-node events: the record keeps them through JSON; old records have none",
          "[recovery][record][slow-nodes]") {
  JobRecord r = running_job();
  apply_event(r, slow_event("n4", 0.48, kSlowNodeExclude), false, 1700000000.25);
  apply_event(r, slow_event("n2", 0.75, kSlowNodeReport), false, 1700000001.5);
  const auto text = to_json(r);
  auto back = parse_job_record(text);
  REQUIRE(back);
  CHECK(to_json(*back) == text);
  REQUIRE(back->slow_nodes.size() == 2);
  CHECK(back->slow_nodes[0].node == "n4");
  CHECK(back->slow_nodes[0].score == 0.48);
  CHECK(back->slow_nodes[0].time == 1700000000.25);
  CHECK(back->slow_nodes[0].action == "exclude");
  const auto j = nlohmann::json::parse(text);
  CHECK(j["slow_nodes"][1] ==
        nlohmann::json{{"node", "n2"}, {"score", 0.75}, {"time", 1700000001.5}, {"action", "report"}});
  // A record stored before slow-node reports existed reads with none.
  auto old = parse_job_record(R"({"job_id":3,"state":"running","nodes":["n1"]})");
  REQUIRE(old);
  CHECK(old->slow_nodes.empty());
}
