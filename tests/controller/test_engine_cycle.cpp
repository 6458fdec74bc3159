// The engine's decision cycle against Slurm as an in-memory table (fake_backend.hpp) and a real SQLite store:
// requeue, relaunch inside the allocation, hand-over, give-up, a recovery in place, and a controller that dies in the
// middle of a requeue.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "db.hpp"
#include "engine.hpp"
#include "fake_backend.hpp"
#include "log.hpp"
#include "observe.hpp"

namespace rec = ckpt::recovery;
using ckpt::controller::Database;
using ckpt::controller::Engine;
using ckpt::controller::testing::FakeBackend;

namespace {

constexpr std::uint32_t kJob = 100;

// One engine over a fresh database, with a clock of its own: each cycle is 0.1 s of it, and a few real
// milliseconds for the probes and checkpoint reads that run on threads of their own.
struct Harness {
  std::filesystem::path dir;
  FakeBackend slurm;
  std::unique_ptr<Database> db;
  ckpt::controller::Metrics metrics;
  ckpt::controller::Alerts alerts{"", 1};
  rec::ControllerConfig config;
  std::unique_ptr<Engine> engine;
  double now = 1000;

  Harness() {
    ckpt::toolkit::set_log_level("error");
    std::string templ = (std::filesystem::temp_directory_path() / "engine_cycle.XXXXXX").string();
    REQUIRE(mkdtemp(templ.data()) != nullptr);
    dir = templ;
    config.database = (dir / "controller.db").string();
    config.settle_s = 0;
    config.probe_timeout_s = 0.2;
    config.hung_after_s = 0;
    for (const char* n : {"n1", "n2", "n3"}) slurm.nodes.push_back(rec::SlurmNode{n, "127.0.0.1", 1, false, false, "", {}});
    rec::SlurmJob j;
    j.job_id = kJob;
    j.state = rec::SlurmState::Running;
    j.user_id = 1000;
    j.group_id = 1000;
    j.submit_time = 500;
    j.nodes = {"n1", "n2", "n3"};
    j.batch_host = "n1";
    slurm.jobs[kJob] = j;
    start();
  }
  ~Harness() {
    engine.reset();
    db.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  void start() {
    auto opened = Database::open(config.database);
    REQUIRE(opened);
    db = std::move(opened).value();
    engine = std::make_unique<Engine>(config, slurm, *db, metrics, alerts);
    REQUIRE(engine->start(now));
  }
  // The controller dies: nothing of it is left but its database.
  void crash_and_restart() {
    engine.reset();
    db.reset();
    start();
  }

  void send(rec::EventType type, std::uint32_t step, const std::string& node, bool in_allocation = false) {
    rec::Event e;
    e.type = type;
    e.job_id = kJob;
    e.step_id = step;
    e.node = node;
    e.in_allocation = in_allocation;
    e.exit_code = type == rec::EventType::TaskExit ? 1 : 0;
    e.restart_count = slurm.jobs[kJob].restart_count;
    send(e);
  }
  // Queued as from root (the plugin): handled together at the next cycle.
  void send(const rec::Event& e) { engine->submit(e, 0, 0); }
  void cycle() {
    now += 0.1;
    engine->cycle(now);
  }
  void set_state(rec::SlurmState state) { slurm.jobs[kJob].state = state; }
  // A rank failed on every node, each node's plugin reported it, and the batch script ended with an error.
  void every_rank_failed(std::uint32_t step = 0) {
    for (const char* n : {"n1", "n2", "n3"}) send(rec::EventType::TaskExit, step, n);
    set_state(rec::SlurmState::Failed);
  }

  bool cycle_until(const std::function<bool()>& done) {
    for (int i = 0; i < 3000; ++i) {
      cycle();
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
  nlohmann::json job() {
    auto j = engine->job_json(kJob, now, rec::ReadAccess{std::nullopt, true});
    REQUIRE(j);
    return *j;
  }
  std::string state() { return job()["state"].get<std::string>(); }
  bool in(const char* s) { return state() == s; }
  // The job's run started: the batch step and step 0 on every node.
  void run_started(bool in_allocation = false) {
    send(rec::EventType::JobStart, rec::kBatchStep, "n1");
    for (const char* n : {"n1", "n2", "n3"}) send(rec::EventType::JobStart, 0, n, in_allocation);
    cycle();
  }
};

}  // namespace

TEST_CASE("engine cycle: a crashed task is requeued once and runs again", "[controller][engine]") {
  Harness h;
  h.run_started();
  CHECK(h.in("running"));
  h.every_rank_failed();
  REQUIRE(h.cycle_until([&] { return h.in("pending"); }));
  CHECK(h.slurm.requeues == 1);
  CHECK(h.slurm.updates == 1);
  CHECK(h.job()["ending"] == "task crash");
  CHECK(h.job()["budget"]["restarts"] == 1);
  CHECK_FALSE(h.job().contains("intent"));

  h.set_state(rec::SlurmState::Running);
  REQUIRE(h.cycle_until([&] { return h.in("running"); }));
  CHECK(h.job()["restart_count"] == 1);
  CHECK(h.slurm.requeues == 1);
}

TEST_CASE("engine cycle: a requeue is counted once the job runs again, never when its user cancelled it first",
          "[controller][engine]") {
  const std::string counted = "ckpt_controller_restarts_total{ending=\"task crash\",path=\"requeue\"} 1\n";
  Harness h;
  h.run_started();
  h.every_rank_failed();
  SECTION("carried out") {
    REQUIRE(h.cycle_until([&] { return h.in("pending"); }));
    CHECK(h.engine->metrics_text(h.now).find(counted) == std::string::npos);  // decided, not yet carried out
    h.set_state(rec::SlurmState::Running);
    REQUIRE(h.cycle_until([&] { return h.in("running"); }));
    CHECK(h.engine->metrics_text(h.now).find(counted) != std::string::npos);
  }
  SECTION("carried out, the new run's batch step heard from before Slurm's restart count") {
    REQUIRE(h.cycle_until([&] { return h.in("pending"); }));
    rec::Event e;  // run 1's batch step, under run 0's restart count (seen on the cluster)
    e.type = rec::EventType::JobStart;
    e.job_id = kJob;
    e.step_id = rec::kBatchStep;
    e.node = "n1";
    e.restart_count = 0;
    h.send(e);
    h.cycle();
    h.set_state(rec::SlurmState::Running);
    REQUIRE(h.cycle_until([&] { return h.in("running"); }));
    CHECK(h.engine->metrics_text(h.now).find(counted) != std::string::npos);
  }
  SECTION("the user's scancel overtook it") {
    REQUIRE(h.cycle_until([&] { return h.in("requeueing"); }));
    h.set_state(rec::SlurmState::Cancelled);
    REQUIRE(h.cycle_until([&] { return h.in("cancelled"); }));
    CHECK(h.engine->metrics_text(h.now).find("path=\"requeue\"} 1") == std::string::npos);
  }
}

TEST_CASE("engine cycle: a node lost under ckpt-run is relaunched inside the allocation", "[controller][engine]") {
  Harness h;
  h.run_started(true);
  h.slurm.nodes[2].down = true;  // n3 is lost; the ranks on n1 and n2 report its loss
  h.send(rec::EventType::TaskExit, 0, "n1");
  h.send(rec::EventType::TaskExit, 0, "n2");
  REQUIRE(h.cycle_until([&] { return h.in("relaunching"); }));
  CHECK(h.job()["relaunch_step"] == 0);
  CHECK(h.job()["ending"] == "node failure");
  CHECK(h.job()["exclude"] == nlohmann::json::array({"n3"}));
  CHECK(h.slurm.requeues == 0);

  // ckpt-run starts the replacement step on the nodes left.
  h.send(rec::EventType::JobStart, 1, "n1", true);
  h.cycle();
  CHECK(h.in("running"));
  CHECK(h.job()["clock"]["path"] == "relaunch");
  CHECK(h.job()["clock"]["launched"].get<double>() > 0);
}

TEST_CASE("engine cycle: a hand-over from ckpt-run is requeued without spending the budget again",
          "[controller][engine]") {
  Harness h;
  h.run_started(true);
  h.slurm.nodes[2].down = true;
  h.send(rec::EventType::TaskExit, 0, "n1");
  h.send(rec::EventType::TaskExit, 0, "n2");
  REQUIRE(h.cycle_until([&] { return h.in("relaunching"); }));
  REQUIRE(h.job()["budget"]["restarts"] == 1);

  h.send(rec::EventType::Handover, 0, "n1");
  REQUIRE(h.cycle_until([&] { return h.in("pending"); }));
  CHECK(h.slurm.requeues == 1);
  CHECK(h.slurm.downed == std::vector<std::string>{"n3"});
  CHECK(h.slurm.last_exclude == std::vector<std::string>{"n3"});
  CHECK(h.job()["budget"]["restarts"] == 1);
  CHECK(h.job()["reason"].get<std::string>().find("ckpt-run handed over") != std::string::npos);
}

TEST_CASE("engine cycle: survivors that gave up under ckpt-run --spares: its word decides, else a requeue",
          "[controller][engine]") {
  Harness h;
  rec::Event start;  // ckpt-run's node steps: not relaunched by the controller, one spare kept
  start.type = rec::EventType::JobStart;
  start.job_id = kJob;
  start.step_id = 0;
  start.spares = 1;
  for (const char* n : {"n1", "n2", "n3"}) {
    start.node = n;
    h.send(start);
  }
  h.send(rec::EventType::JobStart, rec::kBatchStep, "n1");
  h.cycle();
  h.slurm.nodes[2].down = true;  // n3 crashed; the survivors on n1 and n2 gave up in place
  h.now += 11;                   // the engine's view of the nodes (kept 10 s) sees it at the failure
  for (const char* n : {"n1", "n2"}) {
    rec::Event exit75;
    exit75.type = rec::EventType::TaskExit;
    exit75.job_id = kJob;
    exit75.step_id = 0;
    exit75.node = n;
    exit75.exit_code = rec::kExitPeerLost;
    h.send(exit75);
  }
  const double failed = h.now;
  // Probed and found dead within the wait (real time enough for the probes' thread), yet not requeued: ckpt-run's
  // word is due.
  while (h.now < failed + rec::kCkptRunWord_s - 1) {
    h.cycle();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(h.in("failing"));
  CHECK(h.slurm.requeues == 0);
  SECTION("ckpt-run relaunches the node steps") {
    rec::Event relaunch;
    relaunch.type = rec::EventType::Relaunch;
    relaunch.job_id = kJob;
    relaunch.step_id = 0;
    relaunch.node = "n1";
    relaunch.failed_nodes = "n3";
    relaunch.resume_step = 40;
    h.send(relaunch);
    h.cycle();
    CHECK(h.in("relaunching"));
    for (int i = 0; i < 100; ++i) h.cycle();  // past the wait: the decision stands
    CHECK(h.in("relaunching"));
    CHECK(h.slurm.requeues == 0);
    CHECK(h.job()["budget"]["restarts"] == 1);
  }
  SECTION("ckpt-run says nothing (it hung): the failure is decided as any other") {
    REQUIRE(h.cycle_until([&] { return h.in("pending"); }));
    CHECK(h.now >= failed + rec::kCkptRunWord_s);
    CHECK(h.slurm.requeues == 1);
    CHECK(h.slurm.last_exclude == std::vector<std::string>{"n3"});
  }
}

TEST_CASE("engine cycle: a spent budget gives up and holds nothing that is not pending", "[controller][engine]") {
  Harness h;
  rec::Event start;
  start.type = rec::EventType::JobStart;
  start.job_id = kJob;
  start.node = "n1";
  start.max_restarts = 0;
  h.send(start);
  h.every_rank_failed(rec::kBatchStep);
  REQUIRE(h.cycle_until([&] { return h.in("gave-up"); }));
  CHECK(h.slurm.requeues == 0);
  CHECK(h.slurm.holds == 0);
  CHECK(h.job()["reason"].get<std::string>().find("restarts without progress") != std::string::npos);

  // An admin releases it: requeued with a fresh budget.
  h.engine->admin("release", std::to_string(kJob), 0, 0);
  REQUIRE(h.cycle_until([&] { return h.in("pending"); }));
  CHECK(h.slurm.requeues == 1);
  CHECK(h.job()["budget"]["without_progress"] == 0);
}

TEST_CASE("engine cycle: Slurm refuses the requeue: the engine gives up", "[controller][engine]") {
  Harness h;
  h.run_started();
  h.slurm.refuse_requeue = true;
  h.every_rank_failed();
  REQUIRE(h.cycle_until([&] { return h.in("gave-up"); }));
  CHECK(h.slurm.requeues == 1);
  CHECK(h.job()["reason"].get<std::string>().rfind("Slurm refused the requeue", 0) == 0);
}

TEST_CASE("engine cycle: a controller that dies after Slurm requeued never requeues twice", "[controller][engine]") {
  Harness h;
  h.run_started();
  h.slurm.crash_after_requeue = true;
  h.every_rank_failed();
  REQUIRE(h.cycle_until([&] { return h.slurm.requeues == 1; }));
  CHECK(h.in("requeueing"));

  h.crash_and_restart();
  CHECK(h.in("requeueing"));
  CHECK(h.job()["intent"]["phase"] == "requeue");
  REQUIRE(h.cycle_until([&] { return h.in("pending"); }));
  CHECK(h.slurm.requeues == 1);
  CHECK(h.slurm.updates == 1);
  h.set_state(rec::SlurmState::Running);
  REQUIRE(h.cycle_until([&] { return h.in("running"); }));
  CHECK(h.job()["restart_count"] == 1);
}

namespace {

// ckpt-run's report that the job recovered in place: n3 lost, resumed from step 40, 6 s from detection to step.
rec::Event in_place_recovery(std::uint32_t generation) {
  rec::Event e;
  e.type = rec::EventType::InPlace;
  e.job_id = kJob;
  e.node = "n1";
  e.failed_nodes = "n3";
  e.generation = generation;
  e.resume_step = 40;
  e.phases = rec::InPlacePhases{1001, 1001.5, 1002, 1004, 1005.5, 1007};  // after the run started (1000)
  return e;
}

std::string history_text(Harness& h) {
  auto lines = h.engine->history_json(kJob, rec::ReadAccess{std::nullopt, true});
  REQUIRE(lines);
  REQUIRE(*lines);
  return (**lines).dump();
}

}  // namespace

TEST_CASE("engine cycle: a recovery in place is recorded, timed by phase and counted", "[controller][engine]") {
  Harness h;
  h.run_started(true);
  h.now = 1010;  // the report arrives after the recovery it reports
  h.send(in_place_recovery(1));
  h.cycle();
  CHECK(h.in("running"));
  CHECK(h.job()["clock"]["path"] == "in-place");
  CHECK(h.job()["clock"]["restored"] == 1005.5);
  CHECK(h.job()["ending"] == "node failure");
  CHECK(h.job()["budget"]["restarts"] == 1);
  CHECK(h.job()["exclude"] == nlohmann::json::array({"n3"}));
  CHECK(h.job()["last_recovery"]["path"] == "in-place");
  CHECK(h.job()["last_recovery"]["total_s"] == 6.0);
  CHECK(h.job()["last_recovery"]["phases_s"]["state_load"] == 1.5);
  const std::string history = history_text(h);
  CHECK(history.find("recovery 1 in place without n3, resuming from step 40") != std::string::npos);
  CHECK(history.find("running again after 6.000 s (in-place): detected at 1001.000; agreement 0.500 s, last words "
                     "0.500 s, reformation 2.000 s, state load 1.500 s, first step 1.500 s") != std::string::npos);
  const std::string metrics = h.engine->metrics_text(h.now);
  CHECK(metrics.find("ckpt_controller_restarts_total{ending=\"node failure\",path=\"in-place\"} 1\n") !=
        std::string::npos);
  CHECK(metrics.find("ckpt_controller_recovery_seconds_count{path=\"in-place\"} 1\n") != std::string::npos);
  CHECK(metrics.find("ckpt_controller_recovery_phase_seconds_count{path=\"in-place\",phase=\"state_load\"} 1\n") !=
        std::string::npos);
  CHECK(metrics.find("ckpt_controller_recovery_phase_seconds_bucket{path=\"in-place\",phase=\"reformation\","
                     "le=\"2\"} 1\n") != std::string::npos);
  CHECK(metrics.find("ckpt_controller_recovery_phase_seconds_count{path=\"requeue\",phase=\"slurm\"} 0\n") !=
        std::string::npos);
  CHECK(metrics.find("ckpt_controller_events_total{type=\"in-place\",result=\"accepted\"} 1\n") != std::string::npos);

  // The record and its clock survive the controller.
  h.crash_and_restart();
  CHECK(h.in("running"));
  CHECK(h.job()["clock"]["last_words_done"] == 1002);
}

TEST_CASE("engine cycle: a recovery in place past the budget gives the job up", "[controller][engine]") {
  Harness h;
  rec::Event start;
  start.type = rec::EventType::JobStart;
  start.job_id = kJob;
  start.node = "n1";
  start.max_restarts = 1;
  h.send(start);
  h.run_started(true);
  h.now = 1010;  // the report arrives after the recovery it reports
  h.send(in_place_recovery(1));
  h.cycle();
  REQUIRE(h.in("running"));
  h.send(in_place_recovery(2));  // the same checkpoint step: no progress
  h.cycle();
  CHECK(h.in("gave-up"));
  CHECK(h.job()["reason"].get<std::string>().find("restarts without progress (budget 1") != std::string::npos);
  CHECK(h.slurm.holds == 0);
  CHECK(h.engine->metrics_text(h.now).find("ckpt_controller_gave_up_total{ending=\"node failure\"} 1\n") !=
        std::string::npos);
}

// One user's flood of their own signed events does not hold back another user's failure report: the first cycle
// takes a fair share of the flood and the report, and commits them once (the flood once cost a commit per event).
TEST_CASE("engine cycle: another user's flood delays a failure report by one cycle at most", "[controller][security]") {
  Harness h;
  h.run_started();
  constexpr std::uint32_t kFlooder = 101;
  rec::SlurmJob theirs = h.slurm.jobs[kJob];
  theirs.job_id = kFlooder;
  theirs.user_id = 2000;
  h.slurm.jobs[kFlooder] = theirs;
  for (int i = 0; i < 3000; ++i) {
    rec::Event e;
    e.type = rec::EventType::JobStart;
    e.job_id = kFlooder;
    e.step_id = static_cast<std::uint32_t>(i % 50);
    e.node = "n1";
    h.engine->submit(e, 2000, 0);  // signed by its owner, uid 2000
  }
  // The plugin's report of the victim's failure (signed by root, for the job of uid 1000), after the flood.
  rec::Event exit;
  exit.type = rec::EventType::TaskExit;
  exit.job_id = kJob;
  exit.step_id = 0;
  exit.node = "n2";
  exit.exit_code = 1;
  exit.uid = 1000;
  h.engine->submit(exit, 0, 0);
  CHECK(h.engine->queued() == 3001);
  h.cycle();
  CHECK(h.in("failing"));                      // handled in the first cycle
  CHECK(h.engine->queued() >= 3001 - 256);     // while most of the flood waits its turn
  CHECK(h.cycle_until([&] { return h.engine->queued() == 0; }));  // and none of it is lost
}

namespace {

// The job's root rank reports `node` slow, signed by `uid` (1000: the job's owner).
void report_slow(Harness& h, const std::string& node, const char* action, std::uint32_t uid = 1000) {
  rec::Event e;
  e.type = rec::EventType::SlowNode;
  e.job_id = kJob;
  e.step_id = 0;
  e.node = "n1";
  e.uid = 1000;
  e.slow_node = node;
  e.score = 0.5;
  e.action = action;
  e.detail = "0.5 of the job's best for 3 windows up to step 25 (rank 2)";
  e.restart_count = h.slurm.jobs[kJob].restart_count;
  h.engine->submit(e, uid, 0);
}

}  // namespace

TEST_CASE("engine cycle: a slow node is recorded, counted, shown, and left out of the next requeue",
          "[controller][engine][slow-nodes]") {
  Harness h;
  h.run_started();
  report_slow(h, "n2", rec::kSlowNodeReport);
  report_slow(h, "n3", rec::kSlowNodeExclude);
  h.cycle();
  CHECK(h.in("running"));  // not a failure: the job goes on, no restart spent
  CHECK(h.job()["budget"]["restarts"] == 0);
  const auto slow = h.job()["slow_nodes"];
  REQUIRE(slow.size() == 2);
  CHECK(slow[1] == nlohmann::json{{"node", "n3"}, {"score", 0.5}, {"time", h.now}, {"action", "exclude"}});
  CHECK(h.job()["summary"]["slow_nodes"] == slow);  // what `jobs` and the status page show
  CHECK(h.job()["exclude"] == nlohmann::json::array({"n3"}));
  CHECK(h.job()["bad_nodes"][0]["reason"] == "reported slow by job 100 (0.5 of the job's best)");
  const std::string history = history_text(h);
  CHECK(history.find("slow node n2: 0.5 of the job's best (0.5 of the job's best for 3 windows up to step 25 "
                     "(rank 2))") != std::string::npos);
  CHECK(history.find("slow node n3: 0.5 of the job's best (0.5 of the job's best for 3 windows up to step 25 "
                     "(rank 2)), excluding it from the job's next runs") != std::string::npos);
  const std::string metrics = h.engine->metrics_text(h.now);
  CHECK(metrics.find("ckpt_controller_slow_node_events_total{action=\"exclude\"} 1\n") != std::string::npos);
  CHECK(metrics.find("ckpt_controller_slow_node_events_total{action=\"report\"} 1\n") != std::string::npos);
  CHECK(metrics.find("ckpt_controller_events_total{type=\"slow_node\",result=\"accepted\"} 2\n") !=
        std::string::npos);
  CHECK(metrics.find("ckpt_controller_node_excluded{node=\"n3\"} 1\n") != std::string::npos);

  // The record keeps them through a restart of the controller; the next requeue leaves n3 out, marks nothing DOWN.
  h.crash_and_restart();
  CHECK(h.job()["slow_nodes"].size() == 2);
  h.every_rank_failed();
  REQUIRE(h.cycle_until([&] { return h.in("pending"); }));
  CHECK(h.slurm.last_exclude == std::vector<std::string>{"n3"});
  CHECK(h.slurm.downed.empty());
  CHECK(h.slurm.drained.empty());
}

TEST_CASE("engine cycle: a slow-node report by another user, or of another job's node, changes nothing",
          "[controller][engine][slow-nodes][security]") {
  Harness h;
  h.run_started();
  report_slow(h, "n3", rec::kSlowNodeExclude, 2000);  // forged by uid 2000 for uid 1000's job
  h.cycle();
  CHECK(h.job()["slow_nodes"].empty());
  CHECK(h.job()["exclude"].empty());
  CHECK(h.job()["bad_nodes"].empty());
  CHECK(history_text(h).find("rejected") != std::string::npos);
  const std::string metrics = h.engine->metrics_text(h.now);
  CHECK(metrics.find("ckpt_controller_events_total{type=\"slow_node\",result=\"rejected\"} 1\n") !=
        std::string::npos);
  CHECK(metrics.find("ckpt_controller_slow_node_events_total{action=\"exclude\"} 0\n") != std::string::npos);

  report_slow(h, "gpu9", rec::kSlowNodeExclude);  // the owner names a node outside the job's allocation
  h.cycle();
  CHECK(h.job()["slow_nodes"].empty());
  CHECK(h.job()["exclude"].empty());
  CHECK(history_text(h).find("slow node gpu9 is not a node of the job's allocation; ignored") != std::string::npos);
}

TEST_CASE("engine cycle: a requeue keeps the job's own exclusions, and those its user adds; a pending job lets go of "
          "a node an admin forgot",
          "[controller][engine]") {
  Harness h;
  h.slurm.jobs[kJob].excluded = "n9";  // the user's own --exclude
  h.run_started();
  report_slow(h, "n3", rec::kSlowNodeExclude);
  h.cycle();
  h.every_rank_failed();
  REQUIRE(h.cycle_until([&] { return h.in("pending"); }));
  CHECK(h.slurm.last_exclude == std::vector<std::string>{"n3", "n9"});
  CHECK(h.slurm.jobs[kJob].excluded == "n3,n9");
  CHECK(history_text(h).find("the job excludes n9 itself: kept at every requeue") != std::string::npos);

  // Slurm cannot start the job without n3 and holds it itself: the history says why, once; nothing lapsed yet.
  h.slurm.jobs[kJob].held = true;
  h.slurm.jobs[kJob].bad_constraints = true;
  const std::size_t updates = h.slurm.updates;
  for (int i = 0; i < 5; ++i) h.cycle();
  CHECK(h.slurm.updates == updates);
  const std::string why = "Slurm cannot start the job as it stands (BadConstraints) while it excludes n3";
  const std::string history = history_text(h);
  CHECK(history.find(why) != std::string::npos);
  CHECK(history.find(why, history.find(why) + 1) == std::string::npos);

  // The user adds n7 by hand (scontrol update): theirs from now on, and nothing for the controller to write.
  h.slurm.jobs[kJob].excluded = "n3,n7,n9";
  for (int i = 0; i < 5; ++i) h.cycle();
  CHECK(h.slurm.updates == updates);
  CHECK(history_text(h).find("the job's own exclusions are now n7,n9 (its ExcNodeList changed in Slurm)") !=
        std::string::npos);

  // An admin forgets n3: the job keeps its own n7 and n9 alone, and Slurm's hold ends with the update.
  ckpt::controller::Verdict verdict;
  std::thread admin([&] { verdict = h.engine->admin("forget-node", "n3", 0, 10); });
  const bool updated = h.cycle_until([&] { return h.slurm.updates > updates; });
  admin.join();
  REQUIRE(updated);
  CHECK(verdict.http_status == 200);
  CHECK(h.slurm.last_exclude == std::vector<std::string>{"n7", "n9"});
  CHECK(h.slurm.jobs[kJob].excluded == "n7,n9");
  CHECK_FALSE(h.slurm.jobs[kJob].held);
  CHECK(history_text(h).find("ExcNodeList=n7,n9 (n3 no longer excluded") != std::string::npos);
  for (int i = 0; i < 5; ++i) h.cycle();
  CHECK(h.slurm.updates == updates + 1);  // once
}
