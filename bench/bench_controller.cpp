// bench_controller: one decision cycle of the recovery controller over 10,000 tracked jobs, with the real engine
// and the real SQLite store (WAL, synchronous=FULL). Slurm is replaced by an in-memory table of 10,000 jobs,
// 1% of which have just failed (the cluster has 4 nodes; the point is the controller's own cost).
// Prints: records loaded, the cycle's time and per-job cost, the resident memory, against a baseline (a bare
// pass over the same Slurm data) as a ratio. Not a test.
//
//   bench_controller [JOBS] [FAILED_PERCENT]
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../tests/support/fake_backend.hpp"
#include "backend.hpp"
#include "ckpt/clock.hpp"
#include "ckpt/recovery.hpp"
#include "db.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "observe.hpp"

namespace {

namespace rec = ckpt::recovery;
using namespace ckpt::controller;

long rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string key;
  long value = 0;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> value;
      return value;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

// Slurm as an in-memory table: what slurm_load_jobs would return for a busy cluster.
using TableBackend = ckpt::controller::testing::FakeBackend;

// Writes `count` running jobs to the database at `db_path` and the same jobs to `slurm`, `failed_pct` percent of them
// just failed there; false (with a line on stderr) when the database refuses.
bool seed_jobs(const std::string& db_path, TableBackend& slurm, std::uint32_t count, std::uint32_t failed_pct,
               double now) {
  auto db = Database::open(db_path);
  if (!db) {
    std::fprintf(stderr, "bench_controller: %s\n", db.error().c_str());
    return false;
  }
  std::vector<rec::JobRecord> records(count);
  std::vector<const rec::JobRecord*> ptrs;
  for (std::uint32_t i = 0; i < count; ++i) {
    rec::JobRecord& r = records[i];
    r.job_id = 1000 + i;
    r.state = rec::JobState::Running;
    r.uid = 1000 + i % 50;
    r.uid_known = true;
    r.ckpt_dir = "";  // no checkpoint reads: this measures the controller, not the file system
    r.nodes = {"n" + std::to_string(1 + i % 4), "n" + std::to_string(1 + (i + 1) % 4)};
    r.batch_host = r.nodes[0];
    r.steps[0] = rec::StepInfo{false, r.nodes};
    r.created = r.updated = now - 3600;
    ptrs.push_back(&r);
    SlurmJob s;
    s.job_id = r.job_id;
    s.state = (i % 100) < failed_pct ? rec::SlurmState::Failed : rec::SlurmState::Running;
    s.exit_code = s.state == rec::SlurmState::Failed ? 1 : 0;
    s.user_id = r.uid;
    s.nodes = r.nodes;
    s.batch_host = r.batch_host;
    s.end_time = now - 10;
    slurm.jobs[s.job_id] = s;
  }
  auto t0 = std::chrono::steady_clock::now();
  if (auto s = (*db)->save(ptrs, {}); !s) {
    std::fprintf(stderr, "bench_controller: %s\n", s.error().c_str());
    return false;
  }
  std::printf("wrote %u synthetic job records in %.3f s\n", count, ckpt::seconds_since(t0));
  return true;
}

struct Timings {
  double load_s = 0;      // the engine's start: every record loaded from SQLite
  double baseline_s = 0;  // a bare pass over Slurm's table
  double cycle_s = 0;     // the first decision cycle
  double second_s = 0;    // the next one, which completes what the probes waited for
  std::size_t finished = 0;
  std::size_t tracked = 0;
};

// The real engine and SQLite store on the seeded database, deciding against `slurm`.
struct EngineUnderTest {
  static rec::ControllerConfig config(const std::string& db_path) {
    rec::ControllerConfig cfg;
    cfg.database = db_path;
    cfg.settle_s = 0;
    return cfg;
  }

  EngineUnderTest(const std::string& db_path, TableBackend& slurm)
      : db(Database::open(db_path)), cfg(config(db_path)), engine(cfg, slurm, **db, metrics, alerts) {}

  ckpt::Result<std::unique_ptr<Database>> db;
  rec::ControllerConfig cfg;
  Metrics metrics;
  Alerts alerts{"", 1};
  Engine engine;
};

// Starts `engine` and runs its decision cycles against `slurm` until every failed job was requeued (or 50 more
// cycles passed); false (with a line on stderr) when the engine cannot start.
bool run_cycles(Engine& engine, TableBackend& slurm, Timings& t) {
  auto t0 = std::chrono::steady_clock::now();
  if (auto s = engine.start(ckpt::unix_seconds()); !s) {
    std::fprintf(stderr, "bench_controller: %s\n", s.error().c_str());
    return false;
  }
  t.load_s = ckpt::seconds_since(t0);

  // Baseline: one bare pass over Slurm's table (what any controller must at least read each cycle).
  t0 = std::chrono::steady_clock::now();
  auto all = slurm.load_jobs();
  for (const auto& j : *all) t.finished += rec::is_finished(j.state) ? 1 : 0;
  t.baseline_s = ckpt::seconds_since(t0);

  // One decision cycle: compare every job with Slurm, classify the failed ones, record intents, requeue.
  t0 = std::chrono::steady_clock::now();
  engine.cycle(ckpt::unix_seconds(), true);
  t.cycle_s = ckpt::seconds_since(t0);
  // The probes run in the background; the next cycle completes the decisions they were waiting for.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  t0 = std::chrono::steady_clock::now();
  engine.cycle(ckpt::unix_seconds(), false);
  t.second_s = ckpt::seconds_since(t0);
  for (int i = 0; i < 50 && slurm.requeues < t.finished; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    engine.cycle(ckpt::unix_seconds(), false);
  }
  t.tracked = engine.tracked_jobs();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const std::uint32_t count = argc > 1 ? static_cast<std::uint32_t>(std::atoi(argv[1])) : 10000;
  const std::uint32_t failed_pct = argc > 2 ? static_cast<std::uint32_t>(std::atoi(argv[2])) : 1;
  ckpt::toolkit::set_log_level("error");
  const auto dir = std::filesystem::temp_directory_path() / ("bench_controller." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string db_path = (dir / "controller.db").string();

  TableBackend slurm;
  if (!seed_jobs(db_path, slurm, count, failed_pct, ckpt::unix_seconds())) return 1;
  const long rss_before = rss_kib();
  EngineUnderTest under_test(db_path, slurm);
  Timings t;
  if (!run_cycles(under_test.engine, slurm, t)) return 1;
  const long rss_after = rss_kib();

  std::printf("jobs tracked: %zu (%zu failed in this cycle)\n", t.tracked, t.finished);
  std::printf("load from SQLite at start: %.3f s\n", t.load_s);
  std::printf("decision cycle (reconcile all + classify %zu failures): %.3f s = %.1f us/job; "
              "baseline bare pass %.4f s (ratio %.0fx)\n",
              t.finished, t.cycle_s, t.cycle_s * 1e6 / count, t.baseline_s,
              t.baseline_s > 0 ? t.cycle_s / t.baseline_s : 0.0);
  std::printf("next cycle (decisions and requeues recorded durably): %.3f s; requeues %zu, updates %zu\n", t.second_s,
              slurm.requeues, slurm.updates);
  std::printf("resident memory: %.1f MiB after loading and deciding (%.1f MiB before the engine; %.0f bytes/job)\n",
              static_cast<double>(rss_after) / 1024, static_cast<double>(rss_before) / 1024,
              static_cast<double>(rss_after - rss_before) * 1024 / count);
  std::printf("database: %.1f MiB\n", static_cast<double>(std::filesystem::file_size(db_path)) / (1024 * 1024));
  std::filesystem::remove_all(dir);
  return slurm.requeues == t.finished ? 0 : 1;
}
