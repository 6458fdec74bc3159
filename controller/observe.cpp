#include "observe.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "ckpt/controller_limits.hpp"
#include "ckpt/format.hpp"
#include "ckpt/posix.hpp"
#include "ckpt/recovery_plan.hpp"
#include "ckpt/store.hpp"
#include "http.hpp"
#include "log.hpp"

namespace ckpt::controller {
using namespace ckpt::toolkit;  // MUNGE, HTTP

namespace {

const std::map<std::string, std::string>& help() {
  static const std::map<std::string, std::string> h = {
      {"ckpt_controller_restarts_total", "Restarts made or seen, by ending and path"},
      {"ckpt_controller_gave_up_total", "Jobs the controller stopped restarting, by ending"},
      {"ckpt_controller_lost_work_seconds_total", "Training time lost to failures (since the newest checkpoint)"},
      {"ckpt_controller_events_total", "Events received, by type and result"},
      {"ckpt_controller_excluded_nodes_total", "Nodes excluded from a job after a failure or a slow-node report"},
      {"ckpt_controller_slow_node_events_total", "Slow-node reports recorded, by action (report, exclude)"},
      {"ckpt_controller_slurm_errors_total", "Slurm calls that failed, by operation"},
  };
  return h;
}

std::string phase_labels(const std::string& path, const std::string& phase) {
  return "path=\"" + path + "\",phase=\"" + phase + "\"";
}

}  // namespace

Metrics::Metrics() {
  using ckpt::recovery::Ending;
  for (Ending e : {Ending::NodeFailure, Ending::TaskCrash, Ending::TimeLimit, Ending::Preemption, Ending::OutOfMemory,
                   Ending::UserCancel, Ending::CleanExit, Ending::DoNotRestart}) {
    const std::string ending = std::string("ending=\"") + ckpt::recovery::to_string(e) + "\"";
    counters_["ckpt_controller_gave_up_total"][ending] = 0;
    if (!ckpt::recovery::restartable(e)) continue;
    for (const char* path : {"requeue", "relaunch", "in-place"}) {
      counters_["ckpt_controller_restarts_total"][ending + ",path=\"" + path + "\""] = 0;
    }
  }
  for (const char* action : {ckpt::recovery::kSlowNodeReport, ckpt::recovery::kSlowNodeExclude}) {
    counters_["ckpt_controller_slow_node_events_total"][std::string("action=\"") + action + "\""] = 0;
  }
  for (const char* path : {"requeue", "relaunch", "in-place"}) {
    recovery_[path].buckets.assign(recovery_buckets().size(), 0);
    for (const char* phase : ckpt::recovery::recovery_phase_names(path)) {
      phases_[phase_labels(path, phase)].buckets.assign(phase_buckets().size(), 0);
    }
  }
}

void Metrics::add(const std::string& name, const std::string& labels, double value) {
  std::lock_guard<std::mutex> lock(mutex_);
  counters_[name][labels] += value;
}

void Metrics::observe_into(Histogram& h, const std::vector<double>& bounds, double seconds) {
  if (h.buckets.empty()) h.buckets.assign(bounds.size(), 0);
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (seconds <= bounds[i]) ++h.buckets[i];
  }
  ++h.count;
  h.sum += seconds;
}

void Metrics::observe_recovery(const std::string& path, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  observe_into(recovery_[path], recovery_buckets(), seconds);
}

void Metrics::observe_phase(const std::string& path, const std::string& phase, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  observe_into(phases_[phase_labels(path, phase)], phase_buckets(), seconds);
}

void Metrics::render_histogram(std::string& out, const std::string& name, const std::string& labels,
                               const Histogram& h, const std::vector<double>& bounds) {
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    out += name + "_bucket{" + labels + ",le=\"" + format_number_exact(bounds[i]) + "\"} " +
           std::to_string(h.buckets[i]) + "\n";
  }
  out += name + "_bucket{" + labels + ",le=\"+Inf\"} " + std::to_string(h.count) + "\n";
  out += name + "_sum{" + labels + "} " + format_number_exact(h.sum) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(h.count) + "\n";
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  for (const auto& [name, h] : help()) {
    out += "# HELP " + name + " " + h + "\n# TYPE " + name + " counter\n";
    auto it = counters_.find(name);
    if (it == counters_.end()) {
      out += name + " 0\n";
      continue;
    }
    for (const auto& [labels, value] : it->second) {
      out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + format_number_exact(value) + "\n";
    }
  }
  const std::string hist = "ckpt_controller_recovery_seconds";
  out += "# HELP " + hist + " Time from the first failure report to the job's next run starting\n";
  out += "# TYPE " + hist + " histogram\n";
  for (const auto& [path, h] : recovery_) {
    render_histogram(out, hist, "path=\"" + path + "\"", h, recovery_buckets());
  }
  const std::string phases = "ckpt_controller_recovery_phase_seconds";
  out += "# HELP " + phases + " Time one phase of a recovery took, by path and phase\n";
  out += "# TYPE " + phases + " histogram\n";
  for (const auto& [labels, h] : phases_) render_histogram(out, phases, labels, h, phase_buckets());
  return out;
}

Alerts::Alerts(std::string url, double timeout_s, int attempts, std::chrono::milliseconds first_retry)
    : url_(std::move(url)), timeout_s_(timeout_s), attempts_(std::max(1, attempts)), first_retry_(first_retry) {
  if (!url_.empty()) thread_ = std::thread([this] { worker(); });
}

Alerts::~Alerts() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Alerts::send(const std::string& json) {
  if (url_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.size() >= 1000) {
      log_warning("alert queue is full; dropping an alert");
      return;
    }
    queue_.push_back(json);
  }
  cv_.notify_one();
}

void Alerts::worker() {
  for (;;) {
    std::string body;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      body = std::move(queue_.front());
      queue_.pop_front();
    }
    deliver(body);
  }
}

void Alerts::deliver(const std::string& body) {
  HttpRequest request;
  request.method = "POST";
  request.url = url_;
  request.body = body;
  request.timeout_s = timeout_s_;
  auto wait = first_retry_;
  for (int attempt = 1;; ++attempt) {
    HttpResponse response = http_request(request);
    if (response.ok()) return;
    const std::string why = response.error.empty() ? "HTTP " + std::to_string(response.status) : response.error;
    const bool may_pass = !response.error.empty() || response.status == 429 || response.status >= 500;
    if (!may_pass || attempt >= attempts_) {
      log_warning("webhook " + url_ + " failed: " + why + (may_pass ? "; given up after " + std::to_string(attempt) +
                                                                          " attempts" : "; not retried"));
      return;
    }
    log_warning("webhook " + url_ + " failed: " + why + "; retrying in " + std::to_string(wait.count()) + " ms");
    std::unique_lock<std::mutex> lock(mutex_);
    if (cv_.wait_for(lock, wait, [&] { return stop_; })) {
      log_warning("webhook " + url_ + ": stopping; an alert was not delivered");
      return;
    }
    wait = std::min<std::chrono::milliseconds>(wait * 2, std::chrono::seconds(60));
  }
}

namespace {

constexpr const char* kTimeLimitStopFile = "time-limit-stop.json";  // written by the hooks' rank 0

// The time-limit stop a run recorded; nullopt when there is none or it cannot be read (then the run's end counts
// as clean, as it would without the record).
std::optional<ckpt::recovery::TimeLimitStop> read_time_limit_stop(const std::string& dir) {
  auto text = ckpt::store::read_control_file(dir, kTimeLimitStopFile);
  if (!text || !*text) return std::nullopt;
  auto j = nlohmann::json::parse(**text, nullptr, false);
  if (!j.is_object() || !j["job_id"].is_string() || !j["restart_count"].is_number_unsigned() ||
      !j["step"].is_number_unsigned()) {
    return std::nullopt;
  }
  ckpt::recovery::TimeLimitStop stop;
  stop.job_id = j["job_id"].get<std::string>();
  const auto count = j["restart_count"].get<std::uint64_t>();
  if (count > ckpt::recovery::kMaxRestartCount) return std::nullopt;
  stop.restart_count = static_cast<std::uint32_t>(count);
  stop.step = j["step"].get<std::uint64_t>();
  return stop;
}

nlohmann::json stop_json(const std::optional<ckpt::recovery::TimeLimitStop>& stop) {
  if (!stop) return nullptr;
  return {{"job_id", stop->job_id}, {"restart_count", stop->restart_count}, {"step", stop->step}};
}

}  // namespace

CheckpointView read_checkpoints(const std::string& dir) {
  CheckpointView view;
  if (dir.empty()) return view;
  try {
    auto entries = ckpt::store::scan(dir);
    if (!entries) {
      view.error = entries.error();
      return view;
    }
    view.time_limit_stop = read_time_limit_stop(dir);
    if (auto lost = ckpt::store::read_control_file(dir, ckpt::recovery::kPeerLostFile); lost && *lost) {
      view.peer_lost = ckpt::recovery::parse_peer_lost(**lost);
    }
    auto candidates = ckpt::store::resume_candidates(*entries);
    if (candidates.empty()) return view;
    view.newest_complete = candidates.front();
    for (const auto& e : *entries) {
      if (e.step != candidates.front()) continue;
      view.newest_wall_time = e.manifest ? e.manifest->wall_time : e.mtime;
    }
  } catch (const std::exception& ex) {
    view.error = ex.what();
  }
  return view;
}

namespace {

constexpr rlim_t kReaderMemoryBytes = rlim_t{1} << 30;
std::mutex g_reader_mutex;
std::string g_reader_exe;

// Reaps a child that may be stuck in an uninterruptible read (a hung file system) without blocking the caller.
void reap(pid_t pid) {
  for (int i = 0; i < 20; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) != 0) return;
    usleep(5000);
  }
  try {
    std::thread([pid] { waitpid(pid, nullptr, 0); }).detach();
  } catch (const std::system_error&) {
    waitpid(pid, nullptr, 0);  // out of threads: this reader worker waits for it (SIGKILLed already)
  }
}

}  // namespace

void set_checkpoint_reader(const std::string& exe) {
  std::lock_guard<std::mutex> lock(g_reader_mutex);
  g_reader_exe = exe;
}

int checkpoint_reader_main(const std::string& dir, const std::string& trusted_dirs) {
  // The store opens the dir under the rules the plugin created it with (ckpt/trusted_dir.hpp).
  if (!trusted_dirs.empty()) ::setenv("CKPT_TRUSTED_DIRS", trusted_dirs.c_str(), 1);
  CheckpointView v = read_checkpoints(dir);
  nlohmann::json j = {{"newest_complete", v.newest_complete ? nlohmann::json(*v.newest_complete) : nlohmann::json(nullptr)},
                      {"newest_wall_time", v.newest_wall_time},
                      {"time_limit_stop", stop_json(v.time_limit_stop)},
                      {"peer_lost", v.peer_lost ? nlohmann::json::parse(ckpt::recovery::to_json(*v.peer_lost))
                                                : nlohmann::json(nullptr)},
                      {"error", v.error}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

namespace {

// The groups a reader running as `uid` gets: the user's groups from the password and group databases, else `gid`
// alone.
std::vector<gid_t> groups_of(std::uint32_t uid, std::uint32_t gid) {
  std::vector<gid_t> groups(1, gid);
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    int n = 256;
    groups.assign(static_cast<std::size_t>(n), 0);
    if (getgrouplist(found->pw_name, gid, groups.data(), &n) < 0) n = std::min(n, 256);
    groups.resize(static_cast<std::size_t>(std::max(n, 0)));
    if (groups.empty()) groups.push_back(gid);
  }
  return groups;
}

// Forks `exe --read-checkpoints DIR TRUSTED_DIRS` as uid/gid with `groups`, its stdout on `out_fd`; returns fork's
// result. Everything the child needs is prepared before the fork: between fork and exec it calls only
// async-signal-safe functions, and exits 126 when it cannot drop privileges.
pid_t spawn_reader(const std::string& exe, const std::string& dir, const std::string& trusted_dirs, std::uint32_t uid,
                   std::uint32_t gid, const std::vector<gid_t>& groups, int out_fd) {
  const std::string flag = "--read-checkpoints";
  char* const argv[] = {const_cast<char*>(exe.c_str()), const_cast<char*>(flag.c_str()), const_cast<char*>(dir.c_str()),
                        const_cast<char*>(trusted_dirs.c_str()), nullptr};
  // The reader runs as the job's owner, who may read its environment: it gets none of the daemon's (a
  // SLURM_JWT there would be theirs to take), only a PATH and the C locale.
  static const char* const kReaderEnv[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", nullptr};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out_fd, STDOUT_FILENO);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, STDIN_FILENO);
      dup2(null, STDERR_FILENO);
    }
    // A reader that a hostile dir drives into a loop or a huge allocation stops at 1 GiB and its 10 s timeout.
    const rlimit memory{kReaderMemoryBytes, kReaderMemoryBytes};
    (void)setrlimit(RLIMIT_AS, &memory);
    if (!ckpt::posix::drop_privileges(uid, gid, groups.data(), groups.size())) _exit(126);
    execve(exe.c_str(), argv, const_cast<char* const*>(kReaderEnv));
    _exit(127);
  }
  return pid;
}

// The view the reader printed (checkpoint_reader_main's JSON).
CheckpointView parse_reader_answer(const std::string& text) {
  CheckpointView view;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    view.error = "the checkpoint reader's answer is not JSON";
    return view;
  }
  if (j["newest_complete"].is_number_unsigned()) view.newest_complete = j["newest_complete"].get<std::uint64_t>();
  if (j["newest_wall_time"].is_number()) view.newest_wall_time = j["newest_wall_time"].get<double>();
  if (j["error"].is_string()) view.error = j["error"].get<std::string>();
  if (const auto& t = j["time_limit_stop"]; t.is_object() && t["job_id"].is_string() &&
                                            t["restart_count"].is_number_unsigned() && t["step"].is_number_unsigned()) {
    ckpt::recovery::TimeLimitStop stop;
    stop.job_id = t["job_id"].get<std::string>();
    stop.restart_count = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(t["restart_count"].get<std::uint64_t>(), ckpt::recovery::kMaxRestartCount));
    stop.step = t["step"].get<std::uint64_t>();
    view.time_limit_stop = stop;
  }
  if (const auto& lost = j["peer_lost"]; lost.is_object()) view.peer_lost = ckpt::recovery::parse_peer_lost(lost.dump());
  return view;
}

}  // namespace

CheckpointView read_checkpoints_as(const std::string& dir, const std::string& trusted_dirs, std::uint32_t uid,
                                   std::uint32_t gid, double timeout_s) {
  CheckpointView view;
  if (dir.empty()) return view;
  if (geteuid() != 0) return read_checkpoints(dir);  // unprivileged already: nothing to drop
  std::string exe;
  {
    std::lock_guard<std::mutex> lock(g_reader_mutex);
    exe = g_reader_exe;
  }
  if (exe.empty()) {
    view.error = "no reader to drop privileges with; not read as root";
    return view;
  }
  const std::vector<gid_t> groups = groups_of(uid, gid);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    view.error = std::string("cannot create a pipe: ") + std::strerror(errno);
    return view;
  }
  pid_t pid = spawn_reader(exe, dir, trusted_dirs, uid, gid, groups, out[1]);
  close(out[1]);
  if (pid < 0) {
    close(out[0]);
    view.error = std::string("cannot fork: ") + std::strerror(errno);
    return view;
  }
  std::string text;
  const bool timed_out = !ckpt::posix::read_within(out[0], timeout_s, 65536, text);
  close(out[0]);
  if (timed_out) {
    kill(pid, SIGKILL);
    reap(pid);
    view.error = "reading " + dir + " as uid " + std::to_string(uid) + " took longer than " +
                 std::to_string(static_cast<int>(timeout_s)) + " s; stopped";
    return view;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    view.error = WIFEXITED(status) && WEXITSTATUS(status) == 126
                     ? "cannot drop privileges to uid " + std::to_string(uid) + " to read " + dir
                     : "the checkpoint reader failed on " + dir;
    return view;
  }
  return parse_reader_answer(text);
}

}  // namespace ckpt::controller
