#pragma once
// Is a node's slurmd there? A TCP connect to its port: refused or unanswered within the timeout means the node
// is dead (a crashed host, a killed slurmd). A frozen host whose kernel still answers looks alive here; Slurm's
// own SlurmdTimeout catches that case and the controller's reconciliation follows it.
#include <string>
#include <vector>

namespace ckpt::controller {

struct ProbeTarget {
  std::string node;
  std::string address;
  int port = 0;
};

// Probes all targets at once; returns the names of those that did not accept a connection in time.
// Targets without an address or port are not probed and not reported.
std::vector<std::string> probe_dead_nodes(const std::vector<ProbeTarget>& targets, double timeout_s);

}  // namespace ckpt::controller
