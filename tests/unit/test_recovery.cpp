// The recovery controller's pure policy: classification, budget, bad nodes, the state machine's table.
#include <sys/resource.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/recovery.hpp"

using namespace ckpt::recovery;

namespace {

SlurmJob slurm(SlurmState state, int exit_code = 0, int signal = 0) {
  SlurmJob job;
  job.job_id = 7;
  job.state = state;
  job.exit_code = exit_code;
  job.exit_signal = signal;
  return job;
}

TaskFailure failure(const std::string& node, int exit_code, int signal = 0) {
  TaskFailure f;
  f.node = node;
  f.exit_code = exit_code;
  f.signal = signal;
  return f;
}

}  // namespace

TEST_CASE("classify: each ending from Slurm's final state", "[recovery][classify]") {
  EndingFacts facts;
  facts.slurm = slurm(SlurmState::Completed);
  CHECK(classify(facts) == Ending::CleanExit);
  facts.slurm = slurm(SlurmState::Cancelled);
  CHECK(classify(facts) == Ending::UserCancel);
  facts.slurm = slurm(SlurmState::Timeout);
  CHECK(classify(facts) == Ending::TimeLimit);
  facts.slurm = slurm(SlurmState::Preempted);
  CHECK(classify(facts) == Ending::Preemption);
  facts.slurm = slurm(SlurmState::OutOfMemory);
  CHECK(classify(facts) == Ending::OutOfMemory);
  facts.slurm = slurm(SlurmState::NodeFail);
  CHECK(classify(facts) == Ending::NodeFailure);
  facts.slurm = slurm(SlurmState::Failed, 1);
  CHECK(classify(facts) == Ending::TaskCrash);
  facts.slurm = slurm(SlurmState::Failed, kExitNoRestart);
  CHECK(classify(facts) == Ending::DoNotRestart);
}

TEST_CASE("classify: reports while Slurm still runs the job", "[recovery][classify]") {
  EndingFacts facts;
  facts.slurm = slurm(SlurmState::Running);
  SECTION("nothing known yet") { CHECK_FALSE(classify(facts).has_value()); }
  SECTION("a task crash on a live node waits for the batch script") {
    facts.failures.push_back(failure("n1", 1));
    CHECK_FALSE(classify(facts).has_value());
  }
  SECTION("a dead node is a node failure at once") {
    facts.failures.push_back(failure("n1", 1));
    facts.dead_nodes = {"n3"};
    CHECK(classify(facts) == Ending::NodeFailure);
  }
  SECTION("the reserved exit code is never turned into a node failure") {
    facts.failures.push_back(failure("n1", kExitNoRestart));
    facts.dead_nodes = {"n3"};
    CHECK_FALSE(classify(facts).has_value());
    facts.slurm = slurm(SlurmState::Failed, 1);
    CHECK(classify(facts) == Ending::DoNotRestart);
  }
  SECTION("a user's scancel wins over everything, dead nodes included") {
    facts.failures.push_back(failure("n1", 0, 15));
    facts.dead_nodes = {"n3"};
    facts.slurm = slurm(SlurmState::Cancelled);
    CHECK(classify(facts) == Ending::UserCancel);
  }
  SECTION("a clean exit of the batch script wins over rank failures it handled") {
    facts.failures.push_back(failure("n1", 1));
    facts.slurm = slurm(SlurmState::Completed, 0);
    CHECK(classify(facts) == Ending::CleanExit);
  }
  SECTION("no Slurm answer: only a dead node decides") {
    facts.slurm.reset();
    facts.failures.push_back(failure("n1", 1));
    CHECK_FALSE(classify(facts).has_value());
    facts.dead_nodes = {"n2"};
    CHECK(classify(facts) == Ending::NodeFailure);
  }
}

TEST_CASE("restart budget: resets only on progress, stops after N without", "[recovery][budget]") {
  Budget budget;
  budget.max_restarts = 2;
  SECTION("no checkpoint ever: two restarts, then give up with the reason") {
    auto v1 = decide_restart(Ending::TaskCrash, budget, std::nullopt, false);
    REQUIRE(v1.restart);
    CHECK(v1.after.without_progress == 1);
    auto v2 = decide_restart(Ending::TaskCrash, v1.after, std::nullopt, false);
    REQUIRE(v2.restart);
    auto v3 = decide_restart(Ending::TaskCrash, v2.after, std::nullopt, false);
    CHECK_FALSE(v3.restart);
    CHECK(v3.reason == "task crash after 2 restarts without progress (budget 2; newest complete checkpoint: none)");
    CHECK(v3.after.restarts == 2);
  }
  SECTION("an advancing checkpoint resets the count") {
    auto v1 = decide_restart(Ending::NodeFailure, budget, 100, false);
    auto v2 = decide_restart(Ending::NodeFailure, v1.after, 100, false);
    REQUIRE(v2.restart);
    CHECK(v2.after.without_progress == 2);
    auto v3 = decide_restart(Ending::NodeFailure, v2.after, 200, false);
    REQUIRE(v3.restart);
    CHECK(v3.after.without_progress == 1);
    CHECK(v3.after.progress_step == 200u);
    CHECK(v3.after.restarts == 3);
    auto v4 = decide_restart(Ending::NodeFailure, v3.after, 200, false);
    REQUIRE(v4.restart);
    CHECK_FALSE(decide_restart(Ending::NodeFailure, v4.after, 200, false).restart);
  }
  SECTION("a checkpoint that is not newer is not progress") {
    budget.progress_step = 300;
    budget.without_progress = 2;
    CHECK_FALSE(decide_restart(Ending::TaskCrash, budget, 300, false).restart);
    CHECK_FALSE(decide_restart(Ending::TaskCrash, budget, 200, false).restart);
  }
  SECTION("preemption does not spend the budget") {
    budget.without_progress = 2;
    auto v = decide_restart(Ending::Preemption, budget, std::nullopt, false);
    REQUIRE(v.restart);
    CHECK(v.after.without_progress == 2);
  }
  SECTION("max_restarts = 0 never restarts") {
    budget.max_restarts = 0;
    CHECK_FALSE(decide_restart(Ending::NodeFailure, budget, 5, false).restart);
  }
  SECTION("a job that needs a checkpoint is never restarted without one") {
    auto v = decide_restart(Ending::NodeFailure, budget, std::nullopt, true);
    CHECK_FALSE(v.restart);
    CHECK(v.reason == "node failure, and the job needs a checkpoint to restart but none is complete");
    CHECK(decide_restart(Ending::NodeFailure, budget, 10, true).restart);
  }
  SECTION("endings that are never restarted") {
    for (Ending e : {Ending::UserCancel, Ending::CleanExit, Ending::DoNotRestart, Ending::OutOfMemory}) {
      auto v = decide_restart(e, budget, 100, false);
      CHECK_FALSE(v.restart);
      CHECK_FALSE(v.reason.empty());
      CHECK(v.after.restarts == 0);
    }
  }
}

TEST_CASE("a clean exit after a time-limit stop of the same run is a time limit", "[recovery][classify]") {
  TimeLimitStop stop{"42", 2, 566};
  CHECK(ending_of_clean_exit(stop, 42, 2) == Ending::TimeLimit);
  CHECK(restartable(ending_of_clean_exit(stop, 42, 2)));
  CHECK(ending_of_clean_exit(std::nullopt, 42, 2) == Ending::CleanExit);
  CHECK(ending_of_clean_exit(stop, 42, 3) == Ending::CleanExit);  // an earlier run's record: the job finished
  CHECK(ending_of_clean_exit(stop, 43, 2) == Ending::CleanExit);  // another job's record in the same dir
  // Progress resets the budget: a chain of stops that each advanced never runs out.
  Budget budget{1, 0, 0, std::nullopt};
  for (std::uint64_t step : {400, 869, 1000}) {
    auto verdict = decide_restart(Ending::TimeLimit, budget, step, false);
    REQUIRE(verdict.restart);
    budget = verdict.after;
  }
  CHECK_FALSE(decide_restart(Ending::TimeLimit, decide_restart(Ending::TimeLimit, budget, 1000, false).after, 1000,
                             false)
                  .restart);
}

TEST_CASE("bad nodes are remembered with an expiry", "[recovery][nodes]") {
  auto nodes = add_bad_nodes({}, {"n3", "n1"}, "slurmd unreachable", 1000, 60);
  CHECK(active_bad_nodes(nodes, 1001) == std::vector<std::string>{"n1", "n3"});
  CHECK(active_bad_nodes(nodes, 1060).empty());
  nodes = add_bad_nodes(nodes, {"n3"}, "again", 1030, 60);
  CHECK(active_bad_nodes(nodes, 1070) == std::vector<std::string>{"n3"});
  CHECK(nodes[0].reason == "slurmd unreachable");  // refreshed, first reason kept
  nodes = add_bad_nodes(nodes, {"n1"}, "new episode", 2000, 60);
  CHECK(nodes[1].reason == "new episode");
  CHECK(forget_bad_node(nodes, "n1", 2010));
  CHECK_FALSE(forget_bad_node(nodes, "n1", 2010));  // no longer active
  CHECK_FALSE(forget_bad_node(nodes, "n3", 2010));  // expired long ago
  CHECK(active_bad_nodes(nodes, 2010).empty());
  CHECK(nodes.size() == 2);  // forgotten, not erased: it was bad once
  nodes = add_bad_nodes(nodes, {"n1"}, "fails again", 2020, 60);  // a new episode
  CHECK(active_bad_nodes(nodes, 2021) == std::vector<std::string>{"n1"});
  CHECK(nodes[1].reason == "fails again");
}

TEST_CASE("state machine: the table allows the recovery paths and nothing else", "[recovery][state]") {
  using S = JobState;
  SECTION("allowed") {
    CHECK(check_transition(S::Running, S::Failing));
    CHECK(check_transition(S::Failing, S::Requeueing));
    CHECK(check_transition(S::Requeueing, S::Pending));
    CHECK(check_transition(S::Pending, S::Running));
    CHECK(check_transition(S::Failing, S::Relaunching));
    CHECK(check_transition(S::Relaunching, S::Running));
    CHECK(check_transition(S::GaveUp, S::Requeueing));  // an admin's release
  }
  SECTION("illegal, with a message naming both states") {
    auto s = check_transition(S::Cancelled, S::Requeueing);
    CHECK_FALSE(s);
    CHECK(s.error() == "illegal transition cancelled -> requeueing");
    CHECK_FALSE(check_transition(S::Completed, S::Requeueing));
    CHECK_FALSE(check_transition(S::Pending, S::Relaunching));
    CHECK_FALSE(check_transition(S::Requeueing, S::Failing));
    CHECK_FALSE(check_transition(S::Gone, S::Running));
    CHECK_FALSE(check_transition(S::Running, S::Running));
  }
  SECTION("no user cancel path leads to a requeue") {
    for (const auto& [from, to] : transition_table()) {
      if (from == S::Cancelled) CHECK(to != S::Requeueing);
    }
  }
  SECTION("names round-trip") {
    for (const auto& [from, to] : transition_table()) {
      CHECK(parse_job_state(to_string(from)) == from);
      CHECK(parse_job_state(to_string(to)) == to);
    }
    CHECK_FALSE(parse_job_state("RUNNING").has_value());
  }
}

TEST_CASE("hostlists", "[recovery][hostlist]") {
  SECTION("good inputs") {
    CHECK(*expand_hostlist("n[1-3]") == std::vector<std::string>{"n1", "n2", "n3"});
    CHECK(*expand_hostlist("n[1-2,4],gpu07") == std::vector<std::string>{"n1", "n2", "n4", "gpu07"});
    CHECK(*expand_hostlist("a[08-10]b") == std::vector<std::string>{"a08b", "a09b", "a10b"});
    CHECK(*expand_hostlist("r[1-2]n[1-2]") == std::vector<std::string>{"r1n1", "r1n2", "r2n1", "r2n2"});
    CHECK(expand_hostlist("")->empty());
    CHECK(expand_hostlist("(null)")->empty());
    CHECK(join_nodes({"n1", "n3"}) == "n1,n3");
  }
  SECTION("bad inputs") {
    CHECK_FALSE(expand_hostlist("n[1-3"));
    CHECK_FALSE(expand_hostlist("n1-3]"));
    CHECK_FALSE(expand_hostlist("n[3-1]"));
    CHECK_FALSE(expand_hostlist("n[a-b]"));
    CHECK_FALSE(expand_hostlist("n1,,n2"));
    CHECK_FALSE(expand_hostlist("n;rm"));
    CHECK_FALSE(expand_hostlist("n[1-100000]", 1000));
  }
}

// Root slurmstepd expands SLURM_STEP_NODELIST, which the user writes: one crafted value (a 30,000-byte prefix over
// 65,535 indices) once expanded to about 2 GiB. Names are bounded now, so it is refused before anything is built.
TEST_CASE("hostlists: a crafted node list is refused without being expanded", "[recovery][hostlist][security]") {
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(expand_hostlist(std::string(30000, 'x') + "[1-65535]"));
  CHECK_FALSE(expand_hostlist(std::string(200, 'a') + "[1-65535]" + std::string(100, 'b')));
  CHECK_FALSE(expand_hostlist("r[1-65535]" + std::string(300, 'n') + "[1-2]"));
  CHECK_FALSE(expand_hostlist(std::string(256, 'y')));
  CHECK_FALSE(expand_hostlist(std::string((1 << 20) + 1, 'z')));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  CHECK(after.ru_maxrss - before.ru_maxrss < 64 * 1024);  // KiB: the bar slurmstepd is held to
  CHECK(took < 5);
  CHECK(expand_hostlist(std::string(255, 'y'))->size() == 1);
  CHECK(expand_hostlist(std::string(250, 'g') + "[1-3]")->size() == 3);
}

TEST_CASE("events: round trip and strict parsing", "[recovery][events]") {
  SECTION("good inputs") {
    Event e;
    e.type = EventType::TaskExit;
    e.job_id = 42;
    e.step_id = 0;
    e.restart_count = 2;
    e.node = "n2";
    e.rank = 5;
    e.exit_code = 1;
    e.time = 1700000000.5;
    auto back = parse_event(to_json(e));
    REQUIRE(back);
    CHECK(back->type == EventType::TaskExit);
    CHECK(back->job_id == 42);
    CHECK(back->restart_count == 2);
    CHECK(back->rank == 5);
    CHECK(back->exit_code == 1);
    Event s;
    s.type = EventType::JobStart;
    s.job_id = 9;
    s.node = "gpu-01.x";
    s.ckpt_dir = "/ckpt/u/9";
    s.max_restarts = 4;
    s.needs_checkpoint = true;
    s.in_allocation = true;
    auto sb = parse_event(to_json(s));
    REQUIRE(sb);
    CHECK(sb->max_restarts == 4u);
    CHECK(sb->needs_checkpoint);
    CHECK(sb->in_allocation);
    CHECK(sb->step_id == kBatchStep);
  }
  SECTION("bad inputs") {
    CHECK_FALSE(parse_event(""));
    CHECK_FALSE(parse_event("[]"));
    CHECK_FALSE(parse_event(R"({"v":2,"type":"job_start","job_id":1,"node":"n1"})"));
    CHECK_FALSE(parse_event(R"({"v":1,"type":"reboot","job_id":1,"node":"n1"})"));
    CHECK_FALSE(parse_event(R"({"v":1,"type":"job_start","node":"n1"})"));
    CHECK_FALSE(parse_event(R"({"v":1,"type":"job_start","job_id":-1,"node":"n1"})"));
    CHECK_FALSE(parse_event(R"({"v":1,"type":"job_start","job_id":4294967296,"node":"n1"})"));
    CHECK_FALSE(parse_event(R"({"v":1,"type":"job_start","job_id":"1","node":"n1"})"));
    CHECK_FALSE(parse_event(R"({"v":1,"type":"job_start","job_id":1,"node":"n1;x"})"));
    CHECK_FALSE(parse_event(R"({"v":1,"type":"job_start","job_id":1,"node":"n1","ckpt_dir":"rel/dir"})"));
    CHECK_FALSE(parse_event(R"({"v":1,"type":"task_exit","job_id":1,"node":"n1","exit_code":300})"));
    CHECK_FALSE(parse_event(std::string(20000, ' ')));
  }
}

namespace {

// An in-place recovery of job 42 as ckpt-run reports it, with one field replaced by `key: value` (JSON text).
std::string in_place_json(const std::string& key = "", const std::string& value = "") {
  nlohmann::json j = nlohmann::json::parse(
      R"({"v":1,"type":"in-place","job_id":42,"node":"n1","uid":1000,"time":1700000010.0,"failed_nodes":"n[2-3]",
          "generation":1,"resume_step":120,"detected":1700000000.0,"agreed":1700000000.25,
          "last_words_done":1700000001.0,"regrouped":1700000003.0,"restored":1700000004.5,"resumed":1700000006.0})");
  if (!key.empty()) j[key] = nlohmann::json::parse(value);
  return j.dump();
}

}  // namespace

TEST_CASE("events: an in-place recovery is strictly parsed", "[recovery][events][security]") {
  SECTION("good inputs") {
    auto e = parse_event(in_place_json());
    REQUIRE(e);
    CHECK(e->type == EventType::InPlace);
    CHECK(std::string(to_string(e->type)) == "in-place");
    CHECK(e->failed_nodes == "n[2-3]");
    CHECK(e->generation == 1);
    CHECK(e->resume_step == 120u);
    CHECK(e->phases.detected == 1700000000.0);
    CHECK(e->phases.agreed == 1700000000.25);
    CHECK(e->phases.last_words_done == 1700000001.0);
    CHECK(e->phases.regrouped == 1700000003.0);
    CHECK(e->phases.restored == 1700000004.5);
    CHECK(e->phases.resumed == 1700000006.0);
    auto back = parse_event(to_json(*e));
    REQUIRE(back);
    CHECK(to_json(*back) == to_json(*e));
    CHECK(parse_event(in_place_json("resume_step", "null"))->resume_step == std::nullopt);
    CHECK(parse_event(in_place_json("agreed", "null"))->phases.agreed == 0);  // a phase the root did not see
    CHECK(parse_event(in_place_json("failed_nodes", R"("gpu-01.x,n7")")));
    CHECK(parse_event(in_place_json("failed_nodes", R"("")")));  // ranks lost on nodes that go on
    // Other types carry no in-place fields.
    Event start;
    start.type = EventType::JobStart;
    start.job_id = 9;
    start.node = "n1";
    CHECK(to_json(start).find("failed_nodes") == std::string::npos);
  }
  SECTION("bad inputs") {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"failed_nodes", R"("n1;reboot")"},      {"failed_nodes", R"("n 1")"},
        {"failed_nodes", R"("n\n1")"},
        {"failed_nodes", R"("n[1-")"},           {"failed_nodes", R"("n[1-999999999]")"},
        {"failed_nodes", "[\"n1\"]"},           {"failed_nodes", "7"},
        {"failed_nodes", '"' + std::string(5000, 'n') + '"'},
        {"generation", "0"},                     {"generation", "4294967296"},
        {"generation", "-1"},                    {"generation", R"("1")"},
        {"generation", "1.5"},                   {"resume_step", "-5"},
        {"resume_step", "1e30"},                 {"resume_step", R"("120")"},
        {"detected", "-1"},                      {"detected", "1e300"},
        {"detected", "0"},                       {"restored", R"("soon")"},
        {"agreed", "-0.5"},                      {"resumed", "1699999999.0"},  // before the detection
        {"regrouped", "[1]"},
    };
    for (const auto& [key, value] : bad) {
      auto e = parse_event(in_place_json(key, value));
      INFO(key << " = " << value.substr(0, 40));
      CHECK_FALSE(e);
      if (!e) CHECK(e.error().find('\n') == std::string::npos);
    }
    auto e = parse_event(in_place_json("failed_nodes", R"("n1;reboot")"));
    REQUIRE_FALSE(e);
    CHECK(e.error() == "event has bad failed_nodes (a Slurm hostlist of at most 4096 names of letters, digits, "
                       "'-', '_' and '.')");
    // The fields are checked on every type: junk is never carried along.
    CHECK_FALSE(parse_event(R"({"v":1,"type":"job_end","job_id":1,"node":"n1","detected":-3})"));
  }
}

TEST_CASE("job records round-trip through JSON", "[recovery][record]") {
  JobRecord r;
  r.job_id = 11;
  r.state = JobState::Requeueing;
  r.uid = 1000;
  r.uid_known = true;
  r.ckpt_dir = "/c/11";
  r.restart_count = 1;
  r.budget.max_restarts = 5;
  r.budget.restarts = 1;
  r.budget.without_progress = 1;
  r.budget.progress_step = 40;
  r.failures.push_back(TaskFailure{0, "n1", 0, 1, 0, 5.5});
  r.steps[0] = StepInfo{true, {"n1", "n2"}};
  r.bad_nodes = add_bad_nodes({}, {"n3"}, "dead", 1, 100);
  Intent i;
  i.id = 3;
  i.phase = Intent::Phase::WaitCompleting;
  i.expected_restart = 2;
  i.exclude = {"n3"};
  i.mark_down = {"n3"};
  r.intent = i;
  r.ending = Ending::NodeFailure;
  r.clock.failed = 10;
  r.clock.last_words_done = 11.5;
  r.clock.restored = 13.25;
  r.clock.path = "in-place";
  auto back = parse_job_record(to_json(r));
  REQUIRE(back);
  CHECK(to_json(*back) == to_json(r));
  CHECK(back->clock.restored == 13.25);
  // A record stored before in-place recoveries existed reads with their times at 0.
  auto old = parse_job_record(
      R"({"job_id":3,"state":"running",)"
      R"("clock":{"failed":1,"decided":2,"slurm_done":3,"launched":4,"path":"requeue"}})");
  REQUIRE(old);
  CHECK(old->clock.launched == 4);
  CHECK(old->clock.last_words_done == 0);
  CHECK(old->clock.restored == 0);
  CHECK_FALSE(parse_job_record(R"({"job_id":1,"state":"flying"})"));
  CHECK_FALSE(parse_job_record("nope"));
}

TEST_CASE("controller config", "[recovery][config]") {
  SECTION("good inputs") {
    auto cfg = parse_controller_config(
        "# comment\nlisten = 127.0.0.1:7000\nbackend = rest\nrest_url = http://h:6820/\nsettle = 250ms\n"
        "bad_node_ttl = 2h\ndrain_bad_nodes = yes\nadmin_users = root, slurm\nmax_restarts = 7\n");
    REQUIRE(cfg);
    CHECK(cfg->listen == "127.0.0.1:7000");
    CHECK(cfg->rest_url == "http://h:6820");
    CHECK(cfg->settle_s == Approx(0.25));
    CHECK(cfg->bad_node_ttl_s == Approx(7200));
    CHECK(cfg->drain_bad_nodes);
    CHECK(cfg->admin_users == std::vector<std::string>{"root", "slurm"});
    CHECK(cfg->max_restarts == 7);
    CHECK(parse_controller_config(""));
  }
  SECTION("bad inputs name the key and the line") {
    auto typo = parse_controller_config("listen = 127.0.0.1:1\nsetle = 1s\n", "c.conf");
    REQUIRE_FALSE(typo);
    CHECK(typo.error() == "c.conf:2: unknown key 'setle'");
    auto value = parse_controller_config("settle = soon\n", "c.conf");
    REQUIRE_FALSE(value);
    CHECK(value.error() == "c.conf:1: settle: invalid value 'soon' (expected a duration like 500ms)");
    CHECK_FALSE(parse_controller_config("backend = pbs\n"));
    CHECK_FALSE(parse_controller_config("backend = rest\n"));  // no rest_url
    CHECK_FALSE(parse_controller_config("listen = nowhere\n"));
    CHECK_FALSE(parse_controller_config("database = relative.db\n"));
    CHECK_FALSE(parse_controller_config("max_restarts = -1\n"));
    CHECK_FALSE(parse_controller_config("listen = off\n"));  // no way in for events
    CHECK_FALSE(parse_controller_config("settle = 1s\nsettle = 2s\n"));
    CHECK_FALSE(parse_controller_config("just words\n"));
  }
  SECTION("durations in milliseconds") {
    CHECK(*parse_duration_ms("500ms") == Approx(0.5));
    CHECK(*parse_duration_ms("2s") == Approx(2));
    CHECK(*parse_duration_ms("1m30s") == Approx(90));
    CHECK_FALSE(parse_duration_ms("ms"));
    CHECK_FALSE(parse_duration_ms("-5ms"));
    CHECK_FALSE(parse_duration_ms("1.5s"));
  }
}

TEST_CASE("a requeued job starts no earlier than the second after its credential was revoked", "[recovery][intent]") {
  CHECK(credential_safe_start(1000.0) == Approx(1002.0));
  CHECK(credential_safe_start(1000.9) == Approx(1002.0));
  CHECK(credential_safe_start(1001.0) == Approx(1003.0));
  CHECK(parse_intent_phase(to_string(Intent::Phase::WaitCompleting)) == Intent::Phase::WaitCompleting);
  CHECK_FALSE(parse_intent_phase("later").has_value());
}

TEST_CASE("Slurm state names as slurmrestd and squeue print them", "[recovery][classify]") {
  CHECK(parse_slurm_state("NODE_FAIL") == SlurmState::NodeFail);
  CHECK(parse_slurm_state("OUT_OF_MEMORY") == SlurmState::OutOfMemory);
  CHECK(parse_slurm_state("COMPLETING") == SlurmState::Unknown);  // a flag, not an ending
  CHECK(parse_slurm_state("") == SlurmState::Unknown);
  CHECK_FALSE(is_finished(SlurmState::Pending));
  CHECK_FALSE(is_finished(SlurmState::Unknown));
  CHECK(is_finished(SlurmState::Timeout));
}
