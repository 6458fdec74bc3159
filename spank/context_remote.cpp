// slurmstepd: resolve the job's settings, create its checkpoint dir and pick the checkpoint to resume from,
// then export CKPT_* to every task. File-system work runs in a child that has fully become the job's owner,
// so nothing is created or read with root's rights.
#include <grp.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

extern "C" {
#include <slurm/slurm.h>
}

#include "ckpt/parse.hpp"
#include "ckpt/store.hpp"
#include "events.hpp"
#include "plugin_state.hpp"

namespace ckpt::spank {

namespace {

struct JobIds {
  uid_t uid = 0;
  gid_t gid = 0;
  std::uint32_t job_id = 0;
};

// Creates every missing component of `dir` with mode 0700. Returns an error message or "".
std::string make_dirs(const std::string& dir) {
  std::string path;
  std::size_t pos = 1;
  while (pos <= dir.size()) {
    std::size_t next = dir.find('/', pos);
    if (next == std::string::npos) next = dir.size();
    path = dir.substr(0, next);
    if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
      return "cannot create " + path + ": " + std::strerror(errno);
    }
    pos = next + 1;
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) return "cannot stat " + dir + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  if (st.st_uid != getuid()) return dir + " is owned by uid " + std::to_string(st.st_uid) + ", not by the job's user";
  return {};
}

// Drops every privilege for good: supplementary groups, gid, uid. Returns false when it could not.
bool become_user(uid_t uid, gid_t gid, const std::string& name) {
  if (geteuid() != 0 && getuid() == 0 && seteuid(0) != 0) return false;  // privileges were only set aside
  if (geteuid() == 0) {
    if (name.empty() || initgroups(name.c_str(), gid) != 0) {
      if (setgroups(0, nullptr) != 0) return false;
    }
    if (setgid(gid) != 0 || setuid(uid) != 0) return false;
  }
  return getuid() == uid && geteuid() == uid;
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

struct ChildReport {
  std::string error;
  ckpt::store::ResumeChoice resume;
};

// Runs the file-system work as the job's owner in a child and reads its report through a pipe.
ChildReport run_as_owner(const JobIds& ids, const std::string& user, const std::string& dir) {
  ChildReport report;
  int fds[2];
  if (pipe(fds) != 0) {
    report.error = std::string("pipe: ") + std::strerror(errno);
    return report;
  }
  pid_t pid = fork();
  if (pid < 0) {
    report.error = std::string("fork: ") + std::strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return report;
  }
  if (pid == 0) {
    close(fds[0]);
    std::string out;
    umask(077);
    if (!become_user(ids.uid, ids.gid, user)) {
      out = "E cannot become uid " + std::to_string(ids.uid) + "\n";
    } else if (std::string err = make_dirs(dir); !err.empty()) {
      out = "E " + err + "\n";
    } else {
      try {
        auto choice = ckpt::store::resolve_resume(dir, true);
        for (const auto& line : choice.log) out += "L " + line + "\n";
        if (choice.step) out += "S " + std::to_string(*choice.step) + "\nP " + choice.path + "\n";
      } catch (...) {
        out = "E cannot read checkpoints in " + dir + "\n";
      }
    }
    write_all(fds[1], out);
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) report.error = "checkpoint dir helper failed";

  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.size() < 2) continue;
    std::string value = line.substr(2);
    switch (line[0]) {
      case 'E': report.error = value; break;
      case 'L': report.resume.log.push_back(value); break;
      case 'S': report.resume.step = std::stoull(value); break;
      case 'P': report.resume.path = value; break;
      default: break;
    }
  }
  return report;
}

// Seconds since the epoch at which the job's time limit ends; 0 when unknown or unlimited.
std::time_t job_end_time(std::uint32_t job_id) {
  job_info_msg_t* info = nullptr;
  if (slurm_load_job(&info, job_id, SHOW_ALL) != 0 || info == nullptr) return 0;
  std::time_t end = 0;
  if (info->record_count > 0) end = info->job_array[0].end_time;
  slurm_free_job_info_msg(info);
  return end;
}

// Slurm's KillWait in seconds (SIGTERM to SIGKILL when a step is cancelled); 0 when unknown. Last words size
// their deadline to fit inside it.
unsigned kill_wait_s() {
  slurm_conf_t* conf = nullptr;
  if (slurm_load_ctl_conf(0, &conf) != 0 || conf == nullptr) return 0;
  unsigned seconds = conf->kill_wait;
  slurm_free_ctl_conf(conf);
  return seconds;
}

void export_env(spank_t sp, const std::string& name, const std::string& value) {
  if (spank_setenv(sp, name.c_str(), value.c_str(), 1) != ESPANK_SUCCESS) log_error("cannot export " + name);
}

}  // namespace

int remote_user_init(spank_t sp) {
  auto& state = plugin_state();
  if (!state.first_error.empty()) {
    log_error(state.first_error);
    return -1;
  }
  if (!ckpt::checkpointing_enabled(state.user, state.policy)) return 0;  // pays nothing

  JobIds ids;
  std::uint32_t nnodes = 1, restarts = 0, array_id = 0, array_task = 0, step_id = 0;
  if (spank_get_item(sp, S_JOB_UID, &ids.uid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_GID, &ids.gid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_ID, &ids.job_id) != ESPANK_SUCCESS) {
    log_error("cannot read the job's ids");
    return -1;
  }
  spank_get_item(sp, S_JOB_NNODES, &nnodes);
  spank_get_item(sp, S_SLURM_RESTART_COUNT, &restarts);
  spank_get_item(sp, S_JOB_STEPID, &step_id);
  if (spank_get_item(sp, S_JOB_ARRAY_ID, &array_id) == ESPANK_SUCCESS && array_id != 0) {
    spank_get_item(sp, S_JOB_ARRAY_TASK_ID, &array_task);
  }

  ckpt::JobContext job;
  job.user = user_name(ids.uid);
  job.job_id = std::to_string(ids.job_id);
  job.job_name = job_getenv(sp, "SLURM_JOB_NAME");
  job.array_task_id = array_id != 0 ? std::to_string(array_task) : "";
  job.node_count = nnodes;
  auto settings = ckpt::resolve_settings(state.user, state.policy, job);
  if (!settings) {
    log_error(settings.error());
    return -1;
  }

  ChildReport report = run_as_owner(ids, job.user, settings->dir);
  if (!report.error.empty()) {
    log_error(report.error);
    return -1;
  }

  for (const auto& [name, value] : ckpt::settings_environment(*settings)) export_env(sp, name, value);
  export_env(sp, "CKPT_JOB_ID", job.job_id);
  // Steps of a requeued batch job report a restart count of 0; the job's environment has the real one.
  if (auto count = ckpt::parse_uint(job_getenv(sp, "SLURM_RESTART_COUNT")); count && *count > restarts) {
    restarts = static_cast<std::uint32_t>(*count);
  }
  export_env(sp, "CKPT_RESTART_COUNT", std::to_string(restarts));
  if (std::time_t end = job_end_time(ids.job_id); end > 0) export_env(sp, "CKPT_END_TIME", std::to_string(end));
  if (unsigned wait = kill_wait_s(); wait > 0) export_env(sp, "CKPT_KILL_WAIT", std::to_string(wait) + "s");

  for (const auto& line : report.resume.log) slurm_info("ckpt: job %u.%u: %s", ids.job_id, step_id, line.c_str());
  if (report.resume.step) {
    export_env(sp, "CKPT_RESUME_STEP", std::to_string(*report.resume.step));
    export_env(sp, "CKPT_RESUME_PATH", report.resume.path);
  } else {
    // A stale value from the submitting shell must not make a fresh job resume.
    spank_unsetenv(sp, "CKPT_RESUME_STEP");
    spank_unsetenv(sp, "CKPT_RESUME_PATH");
  }
  report_job_start(sp, *settings);
  return 0;
}

}  // namespace ckpt::spank
