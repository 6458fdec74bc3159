// srun, sbatch and salloc: check the options against site policy before anything is submitted, so a bad value
// is refused with one line on the user's terminal. What only the node knows is checked again in slurmstepd, where
// a failure ends the job's tasks and never the node (context_remote.cpp).
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <vector>

#include "plugin_state.hpp"

namespace ckpt::spank {

namespace {

// This process's command line, one argument each.
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string current;
  for (char c : all) {
    if (c == '\0') {
      args.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  return args;
}

// The job name the command line gives (-J NAME, -JNAME, --job-name=NAME, --job-name NAME); empty when none.
std::string job_name_argument(const std::vector<std::string>& args) {
  std::string name;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if ((a == "-J" || a == "--job-name") && i + 1 < args.size()) {
      name = args[++i];
    } else if (a.rfind("--job-name=", 0) == 0) {
      name = a.substr(11);
    } else if (a.rfind("-J", 0) == 0 && a.size() > 2) {
      name = a.substr(2);
    }
  }
  return name;
}

// The job name %x will expand to, as far as it is known before submission: the command line's, then the one the
// environment names (SBATCH_JOB_NAME / SALLOC_JOB_NAME / SLURM_JOB_NAME inside an allocation). A stand-in when
// Slurm will pick it later (the script's name); slurmstepd checks the real expansion again.
std::string expected_job_name(spank_t sp) {
  if (auto name = job_name_argument(own_arguments()); !name.empty()) return name;
  for (const char* var : {"SBATCH_JOB_NAME", "SALLOC_JOB_NAME", "SLURM_JOB_NAME"}) {
    if (auto name = job_getenv(sp, var); !name.empty()) return name;
  }
  return "job";
}

}  // namespace

int local_post_opt(spank_t sp) {
  auto& state = plugin_state();
  if (!state.first_error.empty()) {
    log_error(state.first_error);
    return -1;
  }
  if (!ckpt::checkpointing_enabled(state.user, state.policy)) return 0;

  ckpt::JobContext job;
  job.user = user_name(getuid());
  job.job_id = job_getenv(sp, "SLURM_JOB_ID");
  if (job.job_id.empty()) job.job_id = "0";  // not assigned yet
  job.job_name = expected_job_name(sp);
  job.array_task_id = job_getenv(sp, "SLURM_ARRAY_TASK_ID");
  auto settings = ckpt::resolve_settings(state.user, state.policy, job);
  if (!settings) {
    log_error(settings.error());
    return -1;
  }
  // What the site's policy changed of the request (a memory tier above max_memory): one line each, on the terminal.
  for (const auto& line : settings->notices) log_user(line);
  return 0;
}

}  // namespace ckpt::spank
