// The engine's cycle: requests queued by the HTTP threads, due jobs, reconciliation with Slurm, and the job
// records with their history and transitions (engine_internal.hpp says where the rest lives).
#include "engine_internal.hpp"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <sstream>

#include "ckpt/clock.hpp"
#include "ckpt/format.hpp"
#include "ckpt/parse.hpp"
#include "log.hpp"

namespace ckpt::controller {
using namespace ckpt::toolkit;  // the log

using namespace engine_detail;

Engine::Engine(ControllerConfig config, SlurmBackend& backend, Database& db, Metrics& metrics, Alerts& alerts)
    : config_(std::move(config)), backend_(backend), db_(db), metrics_(metrics), alerts_(alerts),
      caps_(backend.capabilities()) {
  // Fault injection for the crash tests: CKPT_CONTROLLER_CRASH_AT=intent,requeued,... SIGKILLs the controller
  // when the named point is reached.
  if (const char* points = std::getenv("CKPT_CONTROLLER_CRASH_AT"); points != nullptr) {
    std::stringstream ss(points);
    std::string p;
    while (std::getline(ss, p, ',')) {
      if (!p.empty()) crash_points_.insert(p);
    }
  }
}

Engine::~Engine() = default;

Status Engine::start(double now) {
  std::lock_guard<std::mutex> lock(mutex_);
  started_ = now;
  trusted_uids_.insert(0);
  if (!config_.slurm_user.empty()) {
    auto uid = uid_of(config_.slurm_user);
    if (!uid) return Status::failure("slurm_user: no such user '" + config_.slurm_user + "'");
    trusted_uids_.insert(*uid);
  } else if (auto uid = backend_.slurm_user_uid(); uid) {
    trusted_uids_.insert(*uid);
  }
  for (const auto& user : config_.admin_users) {
    auto uid = uid_of(user);
    if (!uid) return Status::failure("admin_users: no such user '" + user + "'");
    admin_uids_.insert(*uid);
  }
  db_.set_history_limit(config_.history_max_rows);
  auto records = db_.load_jobs(false);
  if (!records) return Status::failure(records.error());
  for (auto& r : *records) {
    const std::uint32_t id = r.job_id;
    jobs_[id] = std::move(r);
  }
  std::size_t open_intents = 0;
  for (auto& [id, r] : jobs_) {
    if (r.intent) ++open_intents;
  }
  log_info("loaded " + std::to_string(jobs_.size()) + " unfinished jobs (" + std::to_string(open_intents) +
           " with a requeue in progress) from " + config_.database);
  refresh_nodes(now, true);
  next_reconcile_ = now;  // compare with Slurm at once: it may have moved on while we were down
  return Status::success();
}

// ---- requests ------------------------------------------------------------------------------------------------

Verdict Engine::submit(const Event& event, std::uint32_t cred_uid, double wait_s) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::Event;
  request->event = event;
  request->uid = cred_uid;
  // The plugin signs every job's events as root: its share is the job's owner, as it names them. Anyone else's is
  // their own uid, whatever their events claim.
  request->share = trusted_uids_.count(cred_uid) != 0 ? event.uid : cred_uid;
  return intake_.submit(request, wait_s);
}

Verdict Engine::admin(const std::string& op, const std::string& arg, std::uint32_t cred_uid, double wait_s) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::Admin;
  request->op = op;
  request->arg = arg;
  request->uid = cred_uid;
  request->share = cred_uid;
  return intake_.submit(request, wait_s);
}

void Engine::wake() { intake_.wake(); }

std::size_t Engine::queued() const { return intake_.size(); }

void Engine::run(const std::atomic<bool>& stop) {
  while (!stop.load()) {
    cycle(unix_seconds());
    // Short cycles while anything is in flight; otherwise sleep until the next reconciliation or a request.
    double wait = config_.reconcile_s;
    {
      std::lock_guard<std::mutex> state(mutex_);
      for (const auto& [id, r] : jobs_) {
        if (r.state == JobState::Failing || r.state == JobState::Requeueing || r.state == JobState::Pending ||
            r.state == JobState::Relaunching) {
          wait = 0.05;
          break;
        }
      }
    }
    intake_.wait(wait, stop);
  }
}

void Engine::cycle(double now, bool force_reconcile) {
  auto requests = intake_.take_batch();
  std::lock_guard<std::mutex> lock(mutex_);
  answer_requests(requests, now);
  if (force_reconcile || now >= next_reconcile_) {
    reconcile(now);
    next_reconcile_ = now + config_.reconcile_s;
  }
  check_due_jobs(now);
  flush();
  // Requeues decided in this cycle are durable now: start them without waiting for the next cycle.
  start_decided_requeues(now);
  flush();
  housekeeping(now);
}

// Handles a batch of requests and answers each once the batch's changes are durable.
void Engine::answer_requests(std::vector<std::shared_ptr<Request>>& requests, double now) {
  std::vector<Verdict> verdicts;
  verdicts.reserve(requests.size());
  for (auto& request : requests) {
    Verdict v;
    try {
      v = handle(*request, now);
    } catch (const std::exception& e) {
      v = Verdict{503, std::string("internal error: ") + e.what()};
      log_error(v.message);
    }
    verdicts.push_back(v);
  }
  flush();  // the batch's accepted events are durable (one commit for all of them) before any is acknowledged
  for (std::size_t i = 0; i < requests.size(); ++i) requests[i]->promise.set_value(verdicts[i]);
}

// Checks every job whose next check is due; an internal error in one job's check delays only that job's next one.
void Engine::check_due_jobs(double now) {
  for (auto& [id, r] : jobs_) {
    Runtime& rt = runtime(id);
    if (now < rt.next_check) continue;
    try {
      check_job(r, rt, now);
    } catch (const std::exception& e) {
      log_error("job " + std::to_string(id) + ": internal error: " + e.what());
      rt.next_check = now + 1;
    }
  }
}

// One due job's check, by its state.
void Engine::check_job(JobRecord& r, Runtime& rt, double now) {
  switch (r.state) {
    case JobState::Failing: check_failing(r, now); break;
    case JobState::Requeueing: intents_.drive(r, now); break;
    case JobState::Pending:
      if (now < rt.watch_until) check_pending(r, nullptr, now);
      break;
    case JobState::Running:
    case JobState::Relaunching:
      if (r.end_reported) {
        bool failed = false;
        auto slurm = load_job(r, now, failed);
        if (!failed && slurm) check_running(r, *slurm, now);
        r.end_reported = false;
        mark_dirty(r, now);
      }
      break;
    default: break;
  }
}

// Drives the intent of every requeueing job whose next check is due.
void Engine::start_decided_requeues(double now) {
  for (auto& [id, r] : jobs_) {
    if (r.state != JobState::Requeueing || now < runtime(id).next_check) continue;
    try {
      intents_.drive(r, now);
    } catch (const std::exception& e) {
      log_error("job " + std::to_string(id) + ": internal error: " + e.what());
    }
  }
}

// Prunes old history hourly and forgets finished jobs after an hour in memory (their records stay in the database).
void Engine::housekeeping(double now) {
  if (now >= next_prune_) {
    next_prune_ = now + 3600;
    if (auto gone = db_.prune(now - config_.history_max_age_s); !gone) {
      log_error(gone.error());
    } else if (*gone > 0) {
      log_info("pruned " + std::to_string(*gone) + " history lines and finished records older than " +
               ckpt::format_duration(static_cast<std::uint64_t>(config_.history_max_age_s)));
    }
  }
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Runtime& rt = runtime(it->first);
    const JobState st = it->second.state;
    if (st != JobState::GaveUp && rec::is_terminal(st) && rt.terminal_since > 0 && now - rt.terminal_since > 3600) {
      runtime_.erase(it->first);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
}

Verdict Engine::handle(const Request& request, double now) {
  if (request.kind == Request::Kind::Admin) return handle_admin(request.op, request.arg, request.uid, now);
  return handle_event(request.event, request.uid, now);
}

Verdict Engine::authorize(const Event& e, std::uint32_t uid, JobRecord* r, double now) {
  if (trusted_uids_.count(uid) != 0) return Verdict{202, "trusted"};
  std::uint32_t owner = 0;
  const std::string unknown = "job " + std::to_string(e.job_id) + " is unknown to Slurm";
  if (r != nullptr && r->uid_known) {
    owner = r->uid;
  } else {
    // Events for made-up ids, or for another user's untracked job, cost one lookup per id per 10 s.
    if (unknown_jobs_.known_unknown(e.job_id, now)) return Verdict{403, unknown};
    const auto cached = r == nullptr ? unknown_jobs_.known_owner(e.job_id, now) : std::nullopt;
    std::optional<SlurmJob> found;
    if (!cached) {
      auto slurm = backend_.load_job(e.job_id);
      if (!slurm) return Verdict{503, "cannot ask Slurm who owns job " + std::to_string(e.job_id) + ": " + slurm.error()};
      if (!*slurm) {
        unknown_jobs_.remember(e.job_id, now);
        return Verdict{403, unknown};
      }
      found = **slurm;
    }
    owner = cached ? *cached : found->user_id;
    if (r == nullptr && !cached) unknown_jobs_.remember_owner(e.job_id, owner, now);
    if (r != nullptr && found) {
      check_reuse(*r, *found, now);
      r->uid = owner;
      r->uid_known = true;
    }
  }
  if (uid != owner) {
    return Verdict{403, "credential uid " + std::to_string(uid) + " is neither root, SlurmUser nor the owner (uid " +
                            std::to_string(owner) + ") of job " + std::to_string(e.job_id)};
  }
  return Verdict{202, "owner"};
}

void Engine::reject(const Event& e, std::uint32_t uid, const Verdict& why, bool job_exists, double now) {
  const std::string what = std::string(rec::to_string(e.type)) + " from " + e.node + " (uid " + std::to_string(uid) + ")";
  metrics_.add("ckpt_controller_events_total", "type=\"" + std::string(rec::to_string(e.type)) + "\",result=\"rejected\"");
  log_limited(LogLevel::Warning, "rejected-event",
              "rejected " + what + " for job " + std::to_string(e.job_id) + ": " + why.message);
  // Anyone can send these: kept in memory, a few per job, for history to show; never a durable row each.
  if (!job_exists) return;
  auto it = rejected_.find(e.job_id);
  if (it == rejected_.end()) {
    if (rejected_.size() >= kRejectedJobs) rejected_.erase(rejected_.begin());
    it = rejected_.emplace(e.job_id, std::vector<HistoryLine>{}).first;
  }
  auto& lines = it->second;
  if (lines.size() >= kRejectedPerJob) lines.erase(lines.begin());
  lines.push_back(HistoryLine{now, e.job_id, e.restart_count, "rejected", what + ": " + why.message});
}

// ---- records ----------------------------------------------------------------------------------------------------

Engine::JobRecord* Engine::find(std::uint32_t job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

Engine::JobRecord& Engine::get_or_create(std::uint32_t job_id, double now) {
  if (JobRecord* r = find(job_id)) return *r;
  auto stored = db_.load_job(job_id);
  if (stored && *stored) {
    jobs_[job_id] = **stored;
    return jobs_[job_id];
  }
  JobRecord r;
  r.job_id = job_id;
  r.state = JobState::Running;
  r.budget.max_restarts = config_.max_restarts;
  r.created = now;
  r.updated = now;
  jobs_[job_id] = r;
  note(jobs_[job_id], "transition", "tracking job " + std::to_string(job_id), now);
  return jobs_[job_id];
}

Engine::Runtime& Engine::runtime(std::uint32_t job_id) {
  auto& slot = runtime_[job_id];
  if (!slot) slot = std::make_unique<Runtime>();
  return *slot;
}

void Engine::note(JobRecord& r, const std::string& kind, const std::string& text, double now) {
  pending_history_.push_back(HistoryLine{now, r.job_id, r.restart_count, kind, escape_controls(text)});
  const std::string line = "job " + std::to_string(r.job_id) + ": " + text;
  if (kind == "event") {
    log_debug(line);
  } else {
    log_info(line);
  }
}

bool Engine::transition(JobRecord& r, JobState to, const std::string& why, double now) {
  if (auto s = rec::check_transition(r.state, to); !s) {
    log_error("job " + std::to_string(r.job_id) + ": " + s.error() + " refused (" + why + ")");
    pending_history_.push_back(HistoryLine{now, r.job_id, r.restart_count, "error", s.error() + " refused: " + why});
    return false;
  }
  note(r, "transition", std::string(rec::to_string(r.state)) + " -> " + rec::to_string(to) + ": " + why, now);
  r.state = to;
  if (!why.empty() && (to == JobState::GaveUp || to == JobState::Cancelled || to == JobState::Completed ||
                       to == JobState::Requeueing || to == JobState::Relaunching || to == JobState::Gone)) {
    r.reason = why;
  }
  Runtime& rt = runtime(r.job_id);
  rt.terminal_since = rec::is_terminal(to) ? now : 0;
  rt.next_check = 0;
  mark_dirty(r, now);
  return true;
}

void Engine::new_run(JobRecord& r, std::uint32_t restart_count, double now) {
  note(r, "event", "Slurm runs the job again (restart count " + std::to_string(restart_count) + ")", now);
  r.restart_count = restart_count;
  r.submit_time = 0;  // Slurm gave the requeued run a new submit time: adopted at the next look
  r.failures.clear();
  r.reporters.clear();
  r.replaced_in_place.clear();
  r.steps.clear();
  r.relaunch_step.reset();
  r.ended_steps.reset();
  r.handover = false;
  r.end_reported = false;
  r.intent.reset();
  runtime(r.job_id) = Runtime{};
  if (r.clock.failed > 0 && r.clock.slurm_done == 0) r.clock.slurm_done = now;
  // A requeue counts once carried out: one that the user's scancel overtook never ran again. Not keyed on
  // slurm_done: the new run's batch step may report its start first, under the old restart count.
  if (r.clock.failed > 0 && r.clock.launched == 0 && r.clock.path == "requeue" && r.ending) {
    count_restart(*r.ending, "requeue");
  }
  if (r.state != JobState::Running) transition(r, JobState::Running, "run " + std::to_string(restart_count) + " started", now);
  mark_dirty(r, now);
}

void Engine::start_failing(JobRecord& r, double now) {
  r.clock = rec::RecoveryClock{};
  r.clock.failed = now;
  Runtime& rt = runtime(r.job_id);
  rt.probe_started = false;
  rt.probe_done = false;
  rt.evidence = rec::NodeEvidence{};
  rt.awaiting_ckpt_run = false;
  rt.next_check = now + config_.settle_s;  // let reports from live nodes arrive before probing the silent ones
  transition(r, JobState::Failing, "failure reported", now);
}

void Engine::mark_dirty(JobRecord& r, double now) {
  r.updated = now;
  dirty_.insert(r.job_id);
}

void Engine::flush() {
  if (dirty_.empty() && pending_history_.empty()) return;
  std::vector<const JobRecord*> records;
  for (auto id : dirty_) {
    if (const JobRecord* r = find(id)) records.push_back(r);
  }
  auto s = db_.save(records, pending_history_);
  if (!s) {
    // Keep them dirty: the next flush tries again. Nothing is sent to Slurm before its intent is saved.
    log_error(s.error());
    return;
  }
  dirty_.clear();
  pending_history_.clear();
}

void Engine::crash_point(const char* name) {
  if (crash_points_.count(name) == 0) return;
  // No flush: whatever the engine has not saved by now is lost, as in a real crash.
  log_warning(std::string("crash point '") + name + "' reached: SIGKILL (CKPT_CONTROLLER_CRASH_AT)");
  std::raise(SIGKILL);
}

void Engine::alert(const json& body) { alerts_.send(body.dump()); }

std::optional<SlurmJob> Engine::load_job(JobRecord& r, double now, bool& failed) {
  failed = false;
  auto slurm = backend_.load_job(r.job_id);
  if (!slurm) {
    failed = true;
    metrics_.add("ckpt_controller_slurm_errors_total", "op=\"load_job\"");
    log_warning(slurm.error());
    runtime(r.job_id).next_check = now + 0.5;
    return std::nullopt;
  }
  if (!*slurm) {
    if (r.state != JobState::Gone) {
      transition(r, JobState::Gone, "Slurm no longer knows the job", now);
    }
    return std::nullopt;
  }
  const SlurmJob& s = **slurm;
  check_reuse(r, s, now);
  r.uid = s.user_id;
  r.uid_known = true;
  r.gid = s.group_id;
  if (!s.nodes.empty()) r.nodes = s.nodes;
  if (!s.batch_host.empty()) r.batch_host = s.batch_host;
  return s;
}

}  // namespace ckpt::controller
