#pragma once
// Is a node's slurmd there? A TCP connect to its port. A refusal seen twice means nothing listens (a killed
// slurmd, a host that rebooted): evidence enough to mark the node DOWN. A timeout is not: a slurmd whose backlog a
// job flooded, or a loaded host, times out too; such a node is only left out of the failed job's next run. A frozen
// host whose kernel still answers looks alive here; Slurm's own SlurmdTimeout catches that case and the
// controller's reconciliation follows it.
#include <string>
#include <utility>
#include <vector>

#include "ckpt/controller_limits.hpp"

namespace ckpt::controller {

struct ProbeTarget {
  std::string node;
  std::string address;
  int port = 0;
};

// Probes all targets at once: each is alive (it accepted), refused (RST: nothing listens), unreachable (no route,
// no such address) or timed out. Targets without an address or port are not probed and not reported.
std::vector<std::pair<std::string, ckpt::recovery::ProbeResult>> probe_nodes(const std::vector<ProbeTarget>& targets,
                                                                             double timeout_s);

// Two rounds, as ckpt::recovery::weigh_probes wants them: the nodes the first round did not find alive are probed
// again after `pause_s` (a refusal must be seen twice to count). `summary` says what each probe found.
ckpt::recovery::NodeEvidence probe_twice(const std::vector<ProbeTarget>& targets, double timeout_s, double pause_s,
                                         std::string& summary);

}  // namespace ckpt::controller
