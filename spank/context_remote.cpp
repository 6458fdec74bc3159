// slurmstepd: resolve the job's settings, create its checkpoint dir and pick the checkpoint to resume from,
// then export CKPT_* to every task. File-system work runs in a child that has fully become the job's owner,
// so nothing is created or read with root's rights.
#include <grp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <poll.h>
#include <csignal>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

extern "C" {
#include <slurm/slurm.h>
}

#include "ckpt/parse.hpp"
#include "ckpt/env_contract.hpp"
#include "ckpt/posix.hpp"
#include "ckpt/recovery.hpp"
#include "ckpt/store.hpp"
#include "ckpt/trusted_dir.hpp"
#include "events.hpp"
#include "plugin_state.hpp"
#include "slurm_handles.hpp"

namespace ckpt::spank {

namespace {

struct JobIds {
  uid_t uid = 0;
  gid_t gid = 0;
  std::uint32_t job_id = 0;
  std::vector<gid_t> groups;  // the job's supplementary groups, as Slurm resolved them at submission
};

// The helper child may wait on a hung shared file system; the step is failed rather than held forever.
constexpr int kHelperTimeoutS = 120;
// The choice of a checkpoint stops looking after this long, so that a slow file system leaves it to the job's rank 0
// instead of failing the step.
constexpr int kResolveDeadlineS = kHelperTimeoutS / 2;

// The groups come from Slurm: initgroups() would query NSS in a child forked from a multithreaded slurmstepd.
bool become_user(const JobIds& ids) {
  return ckpt::posix::drop_privileges(ids.uid, ids.gid, ids.groups.data(), ids.groups.size());
}

struct ChildReport {
  std::string error;
  ckpt::store::ResumeChoice resume;
};

// The child's part: as the job's owner, open (and create) the dir safely, then pick the checkpoint to resume from.
std::string owner_work(const JobIds& ids, const std::string& dir, const std::vector<std::string>& trusted) {
  umask(077);
  if (!become_user(ids)) return "E cannot become uid " + std::to_string(ids.uid) + "\n";
  auto fd = ckpt::fs::open_trusted_dir(dir, ckpt::fs::TrustRules{ids.uid, trusted}, true);
  if (!fd) return "E " + fd.error() + "\n";
  close(*fd);
  // The store opens its root under the same rules (ckpt/trusted_dir.hpp).
  setenv(ckpt::env::name_of("trusted_dirs").c_str(), ckpt::join_trusted_prefixes(trusted).c_str(), 1);
  std::string out;
  try {
    // Manifests and records only: each rank checks the bytes it loads, so the checkpoint is read once, not once per
    // node and again per rank. The deadline bounds a slow file system; a hung one is the parent's timeout.
    ckpt::store::ResolveOptions options;
    options.checksums = false;
    options.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kResolveDeadlineS);
    auto choice = ckpt::store::resolve_resume(dir, options);
    for (const auto& line : choice.log) out += "L " + line + "\n";
    if (choice.timed_out) out += "L no choice within " + std::to_string(kResolveDeadlineS) + " s: rank 0 chooses\n";
    if (choice.step) out += "S " + std::to_string(*choice.step) + "\nP " + choice.path + "\n";
  } catch (...) {
    out = "E cannot read checkpoints in " + dir + "\n";
  }
  return out;
}

// Reads the child's report until EOF or the deadline (at most 1 MiB of it). False on timeout.
bool read_report(int fd, std::string& text) { return ckpt::posix::read_within(fd, kHelperTimeoutS, 1 << 20, text); }

// Runs the file-system work as the job's owner in a child and reads its report through a pipe.
ChildReport run_as_owner(const JobIds& ids, const std::string& dir, const std::vector<std::string>& trusted) {
  ChildReport report;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
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
    const std::string text = owner_work(ids, dir, trusted);
    // A report cut short reads as a failed helper in the parent.
    (void)ckpt::posix::write_all(fds[1], text.data(), text.size(), "the report");
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  bool finished = read_report(fds[0], text);
  close(fds[0]);
  if (!finished) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!finished) {
    report.error = "the checkpoint dir " + dir + " did not answer within " + std::to_string(kHelperTimeoutS) +
                   " s (a hung file system?)";
    return report;
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
      case 'S':
        if (auto step = ckpt::parse_uint(value)) report.resume.step = *step;
        break;
      case 'P': report.resume.path = value; break;
      default: break;
    }
  }
  return report;
}

// The job's supplementary groups as Slurm resolved them; empty when Slurm has none.
std::vector<gid_t> job_groups(spank_t sp) {
  gid_t* gids = nullptr;
  int count = 0;
  if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &count) != ESPANK_SUCCESS || gids == nullptr || count <= 0) {
    return {};
  }
  return std::vector<gid_t>(gids, gids + count);
}

// Seconds since the epoch at which the job's time limit ends; 0 when unknown or unlimited.
std::time_t job_end_time(std::uint32_t job_id) {
  auto info = ckpt::toolkit::load_jobs(job_id);
  if (!info || info->record_count == 0) return 0;
  return info->job_array[0].end_time;
}

// Slurm's KillWait in seconds (SIGTERM to SIGKILL when a step is cancelled); 0 when unknown. Last words size
// their deadline to fit inside it.
unsigned kill_wait_s() {
  auto conf = ckpt::toolkit::load_ctl_conf();
  return conf ? conf->kill_wait : 0;
}

// proctrack/linuxproc ends a step by walking slurmstepd's process tree, which loses a process whose parent died:
// an srun left running by a requeued batch script then outlives the run and, when it gives up, cancels the next
// run's step of the same id. Made a subreaper, the batch step's slurmstepd adopts such orphans, so the walk finds
// them and they end with the step.
void adopt_orphans_under_linuxproc() {
  if (&slurm_conf == nullptr || slurm_conf.proctrack_type == nullptr || std::strcmp(slurm_conf.proctrack_type, "proctrack/linuxproc") != 0) {
    return;
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0) {
    slurm_info("ckpt: ProctrackType=proctrack/linuxproc: this batch step adopts the processes its script orphans, "
               "so that Slurm ends them with it (proctrack/cgroup tracks them by itself)");
  } else {
    slurm_info("ckpt: cannot adopt orphaned processes under proctrack/linuxproc: %s", std::strerror(errno));
  }
}

void export_env(spank_t sp, const std::string& name, const std::string& value) {
  if (spank_setenv(sp, name.c_str(), value.c_str(), 1) != ESPANK_SUCCESS) log_error("cannot export " + name);
}

// What Slurm says of the job and this step besides the job's ids; each keeps its default when Slurm has none.
struct StepFacts {
  std::uint32_t nnodes = 1;
  std::uint32_t restarts = 0;
  std::uint32_t array_id = 0;
  std::uint32_t array_task = 0;
  std::uint32_t step_id = 0;
};

// Reads the job's ids and the step's facts from Slurm; false when the ids cannot be read. The batch step adopts
// its script's orphans on the way (adopt_orphans_under_linuxproc).
bool read_step(spank_t sp, JobIds& ids, StepFacts& step) {
  if (spank_get_item(sp, S_JOB_UID, &ids.uid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_GID, &ids.gid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_ID, &ids.job_id) != ESPANK_SUCCESS) {
    return false;
  }
  ids.groups = job_groups(sp);
  spank_get_item(sp, S_JOB_NNODES, &step.nnodes);
  if (spank_get_item(sp, S_JOB_STEPID, &step.step_id) == ESPANK_SUCCESS && step.step_id == ckpt::recovery::kBatchStep) {
    adopt_orphans_under_linuxproc();
  }
  step.restarts = restart_count(sp);
  spank_get_item(sp, S_JOB_STEPID, &step.step_id);
  if (spank_get_item(sp, S_JOB_ARRAY_ID, &step.array_id) == ESPANK_SUCCESS && step.array_id != 0) {
    spank_get_item(sp, S_JOB_ARRAY_TASK_ID, &step.array_task);
  }
  return true;
}

// The job as --ckpt-dir's expansion sees it.
ckpt::JobContext job_context(spank_t sp, const JobIds& ids, const StepFacts& step) {
  ckpt::JobContext job;
  job.user = user_name(ids.uid);
  job.job_id = std::to_string(ids.job_id);
  job.job_name = job_getenv(sp, "SLURM_JOB_NAME");
  job.array_task_id = step.array_id != 0 ? std::to_string(step.array_task) : "";
  job.node_count = step.nnodes;
  return job;
}

// The site's recovery controller, as the job's tasks and ckpt-run need it.
void export_controller_env(spank_t sp, const ckpt::SitePolicy& policy) {
  // Who continues a job stopped at its time limit: the site's recovery controller, or the job itself.
  export_env(sp, ckpt::env::name_of("requeue"), policy.controller.empty() ? "self" : "controller");
  // ckpt-run asks the site's controller, never one it guesses (a port on the node's loopback anyone may bind).
  if (ckpt::controller_is_url(policy.controller)) {
    export_env(sp, ckpt::env::name_of("controller_url"), policy.controller);
    if (const std::string socket = munge_socket(); !socket.empty()) {
      export_env(sp, ckpt::env::name_of("munge_socket"), socket);
    }
  }
}

// The run's restart count, the end of the job's time limit and Slurm's KillWait.
void export_time_env(spank_t sp, std::uint32_t job_id, std::uint32_t restarts) {
  export_env(sp, ckpt::env::name_of("restart_count"), std::to_string(restarts));
  if (std::time_t end = job_end_time(job_id); end > 0) {
    export_env(sp, ckpt::env::name_of("end_time"), std::to_string(end));
  }
  if (unsigned wait = kill_wait_s(); wait > 0) export_env(sp, ckpt::env::name_of("kill_wait"), std::to_string(wait) + "s");
}

// Logs how the checkpoint to resume from was chosen, and exports it (or clears it when there is none).
void export_resume_env(spank_t sp, std::uint32_t job_id, std::uint32_t step_id,
                       const ckpt::store::ResumeChoice& resume) {
  for (const auto& line : resume.log) slurm_info("ckpt: job %u.%u: %s", job_id, step_id, line.c_str());
  if (resume.step) {
    export_env(sp, ckpt::env::name_of("resume_step"), std::to_string(*resume.step));
    export_env(sp, ckpt::env::name_of("resume_path"), resume.path);
  } else {
    // A stale value from the submitting shell must not make a fresh job resume.
    spank_unsetenv(sp, ckpt::env::name_of("resume_step").c_str());
    spank_unsetenv(sp, ckpt::env::name_of("resume_path").c_str());
  }
}

}  // namespace

// A failure here is never returned to Slurm: slurmstepd would fail the launch and, for a batch step, slurmctld
// would drain the node ("batch job complete failure") for what is the user's mistake. The failure is kept and
// ends the job's tasks in task_init instead (spank/README.md).
int remote_user_init(spank_t sp) {
  auto& state = plugin_state();
  if (!state.first_error.empty()) return fail_tasks(state.first_error);
  if (!state.task_error.empty()) return 0;  // an option already failed the step: nothing to prepare
  if (!ckpt::checkpointing_enabled(state.user, state.policy)) return 0;  // pays nothing

  JobIds ids;
  StepFacts step;
  if (!read_step(sp, ids, step)) return fail_tasks("cannot read the job's ids");
  const ckpt::JobContext job = job_context(sp, ids, step);
  auto settings = ckpt::resolve_settings(state.user, state.policy, job);
  if (!settings) return fail_tasks(settings.error());
  // srun, sbatch and salloc told the user already (context_local.cpp); the node's log keeps it too.
  for (const auto& line : settings->notices) slurm_info("ckpt: job %u: %s", ids.job_id, line.c_str());

  const auto trusted = ckpt::trusted_prefixes_of(settings->dir, state.policy);
  ChildReport report = run_as_owner(ids, settings->dir, trusted);
  if (!report.error.empty()) return fail_tasks(report.error);

  for (const auto& [name, value] : ckpt::settings_environment(*settings)) export_env(sp, name, value);
  export_env(sp, ckpt::env::name_of("job_id"), job.job_id);
  export_env(sp, ckpt::env::name_of("trusted_dirs"), ckpt::join_trusted_prefixes(trusted));
  export_controller_env(sp, state.policy);
  export_time_env(sp, ids.job_id, step.restarts);
  export_resume_env(sp, ids.job_id, step.step_id, report.resume);
  report_job_start(sp, *settings);
  return 0;
}

int fail_tasks(const std::string& line) {
  auto& state = plugin_state();
  if (state.task_error.empty()) {
    state.task_error = line;
    // The node's log keeps it at info level: an error here would reach the job's output only from some
    // callbacks (not while options are read), and remote_task_init says it there exactly once.
    slurm_info("ckpt: the job's tasks will not start: %s", line.c_str());
  }
  return 0;
}

int remote_task_init(spank_t sp) {
  auto& state = plugin_state();
  if (state.task_error.empty()) return 0;
  // The task's stderr is the job's output: the user reads the reason there. Local task 0 says it for the node.
  int task = 0;
  if (spank_get_item(sp, S_TASK_ID, &task) != ESPANK_SUCCESS || task == 0) {
    dprintf(STDERR_FILENO, "ckpt: %s\n", state.task_error.c_str());
  }
  return -1;  // slurmstepd ends this task with exit code 1; the node stays in service
}

}  // namespace ckpt::spank
