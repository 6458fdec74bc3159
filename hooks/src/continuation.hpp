#pragma once
// What happens after a terminal checkpoint taken for the job's time limit: the training goes on in the job's next
// allocation. Rank 0 calls this on its persist thread once that checkpoint is committed; nothing else calls it.
//
// It writes <CKPT_DIR>/.control/time-limit-stop.json (the job, run, step and how many stops in a row made no
// progress), which the recovery controller reads as the job's owner when the run ends. Then, by CKPT_REQUEUE:
//   controller  the recovery controller requeues the job (it keeps the restart budget and the history);
//   self        the job requeues itself (`scontrol requeue`, as its user); Slurm starts it again after its
//               requeue delay;
//   off         the job ends here.
// A stop without progress (no step beyond the one the run resumed from) counts against CKPT_MAX_RESTARTS; past it,
// the job is not continued. Only the time limit continues a job: a signal may be the user's own scancel.
#include <cstdint>
#include <optional>
#include <string>

namespace ckpt::hooks {

struct TimeLimitStop {
  std::string dir;                           // CKPT_DIR
  std::string job_id;                        // empty outside Slurm
  std::uint64_t restart_count = 0;
  std::uint64_t step = 0;                    // the committed terminal checkpoint
  std::optional<std::uint64_t> resume_step;  // where this run started from
  std::uint64_t max_restarts = 3;
  std::string requeue = "self";              // controller, self or off
  std::uint64_t generation = 0;              // restart in place: the group's generation (fencing)
};

// The file the controller reads; its JSON keys are job_id, restart_count, step, progress, no_progress.
inline constexpr const char* kTimeLimitStopFile = "time-limit-stop.json";

// Records the stop and continues the job as described above; logs one line saying which path was taken.
void continue_after_time_limit(const TimeLimitStop& stop);

}  // namespace ckpt::hooks
