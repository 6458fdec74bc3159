#pragma once
// What the recovery controller does next, decided from facts: an event applied to a job's record, what a look at
// Slurm means for a record, the plan of a recovery once its ending is known (give up, relaunch inside the
// allocation, or requeue), an admin's release, and the next step of a requeue intent given what Slurm reports.
// Pure: the engine in controller/ carries out what these return (history lines, transitions, Slurm calls, crash
// points, saves) and decides nothing itself.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/controller_limits.hpp"
#include "ckpt/recovery.hpp"

namespace ckpt::recovery {

// Nodes as history and logs name them: join_nodes(), or "(none)".
std::string nodes_or_none(const std::vector<std::string>& nodes);

// ---- events -------------------------------------------------------------------------------------------------------

// "task_exit from n2 (step 3)", "job_start from n1 (batch step)": how history names an event.
std::string describe(const Event& event);

enum class EventRun { Stale, Current, Newer };
// Whether an event is of an older run than the record tracks (ignored), of that run, or of a newer one (the record
// starts that run before the event is applied).
EventRun run_of_event(const JobRecord& record, const Event& event);

// What applying an event leaves to the engine, in this order: the refused dir, the event's history line, the resets,
// the transition, a new failure, the end of a recovery, a look at the job in this cycle.
struct EventEffects {
  bool dir_refused = false;        // a ckpt_dir from a sender that is not root or SlurmUser was ignored
  std::string note;                // the event's history line
  bool reset_runtime = false;      // the failure is over: forget its probes and checks
  bool reset_probes = false;       // the same failure goes on: probe again before deciding
  std::optional<JobState> to;      // the transition to make
  std::string why;                 // its reason
  bool start_failing = false;      // a new failure: a new recovery clock, then settle, probe and decide
  bool running_again = false;      // the first step of a recovered run started (the clock says when)
  bool check_now = false;          // look at the job in this cycle
  std::vector<std::string> exclude;   // InPlace: the lost nodes, SlowNode: the slow one; out of the job's next runs
  std::string exclude_reason;         // why, for the bad node and its alert (empty: slurmd did not answer)
  std::optional<SlowNode> slow_node;  // SlowNode: the report recorded, to count and alert
  std::optional<Ending> restarted;    // InPlace: a restart was counted, for this ending
  std::optional<std::string> give_up; // InPlace: the budget is spent; why the controller gives up
};

// Applies an event of the record's current run: a JobStart's settings and step (and the end of a relaunch, or of a
// failure the batch script handled), a TaskExit's failure, a JobEnd's request to ask Slurm, a Handover's request to
// requeue, an InPlace recovery's node failure, restart and clock (apply_in_place below), a SlowNode report
// (apply_slow_node below). `trusted`: the sender is root or SlurmUser, the only ones that may name the checkpoint
// dir.
EventEffects apply_event(JobRecord& record, const Event& event, bool trusted, double now);

// An in-place recovery that ckpt-run reports: a node failure on the event's failed nodes (to exclude), a restart
// spent from the budget as decide_restart() rules (the resume step is the newest complete checkpoint), and the
// clock's phases with path "in-place". The record stays Running (a Failing or Relaunching one goes back to it: the
// failure is over); when the budget is spent, `give_up` says why. A job that is not running only gets the note.
// `now`: when the controller got the report; the phases are clamped to the record's lifetime up to it.
void apply_in_place(JobRecord& record, const Event& event, EventEffects& effects, double now);

// A slow node that the job's root rank reports (the sender is the job's owner, or root): recorded in the record's
// slow_nodes and its history, and with kSlowNodeExclude left out of the job's next runs (`exclude`, for the
// bad-node TTL), never marked DOWN or drained. Not a failure: the state and the budget stay as they are. A node
// outside the record's allocation is refused with a note naming it, and a finished job only gets the note.
// `now`: when the controller got the report, the time the record keeps (the sender's clock is not believed).
void apply_slow_node(JobRecord& record, const Event& event, EventEffects& effects, double now);
// Keeps `report` as its node's newest, last in `slow_nodes`; past kMaxSlowNodesPerRecord the oldest report goes.
void record_slow_node(std::vector<SlowNode>& slow_nodes, SlowNode report);

// One phase of a finished recovery, as history and /metrics name it.
struct RecoveryPhase {
  const char* name;
  double seconds;
};
// The phases a recovery on `path` goes through, in order: decision, slurm, launch for a requeue or a relaunch;
// agreement, last_words, reformation, state_load, first_step in place.
const std::vector<const char*>& recovery_phase_names(const std::string& path);
// The clock's phases (0 s where an end is not known); when every end is known they add up to launched - failed.
std::vector<RecoveryPhase> recovery_phases(const RecoveryClock& clock);

// ---- what a look at Slurm means -----------------------------------------------------------------------------------

enum class SlurmNews {
  Nothing,
  NewRun,           // Slurm runs the job again, or ran it and it ended (then look again: the new run ended)
  RequeuedBySlurm,  // Slurm requeued the job on its own (a node failure after SlurmdTimeout, a preemption)
  RunEnded,         // the run the record follows ended
  Cancelled,        // a requeued job's user cancelled it while it was pending
  ExpediteAgain,    // a requeue that completed after the update pushed the start out again (Slurm's BeginTime)
  ExclusionsLapsed, // the pending job still excludes nodes the controller no longer counts as bad (lapsed_exclusions)
};
// What Slurm's word on a job means for its record: Running, Relaunching and Failing (only a newer run there: the
// failure's own checks decide the rest), Pending (`expedite_retries`: StartTime=now sent again so far), and the ended
// states, where only a person's requeue that Slurm runs brings the record back.
SlurmNews news_of(const JobRecord& record, const SlurmJob& slurm, double now, int expedite_retries);

// The nodes a pending job's ExcNodeList (Slurm's, which the controller's requeue wrote) still names although the
// record no longer counts them as bad: their bad_node_ttl ran out, or an admin's forget-node took them back. A job
// that needs them (its MinNodes is the whole partition, or a reservation) would otherwise wait for good.
std::vector<std::string> lapsed_exclusions(const JobRecord& record, const SlurmJob& slurm, double now);
// The nodes of a job's ExcNodeList that are its own (its user's --exclude): all of them but the record's bad nodes,
// which only this controller writes there. Read at the first look at the job in Slurm (own_excluded).
std::vector<std::string> own_exclusions(const JobRecord& record, const SlurmJob& slurm);
// A pending job's own exclusions once its user may have changed its ExcNodeList (scontrol update): those Slurm's
// list still names, and any node there that the record never counted as bad. The record's own when the list does
// not parse.
std::vector<std::string> own_exclusions_now(const JobRecord& record, const SlurmJob& slurm);
// What a requeue or an update writes as the job's ExcNodeList: its own exclusions and the active bad nodes.
std::vector<std::string> job_exclusions(const JobRecord& record, const std::vector<std::string>& bad);
// The same with the record's bad nodes active at `now`: what a pending job's ExcNodeList should be.
std::vector<std::string> job_exclusions_now(const JobRecord& record, double now);
// What the history says once a pending job's run cannot start as it stands (Slurm's BadConstraints): which of its
// exclusions are the controller's and when the first of them lapses, or that they are all the job's own. Empty
// when Slurm says nothing of the kind.
std::string cannot_start_why(const JobRecord& record, const SlurmJob& slurm, double now);
// A pending job Slurm itself holds because it can never start as it stands (priority 0, reason BadConstraints), not
// a person's hold.
bool held_by_slurm(const SlurmJob& slurm);

// ---- a recovery's plan --------------------------------------------------------------------------------------------

// The ending of a failure the controller is looking into: what classify() says; on a hand-over from ckpt-run,
// which classify() cannot see, a node failure while the job has nodes excluded, else a task crash.
std::optional<Ending> ending_of_failure(const JobRecord& record, const EndingFacts& facts, double now);
// The ending of a run Slurm requeued on its own: a node failure when any of its nodes is down, else a preemption.
Ending ending_of_slurm_requeue(const std::vector<std::string>& nodes_down);

// The nodes a failure leaves out of the job's next runs (`dead`), and those with evidence enough to mark them DOWN:
// what the probes of its silent nodes found, and the nodes Slurm has down. A hung node (RPC silence) is marked DOWN
// only where the site allows it (`down_hung_nodes`); otherwise Slurm's SlurmdTimeout decides its state.
struct LostNodes {
  std::vector<std::string> dead;
  std::vector<std::string> mark_down;
};
LostNodes lost_nodes(const NodeEvidence& probes, bool down_hung_nodes, const std::vector<std::string>& slurm_down);

// The nodes of a run whose ranks hang while their hosts live (a stuck kernel, a collective that never returns, a
// stopped process): a survivor of the run reported its peers lost (a TaskExit with kExitPeerLost), the survivors'
// record of that very run (job id and restart count) and failure (kPeerLostFreshness_s) names the nodes, and each is of the run's allocation, sent
// no report of its own in this failure and is not among the `dead` the probes found. The run cannot end by itself
// (srun waits for the hung tasks), so the recovery ends it. The record is the owner's word: these nodes are only
// left out of the owner's own job, never marked DOWN.
// A record written longer than this before the failure's first report is of an earlier failure.
inline constexpr double kPeerLostFreshness_s = 60;
std::vector<std::string> hung_nodes(const JobRecord& record, const std::optional<PeerLost>& peer_lost,
                                    const std::vector<std::string>& dead);
// Whether a failure's reports include a survivor's "peer lost" (then the survivors' record is worth reading).
bool survivors_reported(const JobRecord& record);

// ckpt-run --spares decides what follows survivors that gave up recovering in place (they exit kExitPeerLost): a
// relaunch of its node steps inside the allocation (its `relaunch` event) or a requeue (`handover`). It says which
// when a node step ends or at its next look at the survivors' marker (within 2 s); a requeue the controller decided
// first would stand under the relaunch.
// True while the controller waits for that word: the job has spares, every report of the failure is a survivor's
// exit, Slurm still runs the job, the batch host (where ckpt-run runs) is not among the `dead`, and the first report
// came less than kCkptRunWord_s ago. After that the failure is decided as any other.
inline constexpr double kCkptRunWord_s = 5;
bool awaits_ckpt_run(const JobRecord& record, const SlurmJob& slurm, const std::vector<std::string>& dead, double now);

// MinNodes for a requeue that leaves `excluded` out: a job whose allocation held spares (ckpt-run's, r.spares)
// may start with fewer of them, one fewer per excluded node of its allocation, never fewer than it trains on; 0
// (as submitted) for a job without spares or when none of its nodes is excluded. Without it a -N4 job with one
// spare, one node excluded on a 4-node cluster, would wait for a fourth node it does not need, for good.
std::uint32_t requeue_min_nodes(const JobRecord& r, const std::vector<std::string>& excluded);
// NumTasks to go with MinNodes=`min_nodes`: a job submitted with a task count per node (-N3 --ntasks-per-node=2)
// asks Slurm for nodes x that many tasks and at most that many on a node, so where fewer nodes are left its tasks
// never fit (BadConstraints: pending for good) unless their count comes down too. Lowered only as far as the nodes
// left hold (`usable`, usable_nodes()): where they hold them all, the count stays, since Slurm gives a job no more
// nodes than its tasks need (-N2-3 -n4 --ntasks-per-node=2 runs on 2) and its spares would not come back. 0 (as
// submitted) where nothing changes.
std::uint32_t requeue_min_tasks(const SlurmJob& job, std::uint32_t min_nodes, std::uint32_t usable);
// The nodes a requeued job may run on: in its partition (a node whose partitions are not known counts), neither
// DOWN nor drained, not excluded.
std::uint32_t usable_nodes(const std::vector<SlurmNode>& cluster, const SlurmJob& job,
                           const std::vector<std::string>& excluded);

// Adds `nodes` to a job's bad nodes for `ttl_s`, with `reason`; returns those that were not excluded already.
std::vector<std::string> exclude_bad_nodes(std::vector<BadNode>& bad_nodes, const std::vector<std::string>& nodes,
                                           const std::string& reason, double now, double ttl_s);
// exclude_bad_nodes() with the reason of a failure's dead nodes.
std::vector<std::string> exclude_dead_nodes(std::vector<BadNode>& bad_nodes, const std::vector<std::string>& dead,
                                            std::uint32_t job_id, double now, double ttl_s);

// The work lost by a failure at `failed`: since the newest complete checkpoint, else since the run started.
double lost_work_s(double newest_checkpoint_time, double run_start, double failed);

// What the backend can do and what the site allows, besides the record.
struct RecoveryPolicy {
  bool can_requeue = true;          // the backend can requeue a job
  bool can_set_node_state = true;   // the backend can mark nodes DOWN and drain them
  bool down_dead_nodes = true;      // controller.conf down_dead_nodes
  bool drain_bad_nodes = false;     // controller.conf drain_bad_nodes
  double bad_node_ttl_s = 3600;
  std::string backend = "libslurm"; // named in reasons
};

struct RecoveryFacts {
  Ending ending = Ending::TaskCrash;   // as classified
  SlurmJob slurm;                      // what Slurm said then
  std::vector<std::string> dead;       // the job's nodes to leave out of its next runs
  std::vector<std::string> mark_down;  // of those, the ones with evidence enough to mark them DOWN
  std::vector<std::string> hung;       // of those, the ones whose ranks hang (hung_nodes): only a requeue ends them
  std::optional<std::uint64_t> newest_complete;
  std::optional<TimeLimitStop> time_limit_stop;
  bool slurm_requeued = false;         // Slurm requeued the job on its own
  std::vector<SlurmNode> cluster;      // the nodes Slurm has (empty: not known)
  double now = 0;
};

struct RecoveryPlan {
  enum class Action { Cancel, Complete, GiveUp, Relaunch, Requeue };
  Action action = Action::GiveUp;
  Ending ending = Ending::TaskCrash;   // a clean exit becomes a time limit when that run stopped for it
  bool time_limit_stop = false;        // ... which is why
  std::string reason;                  // of the transition, or why the controller gives up
  bool counts_lost_work = false;       // the failure's lost work is counted (a restartable ending)
  Budget budget;                       // Relaunch, Requeue: the record's budget from now on
  std::uint32_t relaunch_step = 0;     // Relaunch: the step ckpt-run replaces
  Intent intent;                       // Requeue: what to carry out (the engine gives it an id and a time)
  bool waits_for_slurm = false;        // Requeue: the backend cannot requeue; Slurm's own requeue is awaited
};

// Decides a recovery: never for a user's cancel or a clean exit; for the rest, the restart budget (a hand-over after
// a relaunch decision spent it already); then a relaunch inside the allocation when the failed step runs under
// ckpt-run, the batch host lives, only nodes failed and none of them hangs (a hung step does not end for ckpt-run
// to relaunch it); else a requeue, when the job and the backend allow one.
RecoveryPlan plan_recovery(const JobRecord& record, const RecoveryFacts& facts, const RecoveryPolicy& policy);

// When the controller gives up on a job Slurm requeued on its own, the job is held: it must not run again until an
// admin releases it.
bool hold_when_giving_up(const SlurmJob& slurm);

// An admin's release of a job the controller gave up on, while Slurm has it as `slurm`: a requeue with the
// no-progress budget reset (only a release and StartTime=now when Slurm holds it pending already), or a refusal.
struct ReleasePlan {
  enum class Refusal { None, Running, CannotRequeue };
  Refusal refusal = Refusal::None;
  Intent intent;  // the engine gives it an id
  Budget budget;  // the record's budget from now on
};
ReleasePlan plan_release(const JobRecord& record, const SlurmJob& slurm, bool can_requeue, std::uint32_t by_uid,
                         double now);

// ---- a requeue intent, step by step -------------------------------------------------------------------------------

struct IntentFacts {
  SlurmJob slurm;                    // Slurm's latest word on the job
  std::uint32_t record_restart = 0;  // the run the record tracks
  double now = 0;
  double completing_timeout_s = 120;
  bool first_look = true;            // the cycle's first look at Slurm: a cancellation is acted on then
};

struct IntentStep {
  enum class Kind {
    Cancel,    // the user cancelled the job while it was being requeued: drop the intent
    MarkDown,  // mark the intent's nodes DOWN, drain its drained ones; look at Slurm again when any was marked DOWN
    Requeued,  // Slurm's restart count shows the requeue done (ours before a crash, or Slurm's own)
    Requeue,   // ask Slurm to requeue the job
    Expedite,  // StartTime=now and ExcNodeList; release the job when it is held
    Advance,   // go on to `next` at once
    Wait,      // look again at `at`
    GiveUp,    // `reason`
    Finish,    // carried out: the record follows Slurm's new run, or waits for it
  };
  Kind kind = Kind::Wait;
  Intent::Phase next = Intent::Phase::Done;  // the phase once the action is done
  double at = 0;                             // Wait: when
  double not_before = 0;                     // Requeued: the intent's earliest StartTime=now from now on
  bool look_again = false;                   // MarkDown: Slurm may have requeued the job by itself
  bool release = false;                      // Expedite: the job is held
  bool new_run = false;                      // Finish: Slurm runs the job again already
  std::string reason;                        // Cancel, GiveUp, Finish
};

// The next action of a requeue intent in its phase, given what Slurm reports now.
IntentStep next_intent_step(const Intent& intent, const IntentFacts& facts);
// After Slurm refused the requeue, from a fresh look (none when Slurm could not be asked or forgot the job):
// whether the requeue happened anyway (its restart count says so); else the controller gives up.
bool requeue_happened_anyway(const Intent& intent, const std::optional<SlurmJob>& again);
// After Slurm refused the update: Advance to Done once the completing timeout is past (the job then starts after
// Slurm's own delay), else Wait.
IntentStep after_refused_update(const Intent& intent, double now, double completing_timeout_s);

}  // namespace ckpt::recovery
