#pragma once
// The plugin's side of job events: tells the recovery controller (site policy `controller=`) that a step
// started, that a rank failed, or that the batch step ended. Each event is a JSON payload inside a MUNGE
// credential, POSTed over libcurl to an http(s) URL or dropped as a file into a spool directory.
// None of these functions throws, blocks longer than about a second, or fails the job: a controller that is
// down or slow costs at most a log line.
extern "C" {
#include <slurm/spank.h>
}

#include "ckpt/options.hpp"
#include "ckpt/recovery.hpp"

namespace ckpt::spank {

// The MUNGE socket Slurm's AuthInfo names, or "" for libmunge's default (exported to the ranks, which sign their
// own reports with it).
std::string munge_socket();

// Sends one event to `destination` (a URL or a spool dir). Logs failures at verbose level only.
void report_event(const std::string& destination, const ckpt::recovery::Event& event) noexcept;

// remote_user_init, once settings are resolved: a step of a checkpointing job started on this node.
void report_job_start(spank_t sp, const ckpt::Settings& settings) noexcept;
// slurm_spank_task_exit: a rank exited; reported when it failed (non-zero or killed). Returns 0.
int report_task_exit(spank_t sp) noexcept;
// slurm_spank_exit: the batch step of a checkpointing job ended on this node. Returns 0.
int report_step_exit(spank_t sp) noexcept;

}  // namespace ckpt::spank
