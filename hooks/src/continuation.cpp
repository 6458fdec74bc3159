#include "continuation.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>

#include "ckpt/posix.hpp"
#include "ckpt/store.hpp"
#include "coordinator.hpp"
#include "log.hpp"

extern char** environ;

namespace ckpt::hooks {

namespace {

constexpr int kScontrolTimeoutS = 30;

// Stops in a row without progress, counting this one, from the file an earlier run of the same job left.
std::uint64_t stops_without_progress(const TimeLimitStop& stop, bool progress) {
  if (progress) return 0;
  auto text = store::read_control_file(stop.dir, kTimeLimitStopFile);
  if (!text || !*text) return 1;
  try {
    auto j = nlohmann::json::parse(**text);
    if (j.value("job_id", std::string()) != stop.job_id) return 1;
    return j.value("no_progress", std::uint64_t{0}) + 1;
  } catch (const std::exception&) {
    return 1;  // a damaged file counts as no history
  }
}

// Runs `scontrol requeue <job>` as the job's user; returns "" or what went wrong.
std::string requeue_job(const std::string& job_id) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return "pipe failed";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::string cmd = "scontrol", verb = "requeue", id = job_id;
  char* argv[] = {cmd.data(), verb.data(), id.data(), nullptr};
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, "scontrol", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return "cannot run scontrol: " + posix::errno_text(rc);
  }
  std::string output;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kScontrolTimeoutS);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char buf[512];
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output.size() < 4096) output.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  // EOF comes as scontrol exits; reap it within what is left of the deadline.
  int status = 0;
  pid_t done = 0;
  for (;;) {
    done = ::waitpid(pid, &status, WNOHANG);
    if (done < 0 && errno == EINTR) continue;
    if (done != 0 || std::chrono::steady_clock::now() >= deadline) break;
    ::usleep(10000);
  }
  if (done != pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return "scontrol requeue did not answer within " + std::to_string(kScontrolTimeoutS) + " s";
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  for (char& c : output) c = c == '\n' ? ' ' : c;
  return "scontrol requeue failed" + (output.empty() ? std::string() : ": " + output);
}

}  // namespace

void continue_after_time_limit(const TimeLimitStop& stop) {
  // A stale run (a newer run of the job has started) must neither record a stop nor requeue the job: that would
  // requeue the newer run. Its terminal commit is refused already; this covers a newer run starting since.
  const store::Fence fence{stop.job_id, stop.restart_count, stop.generation};
  if (auto refusal = fenced(stop.dir, fence)) {
    log::warn(0, "time-limit stop at step " + std::to_string(stop.step) + ": not continued: " + *refusal);
    return;
  }
  const bool progress = !stop.resume_step || stop.step > *stop.resume_step;
  const std::uint64_t no_progress = stops_without_progress(stop, progress);
  nlohmann::json record = {{"job_id", stop.job_id},         {"restart_count", stop.restart_count},
                           {"step", stop.step},             {"progress", progress},
                           {"no_progress", no_progress},    {"requeue", stop.requeue},
                           {"time", static_cast<std::int64_t>(std::time(nullptr))}};
  if (Status s = store::write_control_file(stop.dir, kTimeLimitStopFile, record.dump() + "\n", fence); !s) {
    log::error(0, "time-limit stop: " + s.error());
    if (fenced(stop.dir, fence)) return;
  }
  const std::string at = "time-limit stop at step " + std::to_string(stop.step) + ": ";
  if (stop.requeue == "off") {
    log::info(0, at + "CKPT_REQUEUE=off: the job ends here; resubmit it to go on");
    return;
  }
  if (no_progress > stop.max_restarts) {
    log::warn(0, at + std::to_string(no_progress) + " stops in a row without progress (CKPT_MAX_RESTARTS=" +
                     std::to_string(stop.max_restarts) + "): the job is not continued");
    return;
  }
  if (stop.requeue == "controller") {
    log::info(0, at + "the recovery controller continues the job in a new allocation");
    return;
  }
  if (stop.job_id.empty()) {
    log::warn(0, at + "not a Slurm job: nothing to requeue");
    return;
  }
  log::info(0, at + "the job requeues itself (scontrol requeue " + stop.job_id +
                   "); Slurm starts it again after its requeue delay");
  if (std::string err = requeue_job(stop.job_id); !err.empty()) log::error(0, at + err);
}

}  // namespace ckpt::hooks
