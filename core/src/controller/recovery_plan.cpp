// What the recovery controller does next: events applied to records, recovery plans, a requeue intent's steps.
#include "ckpt/recovery_plan.hpp"

#include <algorithm>
#include <cmath>

#include "ckpt/parse.hpp"

namespace ckpt::recovery {

namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

bool running_or_finished(const SlurmJob& s) { return s.state == SlurmState::Running || is_finished(s.state); }

// A survivor's exit after its peers were lost (kExitPeerLost), not a failure of its own.
bool gave_up_on_peers(const TaskFailure& f) { return f.signal == 0 && f.exit_code == kExitPeerLost; }

}  // namespace

std::string nodes_or_none(const std::vector<std::string>& nodes) {
  return nodes.empty() ? "(none)" : join_nodes(nodes);
}

// ---- events -------------------------------------------------------------------------------------------------------

std::string describe(const Event& e) {
  return std::string(to_string(e.type)) + " from " + e.node +
         (e.step_id == kBatchStep ? " (batch step)" : " (step " + std::to_string(e.step_id) + ")");
}

EventRun run_of_event(const JobRecord& r, const Event& e) {
  if (e.restart_count < r.restart_count) return EventRun::Stale;
  return e.restart_count > r.restart_count ? EventRun::Newer : EventRun::Current;
}

namespace {

// A step started: the settings it carries, and whether it ends a relaunch or a failure the batch script handled.
void apply_job_start(JobRecord& r, const Event& e, bool trusted, double now, EventEffects& fx) {
  // The controller reads the checkpoint dir: a user could name any path in an event signed as themselves.
  if (!e.ckpt_dir.empty() && e.ckpt_dir != r.ckpt_dir) {
    if (trusted) {
      r.ckpt_dir = e.ckpt_dir;
      r.trusted_dirs = e.trusted_dirs;
    } else {
      fx.dir_refused = true;
    }
  }
  if (e.max_restarts) r.budget.max_restarts = *e.max_restarts;
  if (e.needs_checkpoint) r.needs_checkpoint = true;
  if (e.spares > 0) r.spares = e.spares;
  // The record is rewritten with every change and its owner names the steps and nodes: bounded, keeping the newest
  // steps (the batch step has the highest id and stays) and the first nodes of each.
  if (r.steps.count(e.step_id) == 0 && r.steps.size() >= kMaxStepsPerRecord) r.steps.erase(r.steps.begin());
  auto& step = r.steps[e.step_id];
  step.in_allocation = step.in_allocation || e.in_allocation;
  if (!contains(step.nodes, e.node) && step.nodes.size() < kMaxNodesPerStep) step.nodes.push_back(e.node);
  fx.note = describe(e) + (e.in_allocation ? " under ckpt-run" : "");
  if (r.clock.failed > 0 && r.clock.slurm_done == 0 && r.clock.path == "requeue") r.clock.slurm_done = now;
  const bool step_started = e.step_id != kBatchStep;
  if (r.state == JobState::Relaunching && step_started && r.relaunch_step && e.step_id > *r.relaunch_step) {
    r.relaunch_step.reset();
    r.failures.clear();
    r.reporters.clear();
    fx.reset_runtime = true;
    fx.to = JobState::Running;
    fx.why = "ckpt-run relaunched the step as step " + std::to_string(e.step_id);
  } else if (r.state == JobState::Failing && step_started && !r.failures.empty() &&
             e.step_id > r.failures.front().step_id && !r.handover) {
    // The batch script started a new step on its own: it handled the failure.
    r.failures.clear();
    r.reporters.clear();
    fx.reset_runtime = true;
    fx.to = JobState::Running;
    fx.why = "the job started step " + std::to_string(e.step_id) + " after the failure";
  }
  // The first step of a recovered run: the recovery's latency is known.
  if (step_started && fx.to.value_or(r.state) == JobState::Running && r.clock.failed != 0 && r.clock.launched == 0) {
    r.clock.launched = now;
    if (r.clock.slurm_done == 0) r.clock.slurm_done = now;
    fx.running_again = true;
  }
}

void apply_task_exit(JobRecord& r, const Event& e, double now, EventEffects& fx) {
  if (contains(r.replaced_in_place, e.node)) {
    // A node the run went on without: a process of it that thawed late leaves now. That failure was handled.
    fx.note = describe(e) + ": from a node this run replaced in place; not a new failure";
    return;
  }
  if (r.ended_steps && e.step_id <= *r.ended_steps) {
    // ckpt-run ended this step itself to relaunch its node steps (apply_relaunch): its tasks' exits say nothing new.
    fx.note = describe(e) + ": from a step ckpt-run ended to relaunch the node steps; not a new failure";
    return;
  }
  TaskFailure f;
  f.step_id = e.step_id;
  f.node = e.node;
  f.rank = e.rank;
  f.exit_code = e.exit_code;
  f.signal = e.signal;
  f.time = now;
  if (r.failures.size() < 4096) r.failures.push_back(f);
  if (!contains(r.reporters, e.node) && r.reporters.size() < kMaxNodesPerStep) r.reporters.push_back(e.node);
  fx.note = describe(e) + ": rank " + std::to_string(e.rank) +
            (e.signal ? " killed by signal " + std::to_string(e.signal) : " exited " + std::to_string(e.exit_code));
  // A relaunching job fails again only in a step after the one ckpt-run replaces.
  if (r.state == JobState::Running || r.state == JobState::Pending ||
      (r.state == JobState::Relaunching && r.relaunch_step && e.step_id > *r.relaunch_step)) {
    if (r.state == JobState::Pending) {
      fx.to = JobState::Running;
      fx.why = "a rank of run " + std::to_string(r.restart_count) + " reported";
    }
    fx.start_failing = true;
  }
}

void apply_handover(JobRecord& r, const Event& e, EventEffects& fx) {
  fx.note = describe(e) + ": ckpt-run hands over to a requeue" + (e.detail.empty() ? "" : " (" + e.detail + ")");
  r.handover = true;
  if (r.state == JobState::Relaunching) {
    // The failure that led to the relaunch decision is the same one: its clock goes on.
    fx.reset_probes = true;
    fx.to = JobState::Failing;
    fx.why = "ckpt-run cannot relaunch inside the allocation";
  } else if (r.state == JobState::Running) {
    fx.start_failing = true;
  }
  fx.check_now = true;
}

// An in-place recovery's phases on the record's clock: its failure is the detection, its decision the survivors'
// agreement, its Slurm phase the new group's forming, its launch the first step.
// The phases are the job owner's word and feed site-wide metrics: each is clamped into what the controller saw (after
// the record was created, before the report arrived) and into order, so no report can claim a negative or longer
// recovery than the time the controller watched the job.
RecoveryClock in_place_clock(InPlacePhases p, double earliest, double now) {
  double floor = earliest;
  for (double* t : {&p.detected, &p.agreed, &p.last_words_done, &p.regrouped, &p.restored, &p.resumed}) {
    if (*t <= 0 || !std::isfinite(*t)) {
      *t = 0;  // not reported
      continue;
    }
    *t = std::clamp(*t, floor, now);
    floor = *t;
  }
  RecoveryClock clock;
  clock.path = "in-place";
  clock.failed = p.detected;
  clock.decided = p.agreed > 0 ? p.agreed : p.last_words_done;
  clock.last_words_done = p.last_words_done;
  clock.slurm_done = p.regrouped;
  clock.restored = p.restored;
  clock.launched = p.resumed;
  return clock;
}

// The nodes an owner's report (in place, relaunch) names as failed, and the job's own among them: the report may
// exclude only those, never name (and raise alerts about) others.
struct ReportedNodes {
  std::vector<std::string> all, own;
};
ReportedNodes reported_nodes(const JobRecord& r, const Event& e) {
  ReportedNodes out;
  if (auto failed = expand_hostlist(e.failed_nodes)) out.all = *failed;  // parse_event checked it
  for (const auto& n : out.all) {
    if (contains(r.nodes, n)) out.own.push_back(n);
  }
  return out;
}

// An owner's report of a recovery it made (in place, a relaunch): the restart spent with the same rule as a requeue
// (the resume step is the owner's word: it can spare only the owner's own job a give-up, which not reporting at all
// would too). False, with the give-up, past the budget.
bool spend_reported_restart(JobRecord& r, Ending ending, const Event& e, const std::string& what, EventEffects& fx) {
  const auto verdict = decide_restart(ending, r.budget, e.resume_step, r.needs_checkpoint);
  if (!verdict.restart) {
    fx.give_up = verdict.reason + "; " + what + ", stop the job";
    return false;
  }
  r.budget = verdict.after;
  fx.restarted = ending;
  return true;
}

}  // namespace

void apply_in_place(JobRecord& r, const Event& e, EventEffects& fx, double now) {
  const ReportedNodes reported = reported_nodes(r, e);
  const auto& nodes = reported.all;
  fx.note = describe(e) + ": recovery " + std::to_string(e.generation) + " in place without " +
            nodes_or_none(nodes) + ", resuming from " +
            (e.resume_step ? "step " + std::to_string(*e.resume_step) : std::string("no checkpoint"));
  if (r.state != JobState::Running && r.state != JobState::Failing && r.state != JobState::Relaunching) return;
  // No failed node: ranks died on nodes whose other ranks went on (a process, not its node, failed).
  const Ending ending = nodes.empty() ? Ending::TaskCrash : Ending::NodeFailure;
  r.ending = ending;
  r.clock = in_place_clock(e.phases, std::min(r.created, now), now);
  for (const auto& n : reported.own) {
    fx.exclude.push_back(n);
    if (!contains(r.replaced_in_place, n) && r.replaced_in_place.size() < 4096) r.replaced_in_place.push_back(n);
  }
  // A relaunch decision on this failure spent its restart already.
  if (r.state != JobState::Relaunching && !spend_reported_restart(r, ending, e, "ckpt-run recovered in place", fx)) {
    return;
  }
  r.failures.clear();
  r.reporters.clear();
  r.relaunch_step.reset();
  if (r.state != JobState::Running) {
    fx.reset_runtime = true;
    fx.to = JobState::Running;
    fx.why = "ckpt-run recovered in place (recovery " + std::to_string(e.generation) + ")";
  }
  fx.running_again = true;
}

void apply_relaunch(JobRecord& r, const Event& e, EventEffects& fx, double now) {
  const ReportedNodes reported = reported_nodes(r, e);
  fx.note = describe(e) + ": the in-place recovery was given up; ckpt-run relaunches the node steps inside the "
            "allocation without " + nodes_or_none(reported.all) + ", ending the steps up to " +
            std::to_string(e.step_id);
  // A decision taken already (a requeue under way, the job given up) stands: ckpt-run's relaunch ends with it.
  if (r.state != JobState::Running && r.state != JobState::Failing) return;
  const Ending ending = reported.all.empty() ? Ending::TaskCrash : Ending::NodeFailure;
  if (!spend_reported_restart(r, ending, e, "ckpt-run relaunches inside the allocation", fx)) return;
  r.ending = ending;
  fx.exclude = reported.own;
  r.failures.clear();
  r.reporters.clear();
  r.ended_steps = std::max(e.step_id, r.ended_steps.value_or(0));
  r.relaunch_step = e.step_id;  // the next step started is the relaunch's (apply_job_start)
  r.clock = RecoveryClock{};
  r.clock.path = "relaunch";
  r.clock.failed = r.clock.decided = now;
  fx.reset_probes = true;
  fx.to = JobState::Relaunching;
  fx.why = "ckpt-run relaunches its node steps inside the allocation";
}

EventEffects apply_event(JobRecord& r, const Event& e, bool trusted, double now) {
  EventEffects fx;
  switch (e.type) {
    case EventType::JobStart: apply_job_start(r, e, trusted, now, fx); break;
    case EventType::TaskExit: apply_task_exit(r, e, now, fx); break;
    case EventType::JobEnd:
      fx.note = describe(e);
      r.end_reported = true;
      fx.check_now = true;
      break;
    case EventType::Handover: apply_handover(r, e, fx); break;
    case EventType::Relaunch: apply_relaunch(r, e, fx, now); break;
    case EventType::InPlace: apply_in_place(r, e, fx, now); break;
    case EventType::SlowNode: apply_slow_node(r, e, fx, now); break;
  }
  return fx;
}

const std::vector<const char*>& recovery_phase_names(const std::string& path) {
  static const std::vector<const char*> restarted = {"decision", "slurm", "launch"};
  static const std::vector<const char*> in_place = {"agreement", "last_words", "reformation", "state_load",
                                                    "first_step"};
  return path == "in-place" ? in_place : restarted;
}

std::vector<RecoveryPhase> recovery_phases(const RecoveryClock& c) {
  const std::vector<double> marks =
      c.path == "in-place" ? std::vector<double>{c.failed, c.decided, c.last_words_done, c.slurm_done, c.restored,
                                                 c.launched}
                           : std::vector<double>{c.failed, c.decided, c.slurm_done, c.launched};
  const auto& names = recovery_phase_names(c.path);
  std::vector<RecoveryPhase> phases;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const bool known = marks[i] > 0 && marks[i + 1] > 0;
    phases.push_back(RecoveryPhase{names[i], known ? marks[i + 1] - marks[i] : 0});
  }
  return phases;
}

// ---- what a look at Slurm means -----------------------------------------------------------------------------------

SlurmNews news_of(const JobRecord& r, const SlurmJob& s, double now, int expedite_retries) {
  const bool newer = s.restart_count > r.restart_count;
  switch (r.state) {
    case JobState::Running:
    case JobState::Relaunching:
    case JobState::Failing:
      if (newer) return s.state == SlurmState::Pending ? SlurmNews::RequeuedBySlurm : SlurmNews::NewRun;
      if (is_finished(s.state) && r.state != JobState::Failing) return SlurmNews::RunEnded;
      return SlurmNews::Nothing;
    case JobState::Pending:
      if (s.state == SlurmState::Cancelled) return SlurmNews::Cancelled;
      if (newer && running_or_finished(s)) return SlurmNews::NewRun;
      // StartTime=now again: a requeue that completed after the update moved the start 121 s out.
      if (s.state == SlurmState::Pending && !s.completing && !s.held && s.begin_time > now + 5 &&
          expedite_retries < 3) {
        return SlurmNews::ExpediteAgain;
      }
      // Slurm holds a job it can never start (priority 0, BadConstraints): a hold of its own, which the update ends.
      if (s.state == SlurmState::Pending && !s.completing && (!s.held || held_by_slurm(s)) && expedite_retries < 3 &&
          !lapsed_exclusions(r, s, now).empty()) {
        return SlurmNews::ExclusionsLapsed;
      }
      return SlurmNews::Nothing;
    case JobState::Completed:
    case JobState::Cancelled:
    case JobState::GaveUp: return newer && s.state == SlurmState::Running ? SlurmNews::NewRun : SlurmNews::Nothing;
    default: return SlurmNews::Nothing;
  }
}

std::vector<std::string> own_exclusions_now(const JobRecord& r, const SlurmJob& s) {
  std::vector<std::string> before = r.own_excluded.value_or(std::vector<std::string>{});
  auto excluded = expand_hostlist(s.excluded);
  if (!excluded) return before;
  std::vector<std::string> own;
  for (const auto& n : *excluded) {
    const auto is_n = [&](const BadNode& b) { return b.node == n; };
    const bool ever_bad = std::any_of(r.bad_nodes.begin(), r.bad_nodes.end(), is_n);
    if ((contains(before, n) || !ever_bad) && !contains(own, n)) own.push_back(n);
  }
  std::sort(own.begin(), own.end());
  return own;
}

std::vector<std::string> own_exclusions(const JobRecord& r, const SlurmJob& s) {
  JobRecord first = r;  // nothing noted yet: every node there that was never bad
  first.own_excluded.reset();
  return own_exclusions_now(first, s);
}

std::vector<std::string> job_exclusions(const JobRecord& r, const std::vector<std::string>& bad) {
  std::set<std::string> all(bad.begin(), bad.end());
  if (r.own_excluded) all.insert(r.own_excluded->begin(), r.own_excluded->end());
  return {all.begin(), all.end()};
}

std::vector<std::string> job_exclusions_now(const JobRecord& r, double now) {
  return job_exclusions(r, active_bad_nodes(r.bad_nodes, now));
}

std::string cannot_start_why(const JobRecord& r, const SlurmJob& s, double now) {
  if (s.state != SlurmState::Pending || !s.bad_constraints) return "";
  std::string why = "Slurm cannot start the job as it stands (BadConstraints)";
  auto excluded = expand_hostlist(s.excluded);
  std::vector<std::string> ours;
  double first_lapse = 0;
  for (const auto& b : r.bad_nodes) {
    if (b.expires <= now || !excluded || !contains(*excluded, b.node) || contains(ours, b.node)) continue;
    ours.push_back(b.node);
    if (first_lapse == 0 || b.expires < first_lapse) first_lapse = b.expires;
  }
  if (ours.empty()) return why + ": none of its exclusions is this controller's";
  char lapse[64];
  std::snprintf(lapse, sizeof lapse, "%.0f s", first_lapse - now);
  return why + " while it excludes " + nodes_or_none(ours) + " after failures: the first of them is let go in " +
         lapse + " (bad_node_ttl), or at once by `ckpt-controller forget-node NODE` once the node is fixed";
}

bool held_by_slurm(const SlurmJob& s) { return s.held && s.bad_constraints; }

std::vector<std::string> lapsed_exclusions(const JobRecord& r, const SlurmJob& s, double now) {
  std::vector<std::string> lapsed;
  auto excluded = expand_hostlist(s.excluded);
  if (!excluded) return lapsed;  // a list that does not parse: left as it is
  const auto keep = job_exclusions_now(r, now);
  for (const auto& n : *excluded) {
    if (!contains(keep, n) && !contains(lapsed, n)) lapsed.push_back(n);
  }
  return lapsed;
}

// ---- a recovery's plan --------------------------------------------------------------------------------------------

std::optional<Ending> ending_of_failure(const JobRecord& r, const EndingFacts& facts, double now) {
  auto ending = classify(facts);
  if (!ending && r.handover) {
    // A node left out for being slow is the owner's word about speed, not a node that failed.
    std::vector<BadNode> failed = r.bad_nodes;
    std::erase_if(failed, [](const BadNode& b) { return b.reason.rfind(kSlowNodeReason, 0) == 0; });
    ending = active_bad_nodes(failed, now).empty() ? Ending::TaskCrash : Ending::NodeFailure;
  }
  return ending;
}

Ending ending_of_slurm_requeue(const std::vector<std::string>& nodes_down) {
  return nodes_down.empty() ? Ending::Preemption : Ending::NodeFailure;
}

LostNodes lost_nodes(const NodeEvidence& probes, bool down_hung_nodes, const std::vector<std::string>& slurm_down) {
  LostNodes lost{probes.failed, probes.mark_down};
  if (!down_hung_nodes) {
    std::erase_if(lost.mark_down, [&](const std::string& n) { return contains(probes.hung, n); });
  }
  for (const auto& n : slurm_down) {
    if (!contains(lost.dead, n)) lost.dead.push_back(n);
    if (!contains(lost.mark_down, n)) lost.mark_down.push_back(n);
  }
  return lost;
}

bool survivors_reported(const JobRecord& r) {
  return std::any_of(r.failures.begin(), r.failures.end(), gave_up_on_peers);
}

bool awaits_ckpt_run(const JobRecord& r, const SlurmJob& s, const std::vector<std::string>& dead, double now) {
  if (r.spares == 0 || r.handover || r.failures.empty() || s.state != SlurmState::Running) return false;
  if (contains(dead, r.batch_host)) return false;  // ckpt-run went with its node
  return std::all_of(r.failures.begin(), r.failures.end(), gave_up_on_peers) &&
         now < r.clock.failed + kCkptRunWord_s;
}

std::vector<std::string> hung_nodes(const JobRecord& r, const std::optional<PeerLost>& lost,
                                    const std::vector<std::string>& dead) {
  std::vector<std::string> hung;
  if (!lost || !survivors_reported(r) || lost->job_id != std::to_string(r.job_id) ||
      lost->restart_count != r.restart_count || lost->time + kPeerLostFreshness_s < r.clock.failed) {
    return hung;  // of another run, or of an earlier failure of this one (an in-place recovery's)
  }
  for (const auto& n : lost->nodes) {
    if (contains(r.nodes, n) && !contains(r.reporters, n) && !contains(dead, n) && !contains(hung, n)) {
      hung.push_back(n);
    }
  }
  return hung;
}

std::vector<std::string> exclude_bad_nodes(std::vector<BadNode>& bad_nodes, const std::vector<std::string>& nodes,
                                           const std::string& reason, double now, double ttl_s) {
  std::vector<std::string> fresh;
  const auto active_before = active_bad_nodes(bad_nodes, now);
  for (const auto& n : nodes) {
    if (!contains(active_before, n)) fresh.push_back(n);
  }
  bad_nodes = add_bad_nodes(bad_nodes, nodes, reason, now, ttl_s);
  return fresh;
}

std::vector<std::string> exclude_dead_nodes(std::vector<BadNode>& bad_nodes, const std::vector<std::string>& dead,
                                            std::uint32_t job_id, double now, double ttl_s) {
  return exclude_bad_nodes(bad_nodes, dead, "slurmd did not answer after a failure of job " + std::to_string(job_id),
                           now, ttl_s);
}

double lost_work_s(double newest_checkpoint_time, double run_start, double failed) {
  // The checkpoint's time is the manifest's, which the job owner writes: never before the run the controller saw.
  double since = newest_checkpoint_time > 0 ? newest_checkpoint_time : run_start;
  if (run_start > 0 && !(since >= run_start)) since = run_start;
  return since > 0 && failed > since ? failed - since : 0;
}

std::uint32_t requeue_min_nodes(const JobRecord& r, const std::vector<std::string>& excluded) {
  const auto held = static_cast<std::uint32_t>(r.nodes.size());
  if (r.spares == 0 || held <= r.spares) return 0;
  const auto lost = static_cast<std::uint32_t>(
      std::count_if(r.nodes.begin(), r.nodes.end(), [&](const std::string& n) { return contains(excluded, n); }));
  if (lost == 0) return 0;  // the allocation's own nodes stay available: ask for them all again
  return held - std::min(lost, r.spares);
}

std::uint32_t requeue_min_tasks(const SlurmJob& job, std::uint32_t min_nodes, std::uint32_t usable) {
  if (min_nodes == 0 || job.tasks_per_node == 0) return 0;
  const std::uint64_t fit = std::uint64_t{std::max(min_nodes, usable)} * job.tasks_per_node;
  return job.tasks > fit ? static_cast<std::uint32_t>(fit) : 0;
}

std::uint32_t usable_nodes(const std::vector<SlurmNode>& cluster, const SlurmJob& job,
                           const std::vector<std::string>& excluded) {
  std::vector<std::string> partitions = split(job.partition, ',');
  std::erase(partitions, std::string());
  const auto in_partition = [&](const SlurmNode& n) {
    if (partitions.empty() || n.partitions.empty()) return true;  // not known: counted, never lowered for it
    for (const auto& p : n.partitions) {
      if (contains(partitions, p)) return true;
    }
    return false;
  };
  return static_cast<std::uint32_t>(std::count_if(cluster.begin(), cluster.end(), [&](const SlurmNode& n) {
    return !n.down && !n.drained && !contains(excluded, n.name) && in_partition(n);
  }));
}

namespace {

// The requeue part of a plan: the intent, or a give-up when the job or the backend cannot be requeued.
void plan_requeue(const JobRecord& r, const RecoveryFacts& f, const RecoveryPolicy& p,
                  const std::vector<std::string>& fresh, const std::vector<std::string>& excluded, RecoveryPlan& plan) {
  const SlurmJob& s = f.slurm;
  const std::string ending = to_string(plan.ending);
  Intent& i = plan.intent;
  i.reason = plan.reason;
  i.created = f.now;
  i.exclude = job_exclusions(r, excluded);
  i.min_nodes = requeue_min_nodes(r, excluded);
  if (!f.cluster.empty()) i.min_tasks = requeue_min_tasks(s, i.min_nodes, usable_nodes(f.cluster, s, i.exclude));
  // A requeued job stays COMPLETING until every node of its old run answers; a dead node never does, and slurmctld
  // would wait SlurmdTimeout to declare it down. Only on evidence nobody but the node can give (refused twice, or
  // Slurm's own state): a timeout is not.
  if (p.down_dead_nodes && p.can_set_node_state) i.mark_down = f.mark_down;
  // Draining takes the same evidence: a node whose slurmd only timed out (a user can load it) stays in service.
  if (p.drain_bad_nodes && p.can_set_node_state) {
    for (const auto& n : fresh) {
      if (contains(f.mark_down, n)) i.drain.push_back(n);
    }
  }
  plan.action = RecoveryPlan::Action::Requeue;
  if (f.slurm_requeued) {
    i.requeue = false;
    i.expected_restart = s.restart_count;
    return;
  }
  i.expected_restart = r.restart_count + 1;
  if (!s.requeue_allowed) {
    plan.action = RecoveryPlan::Action::GiveUp;
    plan.reason = ending + ", but the job does not allow a requeue (--no-requeue)";
  } else if (!p.can_requeue) {
    if (plan.ending == Ending::NodeFailure && !is_finished(s.state)) {
      i.requeue = false;  // Slurm requeues a job that loses a node; this backend then expedites it
      plan.waits_for_slurm = true;
    } else {
      plan.action = RecoveryPlan::Action::GiveUp;
      plan.reason = ending + ": the " + p.backend +
                    " backend cannot requeue a job (slurmrestd openapi/v0.0.38 has no requeue operation)";
    }
  }
}

}  // namespace

RecoveryPlan plan_recovery(const JobRecord& r, const RecoveryFacts& f, const RecoveryPolicy& p) {
  RecoveryPlan plan;
  plan.ending = f.ending;
  if (plan.ending == Ending::CleanExit) {
    plan.ending = ending_of_clean_exit(f.time_limit_stop, r.job_id, r.restart_count);
    plan.time_limit_stop = plan.ending == Ending::TimeLimit;
  }
  const Ending ending = plan.ending;
  if (ending == Ending::UserCancel || ending == Ending::CleanExit) {
    plan.action = ending == Ending::UserCancel ? RecoveryPlan::Action::Cancel : RecoveryPlan::Action::Complete;
    plan.reason = ending == Ending::UserCancel ? "cancelled by its user: never requeued" : "ended cleanly";
    return plan;
  }
  plan.counts_lost_work = restartable(ending);
  auto verdict = decide_restart(ending, r.budget, f.newest_complete, r.needs_checkpoint);
  if (r.handover && r.relaunch_step && restartable(ending) && (!r.needs_checkpoint || f.newest_complete)) {
    // ckpt-run could not relaunch after a decision that already spent the budget for this failure.
    verdict.restart = true;
    verdict.after = r.budget;
    verdict.reason = std::string(to_string(ending)) + ": ckpt-run handed over; requeue (restart " +
                     std::to_string(r.budget.restarts) + " already counted)";
  }
  plan.reason = verdict.reason;
  plan.budget = verdict.after;
  if (!verdict.restart) {
    plan.action = RecoveryPlan::Action::GiveUp;
    return plan;
  }
  // The dead nodes are excluded whatever happens next: the job may be restarted by hand.
  auto bad_nodes = r.bad_nodes;
  const auto fresh = exclude_dead_nodes(bad_nodes, f.dead, r.job_id, f.now, p.bad_node_ttl_s);
  const auto excluded = active_bad_nodes(bad_nodes, f.now);

  const std::uint32_t failed_step = r.failures.empty() ? kBatchStep : r.failures.front().step_id;
  auto step = r.steps.find(failed_step);
  const bool in_allocation = step != r.steps.end() && step->second.in_allocation &&
                             f.slurm.state == SlurmState::Running && !r.handover && !f.slurm_requeued &&
                             ending == Ending::NodeFailure && !contains(f.dead, r.batch_host) && f.hung.empty();
  if (in_allocation) {
    plan.action = RecoveryPlan::Action::Relaunch;
    plan.relaunch_step = failed_step;
    plan.reason +=
        "; ckpt-run relaunches step " + std::to_string(failed_step) + " without " + nodes_or_none(excluded);
    return plan;
  }
  plan_requeue(r, f, p, fresh, excluded, plan);
  return plan;
}

bool hold_when_giving_up(const SlurmJob& s) { return s.state == SlurmState::Pending && !s.held; }

ReleasePlan plan_release(const JobRecord& r, const SlurmJob& s, bool can_requeue, std::uint32_t by_uid, double now) {
  ReleasePlan plan;
  if (s.state == SlurmState::Running) {
    plan.refusal = ReleasePlan::Refusal::Running;
    return plan;
  }
  Intent& i = plan.intent;
  i.created = now;
  i.reason = "released by uid " + std::to_string(by_uid);
  i.exclude = job_exclusions_now(r, now);
  if (s.state == SlurmState::Pending) {
    i.requeue = false;  // already queued (held): only release and expedite it
    i.expected_restart = s.restart_count;
  } else if (!can_requeue) {
    plan.refusal = ReleasePlan::Refusal::CannotRequeue;
    return plan;
  } else {
    i.expected_restart = r.restart_count + 1;
  }
  plan.budget = r.budget;
  plan.budget.without_progress = 0;
  return plan;
}

// ---- a requeue intent, step by step -------------------------------------------------------------------------------

namespace {

IntentStep advance(Intent::Phase next) {
  IntentStep step;
  step.kind = IntentStep::Kind::Advance;
  step.next = next;
  return step;
}

IntentStep wait_until(double at) {
  IntentStep step;
  step.kind = IntentStep::Kind::Wait;
  step.at = at;
  return step;
}

IntentStep give_up(std::string reason) {
  IntentStep step;
  step.kind = IntentStep::Kind::GiveUp;
  step.reason = std::move(reason);
  return step;
}

// Requeues the job, unless Slurm did (its restart count says so), or waits for Slurm's own requeue.
IntentStep requeue_step(const Intent& i, const IntentFacts& f) {
  IntentStep step;
  step.next = Intent::Phase::WaitCompleting;
  if (f.slurm.restart_count >= i.expected_restart) {
    step.kind = IntentStep::Kind::Requeued;
    step.not_before = i.not_before == 0 ? credential_safe_start(f.now) : i.not_before;
    return step;
  }
  if (i.requeue) {
    step.kind = IntentStep::Kind::Requeue;
    return step;
  }
  if (f.now - i.created > f.completing_timeout_s + 60) {
    return give_up("Slurm did not requeue the job after its node failed");
  }
  return wait_until(f.now + 0.25);  // Slurm requeues it once it declares the node down
}

// Waits until Slurm has ended the old run and the old credential is past.
IntentStep wait_completing_step(const Intent& i, const IntentFacts& f) {
  const SlurmJob& s = f.slurm;
  if (s.restart_count >= i.expected_restart && running_or_finished(s)) return advance(Intent::Phase::Done);
  if ((s.completing || s.state != SlurmState::Pending || f.now < i.not_before) &&
      f.now - i.created < f.completing_timeout_s) {
    // StartTime=now sent while the job is still completing would be overwritten when the requeue completes
    // (BeginTime = now + 121 s); sent in the second the old credential was revoked, the new run is killed.
    return wait_until(std::max(f.now + 0.05, std::min(i.not_before, f.now + 1)));
  }
  return advance(Intent::Phase::Update);
}

}  // namespace

IntentStep next_intent_step(const Intent& i, const IntentFacts& f) {
  const SlurmJob& s = f.slurm;
  IntentStep step;
  if (f.first_look && s.state == SlurmState::Cancelled) {
    step.kind = IntentStep::Kind::Cancel;
    step.reason = "cancelled by its user while being requeued";
    return step;
  }
  switch (i.phase) {
    case Intent::Phase::MarkDown:
      step.kind = IntentStep::Kind::MarkDown;
      step.next = Intent::Phase::Requeue;
      // Marking a node DOWN makes Slurm requeue the job (when it allows a requeue): look before asking again.
      step.look_again = !i.mark_down.empty();
      return step;
    case Intent::Phase::Requeue: return requeue_step(i, f);
    case Intent::Phase::WaitCompleting: return wait_completing_step(i, f);
    case Intent::Phase::Update:
      if (s.state != SlurmState::Pending) return advance(Intent::Phase::Done);  // started already (or ended)
      step.kind = IntentStep::Kind::Expedite;
      step.next = Intent::Phase::Done;
      step.release = s.held;
      return step;
    case Intent::Phase::Done: break;
  }
  step.kind = IntentStep::Kind::Finish;
  step.new_run = s.restart_count > f.record_restart && running_or_finished(s);
  step.reason = "requeued; waiting for Slurm to start run " + std::to_string(f.record_restart + 1);
  return step;
}

bool requeue_happened_anyway(const Intent& i, const std::optional<SlurmJob>& again) {
  return again && again->restart_count >= i.expected_restart;
}

IntentStep after_refused_update(const Intent& i, double now, double completing_timeout_s) {
  if (now - i.created > completing_timeout_s) return advance(Intent::Phase::Done);
  return wait_until(now + 0.5);
}

}  // namespace ckpt::recovery
