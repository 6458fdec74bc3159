// Events from the plugin and ckpt-run, and admin requests, applied to job records (engine_internal.hpp).
#include "engine_internal.hpp"

#include "ckpt/parse.hpp"
#include "ckpt/recovery_plan.hpp"
#include "log.hpp"

namespace ckpt::controller {
using namespace ckpt::toolkit;  // the log

using namespace engine_detail;

void Engine::check_reuse(JobRecord& r, const SlurmJob& s, double now) {
  runtime(r.job_id).reuse_checked = now;
  const auto identity = rec::job_identity(r.submit_time, r.restart_count, s.submit_time, s.restart_count);
  if (identity != rec::JobIdentity::Reused) {
    if (s.submit_time > 0 && r.submit_time != s.submit_time) {
      r.submit_time = s.submit_time;  // first seen, or requeued (Slurm sets a new submit time)
      mark_dirty(r, now);
    }
    return;
  }
  const std::uint32_t id = r.job_id;
  log_info("job " + std::to_string(id) + ": Slurm's job " + std::to_string(id) + " was submitted at " +
           fmt_time(s.submit_time) + " (restart count " + std::to_string(s.restart_count) +
           "), the record is of the one submitted at " + fmt_time(r.submit_time) + " (restart count " +
           std::to_string(r.restart_count) + "): the id was reused; starting a fresh record");
  if (auto st = db_.drop_history(id); !st) log_error(st.error());
  pending_history_.erase(std::remove_if(pending_history_.begin(), pending_history_.end(),
                                        [id](const HistoryLine& h) { return h.job_id == id; }),
                         pending_history_.end());
  rejected_.erase(id);
  const double old_submit = r.submit_time;
  JobRecord fresh;
  fresh.job_id = id;
  fresh.state = JobState::Running;
  fresh.budget.max_restarts = config_.max_restarts;
  fresh.uid = s.user_id;
  fresh.uid_known = true;
  fresh.gid = s.group_id;
  fresh.submit_time = s.submit_time;
  fresh.restart_count = s.restart_count;
  fresh.created = now;
  r = fresh;
  Runtime& rt = runtime(id);
  rt = Runtime{};
  rt.reuse_checked = now;
  note(r, "transition", "tracking job " + std::to_string(id) + " (submitted at " + fmt_time(s.submit_time) +
                            "; the id's record of the job submitted at " + fmt_time(old_submit) + " was dropped)", now);
  mark_dirty(r, now);
}

Verdict Engine::handle_event(const Event& e, std::uint32_t uid, double now) {
  JobRecord* existing = find_or_load(e.job_id);
  // A finished record, or one without a submit time, may be of an older job with the same id: ask Slurm (at
  // most every 5 s per job) before the owner or anything else of the record is believed.
  if (existing != nullptr && (rec::is_terminal(existing->state) || existing->submit_time <= 0) &&
      now - runtime(e.job_id).reuse_checked > 5 && !unknown_jobs_.known_unknown(e.job_id, now)) {
    runtime(e.job_id).reuse_checked = now;
    if (auto slurm = backend_.load_job(e.job_id); slurm && *slurm) {
      check_reuse(*existing, **slurm, now);
      existing->uid = (*slurm)->user_id;
      existing->uid_known = true;
      existing->gid = (*slurm)->group_id;
    } else if (slurm) {
      unknown_jobs_.remember(e.job_id, now);
    }
  }
  Verdict auth = authorize(e, uid, existing, now);
  if (!auth.ok()) {
    const bool exists = existing != nullptr ||
                        (auth.http_status == 403 && auth.message.find("unknown to Slurm") == std::string::npos);
    reject(e, uid, auth, exists, now);
    return auth;
  }
  metrics_.add("ckpt_controller_events_total", "type=\"" + std::string(rec::to_string(e.type)) + "\",result=\"accepted\"");

  JobRecord& r = get_or_create(e.job_id, now);
  switch (rec::run_of_event(r, e)) {
    case rec::EventRun::Stale:
      note(r, "event", "stale " + rec::describe(e) + " of run " + std::to_string(e.restart_count) + " ignored", now);
      return Verdict{202, "stale"};
    case rec::EventRun::Newer: new_run(r, e.restart_count, now); break;
    case rec::EventRun::Current: break;
  }
  carry_out(r, e, uid, rec::apply_event(r, e, trusted_uids_.count(uid) != 0, now), now);
  mark_dirty(r, now);
  return Verdict{202, "accepted"};
}

// Carries out what an event decided (rec::apply_event), in the order rec::EventEffects lists.
void Engine::carry_out(JobRecord& r, const Event& e, std::uint32_t uid, const rec::EventEffects& fx, double now) {
  if (fx.dir_refused) {
    log_limited(LogLevel::Warning, "ckpt-dir",
                "job " + std::to_string(e.job_id) + ": ckpt_dir '" + e.ckpt_dir.substr(0, 256) + "' from uid " +
                    std::to_string(uid) + " ignored: only the plugin (root or SlurmUser) names a job's checkpoint dir");
    note(r, "event", "ckpt_dir from uid " + std::to_string(uid) + " ignored (not signed by root or SlurmUser)", now);
  }
  note(r, "event", fx.note, now);
  if (fx.reset_runtime) runtime(r.job_id) = Runtime{};
  if (fx.reset_probes) {
    Runtime& rt = runtime(r.job_id);
    rt.probe_started = false;
    rt.probe_done = false;
  }
  if (fx.to) transition(r, *fx.to, fx.why, now);
  if (!fx.exclude.empty()) exclude_nodes(r, fx.exclude, now, fx.exclude_reason);
  if (fx.slow_node) count_slow_node(r, *fx.slow_node, now);
  if (fx.restarted) count_restart(*fx.restarted, r.clock.path);
  if (fx.give_up) give_up(r, *fx.give_up, nullptr, now);
  if (fx.start_failing) start_failing(r, now);
  if (fx.running_again) note_running_again(r, now);
  if (fx.check_now) runtime(r.job_id).next_check = 0;
}

void Engine::count_restart(rec::Ending ending, const std::string& path) {
  metrics_.add("ckpt_controller_restarts_total",
               "ending=\"" + std::string(rec::to_string(ending)) + "\",path=\"" + path + "\"");
}

// The first step of a recovered run started (in place: completed): the recovery's latency and its phases.
void Engine::note_running_again(JobRecord& r, double now) {
  const std::string path = r.clock.path.empty() ? "requeue" : r.clock.path;
  const double latency = r.clock.launched - r.clock.failed;
  metrics_.observe_recovery(path, latency);
  std::string phases;
  for (const auto& phase : rec::recovery_phases(r.clock)) {
    metrics_.observe_phase(path, phase.name, phase.seconds);
    std::string name = phase.name;
    std::replace(name.begin(), name.end(), '_', ' ');
    phases += (phases.empty() ? "" : ", ") + name + " " + fmt_time(phase.seconds) + " s";
  }
  const std::string detected = path == "in-place" ? "detected at " + fmt_time(r.clock.failed) + "; " : "";
  note(r, "recovery", "running again after " + fmt_time(latency) + " s (" + r.clock.path + "): " + detected + phases,
       now);
}

// A slow-node report the record kept: counted by action, and an alert for the site (a node that slows jobs down
// is worth a look, even when no job excludes it).
void Engine::count_slow_node(const JobRecord& r, const rec::SlowNode& report, double now) {
  metrics_.add("ckpt_controller_slow_node_events_total", "action=\"" + report.action + "\"");
  alert(json{{"event", "slow_node"}, {"job_id", r.job_id}, {"node", report.node}, {"score", report.score},
             {"action", report.action}, {"time", now}});
}

Verdict Engine::handle_admin(const std::string& op, const std::string& arg, std::uint32_t uid, double now) {
  if (admin_uids_.count(uid) == 0 && trusted_uids_.count(uid) == 0) {
    return Verdict{403, "uid " + std::to_string(uid) + " may not " + op + " (admin_users)"};
  }
  if (op == "release") return handle_release(arg, uid, now);
  if (op == "forget-node") return handle_forget_node(arg, uid, now);
  return Verdict{400, "unknown request '" + op + "'"};
}

Engine::JobRecord* Engine::find_or_load(std::uint32_t job_id) {
  JobRecord* r = find(job_id);
  if (r == nullptr) {
    auto stored = db_.load_job(job_id);
    if (stored && *stored) {
      jobs_[(*stored)->job_id] = **stored;
      r = &jobs_[(*stored)->job_id];
    }
  }
  return r;
}

// An admin's "release JOB": a job the controller gave up on is requeued with its budget reset.
Verdict Engine::handle_release(const std::string& arg, std::uint32_t uid, double now) {
  auto id = ckpt::parse_uint(arg);
  if (!id || *id == 0 || *id > 0xffffffffULL) return Verdict{400, "release: bad job id '" + arg + "'"};
  JobRecord* r = find_or_load(static_cast<std::uint32_t>(*id));
  if (r == nullptr) return Verdict{404, "job " + arg + " is not tracked"};
  if (r->state != JobState::GaveUp) {
    return Verdict{409, "job " + arg + " is " + rec::to_string(r->state) + "; only a job the controller gave up on "
                        "can be released"};
  }
  auto slurm = backend_.load_job(r->job_id);
  if (!slurm) return Verdict{503, slurm.error()};
  if (!*slurm) return Verdict{404, "job " + arg + " is unknown to Slurm"};
  const SlurmJob& s = **slurm;
  const auto plan = rec::plan_release(*r, s, caps_.requeue, uid, now);
  switch (plan.refusal) {
    case rec::ReleasePlan::Refusal::Running: return Verdict{409, "job " + arg + " is running"};
    case rec::ReleasePlan::Refusal::CannotRequeue:
      return Verdict{409, std::string("the ") + backend_.name() + " backend cannot requeue a job"};
    case rec::ReleasePlan::Refusal::None: break;
  }
  Intent i = plan.intent;
  auto next = db_.next_id();
  i.id = next ? *next : 0;
  r->budget = plan.budget;
  r->intent = i;
  r->clock = rec::RecoveryClock{};
  r->clock.failed = now;
  r->clock.decided = now;
  r->clock.path = "requeue";
  transition(*r, JobState::Requeueing, i.reason + ": budget reset", now);
  flush();
  intents_.drive(*r, now);
  return Verdict{200, "job " + arg + " released"};
}

// An admin's "forget-node NODE": no job excludes it any longer, and a node this controller drained or marked DOWN
// is resumed in Slurm.
Verdict Engine::handle_forget_node(const std::string& arg, std::uint32_t uid, double now) {
  std::vector<std::string> jobs;
  for (auto& [id, r] : jobs_) {
    if (rec::forget_bad_node(r.bad_nodes, arg, now)) {
      jobs.push_back(std::to_string(id));
      note(r, "action", "node " + arg + " forgotten by uid " + std::to_string(uid), now);
      mark_dirty(r, now);
    }
  }
  std::string extra;
  refresh_nodes(now, true);
  auto node = nodes_.find(arg);
  if (node != nodes_.end() && node->second.reason.rfind("ckpt-controller:", 0) == 0 && caps_.node_state &&
      (node->second.drained || node->second.down)) {
    auto s = backend_.resume_node(arg);
    extra = s ? "; resumed in Slurm" : "; could not resume it: " + s.error();
  }
  log_info("node " + arg + " forgotten (jobs " + list(jobs) + ")" + extra);
  return Verdict{200, "node " + arg + " forgotten by " + std::to_string(jobs.size()) + " jobs" + extra};
}

}  // namespace ckpt::controller
