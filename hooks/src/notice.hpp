#pragma once
// Notices that end a run early: SIGTERM (preemption, scancel, the end of KillWait's warning), SIGUSR1 and SIGUSR2
// (sbatch --signal). The handler only bumps an atomic counter and records the signal; the training loop compares
// the counter with the value it saw at start, at every after_step.
#include <cstdint>

namespace ckpt::hooks::notice {

// Installs the handlers (process-wide, counted: the last release restores the previous dispositions).
void acquire_handlers();
void release_handlers();
// How many notice signals arrived since the process started.
std::uint64_t count();
// The signal number of the latest notice, 0 before the first.
int last_signal();

}  // namespace ckpt::hooks::notice
