#pragma once
// An event for the recovery controller, made on a compute node and sent there signed: ckpt-run's hand-overs and
// in-place recoveries, the heartbeat root's slow-node reports. (The plugin's events start from Slurm's view of the
// step instead, spank/events.cpp, and may be spooled.)
#include <cstdint>
#include <string>

#include "ckpt/recovery.hpp"
#include "ckpt/result.hpp"

namespace ckpt::toolkit {

// An event of `job` as sent from this node, by this process, now: the node from SLURMD_NODENAME ("unknown"
// without), the caller's uid, the run's restart count.
recovery::Event event_from_here(recovery::EventType type, std::uint32_t job, std::uint32_t restart_count);

// Signs the event with MUNGE (`munge_socket` empty: libmunge's default) and POSTs it to <url>/v1/events within
// `timeout_s`. The error says which failed: the signature, or the controller's answer.
Status post_event(const std::string& url, const recovery::Event& event, const std::string& munge_socket,
                  double timeout_s = 2);

}  // namespace ckpt::toolkit
