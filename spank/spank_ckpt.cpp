// spank_ckpt.so: the Slurm side of slurm-ckpt. Each callback is a thin switch on the context; the work lives in
// context_local.cpp (srun, sbatch, salloc) and context_remote.cpp (slurmstepd). No exception leaves this file.
#include <string>
#include <vector>

#include "events.hpp"
#include "plugin_state.hpp"

// Everything is hidden by default; these are the only symbols Slurm may see.
#define CKPT_SPANK_EXPORT __attribute__((visibility("default")))

// SPANK_PLUGIN() inside extern "C" gives these internal linkage in C++, and Slurm then refuses the plugin.
extern "C" {
extern CKPT_SPANK_EXPORT const char plugin_name[];
extern CKPT_SPANK_EXPORT const char plugin_type[];
extern CKPT_SPANK_EXPORT const unsigned int plugin_version;
extern CKPT_SPANK_EXPORT const unsigned int spank_plugin_version;
const char plugin_name[] = "ckpt";
const char plugin_type[] = "spank";
const unsigned int plugin_version = SLURM_VERSION_NUMBER;
const unsigned int spank_plugin_version = 1;
}

namespace {

template <class Fn>
int guarded(Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    ckpt::spank::log_error(std::string("internal error: ") + e.what());
  } catch (...) {
    ckpt::spank::log_error("internal error");
  }
  return -1;
}

}  // namespace

extern "C" {

CKPT_SPANK_EXPORT int slurm_spank_init(spank_t sp, int ac, char** av) {
  return guarded([&] {
    auto& state = ckpt::spank::plugin_state();
    std::vector<std::string> args(av, av + ac);
    auto policy = ckpt::parse_site_policy(args);
    if (!policy) {
      // Fail closed: a typo in site policy must not silently run jobs without it.
      ckpt::spank::log_error(policy.error());
      return -1;
    }
    state.policy = *policy;
    switch (spank_context()) {
      case S_CTX_LOCAL:
      case S_CTX_ALLOCATOR:
      case S_CTX_REMOTE: return ckpt::spank::register_options(sp);
      default: return 0;
    }
  });
}

CKPT_SPANK_EXPORT int slurm_spank_init_post_opt(spank_t sp, int /*ac*/, char** /*av*/) {
  return guarded([&] {
    switch (spank_context()) {
      case S_CTX_LOCAL:
      case S_CTX_ALLOCATOR: return ckpt::spank::local_post_opt(sp);
      default: return 0;
    }
  });
}

CKPT_SPANK_EXPORT int slurm_spank_user_init(spank_t sp, int /*ac*/, char** /*av*/) {
  if (!spank_remote(sp)) return 0;
  // Never -1 from here: slurmctld drains a batch job's node when user_init fails (spank/README.md).
  if (guarded([&] { return ckpt::spank::remote_user_init(sp); }) != 0) {
    guarded([&] { return ckpt::spank::fail_tasks("internal error while preparing the job"); });
  }
  return 0;
}

CKPT_SPANK_EXPORT int slurm_spank_task_init(spank_t sp, int /*ac*/, char** /*av*/) {
  return guarded([&] { return spank_remote(sp) ? ckpt::spank::remote_task_init(sp) : 0; });
}

CKPT_SPANK_EXPORT int slurm_spank_task_exit(spank_t sp, int /*ac*/, char** /*av*/) {
  return guarded([&] { return spank_remote(sp) ? ckpt::spank::report_task_exit(sp) : 0; });
}

// Never -1: a failing prolog or epilog drains the node. slurm_spank_init is not called in these contexts: the site
// policy comes with the arguments.
CKPT_SPANK_EXPORT int slurm_spank_job_prolog(spank_t sp, int ac, char** av) {
  (void)guarded([&] { return ckpt::spank::job_prolog(sp, std::vector<std::string>(av, av + ac)); });
  return 0;
}

CKPT_SPANK_EXPORT int slurm_spank_job_epilog(spank_t sp, int ac, char** av) {
  (void)guarded([&] { return ckpt::spank::job_epilog(sp, std::vector<std::string>(av, av + ac)); });
  return 0;
}

CKPT_SPANK_EXPORT int slurm_spank_exit(spank_t sp, int /*ac*/, char** /*av*/) {
  return guarded([&] { return spank_remote(sp) ? ckpt::spank::report_step_exit(sp) : 0; });
}

}  // extern "C"
