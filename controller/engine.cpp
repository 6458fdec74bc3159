#include "engine.hpp"

#include <pwd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "ckpt/parse.hpp"
#include "log.hpp"
#include "probe.hpp"

namespace ckpt::controller {

namespace rec = ckpt::recovery;
using nlohmann::json;
using rec::EventType;
using rec::Intent;
using rec::SlurmState;

struct Engine::Request {
  enum class Kind { Event, Admin } kind = Kind::Event;
  Event event;
  std::string op, arg;
  std::uint32_t uid = 0;
  std::promise<Verdict> promise;
};

// What the engine keeps about a job between cycles but never persists: it is rebuilt after a restart.
struct Engine::Runtime {
  double next_check = 0;
  std::future<std::pair<rec::NodeEvidence, std::string>> probe;
  bool probe_started = false;
  bool probe_done = false;
  std::vector<std::string> dead;       // probes failed: left out of the job's next run
  std::vector<std::string> mark_down;  // refused twice: may be marked DOWN
  std::future<CheckpointView> checkpoints;  // read with the owner's permissions, off the engine's lock
  bool checkpoints_started = false;
  double reuse_checked = 0;      // when Slurm was last asked whether this id still names the same job
  double watch_until = 0;        // poll Slurm every cycle until then (a requeued job about to run)
  int expedite_retries = 0;
  double terminal_since = 0;     // when it reached a terminal state (for eviction from memory)
};

namespace {

constexpr double kCheckpointReadTimeout_s = 10;
constexpr std::size_t kRejectedPerJob = 20;
constexpr std::size_t kRejectedJobs = 1024;

std::string fmt_time(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", t);
  return buf;
}

std::string list(const std::vector<std::string>& v) { return v.empty() ? "(none)" : rec::join_nodes(v); }

std::optional<std::uint32_t> uid_of(const std::string& user) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return std::nullopt;
  return found->pw_uid;
}

// Like std::async, but the future's destructor does not wait: a record reset while a probe or a checkpoint read
// is still running must not hold the engine's lock until it ends.
template <class F>
auto run_detached(F f) -> std::future<decltype(f())> {
  auto promise = std::make_shared<std::promise<decltype(f())>>();
  auto future = promise->get_future();
  std::thread([promise, f = std::move(f)]() mutable {
    try {
      promise->set_value(f());
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  }).detach();
  return future;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

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
  return enqueue(request, wait_s);
}

Verdict Engine::admin(const std::string& op, const std::string& arg, std::uint32_t cred_uid, double wait_s) {
  auto request = std::make_shared<Request>();
  request->kind = Request::Kind::Admin;
  request->op = op;
  request->arg = arg;
  request->uid = cred_uid;
  return enqueue(request, wait_s);
}

Verdict Engine::enqueue(std::shared_ptr<Request> request, double wait_s) {
  auto future = request->promise.get_future();
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (queue_.size() >= 100000) return Verdict{503, "the controller's queue is full"};
    queue_.push_back(std::move(request));
  }
  queue_cv_.notify_one();
  if (wait_s <= 0) return Verdict{202, "queued"};
  if (future.wait_for(std::chrono::duration<double>(wait_s)) != std::future_status::ready) {
    return Verdict{202, "queued"};
  }
  return future.get();
}

void Engine::wake() { queue_cv_.notify_one(); }

void Engine::run(const std::atomic<bool>& stop) {
  while (!stop.load()) {
    cycle(now_s());
    std::unique_lock<std::mutex> lock(queue_mutex_);
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
    queue_cv_.wait_for(lock, std::chrono::duration<double>(wait), [&] { return !queue_.empty() || stop.load(); });
  }
}

void Engine::cycle(double now, bool force_reconcile) {
  std::vector<std::shared_ptr<Request>> requests;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    requests.swap(queue_);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& request : requests) {
    Verdict v;
    try {
      v = handle(*request, now);
    } catch (const std::exception& e) {
      v = Verdict{503, std::string("internal error: ") + e.what()};
      log_error(v.message);
    }
    flush();  // an accepted event is durable before it is acknowledged
    request->promise.set_value(v);
  }
  if (force_reconcile || now >= next_reconcile_) {
    reconcile(now);
    next_reconcile_ = now + config_.reconcile_s;
  }
  for (auto& [id, r] : jobs_) {
    Runtime& rt = runtime(id);
    if (now < rt.next_check) continue;
    try {
      switch (r.state) {
        case JobState::Failing: check_failing(r, now); break;
        case JobState::Requeueing: drive_intent(r, now); break;
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
    } catch (const std::exception& e) {
      log_error("job " + std::to_string(id) + ": internal error: " + e.what());
      rt.next_check = now + 1;
    }
  }
  flush();
  // Requeues decided in this cycle are durable now: start them without waiting for the next cycle.
  for (auto& [id, r] : jobs_) {
    if (r.state != JobState::Requeueing || now < runtime(id).next_check) continue;
    try {
      drive_intent(r, now);
    } catch (const std::exception& e) {
      log_error("job " + std::to_string(id) + ": internal error: " + e.what());
    }
  }
  flush();
  if (now >= next_prune_) {
    next_prune_ = now + 3600;
    if (auto gone = db_.prune(now - config_.history_max_age_s); !gone) {
      log_error(gone.error());
    } else if (*gone > 0) {
      log_info("pruned " + std::to_string(*gone) + " history lines and finished records older than " +
               ckpt::format_duration(static_cast<std::uint64_t>(config_.history_max_age_s)));
    }
  }
  // Forget finished jobs after an hour in memory; their records stay in the database.
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
    // Events for made-up ids cost one lookup per id per 10 s, however many arrive.
    if (unknown_jobs_.known_unknown(e.job_id, now)) return Verdict{403, unknown};
    auto slurm = backend_.load_job(e.job_id);
    if (!slurm) return Verdict{503, "cannot ask Slurm who owns job " + std::to_string(e.job_id) + ": " + slurm.error()};
    if (!*slurm) {
      unknown_jobs_.remember(e.job_id, now);
      return Verdict{403, unknown};
    }
    owner = (*slurm)->user_id;
    if (r != nullptr) {
      check_reuse(*r, **slurm, now);
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
  JobRecord* existing = find(e.job_id);
  if (existing == nullptr) {
    if (auto stored = db_.load_job(e.job_id); stored && *stored) {
      jobs_[e.job_id] = **stored;
      existing = &jobs_[e.job_id];
    }
  }
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
  const std::string what = std::string(rec::to_string(e.type)) + " from " + e.node +
                           (e.step_id == rec::kBatchStep ? " (batch step)" : " (step " + std::to_string(e.step_id) + ")");
  if (!auth.ok()) {
    const bool exists = existing != nullptr ||
                        (auth.http_status == 403 && auth.message.find("unknown to Slurm") == std::string::npos);
    reject(e, uid, auth, exists, now);
    return auth;
  }
  metrics_.add("ckpt_controller_events_total", "type=\"" + std::string(rec::to_string(e.type)) + "\",result=\"accepted\"");

  JobRecord& r = get_or_create(e.job_id, now);
  if (e.restart_count < r.restart_count) {
    note(r, "event", "stale " + what + " of run " + std::to_string(e.restart_count) + " ignored", now);
    return Verdict{202, "stale"};
  }
  if (e.restart_count > r.restart_count) new_run(r, e.restart_count, now);

  switch (e.type) {
    case EventType::JobStart: {
      // The checkpoint dir is read by the controller: only the plugin running as root (or SlurmUser) in
      // slurmstepd may name it. A user could name any path in an event signed as themselves.
      if (!e.ckpt_dir.empty() && e.ckpt_dir != r.ckpt_dir) {
        if (trusted_uids_.count(uid) != 0) {
          r.ckpt_dir = e.ckpt_dir;
          r.trusted_dirs = e.trusted_dirs;
        } else {
          log_limited(LogLevel::Warning, "ckpt-dir",
                      "job " + std::to_string(e.job_id) + ": ckpt_dir '" + e.ckpt_dir.substr(0, 256) + "' from uid " +
                          std::to_string(uid) + " ignored: only the plugin (root or SlurmUser) names a job's checkpoint dir");
          note(r, "event", "ckpt_dir from uid " + std::to_string(uid) + " ignored (not signed by root or SlurmUser)", now);
        }
      }
      if (e.max_restarts) r.budget.max_restarts = *e.max_restarts;
      if (e.needs_checkpoint) r.needs_checkpoint = true;
      auto& step = r.steps[e.step_id];
      step.in_allocation = step.in_allocation || e.in_allocation;
      if (!contains(step.nodes, e.node)) step.nodes.push_back(e.node);
      note(r, "event", what + (e.in_allocation ? " under ckpt-run" : ""), now);
      if (r.clock.failed > 0 && r.clock.slurm_done == 0 && r.clock.path == "requeue") r.clock.slurm_done = now;
      const bool relaunched = r.state == JobState::Relaunching && e.step_id != rec::kBatchStep && r.relaunch_step &&
                              e.step_id > *r.relaunch_step;
      if (relaunched) {
        r.relaunch_step.reset();
        r.failures.clear();
        r.reporters.clear();
        runtime(r.job_id) = Runtime{};
        transition(r, JobState::Running, "ckpt-run relaunched the step as step " + std::to_string(e.step_id), now);
      } else if (r.state == JobState::Failing && e.step_id != rec::kBatchStep && !r.failures.empty() &&
                 e.step_id > r.failures.front().step_id && !r.handover) {
        // The batch script started a new step on its own: it handled the failure.
        r.failures.clear();
        r.reporters.clear();
        runtime(r.job_id) = Runtime{};
        transition(r, JobState::Running, "the job started step " + std::to_string(e.step_id) + " after the failure", now);
      }
      if (r.clock.failed > 0 && r.clock.launched == 0 && e.step_id != rec::kBatchStep &&
          r.state == JobState::Running) {
        r.clock.launched = now;
        if (r.clock.slurm_done == 0) r.clock.slurm_done = now;
        const double latency = now - r.clock.failed;
        metrics_.observe_recovery(r.clock.path.empty() ? "requeue" : r.clock.path, latency);
        note(r, "recovery",
             "running again after " + fmt_time(latency) + " s (" + r.clock.path + "): decision " +
                 fmt_time(r.clock.decided - r.clock.failed) + " s, slurm " +
                 fmt_time(r.clock.slurm_done - r.clock.decided) + " s, launch " +
                 fmt_time(r.clock.launched - r.clock.slurm_done) + " s",
             now);
      }
      break;
    }
    case EventType::TaskExit: {
      rec::TaskFailure f;
      f.step_id = e.step_id;
      f.node = e.node;
      f.rank = e.rank;
      f.exit_code = e.exit_code;
      f.signal = e.signal;
      f.time = now;
      if (r.failures.size() < 4096) r.failures.push_back(f);
      if (!contains(r.reporters, e.node)) r.reporters.push_back(e.node);
      note(r, "event",
           what + ": rank " + std::to_string(e.rank) +
               (e.signal ? " killed by signal " + std::to_string(e.signal) : " exited " + std::to_string(e.exit_code)),
           now);
      if (r.state == JobState::Running || r.state == JobState::Pending ||
          (r.state == JobState::Relaunching && r.relaunch_step && e.step_id > *r.relaunch_step)) {
        if (r.state == JobState::Pending) transition(r, JobState::Running, "a rank of run " +
                                                     std::to_string(r.restart_count) + " reported", now);
        start_failing(r, now);
      }
      break;
    }
    case EventType::JobEnd:
      note(r, "event", what, now);
      r.end_reported = true;
      runtime(r.job_id).next_check = 0;
      break;
    case EventType::Handover:
      note(r, "event", what + ": ckpt-run hands over to a requeue" + (e.detail.empty() ? "" : " (" + e.detail + ")"), now);
      r.handover = true;
      if (r.state == JobState::Relaunching) {
        // The failure that led to the relaunch decision is the same one: keep its clock.
        Runtime& rt = runtime(r.job_id);
        rt.probe_started = false;
        rt.probe_done = false;
        transition(r, JobState::Failing, "ckpt-run cannot relaunch inside the allocation", now);
      } else if (r.state == JobState::Running) {
        start_failing(r, now);
      }
      runtime(r.job_id).next_check = 0;
      break;
  }
  mark_dirty(r, now);
  return Verdict{202, "accepted"};
}

Verdict Engine::handle_admin(const std::string& op, const std::string& arg, std::uint32_t uid, double now) {
  if (admin_uids_.count(uid) == 0 && trusted_uids_.count(uid) == 0) {
    return Verdict{403, "uid " + std::to_string(uid) + " may not " + op + " (admin_users)"};
  }
  if (op == "release") {
    auto id = ckpt::parse_uint(arg);
    if (!id || *id == 0 || *id > 0xffffffffULL) return Verdict{400, "release: bad job id '" + arg + "'"};
    JobRecord* r = find(static_cast<std::uint32_t>(*id));
    if (r == nullptr) {
      auto stored = db_.load_job(static_cast<std::uint32_t>(*id));
      if (stored && *stored) {
        jobs_[(*stored)->job_id] = **stored;
        r = &jobs_[(*stored)->job_id];
      }
    }
    if (r == nullptr) return Verdict{404, "job " + arg + " is not tracked"};
    if (r->state != JobState::GaveUp) {
      return Verdict{409, "job " + arg + " is " + rec::to_string(r->state) + "; only a job the controller gave up on "
                          "can be released"};
    }
    auto slurm = backend_.load_job(r->job_id);
    if (!slurm) return Verdict{503, slurm.error()};
    if (!*slurm) return Verdict{404, "job " + arg + " is unknown to Slurm"};
    const SlurmJob& s = **slurm;
    if (s.state == SlurmState::Running) return Verdict{409, "job " + arg + " is running"};
    Intent i;
    auto next = db_.next_id();
    i.id = next ? *next : 0;
    i.created = now;
    i.reason = "released by uid " + std::to_string(uid);
    i.exclude = rec::active_bad_nodes(r->bad_nodes, now);
    if (s.state == SlurmState::Pending) {
      i.requeue = false;  // already queued (held): only release and expedite it
      i.expected_restart = s.restart_count;
    } else {
      if (!caps_.requeue) return Verdict{409, std::string("the ") + backend_.name() + " backend cannot requeue a job"};
      i.requeue = true;
      i.expected_restart = r->restart_count + 1;
    }
    r->budget.without_progress = 0;
    r->intent = i;
    r->clock = rec::RecoveryClock{};
    r->clock.failed = now;
    r->clock.decided = now;
    r->clock.path = "requeue";
    transition(*r, JobState::Requeueing, i.reason + ": budget reset", now);
    flush();
    drive_intent(*r, now);
    return Verdict{200, "job " + arg + " released"};
  }
  if (op == "forget-node") {
    std::vector<std::string> jobs;
    for (auto& [id, r] : jobs_) {
      if (rec::forget_bad_node(r.bad_nodes, arg)) {
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
  return Verdict{400, "unknown request '" + op + "'"};
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
  pending_history_.push_back(HistoryLine{now, r.job_id, r.restart_count, kind, text});
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
  r.steps.clear();
  r.relaunch_step.reset();
  r.handover = false;
  r.end_reported = false;
  r.intent.reset();
  runtime(r.job_id) = Runtime{};
  if (r.clock.failed > 0 && r.clock.slurm_done == 0) r.clock.slurm_done = now;
  if (r.state != JobState::Running) transition(r, JobState::Running, "run " + std::to_string(restart_count) + " started", now);
  mark_dirty(r, now);
}

void Engine::start_failing(JobRecord& r, double now) {
  r.clock = rec::RecoveryClock{};
  r.clock.failed = now;
  Runtime& rt = runtime(r.job_id);
  rt.probe_started = false;
  rt.probe_done = false;
  rt.dead.clear();
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
  Intent& i = *r.intent;
  const std::string id = std::to_string(r.job_id);
  if (s.state == SlurmState::Cancelled) {
    r.intent.reset();
    transition(r, JobState::Cancelled, "cancelled by its user while being requeued", now);
    return;
  }
  for (int guard = 0; guard < 8; ++guard) {
    switch (i.phase) {
      case Intent::Phase::MarkDown:
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
        break;
      case Intent::Phase::Requeue:
        if (s.restart_count >= i.expected_restart) {
          note(r, "action", "Slurm's restart count is " + std::to_string(s.restart_count) + ": the requeue is done", now);
          if (i.not_before == 0) i.not_before = rec::credential_safe_start(now);
        } else if (i.requeue) {
          auto status = backend_.requeue(r.job_id);
          if (!status) {
            metrics_.add("ckpt_controller_slurm_errors_total", "op=\"requeue\"");
            bool again_failed = false;
            auto again = load_job(r, now, again_failed);
            if (again_failed || !again || again->restart_count < i.expected_restart) {
              give_up(r, "Slurm refused the requeue: " + status.error(), again ? &*again : nullptr, now);
              return;
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
            return;
          }
          rt.next_check = now + 0.25;  // Slurm requeues it once it declares the node down
          return;
        }
        i.phase = Intent::Phase::WaitCompleting;
        mark_dirty(r, now);
        flush();
        break;
      case Intent::Phase::WaitCompleting:
        if (s.restart_count >= i.expected_restart && (s.state == SlurmState::Running || rec::is_finished(s.state))) {
          i.phase = Intent::Phase::Done;  // Slurm already runs it again
          break;
        }
        if ((s.completing || s.state != SlurmState::Pending || now < i.not_before) &&
            now - i.created < config_.completing_timeout_s) {
          // StartTime=now sent while the job is still completing would be overwritten when the requeue completes
          // (BeginTime = now + 121 s); sent in the second the old credential was revoked, the new run is killed.
          rt.next_check = std::max(now + 0.05, std::min(i.not_before, now + 1));
          return;
        }
        i.phase = Intent::Phase::Update;
        mark_dirty(r, now);
        break;
      case Intent::Phase::Update: {
        if (s.state != SlurmState::Pending) {  // it started already (or ended): nothing to expedite
          i.phase = Intent::Phase::Done;
          break;
        }
        auto status = backend_.expedite(r.job_id, i.exclude, s.held);
        if (!status) {
          metrics_.add("ckpt_controller_slurm_errors_total", "op=\"update\"");
          note(r, "action", "could not update the job: " + status.error(), now);
          if (now - i.created > config_.completing_timeout_s) {
            i.phase = Intent::Phase::Done;  // it will start after Slurm's own delay
            break;
          }
          rt.next_check = now + 0.5;
          return;
        }
        crash_point("updated");
        note(r, "action", std::string("StartTime=now ExcNodeList=") + rec::join_nodes(i.exclude) +
                              (s.held ? " and released" : ""), now);
        i.phase = Intent::Phase::Done;
        break;
      }
      case Intent::Phase::Done: {
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
        return;
      }
    }
  }
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

// ---- views ---------------------------------------------------------------------------------------------------------

namespace {

json job_summary(const rec::JobRecord& r, double now) {
  return json{{"job_id", r.job_id},
              {"state", rec::to_string(r.state)},
              {"restart_count", r.restart_count},
              {"restarts", r.budget.restarts},
              {"restarts_without_progress", r.budget.without_progress},
              {"max_restarts", r.budget.max_restarts},
              {"progress_step", r.budget.progress_step ? json(*r.budget.progress_step) : json(nullptr)},
              {"excluded_nodes", rec::active_bad_nodes(r.bad_nodes, now)},
              {"ending", r.ending ? rec::to_string(*r.ending) : ""},
              {"reason", r.reason},
              {"updated", r.updated}};
}

}  // namespace

rec::ReadAccess Engine::read_access(std::optional<std::uint32_t> uid) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<std::uint32_t> privileged = trusted_uids_;
  privileged.insert(admin_uids_.begin(), admin_uids_.end());
  return rec::read_access(uid, privileged);
}

json Engine::status_json(double now, const rec::ReadAccess& access) {
  std::lock_guard<std::mutex> lock(mutex_);
  json counts = json::object();
  json gave_up = json::array();
  std::map<std::string, json> bad;
  for (const auto& [id, r] : jobs_) {
    counts[rec::to_string(r.state)] = counts.value(rec::to_string(r.state), 0) + 1;
    if (!access.may_see(r.uid, r.uid_known)) continue;
    if (r.state == JobState::GaveUp) gave_up.push_back(json{{"job_id", id}, {"reason", r.reason}, {"time", r.updated}});
    for (const auto& b : r.bad_nodes) {
      if (b.expires <= now) continue;
      json& entry = bad[b.node];
      if (entry.is_null()) entry = json{{"node", b.node}, {"reason", b.reason}, {"expires", b.expires}, {"jobs", json::array()}};
      entry["jobs"].push_back(id);
      entry["expires"] = std::max(entry["expires"].get<double>(), b.expires);
    }
  }
  json bad_list = json::array();
  for (auto& [n, j] : bad) bad_list.push_back(j);
  return json{{"backend", backend_.name()},
              {"can_requeue", caps_.requeue},
              {"can_change_nodes", caps_.node_state},
              {"uptime_s", now - started_},
              {"jobs", counts},
              {"gave_up", gave_up},
              {"excluded_nodes", bad_list}};
}

json Engine::jobs_json(double now, const rec::ReadAccess& access) {
  std::lock_guard<std::mutex> lock(mutex_);
  json out = json::array();
  for (const auto& [id, r] : jobs_) {
    if (access.may_see(r.uid, r.uid_known)) out.push_back(job_summary(r, now));
  }
  return out;
}

std::optional<json> Engine::job_json(std::uint32_t job_id, double now, const rec::ReadAccess& access) {
  std::lock_guard<std::mutex> lock(mutex_);
  const JobRecord* r = find(job_id);
  std::optional<JobRecord> stored;
  if (r == nullptr) {
    auto loaded = db_.load_job(job_id);
    if (!loaded || !*loaded) return std::nullopt;
    stored = **loaded;
    r = &*stored;
  }
  if (!access.may_see(r->uid, r->uid_known)) return std::nullopt;
  json j = json::parse(rec::to_json(*r));
  j["summary"] = job_summary(*r, now);
  j["exclude"] = rec::active_bad_nodes(r->bad_nodes, now);
  return j;
}

Result<std::optional<json>> Engine::history_json(std::uint32_t job_id, const rec::ReadAccess& access) {
  std::lock_guard<std::mutex> lock(mutex_);
  const JobRecord* r = find(job_id);
  std::optional<JobRecord> stored;
  if (r == nullptr) {
    auto loaded = db_.load_job(job_id);
    if (!loaded) return Error{loaded.error()};
    if (!*loaded) return std::optional<json>{};
    stored = **loaded;
    r = &*stored;
  }
  if (!access.may_see(r->uid, r->uid_known)) return std::optional<json>{};
  flush();
  auto lines = db_.history(job_id);
  if (!lines) return Error{lines.error()};
  if (auto it = rejected_.find(job_id); it != rejected_.end()) {
    lines->insert(lines->end(), it->second.begin(), it->second.end());
    std::stable_sort(lines->begin(), lines->end(), [](const HistoryLine& a, const HistoryLine& b) { return a.time < b.time; });
  }
  json out = json::array();
  for (const auto& h : *lines) {
    out.push_back(json{{"time", h.time}, {"restart_count", h.restart_count}, {"kind", h.kind}, {"text", h.text}});
  }
  return std::optional<json>(std::move(out));
}

std::string Engine::metrics_text(double now) {
  std::string out = metrics_.render();
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, int> counts;
  std::set<std::string> excluded;
  for (const auto& [id, r] : jobs_) {
    ++counts[rec::to_string(r.state)];
    for (const auto& n : rec::active_bad_nodes(r.bad_nodes, now)) excluded.insert(n);
  }
  out += "# HELP ckpt_controller_jobs Jobs tracked, by recovery state\n# TYPE ckpt_controller_jobs gauge\n";
  for (const char* state : {"running", "failing", "relaunching", "requeueing", "pending", "completed", "cancelled",
                            "gave-up", "gone"}) {
    out += std::string("ckpt_controller_jobs{state=\"") + state + "\"} " + std::to_string(counts[state]) + "\n";
  }
  out += "# HELP ckpt_controller_excluded_nodes Nodes currently excluded from at least one job\n"
         "# TYPE ckpt_controller_excluded_nodes gauge\n";
  out += "ckpt_controller_excluded_nodes " + std::to_string(excluded.size()) + "\n";
  out += "# HELP ckpt_controller_node_excluded A node currently excluded from at least one job\n"
         "# TYPE ckpt_controller_node_excluded gauge\n";
  for (const auto& n : excluded) out += "ckpt_controller_node_excluded{node=\"" + n + "\"} 1\n";
  return out;
}

std::size_t Engine::tracked_jobs() {
  std::lock_guard<std::mutex> lock(mutex_);
  return jobs_.size();
}

}  // namespace ckpt::controller
