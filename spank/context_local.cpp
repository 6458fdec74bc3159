// srun, sbatch and salloc: check the options against site policy before anything is submitted, so a bad value
// is refused with one line on the user's terminal.
#include <unistd.h>

#include "plugin_state.hpp"

namespace ckpt::spank {

int local_post_opt(spank_t sp) {
  auto& state = plugin_state();
  if (!state.first_error.empty()) {
    log_error(state.first_error);
    return -1;
  }
  if (!ckpt::checkpointing_enabled(state.user, state.policy)) return 0;

  // The job id and name may not be known yet; stand-ins keep the prefix check meaningful, and slurmstepd
  // checks the real expansion again.
  ckpt::JobContext job;
  job.user = user_name(getuid());
  job.job_id = job_getenv(sp, "SLURM_JOB_ID");
  if (job.job_id.empty()) job.job_id = "0";
  job.job_name = "job";
  auto settings = ckpt::resolve_settings(state.user, state.policy, job);
  if (!settings) {
    log_error(settings.error());
    return -1;
  }
  return 0;
}

}  // namespace ckpt::spank
