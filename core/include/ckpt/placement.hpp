#pragma once
// Where a relaunch inside the allocation places each rank (ckpt-run, srun --distribution=arbitrary). Pure.
//
// srun's default placement fills nodes in their order, so a relaunch without a lost node's place shifts every rank
// after it onto another node, where the node tier it left (hooks/README.md, "The node tier") is not its own: with
// ZeRO-1, every shifted rank reads its shard from the checkpoint dir. Kept placement moves only the lost ranks.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ckpt::placement {

// The failed step's placement (rank r ran on node_of_rank[r]), kept where it can be: every rank whose node is not
// `excluded` stays on it; the ranks of each excluded node move together to the first node of `alloc` (the
// allocation, in its order) that is neither excluded nor used by the step, excluded nodes taken in the order they
// first appear. nullopt when too few such nodes are left, or the placement is empty or names an empty node.
std::optional<std::vector<std::string>> keep_nodes(const std::vector<std::string>& node_of_rank,
                                                   const std::set<std::string>& excluded,
                                                   const std::vector<std::string>& alloc);

// ckpt-run --spares runs one step per node: the training nodes (group i holds ranks i*K .. i*K+K-1) and the spares.
struct NodeSteps {
  std::vector<std::string> training;  // group i's node
  std::vector<std::string> spares;
};

// The node steps of a launch: each group keeps its node in `training` unless that node is `excluded` (the first
// launch passes the first healthy nodes; a relaunch after the survivors gave up in place, the nodes the groups
// were launched on); an excluded node's group moves to the first node of `alloc` that is neither excluded nor
// training, as keep_nodes moves ranks, so that every other rank finds its node tier again. Up to `spares` of the
// nodes left, in `alloc`'s order, wait as spares. nullopt when a group finds no node, or `training` is empty.
std::optional<NodeSteps> node_steps(const std::vector<std::string>& training, const std::set<std::string>& excluded,
                                    const std::vector<std::string>& alloc, std::size_t spares);

// What a node step's end says of its node: a status other than 0 (done) and `gave_up` (75: its ranks gave up in
// place, or a stale rank left) is a crash or a kill. nullopt: still running.
struct StepEnd {
  std::string node;
  std::optional<int> status;
};

// The nodes a relaunch of the node steps leaves out after the survivors gave up in place: those the ranks they
// lost ran on last (`node_of_rank`), and those that lost all their ranks in an earlier recovery. Only where the
// survivors named no lost rank (a marker of an older version), those whose step ended as a crash or a kill: a step
// of several ranks ends killed once one of them gives up (srun ends the step), whatever its node's health, and a
// node whose ranks died is named by the lost ranks. Empty: nothing says which node failed (no relaunch: it would
// fail alike).
std::set<std::string> failed_nodes(const std::map<int, std::string>& node_of_rank, const std::vector<int>& lost,
                                   const std::set<std::string>& failed_before, const std::vector<StepEnd>& steps,
                                   int gave_up);

// SLURM_HOSTFILE's text for a placement: one node a line, in rank order.
std::string hostfile(const std::vector<std::string>& node_of_rank);

}  // namespace ckpt::placement
