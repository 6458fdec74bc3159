#pragma once
// The two-phase checkpoint engine's state (Checkpointer::Impl), shared by the checkpointer*.cpp files, one per job.
//
// Threads: the training thread calls the API (checkpointer.cpp: create, register_region/set_regions/put_blob,
// restore, then per step before_update and after_step, close), takes snapshots (checkpointer_snapshot.cpp) and,
// on rank 0 with CKPT_INTERVAL=auto, measures the interval (auto_interval_meter.hpp, checkpointer_auto.cpp); the
// copy pool copies host regions into staging during a snapshot; one persist thread ("worker", persist_queue.hpp,
// its tasks in checkpointer_worker.cpp) grows staging in the background, writes shards through ckpt::store,
// publishes them to the coordinator and, on the writer, commits. Staging belongs to the worker whenever it has a
// task queued or running; the training thread touches staging only after queue.wait_idle(), which is what
// back-pressure is. The last-words thread copies device state out and writes a
// terminal shard while training is frozen (checkpointer_rescue.cpp); restore runs before the first step
// (checkpointer_restore.cpp).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/clock.hpp"
#include "ckpt/hooks.hpp"
#include "ckpt/interval.hpp"
#include "ckpt/schedule.hpp"
#include "auto_interval_meter.hpp"
#include "coordinator.hpp"
#include "device.hpp"
#include "last_words_runtime.hpp"
#include "memory_tier.hpp"
#include "node_tier.hpp"
#include "pace.hpp"
#include "nccl_watch.hpp"
#include "persist_queue.hpp"
#include "restore_agreement.hpp"
#include "staging.hpp"

namespace ckpt::hooks {

using Clock = std::chrono::steady_clock;

inline std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// A small named value saved with every checkpoint (extras).
struct Blob {
  std::string name;
  std::vector<std::byte> bytes;
  nlohmann::json meta;
};

// What the persist thread writes for one checkpoint.
struct PersistJob {
  std::uint64_t step = 0;
  store::Kind kind = store::Kind::Periodic;
  std::vector<Piece> pieces;
  std::vector<Blob> blobs;      // pieces point into these; the vector is not resized after
  bool host_copy = false;       // the copy pool is filling host staging
  bool device_copy = false;     // the device backend is filling pinned staging
  std::string error;            // the snapshot failed: publish the failure, write nothing
  std::uint64_t bytes = 0;
  bool memory_only = false;     // a memory-tier checkpoint: the partner's copy, no shard in the dir
};

struct PinnedBuffer {
  void* data = nullptr;
  std::size_t size = 0;
};

// The snapshot's staging: the worker's while it has tasks, the training thread's after wait_idle().
struct Staging {
  HostBuffer host;
  // The memory tier: the buffer the snapshot before the last one lies in. Each snapshot swaps it with `host`, so
  // the last two memory checkpoints stay whole (a partner may hold this rank's copy of the older one only).
  HostBuffer spare;
  PinnedBuffer pinned;
  bool host_copying = false;          // host copies running; before_update has not passed yet
  bool device_guard_pending = false;  // device copies queued; the compute streams do not wait yet
  std::pair<std::size_t, std::size_t> asked;  // guarded by Impl::mu: host and pinned bytes wanted
  bool lent = false;  // guarded by Impl::mu: the last words hold the pinned staging; nothing may grow it
  // Training thread: growth waits until the restored state is loaded (restore() copying into the regions, or the
  // program's next registration or step; a program without a restore: its first step). A restore from memory needs
  // no staging, and must neither wait for gigabytes to be mapped nor share the CPU and memory with it, and a
  // survivor holds its last snapshots until its restore has taken what it needs from them.
  bool growth_held = true;
  bool growth_pending = false;  // asked for while held
};

// What decides the step's checkpoint from step to step (training thread).
struct StepSchedule {
  std::optional<std::uint64_t> last_step;
  std::optional<std::pair<std::uint64_t, Decision>> cached;  // poll()'s decision for the step after_step() ends
  bool stopped = false;
  std::optional<std::uint64_t> time_limit_stop;  // rank 0: the terminal step taken for the time limit
  Clock::time_point last_checkpoint = Clock::now();
  schedule::State state;  // what the scheduling decision remembers (schedule.hpp)
  double interval_s = 0;
  std::uint64_t notices_seen = 0;         // notice::count() at start: only later signals are for this checkpointer
  // CKPT_MEMORY_INTERVAL=auto, rank 0: the step time it measures, and the next memory checkpoint it asks for.
  std::optional<Clock::time_point> last_decide;
  // The times between the last decisions; their lower quartile is the step time: steps a copy slowed (or a
  // back-pressure wait) would otherwise make the interval look long enough.
  std::deque<double> step_times;
  double step_s = 0;
  std::optional<std::uint64_t> memory_next;
  std::uint64_t memory_said = 0;           // the choice the log last said (0: none yet)
  // What a memory checkpoint costs training, its stall plus its interference, measured as CKPT_INTERVAL=auto
  // measures a periodic one (interval::StepMeter, over the memory checkpoints' copies and sends): the median of the
  // last five.
  std::optional<interval::StepMeter> memory_meter;
  bool last_snapshot_memory = false;  // the last snapshot was a memory checkpoint: guard waits are its stall
  double memory_stall_s = 0;          // that snapshot's stall, guard waits included
  std::deque<double> memory_costs;
  double memory_cost_s = 0;
  Clock::time_point backpressure_logged;  // when the last back-pressure line went out
};

// The checkpointer's life: create, the first step, close (training thread).
struct Lifecycle {
  bool started = false;
  bool discarded_above = false;  // rank 0 discarded dead saves above the step it resumes from
  bool handlers = false;         // holds the signal handlers (notice.hpp)
  bool closed = false;
  Status close_status;
  std::uint64_t snapshots = 0;  // taken so far, memory checkpoints included
};

// What watches for a lost or slow peer: the last words (armed: see last_words_runtime.hpp), the pace tree of the
// straggler detection on their network (pace.hpp), the NCCL communicators handed to watch_nccl.
struct Watchers {
  std::unique_ptr<LastWords> last_words;  // reset under mu
  std::shared_ptr<PaceTree> pace;
  double update_started_s = -1;       // training thread: when before_update was called, for pace
  std::unique_ptr<NcclWatch> nccl;    // reset before last_words
  mutable std::mutex mu;              // last_words_report() from any thread while close() resets last_words
  bool armed = false;                 // guarded by mu
  LastWordsOutcome final_outcome;     // guarded by mu: the outcome when close() ended the last words
};

// restore()'s request: what a resharded ZeRO-1 rank reads of other shards, the memory this rank holds already.
struct RestoreRequest {
  std::vector<std::string> reshard_prefixes;
  std::vector<store::LiveRange> live;  // RestoreOptions::live
};

// What restore() loaded: the regions it lists, and the bytes of those in no shard loaded whole (a resharded
// ZeRO-1 rank's ranges of other shards, every tensor of a load onto another split).
struct Restored {
  std::vector<RestoredRegion> regions;
  std::deque<std::unique_ptr<std::byte[]>> ranges;  // not zeroed first: a read fills each whole
  bool resharded = false;  // the last load was such a one

  // A buffer of `bytes` for one of them, kept until the next load.
  std::byte* hold(std::size_t bytes) {
    return ranges.emplace_back(std::make_unique_for_overwrite<std::byte[]>(bytes)).get();
  }
};

// Last words: the device regions copied to host memory when they start (the last-words thread's).
struct Rescued {
  PinnedBuffer buffer;
  bool in_staging = false;           // `buffer` is the snapshot's pinned staging, not an allocation of its own
  std::vector<std::size_t> offsets;  // per region: its offset in `buffer` (device regions only)
};

struct Checkpointer::Impl {
  Config config;
  store::PhaseObserver observer;
  bool enabled = false;
  int rank = 0;
  std::unique_ptr<Coordinator> coord;
  std::unique_ptr<CopyPool> pool;
  std::unique_ptr<DeviceBackend> device;  // created at the first device region
  UpdateTracker tracker;                  // step and mid-update, for the last words
  Watchers watch;
  Lifecycle life;

  // ---- training thread ----
  std::vector<RegionSpec> regions;
  std::vector<nlohmann::json> region_meta;  // parsed meta_json, parallel to regions
  std::vector<Blob> blobs;
  std::vector<void*> device_streams;  // the compute streams of the device regions, marked after every update
  StepSchedule sched;
  RestoreRequest request;
  Restored restored;
  std::optional<AutoIntervalMeter> auto_meter;  // CKPT_INTERVAL=auto, rank 0 only
  Staging staging;
  Rescued rescued;
  std::unique_ptr<NodeTier> node;    // CKPT_MEMORY in a job: staging in files of CKPT_NODE_DIR (node_tier.hpp)
  // CKPT_MEMORY where the last words are armed (memory_tier.hpp). After `node`: its receivers keep held copies
  // there, so it goes first.
  std::unique_ptr<MemoryTier> tier;
  bool partner_kept_copy = false;  // the training thread's: restore() fetched a copy the partner's node kept
  // The tier does not fit some rank's CKPT_MEMORY, so it is off for the whole job: no memory checkpoint, no copy.
  std::atomic<bool> tier_too_big{false};
  bool tier_checked = false;              // the worker's: the budget was checked at the first memory checkpoint
  bool tier_stopped = false;              // the worker's: the tier's links are closed after it went off
  std::uint64_t memory_jobs_done = 0;     // guarded by mu: memory checkpoints whose copy (and send) ended
  std::atomic<bool> closing{false};       // close() began: a partner that ended first refuses the last copy

  // ---- the persist thread ----
  PersistQueue queue;
  mutable std::mutex mu;
  Stats stats;         // guarded by mu
  Status first_error;  // guarded by mu
  // The memory tier: the snapshot staging holds whole (set by the worker once its copy is done, cleared by the
  // training thread before the next one overwrites staging), for the last words' writes from staging.
  std::shared_ptr<const PersistJob> whole_snapshot;     // guarded by mu
  std::shared_ptr<const PersistJob> previous_snapshot;  // guarded by mu: the one before, whole in staging.spare

  ~Impl();

  Stats stats_copy() const;

  // ---- the worker and staging (checkpointer_worker.cpp) ----------------------------------------------------------

  void record_error(const std::string& message);
  void free_pinned();
  void update_staging_stats();
  void open_node_tier();
  Result<HostBuffer> new_staging(std::size_t bytes);
  void say_reserve_use(const BufferReserve::Use& use) const;
  // Worker or training thread (the latter only after wait_idle): host staging of at least `bytes`.
  Status grow_host(std::size_t bytes);
  Status grow_pinned(std::size_t bytes);
  Status grow_spare(std::size_t bytes);
  // Raises the staging sizes wanted; true when they grew (a grow task must be queued).
  bool ask_staging(std::size_t host_bytes, std::size_t pinned_bytes);
  // Training thread: asks the worker for the staging the current regions need.
  void plan_growth();
  void queue_growth();
  void release_growth();
  // The state keys this rank's record covers (store::state_keys_of_rank).
  std::vector<std::string> covers() const;
  store::Manifest manifest(const PersistJob& job) const;
  // This rank's shard of `step`: the pieces in order, claiming `keys`.
  // `written` (when given) receives the shard's record.
  // `as_rank` (default: this rank) names the shard: a stand-in writes its ward's.
  Status write_pieces(std::uint64_t step, const std::vector<Piece>& pieces, const std::vector<std::string>& keys,
                      store::ShardRecord* written = nullptr, int as_rank = -1);
  Status write_shard(const PersistJob& job, store::ShardRecord* written);
  // Worker: the shard, its publication and, on the writer, the commit and retention.
  // Rank 0, once its own shard is written: waits for every rank's, then commits the manifest; false (the error
  // recorded) when it cannot.
  bool commit_when_all_wrote(const PersistJob& job);
  void persist(const std::shared_ptr<const PersistJob>& job);
  // Worker, memory tier: `job`'s snapshot is whole in staging; its copy to the partner.
  // sums: each piece's XXH3-64 where the node tier took them already; empty: the copy computes them.
  void keep_in_memory(const std::shared_ptr<const PersistJob>& job, const std::vector<std::uint64_t>& sums);
  // The partner left the heartbeat network in order (it finished training first): a failed copy is no fault then.
  bool partner_left() const;
  // Whether `step` is a memory checkpoint: every CKPT_MEMORY_INTERVAL steps, or (auto) where rank 0 asked for one.
  bool memory_due(std::uint64_t step);
  // CKPT_MEMORY_INTERVAL=auto, rank 0, once per step: asks for the memory checkpoints within the lead, spaced by
  // ckpt::memtier::auto_interval from the measured cost, the last copy's time, the step time and the MTBF.
  void ask_memory_checkpoints(std::uint64_t step);
  // Rank 0 under CKPT_MEMORY_INTERVAL=auto, once per step: feeds the memory checkpoints' meter.
  void observe_memory_step();
  // A network thread (or the worker, for this rank's own finding): the tier does not fit `who`, so it goes off
  // here too; rank 0 says so for the job.
  void on_tier_off(int who, std::uint64_t need, std::uint64_t budget);
  void collect_garbage(std::uint64_t committed);

  // ---- the API's side: regions, scheduling, close (checkpointer.cpp) ---------------------------------------------

  Result<nlohmann::json> check_region(const RegionSpec& r);
  std::uint64_t lead() const { return config.world_size == 1 ? 0 : config.agree_lead; }
  // Training thread: the coordinator namespace, leftovers of dead saves, the interval clock.
  void start(std::uint64_t step);
  void discard_incomplete_above(std::uint64_t step);
  Decision decide(std::uint64_t step);
  // Training thread: ends the process for a swap (pace.hpp), unless a persist is in flight (then a later step).
  void leave_for_spare(std::uint64_t step);
  // With wait_for_peers false, the writer does not wait for ranks that may be gone.
  Status close(bool wait_for_peers);

  // ---- CKPT_INTERVAL=auto, rank 0, training thread (checkpointer_auto.cpp) ---------------------------------------

  // Uses the auto interval's current choice, logs it and shows it in the stats.
  void publish_auto_interval();
  // Once per step: the step into the meter; a recomputed interval is published and its measurements kept in
  // .control by a task on the persist thread.
  void observe_step();

  // ---- the snapshot, training thread (checkpointer_snapshot.cpp) -------------------------------------------------

  // The guard: waits for the host copies, queues the device guard. Returns the seconds it blocked.
  double guard();
  void report_backpressure(std::uint64_t step, double waited);
  void snapshot(std::uint64_t step, store::Kind kind, bool memory_only = false);
  // The memory tier, before the snapshot of `step` overwrites staging: waits for the wards' copies of the last one.
  // Returns the seconds it waited.
  double wait_for_ward_copies(std::uint64_t step);
  // Points `job` at staging and starts the copies of the regions into it (host: the copy pool; device: the backend).
  void start_copies(PersistJob& job, const StagingPlan& plan);

  // ---- last words (checkpointer_rescue.cpp) ----------------------------------------------------------------------

  void free_rescued();
  // Training thread, in create(): the heartbeat network, with the last words (last_words_runtime.hpp) and this
  // rank's writes when `speak`.
  Result<std::unique_ptr<LastWords>> start_last_words(bool speak);
  // The last-words thread: the device regions into host memory, by `deadline`.
  Status rescue_device_state(Clock::time_point deadline);
  // The last-words thread: this rank's live state, consistent at `step`, as a terminal shard covering `keys`.
  Status write_terminal(std::uint64_t step, const std::vector<std::string>& keys);
  // Training thread, in create(): the memory tier on the last words' network, where CKPT_MEMORY asks for it and
  // the partner is on another node; one line where it cannot be.
  void start_memory_tier();
  // The last-words thread: the shard of `step` from staging (this rank's) or from a partner copy (`ward`'s).
  Status write_from_staging(std::uint64_t step, const std::vector<std::string>& keys);
  Status write_from_copy(int ward, std::uint64_t step, const std::vector<std::string>& keys);

  // ---- restore, training thread (checkpointer_restore.cpp) -------------------------------------------------------

  // Before the restore, where this node's tier holds no snapshot of this rank (a relaunch on a node that replaced a
  // dead one), at a memory step's probe, where it lacks that one (`step` of `launch`), and at a round from the dir
  // in a relaunch, where it lacks that step (any launch: the bytes are checked against the dir's manifest): the
  // copy of that memory checkpoint (without a step: the newest) that the partner's earlier process kept, fetched
  // and offered like this node's own.
  void fetch_own_copy(std::optional<std::uint64_t> step = {}, const std::string& launch = {});
  // This process is a relaunch inside the allocation: its node tier held snapshots of this rank, or the partner's
  // node kept a copy of one. Only then may a round from the dir find the round's step in the partner's memory.
  bool relaunch_with_copies() const;

  // Leader (or the only rank): the candidate after `failed`, the plugin's choice first when it has not been tried.
  RestorePlan choose(const std::vector<std::uint64_t>& failed, bool& plugin_tried);
  // Leader: `dir_plan`, or the newest memory snapshot this rank's node tier holds that is newer, of this world size
  // and not passed over yet (node_failed: the steps of such rounds that failed).
  RestorePlan prefer_node_tier(RestorePlan dir_plan, const std::vector<std::uint64_t>& node_failed) const;
  // The memory snapshot `plan` names, where this rank's node tier holds it with this world size and every
  // registered region (nothing hashed).
  Result<const NodeTier::Snapshot*> find_node_snapshot(const RestorePlan& plan) const;
  // Every rank: the regions from the memory snapshot `plan` names in this rank's node tier, each checked against
  // its checksum (a probe: only whether it is there); a rank that does not hold it whole fails the round
  // (definite: every rank walks back).
  Status load_from_node_tier(const RestorePlan& plan);
  // Reads this rank's shard of the candidate into host staging, checked as it is read; a definite error means
  // the checkpoint is bad.
  Status load(const RestorePlan& plan, bool& definite);
  // Which shard of the candidate this rank loads (store::restore_source), with the manifest when the load needs
  // more of it: a resharded ZeRO-1 partition's ranges, or every saved block of another split.
  struct ShardChoice {
    store::ShardRecord record;
    std::optional<store::Manifest> manifest;
    bool reshard = false;
    bool relayout = false;
  };
  Status choose_shard(const RestorePlan& plan, ShardChoice& choice, bool& definite);
  // Host staging big enough to read `record` into.
  Status grow_staging_for(const store::ShardRecord& record);
  // The whole shard into host staging, checked as it is read, and listed in `restored`: the bytes read.
  Result<std::uint64_t> load_whole_shard(const RestorePlan& plan, const store::ShardRecord& record, bool& definite);
  // The ranges `live` holds taken from there and the others read one by one; nullopt when nothing matched (or
  // a range has no checksum of its own): load() then reads the whole shard.
  std::optional<Status> load_with_live(const RestorePlan& plan, const store::ShardRecord& record, bool& definite);
  // `restored` for `record`'s ranges: in host staging at their offsets, or in live memory where from_live says.
  Status list_restored(std::uint64_t step, const store::ShardRecord& record,
                       const std::vector<std::optional<std::size_t>>& from_live);
  // A tensor saved as one block of a split tensor loads whole only into the same block of the same tensor: a
  // region whose declared global shape or offset differs from that of its range in `record` is another split
  // (load_other_split). Regions or ranges that declare no global shape are not compared.
  Status check_chunks(std::uint64_t step, const store::ShardRecord& record) const;
  // Another split at the same world size, which check_chunks found (`why`): load_relayout instead.
  Status load_other_split(const RestorePlan& plan, const Status& why, bool& definite);
  void set_restore_bytes(std::uint64_t read, std::uint64_t live_bytes);
  Result<std::uint64_t> restore(bool copy_into_regions);
  // At creation: the interval's seconds (a fixed one, or the auto chooser's first, rank 0 keeping the chooser).
  Status start_interval();
  // At creation: the heartbeat network where the coordinator uses it or the job armed the last words, the last
  // words on it where armed, and the pace tree for the straggler detection; a warning when they are on but the job
  // declared no layout.
  Status arm_last_words();
  // The restore's rounds: the leader proposes a candidate, every rank loads it, and all agree; a candidate any rank
  // found bad is marked FAILED once and every rank walks back. The step loaded (nullopt: none), `plan` its plan.
  Result<std::optional<std::uint64_t>> agree_and_load(RestoreAgreement* agreement, RestorePlan& plan);
  // The restored bytes into the registered regions (restore(copy_into_regions)), each of the size it was saved.
  Status copy_into_registered(std::uint64_t step);
  // One range of `record` into host staging at its offset, checked against its own checksum; adds to `bytes`.
  Status read_range_to_host(const RestorePlan& plan, const store::ShardRecord& record, const store::StateRange& range,
                            std::uint64_t& bytes, bool& definite);
  // A resharded ZeRO-1 load: what it needs of its replica's shard (store::replica_ranges), each range against its
  // own checksum; nullopt when a range has none (an older checkpoint: load() reads the whole shard).
  std::optional<Status> load_replica_ranges(const RestorePlan& plan, const store::ShardRecord& record,
                                            bool& definite);
  // A resharded ZeRO-1 load: the ranges of other shards this rank's new partition needs, read and checked.
  Status load_reshard_ranges(const std::string& root, const store::Manifest& m, int source, bool& definite);
  // A load onto another split of the tensors: each of this rank's blocks assembled from the saved ranges it
  // intersects (store::plan_relayout), each read whole and checked against its checksum.
  Status load_relayout(const std::string& root, const store::Manifest& m, bool& definite);
};

}  // namespace ckpt::hooks
