#pragma once
// State shared by the plugin's callbacks within one process (srun, sbatch/salloc or one slurmstepd).
// Slurm loads the plugin once per process and calls option callbacks without a handle, hence globals.
#include <array>
#include <optional>
#include <string>
#include <vector>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/spank.h>
// slurmstepd's parsed slurm.conf. libslurm exports it but no public header declares it; weak, so that a
// process without it leaves it null (check &slurm_conf before reading it).
extern slurm_conf_t slurm_conf __attribute__((weak));
}

#include "ckpt/options.hpp"

namespace ckpt::spank {

struct PluginState {
  ckpt::SitePolicy policy;       // from plugstack.conf, parsed in slurm_spank_init
  ckpt::JobOptions user;         // --ckpt-* values given for this job
  std::string first_error;       // the first option error, reported again if Slurm ignores the callback's rc
  std::string task_error;        // slurmstepd: why this step's tasks must not run (see fail_tasks)
  // Options whose value srun inherited from sbatch's environment; an explicit srun value replaces them.
  std::array<bool, ckpt::kOptionCount> inherited{};
};

PluginState& plugin_state();

// Registers the --ckpt-* options from the core's option table. Returns 0 or -1.
int register_options(spank_t sp);

// The environment of the job: spank_getenv in slurmstepd, getenv in srun/sbatch. Empty when unset.
std::string job_getenv(spank_t sp, const char* name);

// The run's restart count (SLURM_RESTART_COUNT): the larger of Slurm's item and the job's environment. Steps of a
// requeued job see the item as 0, and the environment has the real count; the larger is never stale.
std::uint32_t restart_count(spank_t sp);

// The user's name for %u, from the job's uid; empty when unknown.
std::string user_name(uid_t uid);

// Logs one line for the user ("ckpt: ...").
void log_user(const std::string& line);
// Logs one failure ("ckpt: ...") through slurm_error.
void log_error(const std::string& line);

// Local (srun) and allocator (sbatch/salloc) context: checks the merged options against site policy.
int local_post_opt(spank_t sp);

// Remote (slurmstepd) context, privileges dropped: resolves settings, creates CKPT_DIR as the job's owner,
// finds the checkpoint to resume from and exports CKPT_* to every task.
int remote_user_init(spank_t sp);

// Remote context: keeps `line` as the reason this step's tasks must fail and logs it once in the node's log. Returns 0: a failure
// returned from user_init would make slurmctld drain the node for the user's mistake.
int fail_tasks(const std::string& line);

// slurmd's job prolog and epilog, as root: remove the job's node tier on this node (ckpt/memtier.hpp) as the job's
// user; at the prolog, one an earlier job with the same id left. Return 0 always: a failing prolog or epilog drains
// the node.
int job_prolog(spank_t sp, const std::vector<std::string>& args);
int job_epilog(spank_t sp, const std::vector<std::string>& args);

// Remote context, in each task as its user: when the step was failed, prints the reason to the job's output
// (local task 0) and returns -1, which makes slurmstepd end the task with exit code 1.
int remote_task_init(spank_t sp);

}  // namespace ckpt::spank
