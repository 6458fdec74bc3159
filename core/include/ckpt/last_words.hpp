#pragma once
// "Last words": when part of a DP×TP×PP job dies, decide whether the survivors can write a terminal checkpoint,
// at which step, and who writes which state key. Pure; the hooks library gathers the reports and does the writes.
//
// The survivors hold a complete copy of the network when, for every pipeline stage, at least one data-parallel
// replica still has its whole tensor-parallel group alive, not caught in the middle of an update, and agreeing on
// the step. With ZeRO-1 every optimizer shard must be covered too, and shard optim/pp<p>/tp<t>/dp<d> is held only
// by rank (d, t, p), so that rank must be alive, not mid-update and at the agreed step. The step is the common
// step of the qualifying groups (the newest one that gives full coverage); replicas at another step are
// disqualified. The plan is checked with the store's own completeness function, decide_commit(Kind::Terminal):
// when coverage is not complete, nobody writes anything.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/store.hpp"

namespace ckpt::last_words {

// What one rank said when the failure was caught. A rank that sent no report counts as dead.
struct RankReport {
  store::RankCoord coord;
  bool alive = false;
  bool mid_update = false;  // between before_update and after_step
  std::uint64_t step = 0;   // the step it is on
};

// The decision, with its reasons for the log.
struct Plan {
  bool write = false;      // true: the writers write, then the checkpoint is committed as Kind::Terminal
  std::uint64_t step = 0;  // the agreed step; meaningful when write is true
  std::map<int, std::vector<std::string>> writers;  // rank -> the state keys it writes; empty unless write
  std::vector<int> replica_of_stage;  // per stage: the dp index whose TP group writes the model keys, -1 if none
  std::vector<std::string> reasons;   // one line each: disqualified replicas, elections, missing keys, the store
  std::string summary;                // one line: the decision and its main reason
};

// Whether a survivor caught inside its update may finish it and report the step it ends, rather than be
// disqualified as mid-update: its update must need no collective with a lost peer. True for pure data parallelism,
// where every rank updates its own whole replica; false with tensor or pipeline parallelism or ZeRO-1, whose updates
// may wait on a peer (a global gradient norm, the all-gather of updated shards). The wait is bounded; a survivor
// whose update does not end in time reports mid-update as before.
bool update_finishes_alone(const store::Layout& layout);

// Decides. Reports must name distinct ranks in [0, world_size) with distinct coordinates inside the layout;
// otherwise nothing is written and the reason names the bad report. Election is deterministic: for each stage the
// lowest dp index whose group qualifies; every required state key is written exactly once.
Plan plan(const store::Layout& layout, const std::vector<RankReport>& reports);

// The state keys rank `coord` writes under a plan whose stages went to `replica_of_stage` (Plan::replica_of_stage
// of a plan that writes): exactly plan.writers[coord.rank]. The root of a job decides once and sends only the
// step and the stages; each rank learns its own part from this.
std::vector<std::string> writer_keys(const store::Layout& layout, const std::vector<int>& replica_of_stage,
                                     const store::RankCoord& coord);

// The shard records the plan's writers would produce (rank, shard file name, covers), for decide_commit.
std::vector<store::ShardRecord> planned_records(const Plan& plan);

// "dp1/tp0/pp2".
std::string format_coord(int dp, int tp, int pp);

}  // namespace ckpt::last_words
