#pragma once
// The recovery engine: one thread owns every job's record and runs the decision cycle; other threads (the HTTP
// server, the spool watcher) hand it events and read snapshots. Each job follows the state machine of
// ckpt/recovery.hpp; a requeue is recorded as an intent in SQLite before anything is sent to Slurm, and every
// step of it is idempotent against Slurm's restart count, so a controller killed at any point and restarted
// carries the recovery on and never requeues twice.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend.hpp"
#include "ckpt/controller_limits.hpp"
#include "ckpt/recovery.hpp"
#include "ckpt/recovery_plan.hpp"
#include "db.hpp"
#include "intake.hpp"
#include "intent_runner.hpp"
#include "observe.hpp"
#include "probe.hpp"

namespace ckpt::controller {

using ckpt::recovery::ControllerConfig;
using ckpt::recovery::Event;

// Roles: the intake queues what other threads hand in (intake.hpp); the engine applies events, decides recoveries
// and reconciles its records with Slurm; the intent runner carries a decided requeue out (intent_runner.hpp), through
// the engine as its Host.
class Engine final : private IntentRunner::Host {
 public:
  Engine(ControllerConfig config, SlurmBackend& backend, Database& db, Metrics& metrics, Alerts& alerts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // How a silent node's slurmd is asked an RPC (probe.hpp); unset: TCP probes only. Call before start().
  void set_slurmd_ask(SlurmdAsk ask) { slurmd_ask_ = std::move(ask); }
  // Loads the records of unfinished jobs and learns which uids are trusted. Call once, before run().
  Status start(double now);
  // Queues an event whose MUNGE credential carried `cred_uid`; waits up to `wait_s` for the verdict
  // (0: do not wait, the answer is "queued").
  Verdict submit(const Event& event, std::uint32_t cred_uid, double wait_s);
  // Admin requests: "release" JOB or "forget-node" NODE, from a credential's uid.
  Verdict admin(const std::string& op, const std::string& arg, std::uint32_t cred_uid, double wait_s);
  // Runs decision cycles until `stop` becomes true.
  void run(const std::atomic<bool>& stop);
  // One decision cycle at `now`: queued requests, due jobs, and a reconciliation with Slurm when one is due
  // (or when `force_reconcile`). The benchmark calls this directly.
  void cycle(double now, bool force_reconcile = false);
  // Requests waiting for a cycle (all users).
  std::size_t queued() const;
  void wake();

  // What a reader whose credential carried `uid` may see (nullopt: no credential).
  ckpt::recovery::ReadAccess read_access(std::optional<std::uint32_t> uid);
  // Snapshots for the client subcommands and ckpt-run (JSON), limited to the jobs `access` may see. status has the
  // counts of every state for anyone (as /metrics does), but names only visible jobs.
  nlohmann::json status_json(double now, const ckpt::recovery::ReadAccess& access);
  nlohmann::json jobs_json(double now, const ckpt::recovery::ReadAccess& access);
  // nullopt when the job is not tracked or not visible to `access`.
  std::optional<nlohmann::json> job_json(std::uint32_t job_id, double now, const ckpt::recovery::ReadAccess& access);
  // The stored history and the recent rejected events; nullopt when not tracked or not visible.
  Result<std::optional<nlohmann::json>> history_json(std::uint32_t job_id, const ckpt::recovery::ReadAccess& access);
  std::string metrics_text(double now);
  std::size_t tracked_jobs();

 private:
  struct Runtime;
  using JobRecord = ckpt::recovery::JobRecord;
  using JobState = ckpt::recovery::JobState;
  using Ending = ckpt::recovery::Ending;

  // The steps of cycle(), in its order; check_job is one due job's check.
  void answer_requests(std::vector<std::shared_ptr<Request>>& requests, double now);
  void check_due_jobs(double now);
  void check_job(JobRecord& r, Runtime& rt, double now);
  void start_decided_requeues(double now);
  Verdict handle(const Request& request, double now);
  Verdict handle_event(const Event& event, std::uint32_t uid, double now);
  void carry_out(JobRecord& r, const Event& e, std::uint32_t uid, const ckpt::recovery::EventEffects& fx, double now);
  void note_running_again(JobRecord& r, double now);
  void count_restart(ckpt::recovery::Ending ending, const std::string& path);  // restarts_total{ending,path}
  void count_slow_node(const JobRecord& r, const ckpt::recovery::SlowNode& report, double now);
  Verdict handle_admin(const std::string& op, const std::string& arg, std::uint32_t uid, double now);
  Verdict handle_release(const std::string& arg, std::uint32_t uid, double now);
  Verdict handle_forget_node(const std::string& arg, std::uint32_t uid, double now);
  Verdict authorize(const Event& event, std::uint32_t uid, JobRecord* record, double now);
  void reject(const Event& event, std::uint32_t uid, const Verdict& why, bool job_exists, double now);
  // A job Slurm has under this id with another submit time is another job: the record starts afresh.
  void check_reuse(JobRecord& r, const SlurmJob& slurm, double now);
  std::optional<CheckpointView> checkpoint_view(JobRecord& r, double now);

  JobRecord* find(std::uint32_t job_id);
  // find(), else the record stored in the database (loaded into memory); null when neither has it.
  JobRecord* find_or_load(std::uint32_t job_id);
  JobRecord& get_or_create(std::uint32_t job_id, double now);
  Runtime& runtime(std::uint32_t job_id);
  void note(JobRecord& r, const std::string& kind, const std::string& text, double now) override;
  bool transition(JobRecord& r, JobState to, const std::string& why, double now) override;
  void new_run(JobRecord& r, std::uint32_t restart_count, double now) override;
  void start_failing(JobRecord& r, double now);

  void start_probes(JobRecord& r, double now);
  void check_failing(JobRecord& r, double now);
  // The probes' evidence, once they have answered; false while they run (the job is checked again shortly).
  bool collect_probe_evidence(JobRecord& r, double now);
  // Ends the run without the nodes where the survivors' lost peers hang; true when this check is over.
  bool end_run_of_hung_ranks(JobRecord& r, const SlurmJob& s, const ckpt::recovery::LostNodes& lost, double now);
  void record_ending(JobRecord& r, Ending ending, const SlurmJob& s, const CheckpointView& ckpts, double now);
  // Leaves `nodes` out of the job's next runs for bad_node_ttl, for `reason` (empty: slurmd did not answer).
  void exclude_nodes(JobRecord& r, const std::vector<std::string>& nodes, double now, const std::string& reason = "");
  // The job's own ExcNodeList (its user's), read once at the first look at it in Slurm: requeues keep it.
  void note_own_exclusions(JobRecord& r, const SlurmJob& slurm, double now);
  // A pending job's ExcNodeList as its user changed it: their own exclusions follow (own_exclusions_now).
  void follow_own_exclusions(JobRecord& r, const SlurmJob& slurm, double now);
  void relaunch(JobRecord& r, const ckpt::recovery::RecoveryPlan& plan, double now);
  void start_requeue(JobRecord& r, const ckpt::recovery::RecoveryPlan& plan, double now);
  void decide(JobRecord& r, Ending ending, const SlurmJob& slurm, const std::vector<std::string>& dead,
              const std::vector<std::string>& mark_down, const CheckpointView& ckpts, double now, bool slurm_requeued,
              const std::vector<std::string>& hung = {});
  void give_up(JobRecord& r, const std::string& reason, const SlurmJob* slurm, double now) override;
  void housekeeping(double now);
  void check_pending(JobRecord& r, const SlurmJob* known, double now);
  void check_running(JobRecord& r, const SlurmJob& slurm, double now);
  void on_slurm_requeue(JobRecord& r, const SlurmJob& slurm, double now);
  void check_ended_job(JobRecord& r, const SlurmJob& slurm, double now);
  void reconcile(double now);
  void refresh_nodes(double now, bool force) override;
  std::vector<std::string> nodes_slurm_has_down(const std::vector<std::string>& nodes) const;
  std::optional<SlurmJob> load_job(JobRecord& r, double now, bool& failed) override;
  void mark_dirty(JobRecord& r, double now) override;
  void flush() override;
  void crash_point(const char* name) override;
  // The rest of the intent runner's Host.
  bool unflushed(std::uint32_t job_id) const override { return dirty_.count(job_id) != 0; }
  void check_again_at(std::uint32_t job_id, double at) override;
  void watch_new_run(std::uint32_t job_id, double until) override;
  void alert(const nlohmann::json& body);

  ControllerConfig config_;
  SlurmdAsk slurmd_ask_;
  SlurmBackend& backend_;
  Database& db_;
  Metrics& metrics_;
  Alerts& alerts_;
  Capabilities caps_;

  std::mutex mutex_;  // guards everything below
  std::map<std::uint32_t, JobRecord> jobs_;
  std::unordered_map<std::uint32_t, std::unique_ptr<Runtime>> runtime_;
  std::set<std::uint32_t> dirty_;
  std::vector<HistoryLine> pending_history_;
  std::map<std::string, SlurmNode> nodes_;
  double nodes_loaded_ = 0;
  double next_reconcile_ = 0;
  double started_ = 0;
  std::set<std::uint32_t> trusted_uids_;
  std::set<std::uint32_t> admin_uids_;
  std::set<std::string> crash_points_;
  // Untracked job ids: unknown to Slurm, or whose owner it named; asked once per id per 10 s, however many arrive.
  ckpt::recovery::NegativeCache unknown_jobs_{4096, 10.0};
  // Rejected events of jobs Slurm knows, newest last: shown by history, never stored (anyone can cause them).
  std::map<std::uint32_t, std::vector<HistoryLine>> rejected_;
  double next_prune_ = 0;

  Intake intake_;  // events and admin requests waiting for a cycle (its own lock, never held with mutex_)
  IntentRunner intents_{*this, backend_, metrics_, config_.completing_timeout_s};
};

}  // namespace ckpt::controller
