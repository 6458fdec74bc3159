// The requeue intent's steps against Slurm (intent_runner.hpp).
#include "intent_runner.hpp"

namespace ckpt::controller {

namespace rec = ckpt::recovery;
using rec::Intent;

void IntentRunner::drive(JobRecord& r, double now) {
  if (!r.intent) {
    host_.transition(r, JobState::Pending, "no requeue intent left", now);
    return;
  }
  if (host_.unflushed(r.job_id)) {
    host_.flush();  // the intent (and every step so far) is durable before the next action
    if (host_.unflushed(r.job_id)) {
      host_.check_again_at(r.job_id, now + 1);
      return;
    }
  }
  if (r.intent->phase == Intent::Phase::MarkDown) host_.crash_point("intent");
  bool failed = false;
  auto slurm = host_.load_job(r, now, failed);
  if (failed || !slurm) return;
  SlurmJob s = *slurm;
  for (int look = 0; look < 8 && r.intent; ++look) {
    rec::IntentFacts facts;
    facts.slurm = s;
    facts.record_restart = r.restart_count;
    facts.now = now;
    facts.completing_timeout_s = completing_timeout_s_;
    facts.first_look = look == 0;
    if (!take_step(r, rec::next_intent_step(*r.intent, facts), s, now)) return;
  }
}

bool IntentRunner::take_step(JobRecord& r, const rec::IntentStep& step, SlurmJob& s, double now) {
  using Kind = rec::IntentStep::Kind;
  switch (step.kind) {
    case Kind::Cancel:
      r.intent.reset();
      host_.transition(r, JobState::Cancelled, step.reason, now);
      return false;
    case Kind::Wait: host_.check_again_at(r.job_id, step.at); return false;
    case Kind::GiveUp: host_.give_up(r, step.reason, &s, now); return false;
    case Kind::Advance:
      r.intent->phase = step.next;
      host_.mark_dirty(r, now);
      return true;
    case Kind::MarkDown: return on_mark_down(r, step, s, now);
    case Kind::Requeued: return on_requeued(r, step, now, s);
    case Kind::Requeue: return on_requeue(r, s, now);
    case Kind::Expedite: return on_expedite(r, step, now);
    case Kind::Finish: return on_finish(r, step, s, now);
  }
  return false;
}

// Marks the intent's dead nodes DOWN and drains the opted-in ones.
bool IntentRunner::on_mark_down(JobRecord& r, const rec::IntentStep& step, SlurmJob& s, double now) {
  Intent& i = *r.intent;
  const std::string id = std::to_string(r.job_id);
  for (const auto& n : i.mark_down) {
    auto status = backend_.set_node_down(n, "ckpt-controller: slurmd not answering (job " + id + ")");
    host_.note(r, "action", status ? "marked " + n + " DOWN: its slurmd does not answer"
                             : "could not mark " + n + " DOWN: " + status.error(), now);
  }
  for (const auto& n : i.drain) {
    auto status = backend_.drain_node(n, "ckpt-controller: excluded after a failure of job " + id);
    host_.note(r, "action", status ? "drained " + n : "could not drain " + n + ": " + status.error(), now);
  }
  if (!i.mark_down.empty() || !i.drain.empty()) {
    host_.refresh_nodes(now, true);
    host_.crash_point("marked-down");
  }
  i.phase = step.next;
  if (step.look_again) {
    bool again_failed = false;
    if (auto again = host_.load_job(r, now, again_failed); again) s = *again;
  }
  host_.mark_dirty(r, now);
  host_.flush();
  return true;
}

// Slurm's restart count shows the requeue: ours, before the controller stopped, or Slurm's own.
bool IntentRunner::on_requeued(JobRecord& r, const rec::IntentStep& step, double now, const SlurmJob& s) {
  Intent& i = *r.intent;
  host_.note(r, "action", "Slurm's restart count is " + std::to_string(s.restart_count) + ": the requeue is done", now);
  i.not_before = step.not_before;
  host_.crash_point("requeued");  // Slurm requeued it (a node marked DOWN): the same point as our own requeue
  i.phase = step.next;
  host_.mark_dirty(r, now);
  host_.flush();
  return true;
}

bool IntentRunner::on_requeue(JobRecord& r, SlurmJob& s, double now) {
  Intent& i = *r.intent;
  auto status = backend_.requeue(r.job_id);
  bool again_failed = false;
  if (!status) {
    metrics_.add("ckpt_controller_slurm_errors_total", "op=\"requeue\"");
    auto again = host_.load_job(r, now, again_failed);
    if (!rec::requeue_happened_anyway(i, again)) {
      host_.give_up(r, "Slurm refused the requeue: " + status.error(), again ? &*again : nullptr, now);
      return false;
    }
    s = *again;
  } else {
    host_.crash_point("requeued");
    i.not_before = rec::credential_safe_start(now);
    host_.note(r, "action", "requeued job " + std::to_string(r.job_id) + " (" + backend_.name() + ")", now);
    if (auto again = host_.load_job(r, now, again_failed); again) s = *again;
  }
  i.phase = Intent::Phase::WaitCompleting;
  host_.mark_dirty(r, now);
  host_.flush();
  return true;
}

// StartTime=now and ExcNodeList: the job starts again at once, off the bad nodes.
bool IntentRunner::on_expedite(JobRecord& r, const rec::IntentStep& step, double now) {
  Intent& i = *r.intent;
  auto status = backend_.expedite(r.job_id, i.exclude, step.release, i.min_nodes, i.min_tasks);
  if (!status) {
    metrics_.add("ckpt_controller_slurm_errors_total", "op=\"update\"");
    host_.note(r, "action", "could not update the job: " + status.error(), now);
    const auto next = rec::after_refused_update(i, now, completing_timeout_s_);
    if (next.kind == rec::IntentStep::Kind::Wait) {
      host_.check_again_at(r.job_id, next.at);
      return false;
    }
    i.phase = next.next;
    return true;
  }
  host_.crash_point("updated");
  const std::string fewer =
      i.min_nodes > 0 ? " MinNodes=" + std::to_string(i.min_nodes) +
                            (i.min_tasks > 0 ? " NumTasks=" + std::to_string(i.min_tasks) + " (the nodes left hold no more)"
                                             : std::string()) +
                            " (it may start with fewer spares)"
                      : "";
  host_.note(r, "action", std::string("StartTime=now ExcNodeList=") + rec::join_nodes(i.exclude) + fewer +
                        (step.release ? " and released" : ""), now);
  i.phase = step.next;
  return true;
}

// The intent is carried out: the record follows the new run, or waits for it.
bool IntentRunner::on_finish(JobRecord& r, const rec::IntentStep& step, const SlurmJob& s, double now) {
  r.intent.reset();
  host_.watch_new_run(r.job_id, now + completing_timeout_s_);
  if (step.new_run) {
    host_.new_run(r, s.restart_count, now);
  } else {
    host_.transition(r, JobState::Pending, step.reason, now);
  }
  host_.flush();
  host_.crash_point("pending");
  return false;
}

}  // namespace ckpt::controller
