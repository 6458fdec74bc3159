#pragma once
// Slurm's messages, owned: each is freed with its own free function on every path out of the caller. Loaders
// return null when Slurm gave nothing (slurm_get_errno() says why). Header-only: the plugin resolves libslurm's
// symbols from slurmstepd, the programs link libslurm themselves.
#include <cstdint>
#include <memory>

extern "C" {
#include <slurm/slurm.h>
}

namespace ckpt::toolkit {

struct JobInfoFree {
  void operator()(job_info_msg_t* m) const { slurm_free_job_info_msg(m); }
};
using JobInfo = std::unique_ptr<job_info_msg_t, JobInfoFree>;

struct CtlConfFree {
  void operator()(slurm_conf_t* c) const { slurm_free_ctl_conf(c); }
};
using CtlConf = std::unique_ptr<slurm_conf_t, CtlConfFree>;

// One job's record (SHOW_ALL); job_id 0: every job's (slurm_load_jobs).
inline JobInfo load_jobs(std::uint32_t job_id = 0) {
  job_info_msg_t* m = nullptr;
  const int rc = job_id == 0 ? slurm_load_jobs(0, &m, SHOW_ALL) : slurm_load_job(&m, job_id, SHOW_ALL);
  JobInfo owned(m);
  if (rc != SLURM_SUCCESS) owned.reset();
  return owned;
}

// slurmctld's configuration as it serves it.
inline CtlConf load_ctl_conf() {
  slurm_conf_t* c = nullptr;
  const int rc = slurm_load_ctl_conf(0, &c);
  CtlConf owned(c);
  if (rc != SLURM_SUCCESS) owned.reset();
  return owned;
}

}  // namespace ckpt::toolkit
