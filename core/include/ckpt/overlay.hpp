#pragma once
// The shape of a job's failure-detection and agreement network, as a pure function of the world size and of the
// ranks known to be gone. Every rank computes it alone from what it knows; no rank holds more than a constant
// number of links, whatever the world size.
//
// Ranks form groups of `group_size` consecutive ranks (8: the GPUs of one node under Slurm's block distribution,
// so a group's links stay inside a node). A group's leader is its lowest rank still alive; every other member
// links to its leader only. Leaders form a binary tree over the group ids (the parent of group g is (g-1)/2):
// a leader links to the leader of its nearest ancestor group that still has one, and to the leaders of the groups
// below it whose nearest live ancestor it is. When group 0 has no one left, the lowest live group is the root and
// the groups without a live ancestor hang below it. So a killed leader is replaced by the next rank of its group,
// and a dead node (a whole group) by its parent, in O(1) new links per affected rank.
//
// Reports travel up (`up`) to the root, which decides once; decisions travel down (`down`) and are flooded over
// every link with deduplication, which reaches every live rank even while views of the gone set still differ.
#include <optional>
#include <vector>

namespace ckpt::overlay {

inline constexpr int kGroupSize = 8;

struct Shape {
  int world_size = 1;
  int group_size = kGroupSize;

  int group_of(int rank) const { return rank / group_size; }
  int group_count() const { return (world_size + group_size - 1) / group_size; }
};

// Ranks known to be gone (died or left in order), indexed by rank.
using Gone = std::vector<char>;

// The lowest rank of group `g` not gone; nullopt when the whole group is gone.
std::optional<int> leader(const Shape& shape, int g, const Gone& gone);

// The root: the leader of the lowest group with a live rank; nullopt when every rank is gone.
std::optional<int> root(const Shape& shape, const Gone& gone);

struct Links {
  std::optional<int> up;  // where this rank's reports go; nullopt for the root (and for a gone rank)
  std::vector<int> down;  // the ranks whose reports come here, ascending
  bool is_root = false;
};

// The links of `rank` as it sees the job with `gone` (its own entry is ignored: a rank computes its links while
// alive). Members: up = their leader. Leaders: up = the leader of their nearest live ancestor group (or the root),
// down = their live members and the leaders of the groups that hang below them.
Links links_of(const Shape& shape, int rank, const Gone& gone);
// links_of(shape, rank, nothing gone).up in O(1): a member's group leader, a leader's parent group's leader, none
// for rank 0 (links_of copies the gone set: O(world size) a call).
std::optional<int> up_when_whole(const Shape& shape, int rank);

}  // namespace ckpt::overlay
