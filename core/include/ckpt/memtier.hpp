#pragma once
// The memory tier: every rank keeps its latest memory checkpoint in its own staging, and a copy of it in the host
// memory of a partner rank on another node, so that one node's death loses no shard (the survivors' last words
// write a dead rank's shard from the copy its partner holds: ckpt/last_words.hpp). Pure: who pairs with whom,
// what a set of node deaths loses, and what the tier costs per rank; hooks/src/memory_tier.* moves the bytes.
//
// Who calls what: every rank computes its own partner and wards with stride_partner()/stride_wards(), rank
// arithmetic alone (no rank needs the others' node names, so the cost is flat in the world size), and checks the
// partner's published node; pair_ranks() is the same rule over a node list, for layouts that are not uniform
// (tests, the docs' tables). A rank sizes its buffers with tier_bytes() (and a holder checks each copy's header
// with it); where refuse() gives a line, the tier is off for the whole job (one rank that cannot keep its copies
// leaves its ward's shard nowhere else): every rank is told, rank 0 logs the line, and the job checkpoints to the
// file system alone. lost_after() answers "what would these deaths cost" (tests, the simulator, the docs' tables).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::memtier {

// Who keeps whose copy. Both vectors have one entry per rank.
struct Pairing {
  std::vector<int> partner;            // rank -> the rank that holds its copy; -1 when no node can hold one
  std::vector<std::vector<int>> wards;  // rank -> the ranks whose copies it holds, ascending
};

// Pairs ranks across nodes. node_of_rank[r] is rank r's node name. Nodes are numbered in the sorted order of their
// names; a rank's local index is its position among its node's ranks in rank order. Rank r on node i with local
// index j sends its copy to the rank with local index j % count on node (i + distance) % N, count being that
// node's number of ranks: nodes with fewer ranks hold more copies, but every rank has a partner. No rank is ever
// its own node's partner: with one node, or a distance that is a multiple of N, every partner is -1. A distance
// below 1 counts as 1 (the next node), so a bad setting still pairs across nodes rather than not at all.
Pairing pair_ranks(const std::vector<std::string>& node_of_rank, int distance);

// The ranks, ascending, whose shard no live memory holds after every node in `lost_nodes` died: their own node is
// lost and so is their partner's node, or they have no partner. A rank missing from pairing.partner counts as
// having none. Names in lost_nodes that no rank runs on are ignored.
std::vector<int> lost_after(const Pairing& pairing, const std::vector<std::string>& node_of_rank,
                            const std::vector<std::string>& lost_nodes);

// The host memory one rank's tier needs: its own staging, and for each ward the copy it keeps plus the next copy
// being received beside it (the kept one is replaced only once the new one verified). Saturates at 2^64 - 1.
std::uint64_t tier_bytes(std::uint64_t staging_bytes, std::uint64_t largest_ward_bytes, std::size_t wards);

// Why the tier cannot run within CKPT_MEMORY's `max_bytes` per rank, where `rank` needs `need`: one line naming
// the rank and both sizes ("the memory tier is off for the whole job: rank 3 needs 3.0 GiB ... but CKPT_MEMORY
// allows 2.0 GiB per rank: ..."); nullopt when `need` fits.
std::optional<std::string> refuse(std::uint64_t need, std::uint64_t max_bytes, int rank);

// What CKPT_MEMORY_INTERVAL=auto chooses from, as rank 0 measures it.
struct AutoIntervalInputs {
  double busy_s = 0;  // one memory checkpoint's busy time: the snapshot copy, the send and the partner's answer
  double cost_s = 0;  // what one costs training: its stall plus its interference (longer steps beside the copy)
  double step_s = 0;  // a step's compute
  double mtbf_s = 0;  // the job's MTBF; 0: unknown
};

// CKPT_MEMORY_INTERVAL=auto, in steps: Young's interval √(2·cost·MTBF), which weighs the memory checkpoints' cost
// against the work a failure loses since the last one (as CKPT_INTERVAL=auto weighs the periodic ones), but never
// fewer steps than cover the busy time with a quarter to spare: a snapshot that waits for the previous copy stalls
// training (back-pressure). Without a measured cost or MTBF, the keep-up bound alone: the most frequent interval that
// does not wait. At least 1, at most `max_steps`; 1 where nothing is measured yet (step_s <= 0).
std::uint64_t auto_interval(const AutoIntervalInputs& in, std::uint64_t max_steps = 10000);

// The keep-up bound of auto_interval alone: the fewest steps whose compute covers `busy_s` with a quarter to spare.
std::uint64_t keep_up_interval(double busy_s, double step_s, std::uint64_t max_steps = 10000);

// pair_ranks' rule where every node runs `per_node` ranks, filled in rank order (srun's block distribution,
// torchrun's local world), so that node i holds ranks [i * per_node, (i + 1) * per_node): the partner is
// rank + distance * per_node, modulo the world. -1 with one node, a distance that is a multiple of the node count,
// or a world that is not a whole number of nodes. A distance below 1 counts as 1.
int stride_partner(int rank, int world, int per_node, int distance);
// The ranks whose copies `rank` keeps under stride_partner: the one rank whose partner it is (none where there is
// no partner).
std::vector<int> stride_wards(int rank, int world, int per_node, int distance);
// The ranks per node of a Slurm task count list ("4", "4(x3)", "4(x2),4"), when every node has as many; nullopt
// for counts that differ or anything else.
std::optional<int> uniform_tasks_per_node(std::string_view text);

// The node tier (hooks/src/node_tier.hpp): a rank's staging in files of a node-local memory file system (the site's
// node_dir=, BuiltinDefaults::node_dir), so that a process ckpt-run relaunches in the same job restores from them.
// Its dir under the node dir, per user and job: the hooks make it (0700, the user's own), the plugin removes it when
// the job ends on the node.
inline constexpr const char* kNodeDirPrefix = "slurm-ckpt.";
std::string node_dir_name(unsigned uid, std::string_view job);  // "slurm-ckpt.<uid>.<job>"

}  // namespace ckpt::memtier
