#pragma once
// Is a silent node's slurmd there? First a TCP connect to its port: a refusal seen twice means nothing listens (a
// killed slurmd, a host that rebooted), evidence enough to mark the node DOWN. A connect timeout is not: a slurmd
// whose backlog a job flooded, or a loaded host, times out too; such a node is only left out of the failed job's
// next run. A port that accepts proves only that the kernel runs: a frozen host or a hung slurmd accepts too.
// So a node that accepted is then asked Slurm RPCs (ask_slurmd) until it answers one or a window of
// hung_after seconds passes without an answer (ckpt::recovery::judge_rpc): that node is Hung.
#include <functional>
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
// probe_silent_nodes without an RPC check.
ckpt::recovery::NodeEvidence probe_twice(const std::vector<ProbeTarget>& targets, double timeout_s, double pause_s,
                                         std::string& summary);

// Asks `node`'s slurmd one RPC; true when slurmd answered within `timeout_s`.
using SlurmdAsk = std::function<bool(const std::string& node, double timeout_s)>;

struct ProbePlan {
  double tcp_timeout_s = 1.0;
  double pause_s = 0.2;      // between the two TCP rounds
  SlurmdAsk ask;             // empty: TCP only (a controller off the cluster has no slurm.conf to reach slurmd)
  double rpc_timeout_s = 1.0;
  double hung_after_s = 3;   // 0: no RPC check
};

// probe_twice, then the RPC check of every node whose port accepted, all nodes at once. `summary` says what
// each probe found ("n3 hung: port open, 0 of 3 RPCs answered in 4.5 s").
ckpt::recovery::NodeEvidence probe_silent_nodes(const std::vector<ProbeTarget>& targets, const ProbePlan& plan,
                                                std::string& summary);

// The real SlurmdAsk: runs `exe --ask-slurmd NODE` (ckpt-controller itself; libslurm in a process of its own, so
// a stuck call is killed at the timeout rather than left holding a thread) and reads its exit status.
bool ask_slurmd(const std::string& exe, const std::string& node, double timeout_s);

// The child's side: one REQUEST_ACCT_GATHER_ENERGY with an invalid context to `node`'s slurmd (slurm.conf gives
// its address). slurmd answers that at once with an error code, after checking the request's MUNGE credential,
// without touching any sensor or file. Exit 0: slurmd answered; 1: no answer (refused, timed out, unreadable).
int ask_slurmd_main(const std::string& node);

}  // namespace ckpt::controller
