#pragma once
// The recovery controller's policy: the job events the plugin sends, how a job's ending is classified, the
// restart budget, the bad-node memory, each job's recovery state machine, and the controller's config file.
// Pure logic over in-memory data: no Slurm, no SQLite, no sockets. The daemon in controller/ is a shell around it.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt::recovery {

// A rank that exits with this code asks never to be restarted ("the input is bad, stop"). Exported to jobs as
// CKPT_EXIT_NO_RESTART by the examples; 79 is unused by shells (126-165), sysexits (64-78) and Python.
inline constexpr int kExitNoRestart = 79;

// A rank ends with this code when a peer of its run was lost (died or fell silent), its last words are done and
// the program did not exit on its own within CKPT_EXIT_GRACE (its teardown waited on the lost peer). The plugin
// reports it like any exit; the controller reads it as "a survivor", never as the failure's cause. 75: EX_TEMPFAIL.
inline constexpr int kExitPeerLost = 75;

// A rank of a node found slow ends with this code at a step boundary, so that a warm spare takes its ranks over
// in place (--ckpt-straggler=...,swap): its peers recover as from a crash, from the step it ended after.
inline constexpr int kExitSwappedOut = 76;

// Slurm's step id of a batch script (SLURM_BATCH_SCRIPT).
inline constexpr std::uint32_t kBatchStep = 0xfffffffbU;

// A job record's bounds: what its owner's events can add to it (steps, their nodes, the failure's reporters).
inline constexpr std::size_t kMaxStepsPerRecord = 256;
inline constexpr std::size_t kMaxNodesPerStep = 16384;

// ---- hostlists ---------------------------------------------------------------------------------------------

// Expands a Slurm hostlist ("n[1-3,5],gpu07") into names, in order. Refuses more than `limit` names.
Result<std::vector<std::string>> expand_hostlist(std::string_view list, std::size_t limit = 65536);
// A node name as events carry it: 1 to 255 bytes of letters, digits, '.', '-' and '_'.
bool safe_node_name(const std::string& name);
// Joins names with commas: what ExcNodeList and srun --exclude accept.
std::string join_nodes(const std::vector<std::string>& nodes);

// ---- events -------------------------------------------------------------------------------------------------

enum class EventType {
  JobStart,  // a step started on a node (the plugin's user_init): carries the job's settings
  TaskExit,  // a rank exited with a non-zero status or a signal (the plugin's task_exit)
  JobEnd,    // the batch step ended on its node (the plugin's exit): reconcile the job now
  Handover,  // ckpt-run gives up relaunching inside the allocation: requeue the job
  InPlace,   // ckpt-run: the job recovered in place (survivors and spares went on in the same allocation)
  Relaunch,  // ckpt-run relaunches its node steps inside the allocation (the in-place recovery was given up)
  SlowNode,  // the job's root rank: a node of the job ran slower than the job's best for several windows
};
const char* to_string(EventType type);

// When each phase of an in-place recovery ended, seconds since the epoch (0 when not known).
struct InPlacePhases {
  double detected = 0;         // a rank saw the peer lost
  double agreed = 0;           // the survivors agreed on the lost ranks (the last words' decision)
  double last_words_done = 0;  // the terminal checkpoint is written
  double regrouped = 0;        // survivors and spares formed the new group
  double restored = 0;         // the checkpoint is loaded
  double resumed = 0;          // the first training step after the recovery completed
};

// One report about one job. The controller trusts only the uid of the MUNGE credential that carried it.
struct Event {
  EventType type = EventType::JobStart;
  std::uint32_t job_id = 0;
  std::uint32_t step_id = kBatchStep;
  std::uint32_t restart_count = 0;     // SLURM_RESTART_COUNT of the run that sent it, at most kMaxRestartCount
  std::string node;                    // the node the sender runs on
  std::int64_t rank = -1;              // TaskExit: the global task id
  int exit_code = 0;                   // TaskExit: exit status when the task exited
  int signal = 0;                      // TaskExit: the signal that killed it, 0 when it exited
  std::uint32_t uid = 0;               // the job's uid as the sender saw it (informational)
  std::string ckpt_dir;                // JobStart: CKPT_DIR
  std::string trusted_dirs;            // JobStart: the site's allowed dirs that hold it, ':'-separated
  std::optional<std::uint64_t> max_restarts;  // JobStart: CKPT_MAX_RESTARTS
  bool needs_checkpoint = false;       // JobStart: CKPT_REQUIRE_CHECKPOINT=yes; never restart from scratch
  bool in_allocation = false;          // JobStart: the step runs under ckpt-run (CKPT_RUN set)
  std::uint32_t nnodes = 0;            // JobStart: nodes in the step
  std::uint32_t spares = 0;            // JobStart: spare nodes ckpt-run keeps in the allocation (CKPT_RUN_SPARES)
  double time = 0;                     // sender's clock, seconds since the epoch
  std::string detail;                  // free text (Handover: why; SlowNode: what the rank measured)
  std::string failed_nodes;            // InPlace, Relaunch: hostlist of the nodes that were lost whole (may be empty)
  std::uint32_t generation = 0;        // InPlace: the recovery's number in its run (1, 2, ...)
  std::optional<std::uint64_t> resume_step;  // InPlace: the checkpoint step training resumed from
  InPlacePhases phases;                // InPlace: when each phase of the recovery ended
  std::string slow_node;               // SlowNode: the slow node's name
  double score = 0;                    // SlowNode: its speed relative to the job's fastest node, in (0, 1]
  std::string action;                  // SlowNode: kSlowNodeReport or kSlowNodeExclude
};

// What a slow-node report asks: only to be recorded, or also to leave the node out of the job's next runs.
inline constexpr const char* kSlowNodeReport = "report";
inline constexpr const char* kSlowNodeExclude = "exclude";
// How a bad node left out for being slow begins its reason: such a node is not evidence of a node failure.
inline constexpr const char* kSlowNodeReason = "reported slow";

std::string to_json(const Event& event);
// Never throws. Rejects unknown types, missing ids, oversized input and names with odd characters; a SlowNode
// without a slow node, a score in (0, 1] or an action of kSlowNodeReport or kSlowNodeExclude.
Result<Event> parse_event(std::string_view text);

// ---- what Slurm says about a job ------------------------------------------------------------------------------

enum class SlurmState {
  Pending, Running, Suspended, Completed, Cancelled, Failed, Timeout, NodeFail, Preempted, BootFail, Deadline,
  OutOfMemory, Unknown,
};
const char* to_string(SlurmState state);
// "RUNNING", "NODE_FAIL", "OUT_OF_MEMORY", ... as slurmrestd and squeue spell them; Unknown otherwise.
SlurmState parse_slurm_state(std::string_view text);
bool is_finished(SlurmState state);  // the run is over (anything but Pending, Running, Suspended, Unknown)

struct SlurmJob {
  std::uint32_t job_id = 0;
  SlurmState state = SlurmState::Unknown;
  bool completing = false;             // still waiting for nodes to clean up
  bool held = false;                   // pending with priority 0 (held by user or admin)
  std::uint32_t restart_count = 0;     // Slurm's restart_cnt
  std::uint32_t user_id = 0;
  std::uint32_t group_id = 0;
  double submit_time = 0;              // with the job id and restart count, names the job (see job_identity)
  int exit_code = 0;                   // of the batch script, when finished
  int exit_signal = 0;
  std::vector<std::string> nodes;      // expanded allocation
  std::string batch_host;
  std::string reason;                  // state reason
  std::string excluded;                // ExcNodeList as Slurm has it
  bool requeue_allowed = true;         // Requeue=1
  double begin_time = 0;               // eligible time, seconds since the epoch
  double start_time = 0;
  double end_time = 0;                 // when the run ended (or is expected to), 0 when unknown
  std::uint32_t tasks = 0;             // NumTasks
  std::uint32_t tasks_per_node = 0;    // --ntasks-per-node; 0: not given
  std::string partition;               // comma-separated where it may run in several
  bool bad_constraints = false;        // Slurm's reason BadConstraints: it cannot start as it stands
};

struct SlurmNode {
  std::string name;
  std::string address;
  int port = 0;
  bool down = false;                   // DOWN, or not responding
  bool drained = false;                // DRAIN flag set
  std::string reason;
  std::vector<std::string> partitions;
};

// ---- classification ---------------------------------------------------------------------------------------------

enum class Ending { NodeFailure, TaskCrash, TimeLimit, Preemption, OutOfMemory, UserCancel, CleanExit, DoNotRestart };
const char* to_string(Ending ending);

struct TaskFailure {
  std::uint32_t step_id = 0;
  std::string node;
  std::int64_t rank = -1;
  int exit_code = 0;
  int signal = 0;
  double time = 0;        // when the controller received it
};

struct EndingFacts {
  std::optional<SlurmJob> slurm;         // absent when Slurm could not be asked
  std::vector<TaskFailure> failures;     // rank reports of the current run
  std::vector<std::string> dead_nodes;   // nodes of the job whose slurmd did not answer, or that Slurm has down
};

// How the current run ended, or is ending: nullopt while nothing says so (running, no failure known, or only
// task failures on live nodes while Slurm still runs the job: its batch script decides what happens next).
// Order: user cancel, the reserved exit code, node failure, time limit, preemption, out of memory, task crash,
// clean exit.
std::optional<Ending> classify(const EndingFacts& facts);

// What a run's rank 0 recorded in <CKPT_DIR>/.control/time-limit-stop.json after the terminal checkpoint it took
// for the job's time limit (the hooks' continuation.hpp).
struct TimeLimitStop {
  std::string job_id;
  std::uint32_t restart_count = 0;
  std::uint64_t step = 0;
};

// What the survivors of a run recorded in <CKPT_DIR>/.control/peer-lost.json once their last words ended after
// peers died or fell silent (the hooks' decider writes it, then the survivors exit kExitPeerLost): the run and the
// lost ranks' nodes, as those ranks published them. The job's owner writes it, so it may only ever leave nodes out
// of that owner's own job (hung_nodes() in recovery_plan.hpp), never mark one DOWN.
inline constexpr const char* kPeerLostFile = "peer-lost.json";
struct PeerLost {
  std::string job_id;
  std::uint32_t restart_count = 0;
  std::vector<std::string> nodes;  // the lost ranks' nodes, each once, at most kMaxNodesPerStep
  double time = 0;                 // when it was written, seconds since the epoch
};
std::string to_json(const PeerLost& lost);
// Never throws; nullopt for anything malformed: no object, a missing run, bad node names, too many nodes.
std::optional<PeerLost> parse_peer_lost(std::string_view text);

// The ending of a run that Slurm saw end cleanly: TimeLimit when that very run (same job, same restart count)
// stopped for its time limit after a terminal checkpoint, so the training goes on in a new allocation; else
// CleanExit. The record lives in the user's dir and says only what happens to the user's own job.
Ending ending_of_clean_exit(const std::optional<TimeLimitStop>& stop, std::uint32_t job_id,
                            std::uint32_t restart_count);

// Whether an ending is restarted at all, and whether a restart spends the no-progress budget.
bool restartable(Ending ending);
bool spends_budget(Ending ending);

// ---- the restart budget ------------------------------------------------------------------------------------------

struct Budget {
  std::uint64_t max_restarts = 3;        // restarts allowed without checkpoint progress
  std::uint64_t restarts = 0;            // every restart the controller made or saw
  std::uint64_t without_progress = 0;    // restarts since the newest complete checkpoint last advanced
  std::optional<std::uint64_t> progress_step;  // newest complete step at the last restart
};

struct RestartVerdict {
  bool restart = false;
  std::string reason;  // why not, or a one-line summary of the restart
  Budget after;        // the budget once this restart is made (unchanged when not restarting)
};

// Decides one restart. The budget resets only when `newest_complete` advanced past `progress_step`; a job that
// needs a checkpoint is never restarted while none is complete.
RestartVerdict decide_restart(Ending ending, const Budget& budget, std::optional<std::uint64_t> newest_complete,
                              bool needs_checkpoint);

// ---- bad nodes -----------------------------------------------------------------------------------------------------

struct BadNode {
  std::string node;
  std::string reason;
  double since = 0;
  double expires = 0;
};
// Adds or refreshes nodes (a refreshed node keeps its first reason and gets the new expiry).
std::vector<BadNode> add_bad_nodes(std::vector<BadNode> current, const std::vector<std::string>& nodes,
                                   const std::string& reason, double now, double ttl_s);
// Names of the nodes whose memory has not expired, sorted.
std::vector<std::string> active_bad_nodes(const std::vector<BadNode>& nodes, double now);
// Ends one node's memory now; returns whether it was active. The entry stays, expired: a node that was bad once
// is told apart from one a job's user excludes (own_exclusions_now), and a pending job that still excludes it lets
// it go (lapsed_exclusions).
bool forget_bad_node(std::vector<BadNode>& nodes, const std::string& node, double now);

// ---- the job's recovery state machine -------------------------------------------------------------------------------

enum class JobState {
  Running,      // the job runs; failures are being watched for
  Failing,      // a failure was reported: collecting reports and probing nodes before deciding
  Relaunching,  // ckpt-run relaunches the step inside the allocation, without the bad nodes
  Requeueing,   // a requeue intent is recorded and being carried out
  Pending,      // requeued; waiting for Slurm to run it again
  Completed,    // clean exit (or an ending that is not restarted by design: time limit with restarts off)
  Cancelled,    // the user cancelled it: never requeued
  GaveUp,       // stopped: budget spent, no checkpoint, do-not-restart code, out of memory, Slurm refused
  Gone,         // Slurm forgot the job
};
const char* to_string(JobState state);
std::optional<JobState> parse_job_state(std::string_view text);
// Completed, Cancelled, GaveUp and Gone: no automatic action happens any more.
bool is_terminal(JobState state);

// The table of allowed transitions, for documentation and tests.
const std::vector<std::pair<JobState, JobState>>& transition_table();
bool transition_allowed(JobState from, JobState to);
// An error naming both states when the transition is not in the table.
Status check_transition(JobState from, JobState to);

// ---- the controller's record of one job ------------------------------------------------------------------------------

struct StepInfo {
  bool in_allocation = false;
  std::vector<std::string> nodes;  // nodes that reported the step's start
};

// What a requeue must do, recorded before anything is sent to Slurm. Dead nodes are marked DOWN before the
// requeue: Slurm then ends the old run without waiting on them (a requeue first makes slurmctld wait up to
// MessageTimeout for a dead or hung node to confirm the kill), and requeues a job that allows it by itself.
struct Intent {
  enum class Phase { MarkDown, Requeue, WaitCompleting, Update, Done };
  std::uint64_t id = 0;
  Phase phase = Phase::MarkDown;
  bool requeue = true;                    // false when Slurm already requeued the job (only update it)
  std::uint32_t expected_restart = 0;     // Slurm's restart count once the requeue happened
  std::vector<std::string> exclude;       // ExcNodeList
  std::vector<std::string> mark_down;     // nodes to mark DOWN (their slurmd did not answer)
  std::vector<std::string> drain;         // nodes to drain (opt-in)
  // MinNodes for the next run (0: as submitted): a job whose allocation held spares may start without them
  // when its excluded nodes leave fewer than it asked for (requeue_min_nodes).
  std::uint32_t min_nodes = 0;
  // NumTasks with those fewer nodes (0: as submitted): requeue_min_tasks.
  std::uint32_t min_tasks = 0;
  std::string reason;
  double created = 0;
  // Earliest StartTime=now: nodes revoke the old run's credential when it ends, with one-second resolution, and
  // kill a new run whose credential is from the same second ("Job credential revoked").
  double not_before = 0;
};
const char* to_string(Intent::Phase phase);

// The earliest time a requeued job may be started again when its old run ended at `ended` (seconds).
double credential_safe_start(double ended);
std::optional<Intent::Phase> parse_intent_phase(std::string_view text);

// A node of the job reported slow (EventType::SlowNode), as the record keeps it: the newest report per node.
struct SlowNode {
  std::string node;
  double score = 0;    // its speed relative to the job's fastest node, in (0, 1]
  double time = 0;     // when the controller got the report (seconds since the epoch)
  std::string action;  // kSlowNodeReport or kSlowNodeExclude
};
// The slow nodes a record keeps (the oldest report goes first): the owner's reports cannot grow it without bound.
inline constexpr std::size_t kMaxSlowNodesPerRecord = 64;

// Timestamps of the current recovery, seconds since the epoch (0 when not reached).
struct RecoveryClock {
  double failed = 0;     // first failure report or observation received
  double decided = 0;    // the decision was made
  double slurm_done = 0; // Slurm runs the job again (requeue), ckpt-run started the new step (relaunch), or the
                         // new group formed (in place)
  double launched = 0;   // the plugin reported the new run's first step start (in place: the first step ended)
  std::string path;      // "requeue", "relaunch" or "in-place"
  double last_words_done = 0;  // in place: the terminal checkpoint was written
  double restored = 0;         // in place: the checkpoint was loaded
};

struct JobRecord {
  std::uint32_t job_id = 0;
  JobState state = JobState::Running;
  std::uint32_t uid = 0;                 // owner as Slurm reports it
  bool uid_known = false;
  std::uint32_t gid = 0;                 // the job's group as Slurm reports it
  double submit_time = 0;                // Slurm's submit time of the current run (see job_identity)
  std::string ckpt_dir;                  // as the plugin (root or SlurmUser) reported it; never from the user
  std::string trusted_dirs;              // with it: where the owner-side reader starts its checks (trusted_dir.hpp)
  bool needs_checkpoint = false;
  std::uint32_t restart_count = 0;       // Slurm restart count of the run being tracked
  Budget budget;
  std::vector<TaskFailure> failures;     // of the current run
  std::vector<std::string> reporters;    // nodes whose plugin reported during the current failure: alive
  std::vector<std::string> replaced_in_place;  // of the current run: nodes an in-place recovery replaced
  std::vector<std::string> nodes;        // the current run's allocation
  std::string batch_host;
  std::map<std::uint32_t, StepInfo> steps;  // of the current run
  std::uint32_t spares = 0;              // the spare nodes ckpt-run kept in the allocation (its steps' JobStart)
  std::vector<BadNode> bad_nodes;
  // The job's own ExcNodeList (its user's --exclude), read before the controller first wrote one: every requeue
  // keeps it beside the bad nodes. Unset until the controller has seen the job in Slurm.
  std::optional<std::vector<std::string>> own_excluded;
  std::vector<SlowNode> slow_nodes;      // the newest report per node, oldest first, at most kMaxSlowNodesPerRecord
  std::optional<Intent> intent;
  std::optional<std::uint32_t> relaunch_step;  // Relaunching: the failed step ckpt-run must replace
  // of the current run: ckpt-run relaunched its node steps and ended the steps up to this one itself; their tasks'
  // exits are no new failure
  std::optional<std::uint32_t> ended_steps;
  bool handover = false;                 // ckpt-run asked for a requeue
  bool end_reported = false;             // the batch step's end was reported: ask Slurm now
  std::string reason;                    // the last decision's reason (shown by status)
  std::optional<Ending> ending;          // the last classified ending
  RecoveryClock clock;
  double lost_work_s = 0;                // work lost in the last failure (time since the newest checkpoint)
  double created = 0;
  double updated = 0;
};

std::string to_json(const JobRecord& record);
Result<JobRecord> parse_job_record(std::string_view text);

// ---- the controller's config file ------------------------------------------------------------------------------------

struct ControllerConfig {
  // HTTP: events, client commands, /metrics; "off" for none. 6830: no Slurm daemon's default (slurmd 6818,
  // slurmctld 6817, slurmdbd 6819, slurmrestd has none, srun takes ephemeral ports).
  std::string listen = "127.0.0.1:6830";
  std::string spool_dir;                    // optional event spool directory
  std::string database = "/var/lib/slurm-ckpt/controller.db";
  std::string backend = "libslurm";         // libslurm | rest
  std::string rest_url;                     // rest: slurmrestd base URL
  std::string rest_user = "root";           // rest: X-SLURM-USER-NAME
  std::string rest_token_file;              // rest: file holding the JWT (else SLURM_JWT)
  std::string munge_socket;                 // empty: libmunge's default
  std::uint64_t max_restarts = 3;           // site default when a job does not say
  double bad_node_ttl_s = 3600;             // how long a bad node stays excluded from a job
  bool drain_bad_nodes = false;             // opt-in: drain excluded nodes through Slurm
  bool down_dead_nodes = true;              // mark a node whose slurmd refuses connections DOWN at once
  double settle_s = 0.5;                    // how long to collect reports after the first failure
  double probe_timeout_s = 1.0;             // TCP probe of a silent node's slurmd
  double slurmd_rpc_timeout_s = 1.0;        // one RPC to a silent node's slurmd whose port accepted
  double hung_after_s = 3;                  // no RPC answered for this long: the node hangs (0: no RPC check)
  // Off by default: a user who floods a node's slurmd (idle connections, munged) starves its RPCs while the
  // kernel still accepts, so RPC silence is evidence a user can make. Excluding the node from that job is safe.
  bool down_hung_nodes = false;             // mark a hung node DOWN at once (opt-in; default: only exclude it)
  double reconcile_s = 2.0;                 // full comparison with Slurm
  double completing_timeout_s = 120;        // longest wait for a requeued job to leave COMPLETING
  std::string webhook_url;                  // alerts: JSON POST
  double webhook_timeout_s = 5;
  std::vector<std::string> admin_users = {"root"};  // may release jobs and forget nodes
  std::string slurm_user;                   // events from this user are trusted (empty: ask Slurm)
  std::string log_level = "info";           // error | warning | info | debug ("warn" is read as warning)
  std::uint64_t history_max_rows = 1000;    // history lines kept per job (the oldest go first)
  double history_max_age_s = 30 * 86400;    // history and records of finished jobs older than this are dropped
};

// Parses `key = value` lines; '#' starts a comment. An unknown key or a bad value fails with one line naming
// the key and the line: "controller.conf:7: settle: invalid value 'x' (expected a duration like 500ms)".
Result<ControllerConfig> parse_controller_config(std::string_view text, std::string_view name = "controller.conf");

// "500ms", "2s", "1m30s": seconds as a double. Rejects what parse_duration rejects and fractions.
Result<double> parse_duration_ms(std::string_view text);

// "host:port" -> pair; port 1..65535, host not empty.
Result<std::pair<std::string, int>> parse_host_port(std::string_view text);

}  // namespace ckpt::recovery
