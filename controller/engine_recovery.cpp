// Recoveries: probing silent nodes, classifying the ending, the restart decision, and carrying out a requeue
// intent step by step against Slurm (engine_internal.hpp).
#include "engine_internal.hpp"

#include <chrono>

#include "log.hpp"
#include "probe.hpp"

namespace ckpt::controller {

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
  if (!rt.probe_done) {
    if (!rt.probe_started) {
      start_probes(r, now);
      checkpoint_view(r, now);  // read the checkpoints while the probes run
    }
    if (rt.probe.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      rt.next_check = now + 0.02;
      return;
    }
    auto [evidence, summary] = rt.probe.get();
    rt.dead = evidence.failed;
    rt.mark_down = evidence.mark_down;
    if (!config_.down_hung_nodes) {
      // Site policy: a hung node is only left out of the job's next runs; Slurm's SlurmdTimeout decides its state.
      std::erase_if(rt.mark_down, [&](const std::string& n) { return contains(evidence.hung, n); });
    }
    rt.probe_done = true;
    std::vector<std::string> silent;
    for (const auto& n : r.nodes) {
      if (!contains(r.reporters, n)) silent.push_back(n);
    }
    note(r, "decision", "reports from " + list(r.reporters) + "; probed " + list(silent) + ": " + summary + "; dead " +
                            list(rt.dead) + " (DOWN-worthy: " + list(rt.mark_down) + ")", now);
  }
  std::vector<std::string> dead = rt.dead;
  std::vector<std::string> mark_down = rt.mark_down;
  for (const auto& n : nodes_slurm_has_down(r.nodes)) {
    if (!contains(dead, n)) dead.push_back(n);
    if (!contains(mark_down, n)) mark_down.push_back(n);
  }
  rec::EndingFacts facts;
  facts.slurm = s;
  facts.failures = r.failures;
  facts.dead_nodes = dead;
  auto ending = rec::classify(facts);
  if (!ending && r.handover) {
    ending = rec::active_bad_nodes(r.bad_nodes, now).empty() ? Ending::TaskCrash : Ending::NodeFailure;
  }
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
  decide(r, *ending, s, dead, mark_down, *ckpts, now, false);
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
  rt.probe = run_detached([targets, plan] {
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
    rt.checkpoints = run_detached([dir, trusted, uid, gid] {
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
  if (slurm != nullptr && slurm->state == SlurmState::Pending && !slurm->held) {
    // Slurm requeued it on its own: hold it so it does not run again until an admin releases it.
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
                    bool slurm_requeued) {
  if (ending == Ending::CleanExit) {
    ending = rec::ending_of_clean_exit(ckpts.time_limit_stop, r.job_id, r.restart_count);
    if (ending == Ending::TimeLimit) {
      note(r, "decision", "the run stopped for its time limit after a terminal checkpoint at step " +
                              std::to_string(ckpts.time_limit_stop->step) + ": continued in a new allocation", now);
    }
  }
  record_ending(r, ending, s, ckpts, now);

  switch (ending) {
    case Ending::UserCancel: transition(r, JobState::Cancelled, "cancelled by its user: never requeued", now); return;
    case Ending::CleanExit: transition(r, JobState::Completed, "ended cleanly", now); return;
    default: break;
  }
  if (rec::restartable(ending) && ending != Ending::CleanExit) {
    metrics_.add("ckpt_controller_lost_work_seconds_total", "", r.lost_work_s);
  }
  auto verdict = rec::decide_restart(ending, r.budget, ckpts.newest_complete, r.needs_checkpoint);
  if (r.handover && r.relaunch_step && rec::restartable(ending) && (!r.needs_checkpoint || ckpts.newest_complete)) {
    // ckpt-run could not relaunch after a decision that already spent the budget for this failure.
    verdict.restart = true;
    verdict.after = r.budget;
    verdict.reason = std::string(rec::to_string(ending)) + ": ckpt-run handed over; requeue (restart " +
                     std::to_string(r.budget.restarts) + " already counted)";
  }
  // Remember the dead nodes whatever happens next: the job may be restarted by hand.
  const std::vector<std::string> fresh = exclude_nodes(r, dead, now);
  if (!verdict.restart) {
    give_up(r, verdict.reason, &s, now);
    return;
  }

  const std::uint32_t failed_step = r.failures.empty() ? rec::kBatchStep : r.failures.front().step_id;
  auto step = r.steps.find(failed_step);
  const bool in_allocation = step != r.steps.end() && step->second.in_allocation && s.state == SlurmState::Running &&
                             !r.handover && !slurm_requeued && ending == Ending::NodeFailure &&
                             !contains(dead, r.batch_host);
  if (in_allocation) {
    r.budget = verdict.after;
    r.relaunch_step = failed_step;
    r.clock.path = "relaunch";
    metrics_.add("ckpt_controller_restarts_total",
                 "ending=\"" + std::string(rec::to_string(ending)) + "\",path=\"relaunch\"");
    transition(r, JobState::Relaunching,
               verdict.reason + "; ckpt-run relaunches step " + std::to_string(failed_step) + " without " +
                   list(rec::active_bad_nodes(r.bad_nodes, now)),
               now);
    return;
  }

  start_requeue(r, ending, s, verdict, fresh, mark_down, slurm_requeued, now);
}

// Records the requeue intent (durable at the end of this cycle, carried out by drive_intent), or gives up when
// Slurm or the backend cannot requeue the job.
void Engine::start_requeue(JobRecord& r, Ending ending, const SlurmJob& s, const rec::RestartVerdict& verdict,
                           const std::vector<std::string>& fresh, const std::vector<std::string>& mark_down,
                           bool slurm_requeued, double now) {
  Intent i;
  auto next = db_.next_id();
  i.id = next ? *next : 0;
  i.created = now;
  i.reason = verdict.reason;
  i.exclude = rec::active_bad_nodes(r.bad_nodes, now);
  // A requeued job stays COMPLETING until every node of its old run answers; a dead node never does, and
  // slurmctld would wait SlurmdTimeout to declare it down. Marking it DOWN now (what slurmctld does later
  // anyway) ends the wait. Idempotent.
  // Only on evidence nobody but the node can give (refused twice, or Slurm's own state): a timeout is not.
  if (config_.down_dead_nodes && caps_.node_state) i.mark_down = mark_down;
  // Draining takes the same evidence: a node whose slurmd only timed out (a user can load it) stays in service.
  if (config_.drain_bad_nodes && caps_.node_state) {
    for (const auto& n : fresh) {
      if (contains(mark_down, n)) i.drain.push_back(n);
    }
  }
  if (slurm_requeued) {
    i.requeue = false;
    i.expected_restart = s.restart_count;
  } else {
    i.expected_restart = r.restart_count + 1;
    if (!s.requeue_allowed) {
      give_up(r, std::string(rec::to_string(ending)) + ", but the job does not allow a requeue (--no-requeue)", &s, now);
      return;
    }
    if (!caps_.requeue) {
      if (ending == Ending::NodeFailure && !rec::is_finished(s.state)) {
        i.requeue = false;  // Slurm requeues a job that loses a node; this backend then expedites it
        note(r, "decision", std::string("the ") + backend_.name() +
                                " backend cannot requeue: waiting for Slurm's own node-failure requeue", now);
      } else {
        give_up(r, std::string(rec::to_string(ending)) + ": the " + backend_.name() +
                       " backend cannot requeue a job (slurmrestd openapi/v0.0.38 has no requeue operation)",
                &s, now);
        return;
      }
    }
  }
  r.budget = verdict.after;
  r.intent = i;
  r.clock.path = "requeue";
  metrics_.add("ckpt_controller_restarts_total",
               "ending=\"" + std::string(rec::to_string(ending)) + "\",path=\"requeue\"");
  crash_point("decided");
  if (!transition(r, JobState::Requeueing, verdict.reason, now)) return;
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
  const double since = ckpts.newest_wall_time > 0 ? ckpts.newest_wall_time : s.start_time;
  r.lost_work_s = since > 0 && r.clock.failed > since ? r.clock.failed - since : 0;
  note(r, "decision",
       std::string(rec::to_string(ending)) + "; newest complete checkpoint: " +
           (ckpts.newest_complete ? "step " + std::to_string(*ckpts.newest_complete) : std::string("none")) +
           "; lost work " + fmt_time(r.lost_work_s) + " s",
       now);
}

// Adds `dead` to the job's excluded nodes (for bad_node_ttl); returns those not excluded already, each counted and
// alerted once.
std::vector<std::string> Engine::exclude_nodes(JobRecord& r, const std::vector<std::string>& dead, double now) {
  std::vector<std::string> fresh;
  const auto active_before = rec::active_bad_nodes(r.bad_nodes, now);
  for (const auto& n : dead) {
    if (!contains(active_before, n)) fresh.push_back(n);
  }
  r.bad_nodes = rec::add_bad_nodes(r.bad_nodes, dead, "slurmd did not answer after a failure of job " +
                                                          std::to_string(r.job_id), now, config_.bad_node_ttl_s);
  for (const auto& n : fresh) {
    metrics_.add("ckpt_controller_excluded_nodes_total", "");
    alert(json{{"event", "node_excluded"}, {"job_id", r.job_id}, {"node", n},
               {"reason", "slurmd did not answer after a failure"}, {"ttl_s", config_.bad_node_ttl_s}, {"time", now}});
  }
  if (!fresh.empty()) note(r, "decision", "excluding " + list(fresh) + " from the job's next runs", now);
  return fresh;
}

void Engine::drive_intent(JobRecord& r, double now) {
  if (!r.intent) {
    transition(r, JobState::Pending, "no requeue intent left", now);
    return;
  }
  Runtime& rt = runtime(r.job_id);
  if (dirty_.count(r.job_id) != 0) {
    flush();  // the intent (and every step so far) is durable before the next action
    if (dirty_.count(r.job_id) != 0) {
      rt.next_check = now + 1;
      return;
    }
  }
  if (r.intent->phase == Intent::Phase::MarkDown) crash_point("intent");
  bool failed = false;
  auto slurm = load_job(r, now, failed);
  if (failed || !slurm) return;
  SlurmJob s = *slurm;
  if (s.state == SlurmState::Cancelled) {
    r.intent.reset();
    transition(r, JobState::Cancelled, "cancelled by its user while being requeued", now);
    return;
  }
  // Each phase says whether the next one may follow at once (true) or the job is to be looked at again later.
  for (int guard = 0; guard < 8; ++guard) {
    bool go_on = false;
    switch (r.intent->phase) {
      case Intent::Phase::MarkDown: go_on = intent_mark_down(r, s, now); break;
      case Intent::Phase::Requeue: go_on = intent_requeue(r, s, now); break;
      case Intent::Phase::WaitCompleting: go_on = intent_wait_completing(r, s, now); break;
      case Intent::Phase::Update: go_on = intent_update(r, s, now); break;
      case Intent::Phase::Done: go_on = intent_done(r, s, now); break;
    }
    if (!go_on || !r.intent) return;
  }
}

// Marks the intent's dead nodes DOWN and drains the opted-in ones.
bool Engine::intent_mark_down(JobRecord& r, SlurmJob& s, double now) {
  Intent& i = *r.intent;
  const std::string id = std::to_string(r.job_id);
  for (const auto& n : i.mark_down) {
    auto status = backend_.set_node_down(n, "ckpt-controller: slurmd not answering (job " + id + ")");
    note(r, "action", status ? "marked " + n + " DOWN: its slurmd does not answer"
                             : "could not mark " + n + " DOWN: " + status.error(), now);
  }
  for (const auto& n : i.drain) {
    auto status = backend_.drain_node(n, "ckpt-controller: excluded after a failure of job " + id);
    note(r, "action", status ? "drained " + n : "could not drain " + n + ": " + status.error(), now);
  }
  if (!i.mark_down.empty() || !i.drain.empty()) {
    refresh_nodes(now, true);
    crash_point("marked-down");
  }
  i.phase = Intent::Phase::Requeue;
  if (!i.mark_down.empty()) {
    // Marking a node DOWN made Slurm requeue the job (when it allows a requeue): look before asking again.
    bool again_failed = false;
    if (auto again = load_job(r, now, again_failed); again) s = *again;
  }
  mark_dirty(r, now);
  flush();
  return true;
}

// Requeues the job, unless Slurm did (its restart count says so).
bool Engine::intent_requeue(JobRecord& r, SlurmJob& s, double now) {
  Intent& i = *r.intent;
  Runtime& rt = runtime(r.job_id);
  const std::string id = std::to_string(r.job_id);
  if (s.restart_count >= i.expected_restart) {
    note(r, "action", "Slurm's restart count is " + std::to_string(s.restart_count) + ": the requeue is done", now);
    if (i.not_before == 0) i.not_before = rec::credential_safe_start(now);
    crash_point("requeued");  // Slurm requeued it (a node marked DOWN): the same point as our own requeue
  } else if (i.requeue) {
    auto status = backend_.requeue(r.job_id);
    if (!status) {
      metrics_.add("ckpt_controller_slurm_errors_total", "op=\"requeue\"");
      bool again_failed = false;
      auto again = load_job(r, now, again_failed);
      if (again_failed || !again || again->restart_count < i.expected_restart) {
        give_up(r, "Slurm refused the requeue: " + status.error(), again ? &*again : nullptr, now);
        return false;
      }
      s = *again;
    } else {
      crash_point("requeued");
      i.not_before = rec::credential_safe_start(now);
      note(r, "action", "requeued job " + id + " (" + backend_.name() + ")", now);
      bool again_failed = false;
      if (auto again = load_job(r, now, again_failed); again) s = *again;
    }
  } else {
    if (now - i.created > config_.completing_timeout_s + 60) {
      give_up(r, "Slurm did not requeue the job after its node failed", &s, now);
      return false;
    }
    rt.next_check = now + 0.25;  // Slurm requeues it once it declares the node down
    return false;
  }
  i.phase = Intent::Phase::WaitCompleting;
  mark_dirty(r, now);
  flush();
  return true;
}

// Waits until Slurm has ended the old run and the old credential is past.
bool Engine::intent_wait_completing(JobRecord& r, SlurmJob& s, double now) {
  Intent& i = *r.intent;
  Runtime& rt = runtime(r.job_id);
  if (s.restart_count >= i.expected_restart && (s.state == SlurmState::Running || rec::is_finished(s.state))) {
    i.phase = Intent::Phase::Done;  // Slurm already runs it again
    return true;
  }
  if ((s.completing || s.state != SlurmState::Pending || now < i.not_before) &&
      now - i.created < config_.completing_timeout_s) {
    // StartTime=now sent while the job is still completing would be overwritten when the requeue completes
    // (BeginTime = now + 121 s); sent in the second the old credential was revoked, the new run is killed.
    rt.next_check = std::max(now + 0.05, std::min(i.not_before, now + 1));
    return false;
  }
  i.phase = Intent::Phase::Update;
  mark_dirty(r, now);
  return true;
}

// StartTime=now and ExcNodeList: the job starts again at once, off the bad nodes.
bool Engine::intent_update(JobRecord& r, SlurmJob& s, double now) {
  Intent& i = *r.intent;
  Runtime& rt = runtime(r.job_id);
  if (s.state != SlurmState::Pending) {  // it started already (or ended): nothing to expedite
    i.phase = Intent::Phase::Done;
    return true;
  }
  auto status = backend_.expedite(r.job_id, i.exclude, s.held);
  if (!status) {
    metrics_.add("ckpt_controller_slurm_errors_total", "op=\"update\"");
    note(r, "action", "could not update the job: " + status.error(), now);
    if (now - i.created > config_.completing_timeout_s) {
      i.phase = Intent::Phase::Done;  // it will start after Slurm's own delay
      return true;
    }
    rt.next_check = now + 0.5;
    return false;
  }
  crash_point("updated");
  note(r, "action", std::string("StartTime=now ExcNodeList=") + rec::join_nodes(i.exclude) +
                        (s.held ? " and released" : ""), now);
  i.phase = Intent::Phase::Done;
  return true;
}

// The intent is carried out: the record waits for the new run.
bool Engine::intent_done(JobRecord& r, SlurmJob& s, double now) {
  Runtime& rt = runtime(r.job_id);
  r.intent.reset();
  rt.watch_until = now + config_.completing_timeout_s;
  rt.expedite_retries = 0;
  if (s.restart_count > r.restart_count && (s.state == SlurmState::Running || rec::is_finished(s.state))) {
    new_run(r, s.restart_count, now);
  } else {
    transition(r, JobState::Pending, "requeued; waiting for Slurm to start run " +
                                         std::to_string(r.restart_count + 1), now);
  }
  flush();
  crash_point("pending");
  return false;
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
  if (s.state == SlurmState::Cancelled) {
    transition(r, JobState::Cancelled, "cancelled by its user while pending", now);
    return;
  }
  if (s.restart_count > r.restart_count && (s.state == SlurmState::Running || rec::is_finished(s.state))) {
    new_run(r, s.restart_count, now);
    if (rec::is_finished(s.state)) check_running(r, s, now);
    return;
  }
  if (s.state == SlurmState::Pending && !s.completing && !s.held && s.begin_time > now + 5 && rt.expedite_retries < 3) {
    // The BeginTime trap: a requeue that completed after our update pushed the start 121 s out again.
    ++rt.expedite_retries;
    auto status = backend_.expedite(r.job_id, rec::active_bad_nodes(r.bad_nodes, now), false);
    note(r, "action", status ? "StartTime=now again (Slurm had moved it to " + fmt_time(s.begin_time) + ")"
                             : "could not update the job: " + status.error(), now);
  }
  rt.next_check = now + 0.1;
}

void Engine::check_running(JobRecord& r, const SlurmJob& s, double now) {
  if (s.restart_count > r.restart_count) {
    if (s.state == SlurmState::Pending) {
      // Slurm requeued the job on its own (a node failure after SlurmdTimeout, a preemption): expedite it.
      const auto down = nodes_slurm_has_down(r.nodes);
      const Ending ending = down.empty() ? Ending::Preemption : Ending::NodeFailure;
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
      decide(r, ending, s, down, down, *ckpts, now, true);
      return;
    }
    new_run(r, s.restart_count, now);
    if (!rec::is_finished(s.state)) return;
  }
  if (rec::is_finished(s.state) && (r.state == JobState::Running || r.state == JobState::Relaunching)) {
    if (r.clock.failed == 0 || r.state == JobState::Running) {
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

void Engine::check_ended_job(JobRecord& r, const SlurmJob& s, double now) {
  // A person may requeue a job that ended or that the controller gave up on: follow it again.
  if (s.restart_count > r.restart_count && s.state == SlurmState::Running) new_run(r, s.restart_count, now);
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
