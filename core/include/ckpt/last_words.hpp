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
//
// The memory tier (ckpt/memtier.hpp) adds two ways for a coordinate to count at step T besides its rank's live
// state: the rank's staging holds a whole snapshot of T (it writes that, even when caught mid-update or already at
// a later step), or a live partner holds a verified copy of the rank's shard at T (a stand-in writes it, even when
// the rank itself is dead). The rank itself is preferred; among holders, the lowest rank. Every step any report
// names is a candidate and the newest with complete coverage wins, so a snapshot or a copy can take the plan back
// to an older step only when the newer ones cannot be covered. A stand-in writes the ward's shard as the ward
// would have: the keys writer_keys() gives the ward's coordinate, in a shard whose record names the ward's rank.
// So Plan::writers stays keyed by the rank whose shard it is, and Plan::stand_ins says who writes it. Without
// snapshots or copies in any report the plan is exactly the one described above.
//
// Who does what: (every rank) sends its RankReport up the heartbeat tree; (the root) runs plan() once and floods
// the step, replica_of_stage and stand_ins; (every rank) writes its own keys (writer_keys() of its coordinate)
// from the source source_for() names, unless a stand-in writes them, and the keys of each ward it stands in for
// (writer_keys() of the ward's coordinate) from its partner copy, under the ward's rank.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/store.hpp"

namespace ckpt::last_words {

// What one rank said when the failure was caught. A rank that sent no report counts as dead.
struct RankReport {
  store::RankCoord coord;
  bool alive = false;
  bool mid_update = false;  // between before_update and after_step
  std::uint64_t step = 0;   // the step it is on
  // Memory tier; both empty without it. A dead rank's entries are never used.
  // Its staging's whole snapshots, newest first: the last memory checkpoint and the one before it, which staging
  // keeps until the next begins (a partner may still hold this rank's copy of that one only).
  std::vector<std::uint64_t> memory_steps;
  std::vector<std::pair<int, std::uint64_t>> held;  // partner copies it holds, whole and verified: (ward rank, step)
};

// Where a rank's own shard of `step` comes from: its live state (alive, not mid-update, at `step`), else its
// staging (alive, a whole snapshot of `step`), else nowhere of its own (a stand-in may write it). The planner and each
// rank's runtime use this one rule, so a rank writes exactly what the root counted on.
enum class WriteSource { Live, Staging, None };
WriteSource source_for(const RankReport& mine, std::uint64_t step);

// The decision, with its reasons for the log.
struct Plan {
  bool write = false;      // true: the writers write, then the checkpoint is committed as Kind::Terminal
  std::uint64_t step = 0;  // the agreed step; meaningful when write is true
  std::map<int, std::vector<std::string>> writers;  // rank whose shard it is -> its state keys; empty unless write
  std::map<int, int> stand_ins;  // ward rank -> the live rank that writes the ward's shard from its partner copy
  std::set<int> from_memory;     // ranks that write their own shard from staging (source_for() is Staging)
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

// Decides. Reports must name distinct ranks in [0, world_size) with distinct coordinates inside the layout, and
// copies of other ranks inside the world; otherwise nothing is written and the reason names the bad report. A
// coordinate nobody reported for cannot be stood in for (no report says which rank's copy fills it). Election is
// deterministic: for each stage the lowest dp index whose group qualifies, groups whose ranks all write their own
// shards (live or staging) before groups that need a stand-in, which writes a second shard on its holder; every
// required state key is written exactly once.
// `oldest`: the newest checkpoint already committed in the dir; a step before it is no candidate (a terminal
// checkpoint older than it would lose more than it), so snapshots and copies of such steps are not counted.
Plan plan(const store::Layout& layout, const std::vector<RankReport>& reports, std::uint64_t oldest = 0);

// The state keys rank `coord` writes under a plan whose stages went to `replica_of_stage` (Plan::replica_of_stage
// of a plan that writes): exactly plan.writers[coord.rank]. The root of a job decides once and sends only the
// step, the stages and the stand-ins; each rank learns its own part from this, and a stand-in its ward's part by
// passing the ward's coordinate.
std::vector<std::string> writer_keys(const store::Layout& layout, const std::vector<int>& replica_of_stage,
                                     const store::RankCoord& coord);

// The shard records the plan's writers would produce (rank, shard file name, covers), for decide_commit. A
// stand-in's record is the ward's: the ward's rank and shard file name.
std::vector<store::ShardRecord> planned_records(const Plan& plan);

// The living ranks that hold no state of a writing plan's step, neither live nor in their staging (source_for() is
// None): a survivor at another step (a step behind, in practice: its last collective failed where a peer's had
// ended), or caught mid-update without a snapshot of the step. Once the terminal checkpoint is committed they must
// load that step; a restart in place has a live replica send it (inplace::Plan::behind). Ascending; empty for a
// plan that does not write.
std::vector<int> behind(const Plan& plan, const std::vector<RankReport>& reports);

// A writer of a plan's `step` died after the plan, before its shard was durable (a node's ranks die one by one as
// their memory is torn down, or a rank is killed alone in its write): the live rank that writes `ward`'s shard in its
// place from the partner copy of `step` it holds, or none. `reports` are those the plan was made from, `gone` the
// ranks lost since; among the holders, the lowest rank, as plan() chooses. The stand-in goes on from there as any
// other: the keys writer_keys() gives the ward's coordinate, under the ward's rank.
std::optional<int> late_stand_in(const std::vector<RankReport>& reports, const std::set<int>& gone, int ward,
                                 std::uint64_t step);

// "dp1/tp0/pp2".
std::string format_coord(int dp, int tp, int pp);

}  // namespace ckpt::last_words
