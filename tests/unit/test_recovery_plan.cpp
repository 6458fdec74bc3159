// What the recovery controller does next: events applied to records, recovery plans, a requeue intent's steps.
#include <catch2/catch.hpp>

#include <cmath>

#include "ckpt/recovery_plan.hpp"

using namespace ckpt::recovery;

namespace {

Event event(EventType type, std::uint32_t step, const std::string& node = "n1") {
  Event e;
  e.type = type;
  e.job_id = 7;
  e.step_id = step;
  e.node = node;
  return e;
}

JobRecord record(JobState state) {
  JobRecord r;
  r.job_id = 7;
  r.state = state;
  r.nodes = {"n1", "n2", "n3"};
  r.batch_host = "n1";
  return r;
}

TaskFailure failure_in(std::uint32_t step, const std::string& node) {
  TaskFailure f;
  f.step_id = step;
  f.node = node;
  f.exit_code = 1;
  return f;
}

SlurmJob slurm(SlurmState state, std::uint32_t restart_count = 0) {
  SlurmJob s;
  s.job_id = 7;
  s.state = state;
  s.restart_count = restart_count;
  return s;
}

RecoveryFacts facts(Ending ending, SlurmState state, std::vector<std::string> dead = {}) {
  RecoveryFacts f;
  f.ending = ending;
  f.slurm = slurm(state);
  f.dead = dead;
  f.mark_down = dead;
  f.newest_complete = 100;
  f.now = 1000;
  return f;
}

// A job whose step 1 runs under ckpt-run and failed on n2.
JobRecord under_ckpt_run() {
  JobRecord r = record(JobState::Failing);
  r.steps[1] = StepInfo{true, {"n1", "n2", "n3"}};
  r.failures = {failure_in(1, "n1")};
  return r;
}

IntentFacts look(SlurmState state, std::uint32_t restart_count, double now) {
  IntentFacts f;
  f.slurm = slurm(state, restart_count);
  f.now = now;
  f.completing_timeout_s = 120;
  return f;
}

}  // namespace

// ---- events -------------------------------------------------------------------------------------------------------

TEST_CASE("events: stale, current and newer runs", "[recovery][events]") {
  JobRecord r = record(JobState::Running);
  r.restart_count = 2;
  Event e = event(EventType::TaskExit, 0);
  e.restart_count = 1;
  CHECK(run_of_event(r, e) == EventRun::Stale);
  e.restart_count = 2;
  CHECK(run_of_event(r, e) == EventRun::Current);
  e.restart_count = 3;
  CHECK(run_of_event(r, e) == EventRun::Newer);
  CHECK(describe(event(EventType::JobStart, kBatchStep, "n4")) == "job_start from n4 (batch step)");
  CHECK(describe(event(EventType::TaskExit, 3, "n2")) == "task_exit from n2 (step 3)");
}

TEST_CASE("events: only root or SlurmUser names the checkpoint dir", "[recovery][events][security]") {
  JobRecord r = record(JobState::Running);
  Event e = event(EventType::JobStart, kBatchStep);
  e.ckpt_dir = "/scratch/u/7";
  e.trusted_dirs = "/scratch";
  auto fx = apply_event(r, e, false, 10);
  CHECK(fx.dir_refused);
  CHECK(r.ckpt_dir.empty());
  fx = apply_event(r, e, true, 10);
  CHECK_FALSE(fx.dir_refused);
  CHECK(r.ckpt_dir == "/scratch/u/7");
  CHECK(r.trusted_dirs == "/scratch");
}

TEST_CASE("events: a JobStart brings the job's settings and its step", "[recovery][events]") {
  JobRecord r = record(JobState::Running);
  Event e = event(EventType::JobStart, 1, "n2");
  e.max_restarts = 9;
  e.needs_checkpoint = true;
  e.in_allocation = true;
  auto fx = apply_event(r, e, true, 10);
  CHECK(r.budget.max_restarts == 9);
  CHECK(r.needs_checkpoint);
  CHECK(r.steps[1].in_allocation);
  CHECK(r.steps[1].nodes == std::vector<std::string>{"n2"});
  CHECK(fx.note == "job_start from n2 (step 1) under ckpt-run");
  CHECK_FALSE(fx.to);
  CHECK_FALSE(fx.running_again);  // no recovery under way
  apply_event(r, event(EventType::JobStart, 1, "n2"), true, 11);
  CHECK(r.steps[1].nodes.size() == 1);
}

TEST_CASE("events: the relaunched step ends a relaunch; the failed one does not", "[recovery][events]") {
  JobRecord r = under_ckpt_run();
  r.state = JobState::Relaunching;
  r.relaunch_step = 1;
  r.reporters = {"n1"};
  r.clock.failed = 100;
  r.clock.decided = 101;
  r.clock.path = "relaunch";
  auto fx = apply_event(r, event(EventType::JobStart, 1), true, 102);
  CHECK_FALSE(fx.to);
  CHECK(r.relaunch_step == 1u);

  fx = apply_event(r, event(EventType::JobStart, 2), true, 105);
  REQUIRE(fx.to == JobState::Running);
  CHECK(fx.why == "ckpt-run relaunched the step as step 2");
  CHECK(fx.reset_runtime);
  CHECK_FALSE(r.relaunch_step);
  CHECK(r.failures.empty());
  CHECK(r.reporters.empty());
  CHECK(fx.running_again);
  CHECK(r.clock.launched == 105);
  CHECK(r.clock.slurm_done == 105);
  // Once: the next step of the same run is no new recovery.
  r.state = JobState::Running;
  CHECK_FALSE(apply_event(r, event(EventType::JobStart, 3), true, 106).running_again);
}

TEST_CASE("events: a new step after a failure ends it unless ckpt-run handed over", "[recovery][events]") {
  JobRecord r = under_ckpt_run();
  auto fx = apply_event(r, event(EventType::JobStart, 2), true, 10);
  REQUIRE(fx.to == JobState::Running);
  CHECK(fx.why == "the job started step 2 after the failure");
  CHECK(r.failures.empty());

  r = under_ckpt_run();
  r.handover = true;
  CHECK_FALSE(apply_event(r, event(EventType::JobStart, 2), true, 10).to);
  r.handover = false;
  CHECK_FALSE(apply_event(r, event(EventType::JobStart, kBatchStep), true, 10).to);
}

TEST_CASE("events: a requeued run's first step times the recovery", "[recovery][events]") {
  JobRecord r = record(JobState::Running);
  r.clock.failed = 100;
  r.clock.decided = 101;
  r.clock.path = "requeue";
  auto fx = apply_event(r, event(EventType::JobStart, kBatchStep), true, 110);
  CHECK(r.clock.slurm_done == 110);
  CHECK_FALSE(fx.running_again);  // the batch step is not the training
  fx = apply_event(r, event(EventType::JobStart, 0), true, 112);
  CHECK(fx.running_again);
  CHECK(r.clock.slurm_done == 110);
  CHECK(r.clock.launched == 112);
}

TEST_CASE("events: a TaskExit starts a failure where one is not under way", "[recovery][events]") {
  JobRecord r = record(JobState::Running);
  Event e = event(EventType::TaskExit, 0, "n2");
  e.rank = 5;
  e.signal = 9;
  auto fx = apply_event(r, e, false, 10);
  CHECK(fx.start_failing);
  CHECK_FALSE(fx.to);
  CHECK(fx.note == "task_exit from n2 (step 0): rank 5 killed by signal 9");
  REQUIRE(r.failures.size() == 1);
  CHECK(r.failures[0].time == 10);
  CHECK(r.reporters == std::vector<std::string>{"n2"});

  r = record(JobState::Pending);
  r.restart_count = 1;
  fx = apply_event(r, e, false, 10);
  CHECK(fx.to == JobState::Running);
  CHECK(fx.why == "a rank of run 1 reported");
  CHECK(fx.start_failing);

  r = record(JobState::Failing);
  fx = apply_event(r, e, false, 10);
  CHECK_FALSE(fx.start_failing);
  CHECK(r.failures.size() == 1);

  r = record(JobState::Relaunching);
  r.relaunch_step = 1;
  CHECK_FALSE(apply_event(r, event(EventType::TaskExit, 1), false, 10).start_failing);  // the step being replaced
  CHECK(apply_event(r, event(EventType::TaskExit, 2), false, 10).start_failing);        // its replacement failed
}

TEST_CASE("events: JobEnd asks Slurm now; Handover turns to a requeue", "[recovery][events]") {
  JobRecord r = record(JobState::Running);
  auto fx = apply_event(r, event(EventType::JobEnd, kBatchStep), false, 10);
  CHECK(r.end_reported);
  CHECK(fx.check_now);

  r = record(JobState::Relaunching);
  r.relaunch_step = 1;
  Event h = event(EventType::Handover, 1);
  h.detail = "no nodes left";
  fx = apply_event(r, h, false, 10);
  CHECK(r.handover);
  CHECK(fx.to == JobState::Failing);
  CHECK(fx.reset_probes);
  CHECK_FALSE(fx.start_failing);  // the same failure: its clock goes on
  CHECK(fx.check_now);
  CHECK(fx.note == "handover from n1 (step 1): ckpt-run hands over to a requeue (no nodes left)");

  r = record(JobState::Running);
  fx = apply_event(r, h, false, 10);
  CHECK(fx.start_failing);
  CHECK_FALSE(fx.to);
  r = record(JobState::Failing);
  fx = apply_event(r, h, false, 10);
  CHECK_FALSE(fx.start_failing);
  CHECK_FALSE(fx.to);
}

namespace {

// ckpt-run's report of in-place recovery 1: n2 lost, resumed from step 120.
Event in_place(std::optional<std::uint64_t> resume_step = 120) {
  Event e = event(EventType::InPlace, kBatchStep);
  e.failed_nodes = "n2";
  e.generation = 1;
  e.resume_step = resume_step;
  e.phases = InPlacePhases{100, 100.5, 101, 103, 104.5, 106};
  return e;
}

}  // namespace

TEST_CASE("events: an in-place report excludes only the job's own nodes", "[recovery][events][in-place][security]") {
  JobRecord r = record(JobState::Running);
  Event e = in_place();
  e.failed_nodes = "n2,gpu[7-9]";  // the owner's word: nodes of other jobs named too
  auto fx = apply_event(r, e, false, 200);
  CHECK(fx.exclude == std::vector<std::string>{"n2"});
  r.nodes.clear();  // an allocation the controller does not know yet: nothing is taken on the owner's word
  CHECK(apply_event(r, e, false, 300).exclude.empty());
}

// A record is rewritten with each change and its owner's events name its steps and nodes: bounded.
TEST_CASE("events: a job record stays bounded whatever its owner reports", "[recovery][events][security]") {
  JobRecord r = record(JobState::Running);
  apply_event(r, event(EventType::JobStart, kBatchStep), false, 10);
  for (std::uint32_t step = 0; step < 1000; ++step) apply_event(r, event(EventType::JobStart, step), false, 11);
  CHECK(r.steps.size() == kMaxStepsPerRecord);
  CHECK(r.steps.count(kBatchStep) == 1);  // the batch step, the highest id, stays
  CHECK(r.steps.count(999) == 1);         // the newest steps stay
  for (int n = 0; n < 20000; ++n) apply_event(r, event(EventType::JobStart, 999, "x" + std::to_string(n)), false, 12);
  CHECK(r.steps[999].nodes.size() == kMaxNodesPerStep);
  for (int n = 0; n < 20000; ++n) apply_event(r, event(EventType::TaskExit, 999, "y" + std::to_string(n)), false, 13);
  CHECK(r.reporters.size() == kMaxNodesPerStep);
  CHECK(r.failures.size() <= 4096);
}

TEST_CASE("events: an in-place report's phase times are clamped to what the controller saw",
          "[recovery][events][in-place][security]") {
  JobRecord r = record(JobState::Running);
  r.created = 50;
  Event e = in_place();
  e.phases = InPlacePhases{1.0, 1e300, 101, 90, std::nan(""), 1e18};  // the owner's word, made up
  apply_event(r, e, false, 200);
  CHECK(r.clock.failed == 50);          // not before the record existed
  CHECK(r.clock.decided == 200);        // not after the report arrived
  CHECK(r.clock.last_words_done == 200);
  CHECK(r.clock.slurm_done == 200);     // in order
  CHECK(r.clock.restored == 0);         // not a number: not reported
  CHECK(r.clock.launched == 200);
  for (const auto& phase : recovery_phases(r.clock)) {
    CHECK(phase.seconds >= 0);
    CHECK(phase.seconds <= 150);
  }
}

TEST_CASE("events: a late exit from a node replaced in place is not a new failure", "[recovery][events][in-place]") {
  JobRecord r = record(JobState::Running);
  apply_event(r, in_place(), false, 200);
  CHECK(r.replaced_in_place == std::vector<std::string>{"n2"});
  Event late = event(EventType::TaskExit, 0, "n2");  // the frozen rank thawed and leaves (75)
  late.exit_code = kExitPeerLost;
  auto fx = apply_event(r, late, false, 300);
  CHECK_FALSE(fx.start_failing);
  CHECK(r.failures.empty());
  CHECK(fx.note == "task_exit from n2 (step 0): from a node this run replaced in place; not a new failure");
  CHECK(apply_event(r, event(EventType::TaskExit, 0, "n3"), false, 300).start_failing);  // another node: news

  SECTION("kept across a controller restart") {
    auto back = parse_job_record(to_json(r));
    REQUIRE(back);
    CHECK(back->replaced_in_place == std::vector<std::string>{"n2"});
  }
}

TEST_CASE("events: an in-place recovery spends a restart and keeps the job running", "[recovery][events][in-place]") {
  JobRecord r = record(JobState::Running);
  r.budget.max_restarts = 2;
  auto fx = apply_event(r, in_place(), false, 200);
  CHECK(fx.note == "in-place from n1 (batch step): recovery 1 in place without n2, resuming from step 120");
  CHECK_FALSE(fx.to);  // training never stopped
  CHECK_FALSE(fx.give_up);
  CHECK(fx.running_again);
  CHECK(fx.restarted == Ending::NodeFailure);
  CHECK(fx.exclude == std::vector<std::string>{"n2"});
  CHECK(r.ending == Ending::NodeFailure);
  CHECK(r.budget.restarts == 1);
  CHECK(r.budget.without_progress == 1);
  CHECK(r.budget.progress_step == 120u);

  SECTION("the clock holds the phases, on the in-place path") {
    CHECK(r.clock.path == "in-place");
    CHECK(r.clock.failed == 100);
    CHECK(r.clock.decided == 100.5);
    CHECK(r.clock.last_words_done == 101);
    CHECK(r.clock.slurm_done == 103);
    CHECK(r.clock.restored == 104.5);
    CHECK(r.clock.launched == 106);
    const auto phases = recovery_phases(r.clock);
    REQUIRE(phases.size() == 5);
    CHECK(std::string(phases[0].name) == "agreement");
    CHECK(phases[0].seconds == 0.5);
    CHECK(std::string(phases[4].name) == "first_step");
    CHECK(phases[4].seconds == 1.5);
    double total = 0;
    for (const auto& p : phases) total += p.seconds;
    CHECK(total == Approx(r.clock.launched - r.clock.failed));
    Event no_agreement = in_place();
    no_agreement.phases.agreed = 0;  // the last words' end stands for the decision
    apply_event(r, no_agreement, false, 300);
    CHECK(r.clock.decided == 101);
  }
  SECTION("the same rule as a relaunch: progress resets the budget, none spends it to the end") {
    apply_event(r, in_place(200), false, 300);
    CHECK(r.budget.without_progress == 1);  // the checkpoint advanced
    apply_event(r, in_place(200), false, 400);
    CHECK(r.budget.without_progress == 2);
    fx = apply_event(r, in_place(200), false, 500);
    REQUIRE(fx.give_up);
    CHECK(*fx.give_up == "node failure after 2 restarts without progress (budget 2; newest complete checkpoint: "
                         "step 200); ckpt-run recovered in place, stop the job");
    CHECK_FALSE(fx.restarted);
    CHECK_FALSE(fx.running_again);
    CHECK(fx.exclude == std::vector<std::string>{"n2"});  // excluded whatever happens next
    CHECK(r.budget.restarts == 3);                        // unchanged by the refused restart
  }
  SECTION("ranks lost on nodes whose other ranks went on: a task crash, no node excluded") {
    Event process = in_place();
    process.failed_nodes = "";
    fx = apply_event(r, process, false, 300);
    CHECK(fx.restarted == Ending::TaskCrash);
    CHECK(r.ending == Ending::TaskCrash);
    CHECK(fx.exclude.empty());
    CHECK(fx.note == "in-place from n1 (batch step): recovery 1 in place without (none), resuming from step 120");
  }
  SECTION("a job that needs a checkpoint gives up without one") {
    r = record(JobState::Running);
    r.needs_checkpoint = true;
    fx = apply_event(r, in_place(std::nullopt), false, 200);
    REQUIRE(fx.give_up);
    CHECK(fx.give_up->find("needs a checkpoint") != std::string::npos);
  }
}

TEST_CASE("events: an in-place recovery ends a failure the controller was looking into",
          "[recovery][events][in-place]") {
  SECTION("failing: back to running, the restart spent") {
    JobRecord r = under_ckpt_run();
    r.reporters = {"n1"};
    auto fx = apply_event(r, in_place(), false, 200);
    CHECK(fx.to == JobState::Running);
    CHECK(fx.reset_runtime);
    CHECK(fx.restarted == Ending::NodeFailure);
    CHECK(r.failures.empty());
    CHECK(r.reporters.empty());
    CHECK(r.budget.restarts == 1);
  }
  SECTION("relaunching: the relaunch decision counted this failure already") {
    JobRecord r = record(JobState::Relaunching);
    r.relaunch_step = 1;
    r.budget.restarts = 1;
    r.budget.without_progress = 1;
    auto fx = apply_event(r, in_place(), false, 200);
    CHECK(fx.to == JobState::Running);
    CHECK_FALSE(fx.restarted);
    CHECK(r.budget.restarts == 1);
    CHECK_FALSE(r.relaunch_step);
    CHECK(fx.running_again);
  }
  SECTION("a job that is not running only gets the history line") {
    for (JobState st : {JobState::Requeueing, JobState::Pending, JobState::GaveUp, JobState::Completed}) {
      JobRecord r = record(st);
      auto fx = apply_event(r, in_place(), false, 200);
      CHECK_FALSE(fx.note.empty());
      CHECK_FALSE(fx.to);
      CHECK_FALSE(fx.give_up);
      CHECK(fx.exclude.empty());
      CHECK(r.budget.restarts == 0);
      CHECK(r.clock.path.empty());
    }
  }
  SECTION("the lost nodes join the bad nodes the way a decision adds them") {
    JobRecord r = record(JobState::Running);
    Event e = in_place();
    e.failed_nodes = "n[2-3]";
    auto fx = apply_event(r, e, false, 200);
    const auto fresh = exclude_dead_nodes(r.bad_nodes, fx.exclude, r.job_id, 200, 3600);
    CHECK(fresh == std::vector<std::string>{"n2", "n3"});
    CHECK(active_bad_nodes(r.bad_nodes, 201) == std::vector<std::string>{"n2", "n3"});
  }
}

TEST_CASE("recovery phases of a requeue or a relaunch", "[recovery][in-place]") {
  RecoveryClock c;
  c.failed = 10;
  c.decided = 11;
  c.slurm_done = 14;
  c.launched = 20;
  c.path = "relaunch";
  const auto phases = recovery_phases(c);
  REQUIRE(phases.size() == 3);
  CHECK(std::string(phases[0].name) == "decision");
  CHECK(phases[0].seconds == 1);
  CHECK(phases[1].seconds == 3);
  CHECK(phases[2].seconds == 6);
  c.slurm_done = 0;  // not reached: its phases are not known
  CHECK(recovery_phases(c)[1].seconds == 0);
  CHECK(recovery_phase_names("requeue").size() == 3);
  CHECK(recovery_phase_names("in-place").size() == 5);
}

// ---- what a look at Slurm means -----------------------------------------------------------------------------------

TEST_CASE("news: a running record follows Slurm's requeues and endings", "[recovery][news]") {
  for (JobState st : {JobState::Running, JobState::Relaunching}) {
    JobRecord r = record(st);
    CHECK(news_of(r, slurm(SlurmState::Running), 10, 0) == SlurmNews::Nothing);
    CHECK(news_of(r, slurm(SlurmState::NodeFail), 10, 0) == SlurmNews::RunEnded);
    CHECK(news_of(r, slurm(SlurmState::Pending, 1), 10, 0) == SlurmNews::RequeuedBySlurm);
    CHECK(news_of(r, slurm(SlurmState::Running, 1), 10, 0) == SlurmNews::NewRun);
    CHECK(news_of(r, slurm(SlurmState::Failed, 1), 10, 0) == SlurmNews::NewRun);
  }
  // A failing record's own checks decide its run's end; only a newer run is news.
  JobRecord r = record(JobState::Failing);
  CHECK(news_of(r, slurm(SlurmState::Failed), 10, 0) == SlurmNews::Nothing);
  CHECK(news_of(r, slurm(SlurmState::Pending, 1), 10, 0) == SlurmNews::RequeuedBySlurm);
  CHECK(news_of(r, slurm(SlurmState::Running, 1), 10, 0) == SlurmNews::NewRun);
}

TEST_CASE("news: a pending record", "[recovery][news]") {
  JobRecord r = record(JobState::Pending);
  CHECK(news_of(r, slurm(SlurmState::Cancelled, 1), 10, 0) == SlurmNews::Cancelled);
  CHECK(news_of(r, slurm(SlurmState::Running, 1), 10, 0) == SlurmNews::NewRun);
  CHECK(news_of(r, slurm(SlurmState::Completed, 1), 10, 0) == SlurmNews::NewRun);
  CHECK(news_of(r, slurm(SlurmState::Pending, 1), 10, 0) == SlurmNews::Nothing);
  // The BeginTime trap: StartTime=now again, three times at most, once the job is neither completing nor held.
  SlurmJob s = slurm(SlurmState::Pending, 1);
  s.begin_time = 131;
  CHECK(news_of(r, s, 10, 0) == SlurmNews::ExpediteAgain);
  CHECK(news_of(r, s, 10, 3) == SlurmNews::Nothing);
  CHECK(news_of(r, s, 127, 0) == SlurmNews::Nothing);
  s.completing = true;
  CHECK(news_of(r, s, 10, 0) == SlurmNews::Nothing);
  s.completing = false;
  s.held = true;
  CHECK(news_of(r, s, 10, 0) == SlurmNews::Nothing);
}

TEST_CASE("news: a node the user adds to a pending job's ExcNodeList is theirs, never let go as lapsed",
          "[recovery][news]") {
  JobRecord r = record(JobState::Pending);
  r.bad_nodes = {BadNode{"n3", "slurmd did not answer", 0, 100}};
  r.own_excluded = std::vector<std::string>{"n8"};
  SlurmJob s = slurm(SlurmState::Pending, 1);
  s.excluded = "n3,n8";  // what the requeue wrote
  CHECK(own_exclusions_now(r, s) == std::vector<std::string>{"n8"});
  // The user adds n7 by hand (scontrol update): theirs from now on.
  s.excluded = "n[3,7-8]";
  r.own_excluded = own_exclusions_now(r, s);
  CHECK(*r.own_excluded == std::vector<std::string>{"n7", "n8"});
  CHECK(lapsed_exclusions(r, s, 10).empty());
  // An admin forgets n3: the update lets it go, and only it.
  CHECK(forget_bad_node(r.bad_nodes, "n3", 10));
  CHECK(own_exclusions_now(r, s) == std::vector<std::string>{"n7", "n8"});  // n3 was bad once: never the user's
  CHECK(lapsed_exclusions(r, s, 10) == std::vector<std::string>{"n3"});
  CHECK(job_exclusions_now(r, 10) == std::vector<std::string>{"n7", "n8"});
  // The user takes n8 out: theirs no longer.
  s.excluded = "n7";
  CHECK(own_exclusions_now(r, s) == std::vector<std::string>{"n7"});
  // A node of their own that failed later stays theirs while Slurm lists it, after its bad_node_ttl too.
  r.own_excluded = std::vector<std::string>{"n7"};
  r.bad_nodes.push_back(BadNode{"n7", "slurmd did not answer", 20, 30});
  CHECK(own_exclusions_now(r, s) == std::vector<std::string>{"n7"});
  CHECK(lapsed_exclusions(r, s, 40).empty());
  // A list that does not parse changes nothing; an empty one (Slurm's "(null)") is the user taking all out.
  s.excluded = "n[1-3";
  CHECK(own_exclusions_now(r, s) == std::vector<std::string>{"n7"});
  s.excluded = "(null)";
  CHECK(own_exclusions_now(r, s).empty());
}

TEST_CASE("news: a pending job's exclusions follow the record's bad nodes", "[recovery][news]") {
  JobRecord r = record(JobState::Pending);
  r.bad_nodes = {BadNode{"n3", "slurmd did not answer", 0, 100}, BadNode{"n4", "slurmd did not answer", 0, 50}};
  SlurmJob s = slurm(SlurmState::Pending, 1);
  s.excluded = "n[3-4]";
  // Both still bad: nothing to do.
  CHECK(lapsed_exclusions(r, s, 10).empty());
  CHECK(news_of(r, s, 10, 0) == SlurmNews::Nothing);
  // n4's bad_node_ttl ran out: the job must no longer exclude it (the update writes n3 alone).
  CHECK(lapsed_exclusions(r, s, 60) == std::vector<std::string>{"n4"});
  CHECK(news_of(r, s, 60, 0) == SlurmNews::ExclusionsLapsed);
  CHECK(active_bad_nodes(r.bad_nodes, 60) == std::vector<std::string>{"n3"});
  // An admin forgot n3 (forget-node): expired in the record, so lapsed too.
  CHECK(forget_bad_node(r.bad_nodes, "n3", 10));
  CHECK(lapsed_exclusions(r, s, 10) == std::vector<std::string>{"n3"});
  // Once Slurm has the record's list, no more news; nor while the job completes or is held, nor after 3 updates.
  s.excluded = "n4";
  CHECK(news_of(r, s, 10, 0) == SlurmNews::Nothing);
  s.excluded = "";
  CHECK(news_of(r, s, 60, 0) == SlurmNews::Nothing);
  s.excluded = "(null)";
  CHECK(lapsed_exclusions(r, s, 60).empty());
  s.excluded = "n[3-4]";
  CHECK(news_of(r, s, 60, 3) == SlurmNews::Nothing);
  s.completing = true;
  CHECK(news_of(r, s, 60, 0) == SlurmNews::Nothing);
  s.completing = false;
  s.held = true;  // a person's hold
  CHECK(news_of(r, s, 60, 0) == SlurmNews::Nothing);
  CHECK_FALSE(held_by_slurm(s));
  s.bad_constraints = true;  // Slurm's own: the job cannot start as it stands (it needs the node it excludes)
  CHECK(held_by_slurm(s));
  CHECK(news_of(r, s, 60, 0) == SlurmNews::ExclusionsLapsed);
  s.held = false;
  // Why it waits, said once by the engine: the controller's exclusions and the first to lapse.
  r.bad_nodes = {BadNode{"n3", "slurmd did not answer", 0, 100}, BadNode{"n4", "slurmd did not answer", 0, 50}};
  s.excluded = "n[3-4]";
  const std::string why = cannot_start_why(r, s, 10);
  CHECK_THAT(why, Catch::Matchers::Contains("BadConstraints") && Catch::Matchers::Contains("excludes n3,n4") &&
                      Catch::Matchers::Contains("in 40 s"));
  s.excluded = "n9";  // none of them ours
  CHECK_THAT(cannot_start_why(r, s, 10), Catch::Matchers::Contains("none of its exclusions"));
  s.bad_constraints = false;
  CHECK(cannot_start_why(r, s, 10).empty());
  // A list that does not parse is left as it is.
  s.excluded = "n[3-";
  CHECK(lapsed_exclusions(r, s, 60).empty());
  // Only a pending record's job: a running one's ExcNodeList is for its next requeue to write.
  s.excluded = "n[3-4]";
  CHECK(news_of(record(JobState::Running), slurm(SlurmState::Running), 60, 0) == SlurmNews::Nothing);
}

TEST_CASE("news: an ended record comes back only when Slurm runs it again", "[recovery][news]") {
  for (JobState st : {JobState::Completed, JobState::Cancelled, JobState::GaveUp}) {
    JobRecord r = record(st);
    CHECK(news_of(r, slurm(SlurmState::Running, 1), 10, 0) == SlurmNews::NewRun);
    CHECK(news_of(r, slurm(SlurmState::Pending, 1), 10, 0) == SlurmNews::Nothing);
    CHECK(news_of(r, slurm(SlurmState::Running, 0), 10, 0) == SlurmNews::Nothing);
  }
  CHECK(news_of(record(JobState::Gone), slurm(SlurmState::Running, 1), 10, 0) == SlurmNews::Nothing);
}

// ---- a recovery's plan --------------------------------------------------------------------------------------------

TEST_CASE("plan: endings classify() cannot see", "[recovery][plan]") {
  JobRecord r = record(JobState::Failing);
  EndingFacts ef;
  ef.slurm = slurm(SlurmState::Running);
  ef.failures = {failure_in(0, "n1")};
  CHECK_FALSE(ending_of_failure(r, ef, 10));
  r.handover = true;
  CHECK(ending_of_failure(r, ef, 10) == Ending::TaskCrash);
  // A node left out for being slow is no evidence of a node failure.
  r.bad_nodes = add_bad_nodes({}, {"n3"}, std::string(kSlowNodeReason) + " by job 7 (0.4)", 5, 100);
  CHECK(ending_of_failure(r, ef, 10) == Ending::TaskCrash);
  r.bad_nodes = add_bad_nodes(r.bad_nodes, {"n2"}, "dead", 5, 100);
  CHECK(ending_of_failure(r, ef, 10) == Ending::NodeFailure);
  CHECK(ending_of_failure(r, ef, 200) == Ending::TaskCrash);  // the exclusion expired
  ef.slurm = slurm(SlurmState::Cancelled);
  CHECK(ending_of_failure(r, ef, 10) == Ending::UserCancel);

  CHECK(ending_of_slurm_requeue({}) == Ending::Preemption);
  CHECK(ending_of_slurm_requeue({"n2"}) == Ending::NodeFailure);
}

TEST_CASE("plan: the nodes a failure lost, from probes and Slurm", "[recovery][plan]") {
  NodeEvidence probes;
  probes.failed = {"n2", "n3", "n4"};
  probes.mark_down = {"n2", "n3"};  // n4 only timed out
  probes.hung = {"n3"};
  auto lost = lost_nodes(probes, true, {"n5", "n2"});
  CHECK(lost.dead == std::vector<std::string>{"n2", "n3", "n4", "n5"});
  CHECK(lost.mark_down == std::vector<std::string>{"n2", "n3", "n5"});
  // A site that leaves hung nodes to SlurmdTimeout: n3 is excluded, not marked DOWN.
  lost = lost_nodes(probes, false, {});
  CHECK(lost.dead == std::vector<std::string>{"n2", "n3", "n4"});
  CHECK(lost.mark_down == std::vector<std::string>{"n2"});
}

TEST_CASE("plan: dead nodes excluded once, lost work", "[recovery][plan]") {
  std::vector<BadNode> bad;
  CHECK(exclude_dead_nodes(bad, {"n2", "n3"}, 7, 10, 100) == std::vector<std::string>{"n2", "n3"});
  CHECK(exclude_dead_nodes(bad, {"n3", "n4"}, 7, 20, 100) == std::vector<std::string>{"n4"});
  CHECK(active_bad_nodes(bad, 20) == std::vector<std::string>{"n2", "n3", "n4"});
  CHECK(bad[0].reason == "slurmd did not answer after a failure of job 7");

  CHECK(lost_work_s(90, 50, 100) == 10);   // since the newest checkpoint
  CHECK(lost_work_s(0, 50, 100) == 50);    // none: since the run started
  CHECK(lost_work_s(0, 0, 100) == 0);      // unknown
  CHECK(lost_work_s(120, 50, 100) == 0);   // a clock ahead of the failure
  CHECK(lost_work_s(1, 50, 100) == 50);    // a manifest time before the run (the owner writes it): since the run
}

TEST_CASE("plan: a cancel and a clean exit are never restarted; a time-limit stop is", "[recovery][plan]") {
  JobRecord r = record(JobState::Failing);
  auto plan = plan_recovery(r, facts(Ending::UserCancel, SlurmState::Cancelled), {});
  CHECK(plan.action == RecoveryPlan::Action::Cancel);
  CHECK(plan.reason == "cancelled by its user: never requeued");
  plan = plan_recovery(r, facts(Ending::CleanExit, SlurmState::Completed), {});
  CHECK(plan.action == RecoveryPlan::Action::Complete);
  CHECK_FALSE(plan.counts_lost_work);

  RecoveryFacts f = facts(Ending::CleanExit, SlurmState::Completed);
  f.time_limit_stop = TimeLimitStop{"7", 0, 566};
  plan = plan_recovery(r, f, {});
  CHECK(plan.ending == Ending::TimeLimit);
  CHECK(plan.time_limit_stop);
  CHECK(plan.action == RecoveryPlan::Action::Requeue);
  f.time_limit_stop = TimeLimitStop{"7", 1, 566};  // another run's record
  CHECK(plan_recovery(r, f, {}).action == RecoveryPlan::Action::Complete);
}

TEST_CASE("plan: relaunch inside the allocation only for a node failure under ckpt-run", "[recovery][plan]") {
  JobRecord r = under_ckpt_run();
  auto plan = plan_recovery(r, facts(Ending::NodeFailure, SlurmState::Running, {"n2"}), {});
  REQUIRE(plan.action == RecoveryPlan::Action::Relaunch);
  CHECK(plan.relaunch_step == 1);
  CHECK(plan.budget.restarts == 1);
  CHECK(plan.counts_lost_work);
  CHECK(plan.reason == "node failure: restart 1 (1 of 3 without progress; resumes from step 100); ckpt-run "
                       "relaunches step 1 without n2");

  // A dead batch host, a crash, an ended allocation, a hand-over, Slurm's own requeue: a requeue.
  CHECK(plan_recovery(r, facts(Ending::NodeFailure, SlurmState::Running, {"n1"}), {}).action ==
        RecoveryPlan::Action::Requeue);
  CHECK(plan_recovery(r, facts(Ending::TaskCrash, SlurmState::Running), {}).action == RecoveryPlan::Action::Requeue);
  CHECK(plan_recovery(r, facts(Ending::NodeFailure, SlurmState::NodeFail, {"n2"}), {}).action ==
        RecoveryPlan::Action::Requeue);
  RecoveryFacts f = facts(Ending::NodeFailure, SlurmState::Running, {"n2"});
  f.slurm_requeued = true;
  CHECK(plan_recovery(r, f, {}).action == RecoveryPlan::Action::Requeue);
  r.handover = true;
  CHECK(plan_recovery(r, facts(Ending::NodeFailure, SlurmState::Running, {"n2"}), {}).action ==
        RecoveryPlan::Action::Requeue);
  r = under_ckpt_run();
  r.steps[1].in_allocation = false;
  CHECK(plan_recovery(r, facts(Ending::NodeFailure, SlurmState::Running, {"n2"}), {}).action ==
        RecoveryPlan::Action::Requeue);
}

TEST_CASE("plan: a hung node ends its run through a requeue that leaves it out, never marked DOWN",
          "[recovery][plan]") {
  JobRecord r = under_ckpt_run();
  RecoveryFacts f = facts(Ending::NodeFailure, SlurmState::Running, {"n2"});
  f.mark_down = {};
  f.hung = {"n2"};
  auto plan = plan_recovery(r, f, {});
  REQUIRE(plan.action == RecoveryPlan::Action::Requeue);  // its step never ends for ckpt-run to relaunch
  CHECK(plan.intent.exclude == std::vector<std::string>{"n2"});
  CHECK(plan.intent.mark_down.empty());
}

// A 3-node run whose survivors on n1 and n3 exited kExitPeerLost while n2 stayed silent.
JobRecord survivors_reported_from(std::vector<std::string> reporters) {
  JobRecord r = record(JobState::Failing);
  r.clock.failed = 1000;
  for (const auto& n : reporters) {
    TaskFailure f = failure_in(0, n);
    f.exit_code = kExitPeerLost;
    r.failures.push_back(f);
  }
  r.reporters = std::move(reporters);
  return r;
}

TEST_CASE("hung nodes: named by this run's survivors, live, silent, of the allocation", "[recovery][plan]") {
  JobRecord r = survivors_reported_from({"n1", "n3"});
  PeerLost lost{"7", 0, {"n2"}, 998};
  CHECK(survivors_reported(r));
  CHECK(hung_nodes(r, lost, {}) == std::vector<std::string>{"n2"});
  CHECK(hung_nodes(r, std::nullopt, {}).empty());            // no record: the batch script decides, as before
  CHECK(hung_nodes(r, lost, {"n2"}).empty());                // found dead: a node failure already
  CHECK(hung_nodes(r, PeerLost{"8", 0, {"n2"}, 998}, {}).empty());   // another job's record
  CHECK(hung_nodes(r, PeerLost{"7", 1, {"n2"}, 998}, {}).empty());   // another run's
  CHECK(hung_nodes(r, PeerLost{"7", 0, {"n2"}, 900}, {}).empty());   // an earlier failure's (in place)
  CHECK(hung_nodes(r, PeerLost{"7", 0, {"n3"}, 998}, {}).empty());   // n3 reported: alive and well
  CHECK(hung_nodes(r, PeerLost{"7", 0, {"n9"}, 998}, {}).empty());   // not of this job: never touched
  CHECK(hung_nodes(r, PeerLost{"7", 0, {"n2", "n2"}, 998}, {}) == std::vector<std::string>{"n2"});

  // Without a survivor's kExitPeerLost (a plain crash on n1), the record is not the failure's.
  JobRecord crash = record(JobState::Failing);
  crash.failures = {failure_in(0, "n1")};
  crash.reporters = {"n1"};
  CHECK_FALSE(survivors_reported(crash));
  CHECK(hung_nodes(crash, lost, {}).empty());
}

TEST_CASE("plan: survivors that gave up under ckpt-run --spares wait a while for its relaunch or hand-over",
          "[recovery][plan]") {
  JobRecord r = survivors_reported_from({"n1", "n3"});  // n2 crashed
  r.spares = 1;
  const SlurmJob running = slurm(SlurmState::Running);
  CHECK(awaits_ckpt_run(r, running, {"n2"}, 1000.1));
  CHECK(awaits_ckpt_run(r, running, {"n2"}, 1000 + kCkptRunWord_s - 0.01));
  CHECK_FALSE(awaits_ckpt_run(r, running, {"n2"}, 1000 + kCkptRunWord_s));  // late: decided as any failure
  CHECK_FALSE(awaits_ckpt_run(r, running, {"n1"}, 1000.1));                // ckpt-run's node (the batch host) died
  CHECK_FALSE(awaits_ckpt_run(r, slurm(SlurmState::Failed), {"n2"}, 1000.1));  // the job ended: ckpt-run with it

  JobRecord no_spares = r;
  no_spares.spares = 0;  // no ckpt-run --spares: nobody relaunches node steps
  CHECK_FALSE(awaits_ckpt_run(no_spares, running, {"n2"}, 1000.1));
  JobRecord handed_over = r;
  handed_over.handover = true;  // ckpt-run said it: requeue now
  CHECK_FALSE(awaits_ckpt_run(handed_over, running, {"n2"}, 1000.1));
  JobRecord crashed = r;
  crashed.failures.push_back(failure_in(0, "n3"));  // a rank's own failure, not a survivor's: ckpt-run does not act
  CHECK_FALSE(awaits_ckpt_run(crashed, running, {"n2"}, 1000.1));
  JobRecord killed = r;
  killed.failures.front().signal = 9;
  CHECK_FALSE(awaits_ckpt_run(killed, running, {"n2"}, 1000.1));
  CHECK_FALSE(awaits_ckpt_run(record(JobState::Failing), running, {"n2"}, 1000.1));  // nothing reported
}

TEST_CASE("hung nodes: the survivors' record is parsed strictly", "[recovery][plan][security]") {
  PeerLost lost{"41", 2, {"n2", "gpu-07"}, 1234.5};
  auto back = parse_peer_lost(to_json(lost));
  REQUIRE(back);
  CHECK(back->job_id == "41");
  CHECK(back->restart_count == 2);
  CHECK(back->nodes == lost.nodes);
  CHECK(back->time == 1234.5);
  for (const char* bad : {"", "[]", "{}", R"({"job_id":41,"restart_count":0,"nodes":[]})",
                          R"({"job_id":"41","restart_count":-1,"nodes":[]})",
                          R"({"job_id":"41","restart_count":0,"nodes":["n1;rm -rf /"]})",
                          R"({"job_id":"41","restart_count":0,"nodes":[7]})",
                          R"({"job_id":"41","restart_count":0,"nodes":"n1"})"}) {
    INFO(bad);
    CHECK_FALSE(parse_peer_lost(bad));
  }
  std::string many = R"({"job_id":"41","restart_count":0,"nodes":[)";
  for (std::size_t i = 0; i <= kMaxNodesPerStep; ++i) many += (i ? ",\"n" : "\"n") + std::to_string(i) + "\"";
  CHECK_FALSE(parse_peer_lost(many + "]}"));
}

TEST_CASE("plan: a hand-over after a relaunch decision does not spend the budget again", "[recovery][plan]") {
  JobRecord r = under_ckpt_run();
  r.handover = true;
  r.relaunch_step = 1;
  r.budget.max_restarts = 1;
  r.budget.restarts = 1;
  r.budget.without_progress = 1;
  r.budget.progress_step = 100;
  auto plan = plan_recovery(r, facts(Ending::NodeFailure, SlurmState::Running, {"n2"}), {});
  REQUIRE(plan.action == RecoveryPlan::Action::Requeue);
  CHECK(plan.budget.restarts == 1);
  CHECK(plan.budget.without_progress == 1);
  CHECK(plan.reason == "node failure: ckpt-run handed over; requeue (restart 1 already counted)");
  // Without the relaunch decision the budget is spent: give up.
  r.relaunch_step.reset();
  plan = plan_recovery(r, facts(Ending::NodeFailure, SlurmState::Running, {"n2"}), {});
  CHECK(plan.action == RecoveryPlan::Action::GiveUp);
  // A job that needs a checkpoint and has none is not requeued, hand-over or not.
  r.relaunch_step = 1;
  r.needs_checkpoint = true;
  RecoveryFacts f = facts(Ending::NodeFailure, SlurmState::Running, {"n2"});
  f.newest_complete.reset();
  CHECK(plan_recovery(r, f, {}).action == RecoveryPlan::Action::GiveUp);
}

TEST_CASE("plan: give up on a spent budget and what cannot be requeued", "[recovery][plan]") {
  JobRecord r = record(JobState::Failing);
  r.budget.max_restarts = 0;
  auto plan = plan_recovery(r, facts(Ending::TaskCrash, SlurmState::Failed), {});
  CHECK(plan.action == RecoveryPlan::Action::GiveUp);
  CHECK(plan.reason.find("restarts without progress") != std::string::npos);
  CHECK(plan_recovery(r, facts(Ending::OutOfMemory, SlurmState::OutOfMemory), {}).action ==
        RecoveryPlan::Action::GiveUp);

  r.budget.max_restarts = 3;
  RecoveryFacts f = facts(Ending::TaskCrash, SlurmState::Failed);
  f.slurm.requeue_allowed = false;
  plan = plan_recovery(r, f, {});
  CHECK(plan.action == RecoveryPlan::Action::GiveUp);
  CHECK(plan.reason == "task crash, but the job does not allow a requeue (--no-requeue)");

  RecoveryPolicy rest;
  rest.can_requeue = false;
  rest.backend = "rest";
  plan = plan_recovery(r, facts(Ending::TaskCrash, SlurmState::Failed), rest);
  CHECK(plan.action == RecoveryPlan::Action::GiveUp);
  CHECK(plan.reason.rfind("task crash: the rest backend cannot requeue a job", 0) == 0);
  // A node failure while Slurm still has the job: Slurm requeues it; the backend then expedites it.
  plan = plan_recovery(r, facts(Ending::NodeFailure, SlurmState::Running, {"n2"}), rest);
  CHECK(plan.action == RecoveryPlan::Action::Requeue);
  CHECK(plan.waits_for_slurm);
  CHECK_FALSE(plan.intent.requeue);
}

TEST_CASE("plan: the requeue intent", "[recovery][plan]") {
  JobRecord r = record(JobState::Failing);
  r.restart_count = 2;
  r.bad_nodes = add_bad_nodes({}, {"n9"}, "old", 900, 3600);
  RecoveryFacts f = facts(Ending::NodeFailure, SlurmState::NodeFail, {"n2", "n3", "n9"});
  f.mark_down = {"n2", "n9"};  // n3 only timed out
  RecoveryPolicy p;
  p.drain_bad_nodes = true;
  auto plan = plan_recovery(r, f, p);
  REQUIRE(plan.action == RecoveryPlan::Action::Requeue);
  const Intent& i = plan.intent;
  CHECK(i.phase == Intent::Phase::MarkDown);
  CHECK(i.requeue);
  CHECK(i.expected_restart == 3);
  CHECK(i.exclude == std::vector<std::string>{"n2", "n3", "n9"});
  CHECK(i.mark_down == std::vector<std::string>{"n2", "n9"});
  CHECK(i.drain == std::vector<std::string>{"n2"});  // n9 was excluded before; n3 has no evidence
  CHECK(i.reason == plan.reason);
  CHECK(i.created == 1000);
  CHECK(plan.budget.restarts == 1);

  p.down_dead_nodes = false;
  CHECK(plan_recovery(r, f, p).intent.mark_down.empty());
  p.down_dead_nodes = true;
  p.can_set_node_state = false;
  plan = plan_recovery(r, f, p);
  CHECK(plan.intent.mark_down.empty());
  CHECK(plan.intent.drain.empty());

  f.slurm_requeued = true;
  f.slurm.restart_count = 3;
  plan = plan_recovery(r, f, {});
  CHECK_FALSE(plan.intent.requeue);
  CHECK(plan.intent.expected_restart == 3);
}

TEST_CASE("plan: a job given up on that Slurm requeued is held", "[recovery][plan]") {
  CHECK(hold_when_giving_up(slurm(SlurmState::Pending, 1)));
  SlurmJob held = slurm(SlurmState::Pending, 1);
  held.held = true;
  CHECK_FALSE(hold_when_giving_up(held));
  CHECK_FALSE(hold_when_giving_up(slurm(SlurmState::Failed)));
}

TEST_CASE("plan: an admin's release", "[recovery][plan]") {
  JobRecord r = record(JobState::GaveUp);
  r.restart_count = 1;
  r.budget.restarts = 4;
  r.budget.without_progress = 3;
  r.bad_nodes = add_bad_nodes({}, {"n2"}, "dead", 900, 3600);
  auto plan = plan_release(r, slurm(SlurmState::Failed, 1), true, 0, 1000);
  CHECK(plan.refusal == ReleasePlan::Refusal::None);
  CHECK(plan.intent.requeue);
  CHECK(plan.intent.expected_restart == 2);
  CHECK(plan.intent.exclude == std::vector<std::string>{"n2"});
  CHECK(plan.intent.reason == "released by uid 0");
  CHECK(plan.budget.without_progress == 0);
  CHECK(plan.budget.restarts == 4);
  // Held pending by Slurm already (requeued on its own, then held): release and expedite only.
  plan = plan_release(r, slurm(SlurmState::Pending, 2), false, 0, 1000);
  CHECK(plan.refusal == ReleasePlan::Refusal::None);
  CHECK_FALSE(plan.intent.requeue);
  CHECK(plan.intent.expected_restart == 2);
  CHECK(plan_release(r, slurm(SlurmState::Running, 1), true, 0, 1000).refusal == ReleasePlan::Refusal::Running);
  CHECK(plan_release(r, slurm(SlurmState::Failed, 1), false, 0, 1000).refusal ==
        ReleasePlan::Refusal::CannotRequeue);
}

// ---- a requeue intent, step by step -------------------------------------------------------------------------------

TEST_CASE("intent: a cancel at the cycle's first look drops it", "[recovery][intent]") {
  Intent i;
  i.phase = Intent::Phase::WaitCompleting;
  IntentFacts f = look(SlurmState::Cancelled, 0, 10);
  auto step = next_intent_step(i, f);
  CHECK(step.kind == IntentStep::Kind::Cancel);
  CHECK(step.reason == "cancelled by its user while being requeued");
  f.first_look = false;
  CHECK(next_intent_step(i, f).kind != IntentStep::Kind::Cancel);
}

TEST_CASE("intent: mark down, then requeue unless Slurm did", "[recovery][intent]") {
  Intent i;
  i.created = 10;
  i.expected_restart = 1;
  auto step = next_intent_step(i, look(SlurmState::Running, 0, 10));
  CHECK(step.kind == IntentStep::Kind::MarkDown);
  CHECK(step.next == Intent::Phase::Requeue);
  CHECK_FALSE(step.look_again);
  i.mark_down = {"n2"};
  CHECK(next_intent_step(i, look(SlurmState::Running, 0, 10)).look_again);

  i.phase = Intent::Phase::Requeue;
  step = next_intent_step(i, look(SlurmState::Running, 0, 10.5));
  CHECK(step.kind == IntentStep::Kind::Requeue);
  CHECK(step.next == Intent::Phase::WaitCompleting);
  step = next_intent_step(i, look(SlurmState::Pending, 1, 10.5));
  CHECK(step.kind == IntentStep::Kind::Requeued);
  CHECK(step.not_before == credential_safe_start(10.5));
  i.not_before = 13;  // ours, before the controller stopped
  CHECK(next_intent_step(i, look(SlurmState::Pending, 1, 20)).not_before == 13);

  i.requeue = false;  // waiting for Slurm's own requeue
  i.not_before = 0;
  step = next_intent_step(i, look(SlurmState::Running, 0, 100));
  CHECK(step.kind == IntentStep::Kind::Wait);
  CHECK(step.at == Approx(100.25));
  step = next_intent_step(i, look(SlurmState::Running, 0, 10 + 120 + 61));
  CHECK(step.kind == IntentStep::Kind::GiveUp);
  CHECK(step.reason == "Slurm did not requeue the job after its node failed");
}

TEST_CASE("intent: wait for the old run to end and its credential to pass", "[recovery][intent]") {
  Intent i;
  i.phase = Intent::Phase::WaitCompleting;
  i.created = 100;
  i.expected_restart = 1;
  i.not_before = 102;
  IntentFacts f = look(SlurmState::Pending, 1, 100.5);
  f.slurm.completing = true;
  auto step = next_intent_step(i, f);
  CHECK(step.kind == IntentStep::Kind::Wait);
  CHECK(step.at == Approx(101.5));
  f.slurm.completing = false;
  f.now = 101.8;
  CHECK(next_intent_step(i, f).at == Approx(102));  // the credential's second
  f.now = 102.1;
  step = next_intent_step(i, f);
  CHECK(step.kind == IntentStep::Kind::Advance);
  CHECK(step.next == Intent::Phase::Update);
  // Still completing past the timeout: update anyway.
  f.slurm.completing = true;
  f.now = 100 + 121;
  CHECK(next_intent_step(i, f).next == Intent::Phase::Update);
  // Slurm runs it again already.
  step = next_intent_step(i, look(SlurmState::Running, 1, 100.5));
  CHECK(step.kind == IntentStep::Kind::Advance);
  CHECK(step.next == Intent::Phase::Done);
}

TEST_CASE("intent: expedite a pending job, then finish", "[recovery][intent]") {
  Intent i;
  i.phase = Intent::Phase::Update;
  i.created = 100;
  IntentFacts f = look(SlurmState::Pending, 1, 103);
  f.slurm.held = true;
  auto step = next_intent_step(i, f);
  CHECK(step.kind == IntentStep::Kind::Expedite);
  CHECK(step.release);
  CHECK(step.next == Intent::Phase::Done);
  step = next_intent_step(i, look(SlurmState::Running, 1, 103));
  CHECK(step.kind == IntentStep::Kind::Advance);
  CHECK(step.next == Intent::Phase::Done);

  step = after_refused_update(i, 110, 120);
  CHECK(step.kind == IntentStep::Kind::Wait);
  CHECK(step.at == Approx(110.5));
  step = after_refused_update(i, 221, 120);
  CHECK(step.kind == IntentStep::Kind::Advance);
  CHECK(step.next == Intent::Phase::Done);

  i.phase = Intent::Phase::Done;
  f = look(SlurmState::Pending, 1, 104);
  f.record_restart = 0;
  step = next_intent_step(i, f);
  CHECK(step.kind == IntentStep::Kind::Finish);
  CHECK_FALSE(step.new_run);
  CHECK(step.reason == "requeued; waiting for Slurm to start run 1");
  f = look(SlurmState::Running, 1, 104);
  CHECK(next_intent_step(i, f).new_run);
}

TEST_CASE("intent: a refused requeue that happened anyway goes on", "[recovery][intent]") {
  Intent i;
  i.expected_restart = 2;
  CHECK_FALSE(requeue_happened_anyway(i, std::nullopt));
  CHECK_FALSE(requeue_happened_anyway(i, slurm(SlurmState::Running, 1)));
  CHECK(requeue_happened_anyway(i, slurm(SlurmState::Pending, 2)));
}

TEST_CASE("plan: a requeue keeps the job's own exclusions beside the bad nodes", "[recovery][plan]") {
  JobRecord r = record(JobState::Failing);
  SlurmJob s = slurm(SlurmState::Running);
  s.excluded = "n[8-9]";
  // Read at the first look: all of Slurm's list but the controller's own bad nodes.
  CHECK(own_exclusions(r, s) == std::vector<std::string>{"n8", "n9"});
  r.bad_nodes = {BadNode{"n9", "slurmd did not answer", 0, 100}};
  CHECK(own_exclusions(r, s) == std::vector<std::string>{"n8"});
  s.excluded = "n[8-";  // does not parse: nothing of its own is known
  CHECK(own_exclusions(r, s).empty());
  r.bad_nodes.clear();
  // Unknown (a record older than the field): the bad nodes alone, as before.
  CHECK(job_exclusions(r, {"n2"}) == std::vector<std::string>{"n2"});
  r.own_excluded = std::vector<std::string>{"n8", "n2"};
  CHECK(job_exclusions(r, {"n2", "n1"}) == std::vector<std::string>{"n1", "n2", "n8"});
  // The requeue writes both; the release too.
  auto plan = plan_recovery(r, facts(Ending::NodeFailure, SlurmState::Running, {"n3"}), {});
  REQUIRE(plan.action == RecoveryPlan::Action::Requeue);
  CHECK(plan.intent.exclude == std::vector<std::string>{"n2", "n3", "n8"});
  CHECK(plan_release(r, slurm(SlurmState::Failed), true, 0, 10).intent.exclude ==
        std::vector<std::string>{"n2", "n8"});
  // A pending job's own exclusions never lapse.
  SlurmJob pending = slurm(SlurmState::Pending, 1);
  pending.excluded = "n[2-3,8]";
  r.bad_nodes = {BadNode{"n3", "slurmd did not answer", 0, 100}};
  CHECK(lapsed_exclusions(r, pending, 10).empty());
  CHECK(lapsed_exclusions(r, pending, 200) == std::vector<std::string>{"n3"});
  // Kept in the record.
  auto back = parse_job_record(to_json(r));
  REQUIRE(back);
  REQUIRE(back->own_excluded);
  CHECK(*back->own_excluded == std::vector<std::string>{"n8", "n2"});
  r.own_excluded.reset();
  back = parse_job_record(to_json(r));
  REQUIRE(back);
  CHECK_FALSE(back->own_excluded);
}

TEST_CASE("plan: a requeue may start without the spares its excluded nodes cost", "[recovery][plan]") {
  JobRecord r = record(JobState::Failing);
  r.nodes = {"n1", "n2", "n3", "n4"};
  SECTION("the pure rule") {
    CHECK(requeue_min_nodes(r, {"n2"}) == 0);  // no spares: as submitted
    r.spares = 1;
    CHECK(requeue_min_nodes(r, {}) == 0);               // nothing of the allocation excluded: all of it again
    CHECK(requeue_min_nodes(r, {"n9"}) == 0);           // another node excluded: the same
    CHECK(requeue_min_nodes(r, {"n2"}) == 3);           // one fewer, the spare's
    CHECK(requeue_min_nodes(r, {"n2", "n3"}) == 3);     // never fewer than it trains on
    r.spares = 2;
    CHECK(requeue_min_nodes(r, {"n2", "n3"}) == 2);
    r.spares = 4;                                        // a bogus count: nothing to train on is not asked
    CHECK(requeue_min_nodes(r, {"n2"}) == 0);
  }
  SECTION("in the plan, and through the record") {
    r.spares = 1;
    auto plan = plan_recovery(r, facts(Ending::NodeFailure, SlurmState::Running, {"n1"}), {});
    REQUIRE(plan.action == RecoveryPlan::Action::Requeue);
    CHECK(plan.intent.min_nodes == 3);
    r.intent = plan.intent;
    auto back = parse_job_record(to_json(r));
    REQUIRE(back);
    CHECK(back->spares == 1);
    REQUIRE(back->intent);
    CHECK(back->intent->min_nodes == 3);
  }
  SECTION("a task count per node comes down as far as the nodes left hold") {
    SlurmJob s;
    s.tasks = 8;  // -N4 --ntasks-per-node=2
    CHECK(requeue_min_tasks(s, 3, 3) == 0);  // tasks_per_node not given
    s.tasks_per_node = 2;
    CHECK(requeue_min_tasks(s, 0, 3) == 0);  // MinNodes as submitted: NumTasks too
    CHECK(requeue_min_tasks(s, 3, 3) == 6);  // 3 nodes left
    CHECK(requeue_min_tasks(s, 3, 2) == 6);  // fewer than MinNodes: it waits for them, with tasks that fit
    CHECK(requeue_min_tasks(s, 3, 4) == 0);  // 4 left: they hold all 8, and the spare comes back with them
    CHECK(requeue_min_tasks(s, 2, 3) == 6);  // two spares, 3 nodes left: as many as 3 hold
    s.tasks = 5;                              // -N4 -n5 --ntasks-per-node=2: 5 fit on 3 nodes
    CHECK(requeue_min_tasks(s, 3, 3) == 0);
    CHECK(requeue_min_tasks(s, 2, 2) == 4);
    // Usable: in the job's partition, up, not drained, not excluded.
    auto node = [](std::string name, std::vector<std::string> parts, bool down = false, bool drained = false) {
      SlurmNode n;
      n.name = std::move(name);
      n.partitions = std::move(parts);
      n.down = down;
      n.drained = drained;
      return n;
    };
    const std::vector<SlurmNode> cluster = {node("n1", {"gpu"}), node("n2", {"gpu"}), node("n3", {"gpu"}, true),
                                            node("n4", {"gpu"}, false, true), node("n5", {"cpu"}),
                                            node("n6", {"cpu", "gpu"})};
    SlurmJob job;
    job.partition = "gpu";
    CHECK(usable_nodes(cluster, job, {}) == 3);      // n1, n2, n6
    CHECK(usable_nodes(cluster, job, {"n2"}) == 2);
    job.partition = "cpu,gpu";
    CHECK(usable_nodes(cluster, job, {"n2"}) == 3);  // n5 too
    job.partition = "";
    CHECK(usable_nodes(cluster, job, {}) == 4);      // any partition
    job.partition = "gpu";
    CHECK(usable_nodes({node("n7", {})}, job, {}) == 1);  // its partitions not known: counted
    // In the plan: n1 excluded of a 4-node cluster, 2 tasks a node.
    r.spares = 1;
    auto f = facts(Ending::NodeFailure, SlurmState::Running, {"n1"});
    f.slurm.tasks = 8;
    f.slurm.tasks_per_node = 2;
    auto plan = plan_recovery(r, f, {});
    REQUIRE(plan.action == RecoveryPlan::Action::Requeue);
    CHECK(plan.intent.min_nodes == 3);
    CHECK(plan.intent.min_tasks == 0);  // the cluster's nodes not known: as submitted
    for (const char* n : {"n1", "n2", "n3", "n4"}) f.cluster.push_back(node(n, {}));
    plan = plan_recovery(r, f, {});
    CHECK(plan.intent.min_tasks == 6);
    f.cluster.push_back(node("n5", {}));  // a fifth node: all 8 fit
    CHECK(plan_recovery(r, f, {}).intent.min_tasks == 0);
    r.intent = plan.intent;
    auto back = parse_job_record(to_json(r));
    REQUIRE(back);
    REQUIRE(back->intent);
    CHECK(back->intent->min_tasks == 6);
  }
  SECTION("ckpt-run's steps say how many spares it keeps") {
    Event e;
    e.type = EventType::JobStart;
    e.job_id = 7;
    e.node = "n2";
    e.ckpt_dir = "/scratch/x";
    e.spares = 1;
    auto back = parse_event(to_json(e));
    REQUIRE(back);
    CHECK(back->spares == 1);
    JobRecord running = record(JobState::Running);
    apply_event(running, *back, true, 10);
    CHECK(running.spares == 1);
    auto bad = to_json(e);
    bad.replace(bad.find("\"spares\":1"), 10, "\"spares\":99999");
    CHECK_FALSE(parse_event(bad));
  }
}

TEST_CASE("events: ckpt-run relaunching its node steps ends the failure; the steps it ended say nothing new",
          "[recovery][events][in-place]") {
  JobRecord r = record(JobState::Failing);  // the survivors' exits (75) came first
  r.failures = {failure_in(4, "n1")};
  r.budget.max_restarts = 3;
  Event e = event(EventType::Relaunch, 6);
  e.failed_nodes = "n2,n9";
  e.resume_step = 120;
  auto fx = apply_event(r, e, false, 200);
  CHECK(fx.note == "relaunch from n1 (step 6): the in-place recovery was given up; ckpt-run relaunches the node "
                   "steps inside the allocation without n2,n9, ending the steps up to 6");
  CHECK(fx.to == JobState::Relaunching);
  CHECK(fx.restarted == Ending::NodeFailure);
  CHECK(fx.exclude == std::vector<std::string>{"n2"});  // the owner's word: n9 is not the job's
  CHECK(r.budget.restarts == 1);
  CHECK(r.budget.progress_step == 120u);
  CHECK(r.failures.empty());
  CHECK(r.ended_steps == 6u);
  CHECK(r.clock.path == "relaunch");

  SECTION("the ended steps' tasks exit: no new failure, also once the relaunch runs") {
    Event killed = event(EventType::TaskExit, 5, "n3");
    killed.signal = 9;
    auto late = apply_event(r, killed, false, 201);
    CHECK_FALSE(late.start_failing);
    CHECK(late.note == "task_exit from n3 (step 5): from a step ckpt-run ended to relaunch the node steps; not a new "
                       "failure");
    r.state = JobState::Relaunching;
    auto started = apply_event(r, event(EventType::JobStart, 7, "n4"), false, 202);
    CHECK(started.to == JobState::Running);
    r.state = JobState::Running;
    CHECK_FALSE(apply_event(r, killed, false, 203).start_failing);
    CHECK(r.failures.empty());
    CHECK(apply_event(r, event(EventType::TaskExit, 7, "n4"), false, 204).start_failing);  // the relaunch's: news
  }
  SECTION("kept across a controller restart") {
    auto back = parse_job_record(to_json(r));
    REQUIRE(back);
    CHECK(back->ended_steps == 6u);
  }
  SECTION("a decision taken already stands") {
    JobRecord q = record(JobState::Requeueing);
    auto fx2 = apply_event(q, e, false, 200);
    CHECK_FALSE(fx2.to);
    CHECK(q.budget.restarts == 0);
    CHECK_FALSE(q.ended_steps);
  }
  SECTION("the budget spent without progress: the controller gives up") {
    JobRecord g = record(JobState::Running);
    g.budget.max_restarts = 1;
    g.budget.without_progress = 1;
    g.budget.progress_step = 120;
    auto fx3 = apply_event(g, e, false, 200);
    REQUIRE(fx3.give_up);
    CHECK(fx3.give_up->find("ckpt-run relaunches inside the allocation, stop the job") != std::string::npos);
  }
  SECTION("a relaunch event names its step") {
    Event bad = e;
    bad.step_id = kBatchStep;
    CHECK_FALSE(parse_event(to_json(bad)));
    auto parsed = parse_event(to_json(e));
    REQUIRE(parsed);
    CHECK(parsed->type == EventType::Relaunch);
    CHECK(parsed->failed_nodes == "n2,n9");
    CHECK(parsed->resume_step == 120u);
  }
}
