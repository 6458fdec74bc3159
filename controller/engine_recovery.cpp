// Recoveries: probing silent nodes, reading checkpoints, deciding what ckpt/recovery_plan.hpp says (the recovery's
// plan, what Slurm's word on a job means) and recording a requeue's intent, which intent_runner.cpp carries out.
#include "engine_internal.hpp"

#include <chrono>

#include "log.hpp"
#include "probe.hpp"

namespace ckpt::controller {
using namespace ckpt::toolkit;  // the log

using namespace engine_detail;

// ---- decisions ----------------------------------------------------------------------------------------------------

void Engine::refresh_nodes(double now, bool force) {
  if (!force && now - nodes_loaded_ < 10) return;
  auto nodes = backend_.load_nodes();
  if (!nodes) {
    metrics_.add("ckpt_controller_slurm_errors_total", "op=\"load_nodes\"");
    log_warning(nodes.error());
    return;
  }
  nodes_.clear();
  for (auto& n : *nodes) nodes_[n.name] = n;
  nodes_loaded_ = now;
}

std::vector<std::string> Engine::nodes_slurm_has_down(const std::vector<std::string>& nodes) const {
  std::vector<std::string> down;
  for (const auto& n : nodes) {
    auto it = nodes_.find(n);
    if (it != nodes_.end() && it->second.down) down.push_back(n);
  }
  return down;
}

void Engine::check_failing(JobRecord& r, double now) {
  Runtime& rt = runtime(r.job_id);
  bool failed = false;
  auto slurm = load_job(r, now, failed);
  if (failed || !slurm) return;
  const SlurmJob& s = *slurm;
  if (s.restart_count > r.restart_count) {
    check_running(r, s, now);  // Slurm requeued it meanwhile
    return;
  }
  if (!rt.probe_done && !collect_probe_evidence(r, now)) return;
  const auto lost = rec::lost_nodes(rt.evidence, config_.down_hung_nodes, nodes_slurm_has_down(r.nodes));
  if (rec::awaits_ckpt_run(r, s, lost.dead, now)) {
    if (!rt.awaiting_ckpt_run) {
      rt.awaiting_ckpt_run = true;
      const std::string wait = std::to_string(static_cast<int>(rec::kCkptRunWord_s));
      note(r, "decision", "the survivors gave up in place; waiting up to " + wait +
                              " s for ckpt-run's relaunch inside the allocation or its hand-over", now);
    }
    rt.next_check = now + 0.05;
    return;
  }
  rec::EndingFacts facts;
  facts.slurm = s;
  facts.failures = r.failures;
  facts.dead_nodes = lost.dead;
  const auto ending = rec::ending_of_failure(r, facts, now);
  if (!ending && rec::survivors_reported(r) && end_run_of_hung_ranks(r, s, lost, now)) return;
  if (!ending) {
    // Ranks failed on live nodes and Slurm still runs the job: its script decides. Look again soon; the
    // batch step's end is reported by the plugin and brings the check forward.
    rt.next_check = now + std::min(2.0, config_.reconcile_s);
    return;
  }
  auto ckpts = checkpoint_view(r, now);
  if (!ckpts) {
    rt.next_check = now + 0.02;
    return;
  }
  decide(r, *ending, s, lost.dead, lost.mark_down, *ckpts, now, false);
}

// Starts the probes of the failure's silent nodes (and the checkpoint read beside them) on the first call; once
// they have answered, keeps their evidence and notes what they found. False while they are still running.
bool Engine::collect_probe_evidence(JobRecord& r, double now) {
  Runtime& rt = runtime(r.job_id);
  if (!rt.probe_started) {
    start_probes(r, now);
    checkpoint_view(r, now);  // read the checkpoints while the probes run
  }
  if (rt.probe.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    rt.next_check = now + 0.02;
    return false;
  }
  auto [evidence, summary] = rt.probe.get();
  rt.evidence = evidence;
  rt.probe_done = true;
  const auto probed = rec::lost_nodes(rt.evidence, config_.down_hung_nodes, {});
  std::vector<std::string> silent;
  for (const auto& n : r.nodes) {
    if (!contains(r.reporters, n)) silent.push_back(n);
  }
  note(r, "decision", "reports from " + list(r.reporters) + "; probed " + list(silent) + ": " + summary + "; dead " +
                          list(probed.dead) + " (DOWN-worthy: " + list(probed.mark_down) + ")", now);
  return true;
}

// Survivors said their peers were lost, yet the probed nodes live: the lost ranks may hang there, and then the
// step never ends by itself. Their record names the nodes (hung_nodes). True when this check is over: the run was
// ended without those nodes, or the checkpoints are still being read.
bool Engine::end_run_of_hung_ranks(JobRecord& r, const SlurmJob& s, const rec::LostNodes& lost, double now) {
  auto ckpts = checkpoint_view(r, now);
  if (!ckpts) {
    runtime(r.job_id).next_check = now + 0.02;
    return true;
  }
  const auto hung = rec::hung_nodes(r, ckpts->peer_lost, lost.dead);
  if (hung.empty()) return false;
  note(r, "decision", "the survivors lost the ranks on " + list(hung) + ", whose slurmd answers: hung there; " +
                          "the run is ended and goes on without them (not marked DOWN)", now);
  auto dead = lost.dead;
  dead.insert(dead.end(), hung.begin(), hung.end());
  decide(r, Ending::NodeFailure, s, dead, lost.mark_down, *ckpts, now, false, hung);
  return true;
}

// Probes the job's nodes that did not report (probe.hpp), off the engine's thread.
void Engine::start_probes(JobRecord& r, double now) {
  Runtime& rt = runtime(r.job_id);
  crash_point("failing");  // the failure is recorded; nothing is decided yet
  std::vector<ProbeTarget> targets;
  refresh_nodes(now, false);
  for (const auto& node : r.nodes) {
    if (contains(r.reporters, node)) continue;  // its plugin just spoke: alive
    auto it = nodes_.find(node);
    if (it == nodes_.end()) {
      refresh_nodes(now, true);
      it = nodes_.find(node);
    }
    if (it != nodes_.end()) targets.push_back(ProbeTarget{node, it->second.address, it->second.port});
  }
  ProbePlan plan;
  plan.tcp_timeout_s = config_.probe_timeout_s;
  plan.ask = slurmd_ask_;
  plan.rpc_timeout_s = config_.slurmd_rpc_timeout_s;
  plan.hung_after_s = config_.hung_after_s;
  rt.probe = probe_pool().submit([targets, plan] {
    std::string summary;
    auto evidence = probe_silent_nodes(targets, plan, summary);
    return std::make_pair(std::move(evidence), std::move(summary));
  });
  rt.probe_started = true;
}

std::optional<CheckpointView> Engine::checkpoint_view(JobRecord& r, double now) {
  (void)now;
  Runtime& rt = runtime(r.job_id);
  if (!rt.checkpoints_started) {
    const std::string dir = r.ckpt_dir;
    const std::string trusted = r.trusted_dirs;
    const std::uint32_t uid = r.uid_known ? r.uid : 65534;  // nobody, while the owner is not known
    const std::uint32_t gid = r.uid_known ? r.gid : 65534;
    rt.checkpoints = reader_pool().submit([dir, trusted, uid, gid] {
      return read_checkpoints_as(dir, trusted, uid, gid, kCheckpointReadTimeout_s);
    });
    rt.checkpoints_started = true;
  }
  if (rt.checkpoints.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return std::nullopt;
  rt.checkpoints_started = false;
  return rt.checkpoints.get();
}

void Engine::give_up(JobRecord& r, const std::string& reason, const SlurmJob* slurm, double now) {
  if (!transition(r, JobState::GaveUp, reason, now)) return;
  r.intent.reset();
  metrics_.add("ckpt_controller_gave_up_total",
               "ending=\"" + std::string(r.ending ? rec::to_string(*r.ending) : "none") + "\"");
  log_warning("job " + std::to_string(r.job_id) + ": gave up: " + reason);
  if (slurm != nullptr && rec::hold_when_giving_up(*slurm)) {
    auto s = backend_.hold(r.job_id);
    note(r, "action", s ? "held the job (release with: ckpt-controller release " + std::to_string(r.job_id) + ")"
                        : "could not hold the job: " + s.error(), now);
  }
  alert(json{{"event", "gave_up"},
             {"job_id", r.job_id},
             {"reason", reason},
             {"ending", r.ending ? rec::to_string(*r.ending) : ""},
             {"restarts", r.budget.restarts},
             {"restarts_without_progress", r.budget.without_progress},
             {"max_restarts", r.budget.max_restarts},
             {"time", now}});
}

void Engine::decide(JobRecord& r, Ending ending, const SlurmJob& s, const std::vector<std::string>& dead,
                    const std::vector<std::string>& mark_down, const CheckpointView& ckpts, double now,
                    bool slurm_requeued, const std::vector<std::string>& hung) {
  note_own_exclusions(r, s, now);
  rec::RecoveryFacts facts;
  facts.hung = hung;
  facts.ending = ending;
  facts.slurm = s;
  facts.dead = dead;
  facts.mark_down = mark_down;
  facts.newest_complete = ckpts.newest_complete;
  facts.time_limit_stop = ckpts.time_limit_stop;
  facts.slurm_requeued = slurm_requeued;
  facts.now = now;
  // Which nodes a requeue may still use, where a task count per node could keep the job off fewer of them
  // (requeue_min_tasks): with their partitions, which the periodic node list leaves out.
  if (r.spares > 0 && s.tasks_per_node > 0) {
    if (auto nodes = backend_.load_nodes(true)) {
      facts.cluster = std::move(*nodes);
    } else {
      metrics_.add("ckpt_controller_slurm_errors_total", "op=\"load_nodes\"");
      log_warning(nodes.error());
    }
  }
  rec::RecoveryPolicy policy;
  policy.can_requeue = caps_.requeue;
  policy.can_set_node_state = caps_.node_state;
  policy.down_dead_nodes = config_.down_dead_nodes;
  policy.drain_bad_nodes = config_.drain_bad_nodes;
  policy.bad_node_ttl_s = config_.bad_node_ttl_s;
  policy.backend = backend_.name();
  const rec::RecoveryPlan plan = rec::plan_recovery(r, facts, policy);
  if (plan.time_limit_stop) {
    note(r, "decision", "the run stopped for its time limit after a terminal checkpoint at step " +
                            std::to_string(ckpts.time_limit_stop->step) + ": continued in a new allocation", now);
  }
  record_ending(r, plan.ending, s, ckpts, now);
  using Action = rec::RecoveryPlan::Action;
  switch (plan.action) {
    case Action::Cancel: transition(r, JobState::Cancelled, plan.reason, now); return;
    case Action::Complete: transition(r, JobState::Completed, plan.reason, now); return;
    default: break;
  }
  if (plan.counts_lost_work) metrics_.add("ckpt_controller_lost_work_seconds_total", "", r.lost_work_s);
  exclude_nodes(r, dead, now);  // whatever happens next: the job may be restarted by hand
  switch (plan.action) {
    case Action::GiveUp: give_up(r, plan.reason, &s, now); return;
    case Action::Relaunch: relaunch(r, plan, now); return;
    default: start_requeue(r, plan, now); return;
  }
}

// ckpt-run relaunches the failed step inside the allocation, without the excluded nodes.
void Engine::relaunch(JobRecord& r, const rec::RecoveryPlan& plan, double now) {
  r.budget = plan.budget;
  r.relaunch_step = plan.relaunch_step;
  r.clock.path = "relaunch";
  count_restart(plan.ending, "relaunch");
  transition(r, JobState::Relaunching, plan.reason, now);
}

// Records the requeue intent (durable at the end of this cycle, carried out by the intent runner).
void Engine::start_requeue(JobRecord& r, const rec::RecoveryPlan& plan, double now) {
  if (plan.waits_for_slurm) {
    note(r, "decision", std::string("the ") + backend_.name() +
                            " backend cannot requeue: waiting for Slurm's own node-failure requeue", now);
  }
  Intent i = plan.intent;
  auto next = db_.next_id();
  i.id = next ? *next : 0;
  r.budget = plan.budget;
  r.intent = i;
  r.clock.path = "requeue";  // counted in restarts_total once Slurm runs the job again (new_run)
  crash_point("decided");
  if (!transition(r, JobState::Requeueing, plan.reason, now)) return;
  // Nothing is sent to Slurm before the intent is durable: the end of this cycle saves every decision in one
  // transaction, and the next cycle (a few ms later) carries them out.
  runtime(r.job_id).next_check = 0;
}

// The ending, when it was decided, and the work lost since the newest complete checkpoint.
void Engine::record_ending(JobRecord& r, Ending ending, const SlurmJob& s, const CheckpointView& ckpts, double now) {
  r.ending = ending;
  r.clock.decided = now;
  if (r.clock.failed == 0) r.clock.failed = now;
  if (!ckpts.error.empty()) note(r, "decision", "cannot read checkpoints in " + r.ckpt_dir + ": " + ckpts.error, now);
  r.lost_work_s = rec::lost_work_s(ckpts.newest_wall_time, s.start_time, r.clock.failed);
  note(r, "decision",
       std::string(rec::to_string(ending)) + "; newest complete checkpoint: " +
           (ckpts.newest_complete ? "step " + std::to_string(*ckpts.newest_complete) : std::string("none")) +
           "; lost work " + fmt_time(r.lost_work_s) + " s",
       now);
}

void Engine::note_own_exclusions(JobRecord& r, const SlurmJob& s, double now) {
  if (r.own_excluded || s.job_id != r.job_id) return;
  r.own_excluded = rec::own_exclusions(r, s);
  if (!r.own_excluded->empty()) {
    note(r, "event", "the job excludes " + list(*r.own_excluded) + " itself: kept at every requeue", now);
  }
  mark_dirty(r, now);
}

// A pending job's user may change its ExcNodeList (scontrol update): a node they add is theirs, kept at every
// requeue and never let go as lapsed; one they take out is theirs no longer.
void Engine::follow_own_exclusions(JobRecord& r, const SlurmJob& s, double now) {
  if (!r.own_excluded || s.job_id != r.job_id || s.state != SlurmState::Pending) return;
  auto own = rec::own_exclusions_now(r, s);
  auto before = *r.own_excluded;
  std::sort(before.begin(), before.end());
  if (own == before) return;
  note(r, "event",
       "the job's own exclusions are now " + list(own) + " (its ExcNodeList changed in Slurm): kept at every requeue",
       now);
  r.own_excluded = std::move(own);
  mark_dirty(r, now);
}

// Adds `nodes` to the job's excluded nodes (for bad_node_ttl); those not excluded already are counted and alerted once.
void Engine::exclude_nodes(JobRecord& r, const std::vector<std::string>& nodes, double now, const std::string& reason) {
  const auto fresh = reason.empty()
                         ? rec::exclude_dead_nodes(r.bad_nodes, nodes, r.job_id, now, config_.bad_node_ttl_s)
                         : rec::exclude_bad_nodes(r.bad_nodes, nodes, reason, now, config_.bad_node_ttl_s);
  for (const auto& n : fresh) {
    metrics_.add("ckpt_controller_excluded_nodes_total", "");
    alert(json{{"event", "node_excluded"}, {"job_id", r.job_id}, {"node", n},
               {"reason", reason.empty() ? "slurmd did not answer after a failure" : reason},
               {"ttl_s", config_.bad_node_ttl_s}, {"time", now}});
  }
  if (!fresh.empty()) note(r, "decision", "excluding " + list(fresh) + " from the job's next runs", now);
}

void Engine::check_again_at(std::uint32_t job_id, double at) { runtime(job_id).next_check = at; }

void Engine::watch_new_run(std::uint32_t job_id, double until) {
  Runtime& rt = runtime(job_id);
  rt.watch_until = until;
  rt.expedite_retries = 0;
  rt.cannot_start_told = false;
}

void Engine::check_pending(JobRecord& r, const SlurmJob* known, double now) {
  Runtime& rt = runtime(r.job_id);
  std::optional<SlurmJob> loaded;
  if (known == nullptr) {
    bool failed = false;
    loaded = load_job(r, now, failed);
    if (failed || !loaded) return;
    known = &*loaded;
  }
  const SlurmJob& s = *known;
  follow_own_exclusions(r, s, now);
  switch (rec::news_of(r, s, now, rt.expedite_retries)) {
    case rec::SlurmNews::Cancelled:
      transition(r, JobState::Cancelled, "cancelled by its user while pending", now);
      return;
    case rec::SlurmNews::NewRun:
      new_run(r, s.restart_count, now);
      if (rec::is_finished(s.state)) check_running(r, s, now);
      return;
    case rec::SlurmNews::ExpediteAgain: {
      ++rt.expedite_retries;
      const auto exclude = rec::job_exclusions_now(r, now);
      auto status = backend_.expedite(r.job_id, exclude, false);
      note(r, "action", status ? "StartTime=now again (Slurm had moved it to " + fmt_time(s.begin_time) + ")"
                               : "could not update the job: " + status.error(), now);
      break;
    }
    case rec::SlurmNews::ExclusionsLapsed: {
      ++rt.expedite_retries;
      const auto exclude = rec::job_exclusions_now(r, now);
      const auto lapsed = rec::lapsed_exclusions(r, s, now);
      auto status = backend_.expedite(r.job_id, exclude, rec::held_by_slurm(s));
      note(r, "action", status ? "ExcNodeList=" + rec::join_nodes(exclude) + " (" + list(lapsed) +
                                     " no longer excluded: bad_node_ttl ran out, or an admin forgot them)"
                               : "could not update the job: " + status.error(), now);
      break;
    }
    default:
      if (!rt.cannot_start_told) {
        const std::string why = rec::cannot_start_why(r, s, now);
        if (!why.empty()) note(r, "event", why, now);
        rt.cannot_start_told = !why.empty();
      }
      break;
  }
  rt.next_check = now + 0.1;
}

void Engine::check_running(JobRecord& r, const SlurmJob& s, double now) {
  auto news = rec::news_of(r, s, now, 0);
  if (news == rec::SlurmNews::NewRun) {
    new_run(r, s.restart_count, now);
    news = rec::news_of(r, s, now, 0);  // the new run may have ended already
  }
  if (news == rec::SlurmNews::RequeuedBySlurm) {
    on_slurm_requeue(r, s, now);
  } else if (news == rec::SlurmNews::RunEnded) {
    if (r.clock.failed == 0 || r.state == JobState::Running) {  // a relaunch's failure keeps its clock
      r.clock = rec::RecoveryClock{};
      r.clock.failed = now;
    }
    transition(r, JobState::Failing, std::string("Slurm reports the run ended: ") + rec::to_string(s.state), now);
    Runtime& rt = runtime(r.job_id);
    rt.probe_started = false;
    rt.probe_done = false;
    rt.next_check = 0;
    check_failing(r, now);
  }
}

// Slurm requeued the job on its own (a node failure after SlurmdTimeout, a preemption): decide, then expedite it.
void Engine::on_slurm_requeue(JobRecord& r, const SlurmJob& s, double now) {
  const auto down = nodes_slurm_has_down(r.nodes);
  if (r.state == JobState::Running || r.state == JobState::Relaunching) {
    r.clock = rec::RecoveryClock{};
    r.clock.failed = now;
    transition(r, JobState::Failing, "Slurm requeued it", now);
  }
  if (r.state != JobState::Failing) return;
  // Decided once the checkpoints are read (off the lock); the failing job's checks come back here.
  auto ckpts = checkpoint_view(r, now);
  if (!ckpts) {
    runtime(r.job_id).next_check = now + 0.02;
    return;
  }
  note(r, "decision", "Slurm requeued the job itself (restart count " + std::to_string(s.restart_count) +
                          "; nodes down: " + list(down) + ")", now);
  decide(r, rec::ending_of_slurm_requeue(down), s, down, down, *ckpts, now, true);
}

void Engine::check_ended_job(JobRecord& r, const SlurmJob& s, double now) {
  // A person may requeue a job that ended or that the controller gave up on: follow it again.
  if (rec::news_of(r, s, now, 0) == rec::SlurmNews::NewRun) new_run(r, s.restart_count, now);
}

void Engine::reconcile(double now) {
  refresh_nodes(now, true);
  auto all = backend_.load_jobs();
  if (!all) {
    metrics_.add("ckpt_controller_slurm_errors_total", "op=\"load_jobs\"");
    log_warning(all.error());
    return;
  }
  std::unordered_map<std::uint32_t, const SlurmJob*> by_id;
  by_id.reserve(all->size());
  for (const auto& j : *all) by_id[j.job_id] = &j;
  for (auto& [id, r] : jobs_) {
    auto it = by_id.find(id);
    if (it != by_id.end()) check_reuse(r, *it->second, now);
    if (r.state == JobState::Gone) continue;
    if (it == by_id.end()) {
      if (r.state == JobState::Requeueing || r.state == JobState::Failing) continue;  // checked on their own
      transition(r, JobState::Gone, "Slurm no longer knows the job", now);
      continue;
    }
    const SlurmJob& s = *it->second;
    note_own_exclusions(r, s, now);
    r.uid = s.user_id;
    r.uid_known = true;
    r.gid = s.group_id;
    if (!s.nodes.empty() && s.restart_count == r.restart_count) r.nodes = s.nodes;
    switch (r.state) {
      case JobState::Running:
      case JobState::Relaunching: check_running(r, s, now); break;
      case JobState::Pending: check_pending(r, &s, now); break;
      case JobState::Completed:
      case JobState::Cancelled:
      case JobState::GaveUp: check_ended_job(r, s, now); break;
      default: break;  // Failing and Requeueing are driven every cycle
    }
  }
}

}  // namespace ckpt::controller
