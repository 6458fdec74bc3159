#pragma once
// Last words at run time: when a rank or node dies (or Slurm sends SIGTERM), the survivors agree within a few
// seconds on a terminal checkpoint and write it, or write nothing when they cannot hold a complete copy.
//
//  1. Detection: the heartbeat network (heartbeat.hpp) declares a peer dead on a reset/EOF, a refused dial or
//     1.5 s of silence, and floods the news; a notice signal or a peer's alarm (flooded too) triggers as well.
//  2. Freeze: the training thread may not start another update (UpdateTracker); each rank's report is its step and
//     whether it was caught between before_update and after_step (its state is then inconsistent).
//  3. Agreement: reports travel up the network's tree; its root runs ckpt::last_words::plan once and floods the
//     decision (the step and each stage's writing replica); each rank derives its part (last_words::writer_keys).
//  4. Writes: the elected writers write their live state (consistent at the step when not mid-update) as a shard
//     covering the keys they were elected for and report it up; the root commits through ckpt::store::commit,
//     which commits only when decide_commit(Kind::Terminal) finds every state key covered exactly once.
//  5. Leave: when a peer was lost, every survivor ends within Timing::exit_grace of the outcome, even when its
//     program is stuck in a collective with the dead peer: the controller needs the survivors' exits to act.
//
// Armed when CKPT_LAST_WORDS is on, the job declared its layout and has more than one rank. Every job of more than
// one rank runs the network, for the tree coordinator (coordinator.hpp); a job whose last words are off runs it
// silent (Timing::speak). Not PMIx: Slurm's PMIx server SIGKILLs the whole step when a PMIx-connected rank dies.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/hooks.hpp"
#include "ckpt/last_words.hpp"

namespace ckpt::hooks {

namespace heartbeat {
class Mesh;
struct Frame;
}  // namespace heartbeat

// Whether last words run for this configuration.
bool last_words_armed(const Config& config);

// The manifest of a checkpoint of `step` (shards are filled in by store::commit). Other ranks' coordinates follow
// the default order (tp fastest, then dp, then pp); a restore maps keys to shards through `covers`, not these.
store::Manifest last_words_manifest(const Config& config, std::uint64_t step, store::Kind kind);

// "dp1/tp0/pp2" packed into 64 bits for the mesh's hello, and back.
std::uint64_t pack_coord(const store::RankCoord& coord);
store::RankCoord unpack_coord(int rank, std::uint64_t packed);

// Where the training thread stands: its step and whether it is inside an update. Thread-safe.
class UpdateTracker {
 public:
  struct Progress {
    std::uint64_t step = 0;
    bool mid_update = false;
  };
  // Training thread, before an update: false once frozen (the update must not start).
  bool enter_update();
  // Training thread, after the update of `step` (and at restore, with the resume step).
  void finish_step(std::uint64_t step);
  // Any thread: no update starts after this; returns where training stands. With `finish_by`, an update in
  // progress is let end first (until then at most): the training thread's finish_step() then gives the step it
  // ended.
  Progress freeze(std::optional<std::chrono::steady_clock::time_point> finish_by = std::nullopt);
  Progress progress() const;
  bool frozen() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable finished_;
  // Until restore() or the first after_step() the state is no step's (restore may be copying a checkpoint in):
  // last words must not write it as one.
  Progress progress_{0, true};
  bool frozen_ = false;
};

// What the last words did on this rank.
struct LastWordsOutcome {
  bool triggered = false;
  bool done = false;
  bool wrote = false;       // this rank wrote a terminal shard
  bool committed = false;   // this rank committed the terminal checkpoint
  std::uint64_t step = 0;
  std::string summary;      // the plan's one-line decision
  double detect_unix = 0;   // when the failure was caught here, unix seconds
  double commit_s = 0;      // from detection to the commit (the committer only)
  double decided_unix = 0;  // when the decision reached (or was made on) this rank
  double done_unix = 0;     // when the last words ended here
  int root = -1;            // the rank that decided (the root of the network among the survivors)
  bool ended_committed = false;  // the root's word: the terminal checkpoint is committed
  bool counted_dead = false;     // the other ranks count this rank as dead
  std::vector<int> lost;    // the peers this rank knows died before the outcome (not those that left), ascending
  std::map<int, int> stand_ins;  // the decision's: dead rank -> the survivor writing its shard from a partner copy
  std::vector<int> behind;  // the root's only: survivors holding no state of the step (last_words::behind)
};

class LastWords {
 public:
  // Writes this rank's live state as a terminal shard of `step` covering `keys`; called on the last-words thread
  // while the training thread is frozen.
  using WriteShard = std::function<Status(std::uint64_t step, const std::vector<std::string>& keys)>;
  // Before this rank reports, training frozen: readies its state for WriteShard by `deadline` (copies device
  // regions to host memory). A failure reports this rank as unable to write; the survivors elect around it.
  using Prepare = std::function<Status(std::chrono::steady_clock::time_point deadline)>;

  struct Timing {
    std::chrono::milliseconds period{100};        // heartbeat period
    std::chrono::milliseconds dead_after{1500};   // silence that declares a peer dead
    std::chrono::milliseconds deadline{4500};     // detection to commit, under KillWait (5 s in the test cluster)
    std::chrono::milliseconds connect_timeout{120000};
    // After the last words for a lost peer are done (committed or not), the program has this long to exit on its
    // own; then the library ends the process with kExitPeerLost. Its training thread may be blocked for good in a
    // collective with the lost peer, and teardown (barrier, process-group destroy) waits on it too. 0: never.
    std::chrono::milliseconds exit_grace{0};
    // False: the network alone, for the tree coordinator of a job whose last words are off. A peer's death is
    // noted (the coordinator routes around it), but nothing is triggered: no freeze, report or terminal write.
    bool speak = true;
  };

  // Joins the mesh (blocks until every rank joined); `rendezvous_dir` is shared by every rank of this run.
  static Result<std::unique_ptr<LastWords>> start(const Config& config, const std::string& rendezvous_dir,
                                                  UpdateTracker& tracker, WriteShard write, Prepare prepare,
                                                  Timing timing);
  static Result<std::unique_ptr<LastWords>> start(const Config& config, const std::string& rendezvous_dir,
                                                  UpdateTracker& tracker, WriteShard write, Prepare prepare);
  ~LastWords();
  LastWords(const LastWords&) = delete;
  LastWords& operator=(const LastWords&) = delete;

  // Whether the last words run here (Timing::speak); false: the network alone.
  bool speaks() const;
  // Starts the last words now (tests; a rank whose training failed); nothing when they do not speak.
  void trigger(const std::string& why);
  bool triggered() const;
  // Waits until triggered, at most `timeout`; true when triggered.
  bool wait_triggered(std::chrono::milliseconds timeout) const;
  // Waits until the last words are done (written, committed or given up), at most `timeout`.
  bool wait_done(std::chrono::milliseconds timeout) const;
  LastWordsOutcome outcome() const;
  // An orderly end of training: peers will not take this rank's departure for a failure.
  void leave();
  // The heartbeat network, for the coordinator that shares it (coordinator_tree.cpp).
  heartbeat::Mesh& network();
  // Frames of the periodic coordination (kRequest, kShardsDone, kShardFailed) go to `handler`, on the network's
  // threads, with the rank of the link they came on.
  void set_coordination(std::function<void(const heartbeat::Frame&, int from)> handler);
  // Straggler frames (kPace) go to `handler` likewise; dropped while there is none.
  void set_pace(std::function<void(const heartbeat::Frame&, int from)> handler);

  // The memory tier's part (memory_tier.hpp), where the job keeps one: what this rank holds besides its live state,
  // reported with it, and the writes of a decision that uses it. Set once, right after start().
  struct MemoryHooks {
    // The steps whose snapshots staging holds whole, newest first (the last memory checkpoint and the one before).
    std::function<std::vector<std::uint64_t>()> own_steps;
    // Freezes the partner copies (none is replaced after) and lists those that verify: (ward, step).
    std::function<std::vector<std::pair<int, std::uint64_t>>()> held;
    // This rank's shard of `step` from its staging, covering `keys`.
    std::function<Status(std::uint64_t step, const std::vector<std::string>& keys)> write_staging;
    // `ward`'s shard of `step` from the copy this rank holds, covering `keys`.
    std::function<Status(int ward, std::uint64_t step, const std::vector<std::string>& keys)> write_ward;
    // The memory tier is off for the whole job: it does not fit `rank`, which needs `need` of `budget` bytes.
    // Called once, on a network thread (or the caller's, for this rank's own tier_off()).
    std::function<void(int rank, std::uint64_t need, std::uint64_t budget)> on_tier_off;
  };
  void set_memory(MemoryHooks hooks);
  // The memory tier does not fit `rank`: every rank is told (flooded) and turns it off, this one included.
  void tier_off(int rank, std::uint64_t need, std::uint64_t budget);

 private:
  struct Impl;
  explicit LastWords(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::hooks
