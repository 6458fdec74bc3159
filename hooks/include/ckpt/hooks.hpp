#pragma once
// slurm-ckpt's training-side hooks: register the state a rank must save, take two-phase checkpoints (a snapshot
// into staging memory that training waits for only before its next update, then a background persist and commit),
// agree on checkpoint steps across ranks, stop cleanly on a time-limit or signal notice, and restore bitwise.
//
// Every rank runs the same loop; `step` counts completed updates, so restore() returns where the loop resumes:
//
//   auto cp = std::move(ckpt::hooks::Checkpointer::create().value());
//   cp->register_region({"model", params, params_bytes});
//   std::uint64_t start = cp->restore().value();
//   for (std::uint64_t step = start; step < total; ++step) {
//     forward_backward();
//     cp->before_update();                          // the guard: the last snapshot has copied everything
//     update();
//     if (cp->after_step(step + 1).value()) break;  // a terminal checkpoint was taken: stop the loop
//   }
//   cp->close();                                    // waits for the last persist and commit
//
// Settings come from the CKPT_* environment the SPANK plugin exports; Options override them. Without a
// checkpoint dir the checkpointer is disabled and every call is a cheap no-op.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/options.hpp"
#include "ckpt/result.hpp"
#include "ckpt/store.hpp"
#include "ckpt/straggler.hpp"

// libckpt is built with hidden visibility: CKPT_HOOKS_API marks what it exports of this header.
#define CKPT_HOOKS_API __attribute__((visibility("default")))

namespace ckpt::hooks {

// ---- settings ---------------------------------------------------------------------------------------------------

// One setting: the key code uses, the environment variable it overrides, and what a valid value looks like.
struct OptionKey {
  const char* key;       // "dir"
  const char* env;       // "CKPT_DIR"; several variables for rank and world_size, see load_config
  const char* expected;  // for error messages
};

// Every key Options accepts, in the order --help would list them.
CKPT_HOOKS_API const std::vector<OptionKey>& option_keys();

// Overrides of the environment as key=value settings ("dir", "interval", ...; see option_keys()).
struct Options {
  std::map<std::string, std::string, std::less<>> values;
  store::PhaseObserver persist_observer;  // called on the persist thread at each phase of a save (fault tests)

  // Records one override; an unknown key is an error: "ckpt: unknown setting 'x' (known: dir, interval, ...)".
  CKPT_HOOKS_API Status set(std::string_view key, std::string_view value);
};

// How the ranks of a job find each other's heartbeat address: through PMIx (under srun --mpi=pmix, one fence at
// start) or one address file per rank in the control dir; auto takes PMIx where it describes this job.
enum class RendezvousKind { Auto, Files, Pmix };

enum class LogLevel { Error, Warn, Info, Debug };

// The resolved settings of one rank.
struct Config {
  std::string dir;                         // absolute checkpoint root; empty: checkpointing is off
  Interval interval;                       // CKPT_INTERVAL; Auto: rank 0 measures and picks (AutoInterval)
  std::uint64_t keep = BuiltinDefaults::keep;
  bool last_words = BuiltinDefaults::last_words;
  std::uint64_t mtbf_s = BuiltinDefaults::mtbf_s;
  std::uint64_t grace_s = BuiltinDefaults::grace_s;
  std::uint64_t min_interval_s = SitePolicy{}.min_interval_s;  // bounds of the auto interval (the site's)
  std::uint64_t max_interval_s = 0;                             // 0: none
  std::uint64_t max_restarts = BuiltinDefaults::max_restarts;
  std::uint64_t restart_count = 0;
  std::uint64_t generation = 0;            // CKPT_INPLACE_GENERATION: restart in place's group generation (fencing)
  std::string job_id;                      // CKPT_JOB_ID, else SLURM_JOB_ID; may be empty
  std::optional<std::uint64_t> resume_step;  // CKPT_RESUME_STEP: the plugin's choice, verified again here
  std::string resume_path;                 // CKPT_RESUME_PATH: that checkpoint's step dir
  std::optional<std::int64_t> end_time;    // unix seconds the job must be done by (CKPT_END_TIME, SLURM_JOB_END_TIME)
  std::uint64_t kill_wait_s = 5;           // Slurm's KillWait (CKPT_KILL_WAIT, from the plugin): last words commit
  std::uint64_t exit_grace_s = 2;          // CKPT_EXIT_GRACE: after last words for a lost peer, the program has this
                                           // long to exit before the library ends it (exit 75); 0: never
  std::uint64_t heartbeat_timeout_ms = 1500;  // CKPT_HEARTBEAT_TIMEOUT: silence that declares a peer dead
  std::string requeue = "self";            // CKPT_REQUEUE after a time-limit stop: controller, self or off
                                           // within 90% of it; 5 s when unknown
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string rank_source = "single";      // "override", "torchrun" (RANK/WORLD_SIZE), "slurm" or "single"
  RendezvousKind rendezvous = RendezvousKind::Auto;  // CKPT_RENDEZVOUS
  unsigned copy_threads = 2;               // snapshot copy threads; 0 copies on the training thread
  std::uint64_t commit_timeout_s = 600;    // how long the writer waits for every rank's shard
  std::uint64_t agree_lead = 2;            // steps between a request and the agreed checkpoint step
  bool signals = true;                     // SIGTERM, SIGUSR1 and SIGUSR2 ask for a terminal checkpoint
  std::string run_id;                      // names this run's control files; derived from job ids when unset
  LogLevel log_level = LogLevel::Info;
  // The parallel layout (CKPT_LAYOUT / layout=) and this rank's coordinates in it (CKPT_COORD / coord=). Without
  // a declaration: pure data parallelism, dp = world_size. Shard records cover state_keys_of_rank(layout, coord).
  store::Layout layout;
  store::RankCoord coord;
  bool layout_declared = false;            // the job declared its layout: last words can judge completeness
  // CKPT_STRAGGLER: what the root of the heartbeat network does about a slow node (ckpt/straggler.hpp).
  straggler::Policy straggler = straggler::parse_policy(BuiltinDefaults::straggler).value();
  std::string controller_url;              // CKPT_CONTROLLER_URL: where the root reports a slow node; empty: none
  std::string munge_socket;                // CKPT_MUNGE_SOCKET: munged's socket for those reports; empty: default
  std::string inplace_id;                  // CKPT_INPLACE_ID: the in-place run (ckpt-run --spares) this rank is of
  // CKPT_INPLACE_WATCH: (address, port) of the mailboxes of the processes new to this generation of restart in
  // place (its replacements); one that refuses a connection while the heartbeat network forms is gone.
  std::vector<std::pair<std::string, std::string>> inplace_watch;
  // The memory tier (--ckpt-memory, within the site's max_memory): checkpoints held in host memory, own and a
  // partner's.
  std::uint64_t memory_bytes = BuiltinDefaults::memory_bytes;  // CKPT_MEMORY: host memory per rank the memory tier may
                                                               // use (staging + partner copies); 0: off
  std::uint64_t memory_interval = BuiltinDefaults::memory_interval;  // CKPT_MEMORY_INTERVAL: steps between its
                                                                     // checkpoints, >= 1
  int memory_distance = 1;                 // CKPT_MEMORY_DISTANCE: the partner sits this many nodes away, >= 1
  // CKPT_NODE_DIR: with the memory tier in a job, staging lives in files under <node_dir>/slurm-ckpt.<uid>.<job>/,
  // so that a rank ckpt-run relaunches on the same node restores from them; empty ("off"): anonymous memory.
  std::string node_dir;  // the site's node_dir= as the plugin exports it; load_config's default: BuiltinDefaults::node_dir
};

// Resolves overrides over the environment. Ranks: an override, else RANK/WORLD_SIZE/LOCAL_RANK (torchrun), else
// SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun), else a single process. Any bad value is an error naming the
// variable and the value: "ckpt: CKPT_KEEP='x': expected a whole number >= 1".
CKPT_HOOKS_API Result<Config> load_config(const Options& options,
                                          const std::function<const char*(const char*)>& getenv_fn = nullptr);

// ---- logging ----------------------------------------------------------------------------------------------------

// Receives every log line at or above the configured level; lines start with "ckpt: ".
using LogSink = std::function<void(LogLevel level, std::string_view line)>;
// Replaces the sink (stderr by default; an empty sink restores it); returns the previous one. Process-wide.
CKPT_HOOKS_API LogSink set_log_sink(LogSink sink);

// ---- state ------------------------------------------------------------------------------------------------------

enum class Memory { Host, Device };

// A named byte range the checkpoint saves and a restore fills.
struct RegionSpec {
  std::string name;              // unique within the rank; stored in the shard record
  void* data = nullptr;
  std::size_t size = 0;
  Memory memory = Memory::Host;  // Device needs the CUDA backend (CKPT_HAVE_CUDA) and a GPU
  bool sync = false;             // copied inside after_step: state that changes outside updates (BN statistics)
  std::string meta_json = "{}";  // stored with the region, e.g. {"dtype":"float32","shape":[4,4]}
  void* stream = nullptr;        // Device: the cudaStream_t updates run on; null is the legacy default stream
};

// One region of the checkpoint restore() loaded. `data` points into staging (valid until the next snapshot,
// restore, or registration that grows the state) or, for a range found there, into RestoreOptions::live.
struct RestoredRegion {
  std::string name;
  std::string meta_json;
  const std::byte* data = nullptr;
  std::size_t size = 0;
};

// What restore() does besides loading the step every rank agrees on.
struct RestoreOptions {
  bool copy_into_regions = true;              // fill the registered regions from the loaded ones
  std::vector<std::string> reshard_prefixes;  // ZeRO-1 onto another world size: see restore(bool, prefixes)
  // Memory this rank holds already, by region name: a survivor of a restart in place holds the state it has just
  // checkpointed. A range of the loaded shard whose bytes here hash to the range's recorded checksum is taken
  // from here, and only the other ranges are read from the checkpoint (restored() points into this memory for
  // those). Host regions only; a resharded checkpoint reads everything.
  std::vector<RegionSpec> live;
};

// What after_step does at one step.
struct Decision {
  bool snapshot = false;                      // a checkpoint of this step is taken
  bool stop = false;                          // it is terminal: the loop should stop after this step (without
                                              // a snapshot: the terminal step was asked for after this rank had
                                              // passed it, and the other ranks stopped there)
  store::Kind kind = store::Kind::Periodic;
  bool memory_only = false;                   // a memory-tier checkpoint (CKPT_MEMORY): staging and the partner's
                                              // copy only, nothing written to the checkpoint dir
};

// Counters for reports and tests. Times in seconds.
struct Stats {
  std::uint64_t snapshots = 0;            // checkpoints started on this rank
  std::uint64_t persisted = 0;            // shards made durable by this rank
  std::uint64_t committed = 0;            // manifests this rank wrote (the writer only)
  std::uint64_t failed = 0;               // snapshots, persists or commits that failed
  std::optional<std::uint64_t> last_snapshot_step;
  std::optional<std::uint64_t> last_committed_step;
  double last_stall_s = 0;                // training blocked by the last checkpoint (after_step + before_update)
  double total_stall_s = 0;
  double last_copy_s = 0;                 // the last snapshot's copy, start to finish
  double last_persist_s = 0;              // shard write and fsync through its record
  double last_commit_s = 0;               // persist start to commit done (the writer only)
  std::uint64_t last_persist_bytes = 0;
  std::uint64_t backpressure_waits = 0;   // snapshots that waited for the previous persist (or its partner copies)
  double backpressure_s = 0;              // time spent in those waits (included in the stalls)
  double last_backpressure_s = 0;
  std::uint64_t state_bytes = 0;          // bytes of the registered regions
  std::uint64_t staging_bytes = 0;        // bytes of staging memory held (host and pinned)
  std::uint64_t blob_bytes = 0;           // bytes of small blobs held
  std::uint64_t restore_read_bytes = 0;   // the last restore: bytes read from the checkpoint dir
  std::uint64_t restore_live_bytes = 0;   // the last restore: bytes found already in this rank's memory
  double restore_s = 0;                   // the last restore: its time, agreement and loading together
  // The memory tier (CKPT_MEMORY): checkpoints kept in staging with a copy on the partner rank.
  std::uint64_t memory_checkpoints = 0;   // memory-only checkpoints started (the others count in `snapshots`)
  std::uint64_t partner_copies = 0;       // copies the partner kept
  std::uint64_t partner_failures = 0;     // copies it refused or that did not arrive
  double last_partner_s = 0;              // the last copy's transfer, start to the partner's answer
  bool memory_tier_off = false;           // the word reached this rank: the tier does not fit some rank, and is off
                                          // for the whole job from its next step on
  std::uint64_t memory_interval = 0;      // steps between memory checkpoints: CKPT_MEMORY_INTERVAL, or (auto) rank
                                          // 0's current choice; 0 elsewhere under auto, and without the tier
  // CKPT_INTERVAL=auto, on rank 0 (the rank that decides timed checkpoints); zero elsewhere. Recomputed after
  // each checkpoint's persist (see ckpt::interval::AutoInterval).
  double auto_interval_s = 0;             // the interval in use
  double auto_cost_s = 0;                 // δ: median of stall + interference
  double auto_stall_s = 0;                // median stall
  double auto_interference_s = 0;         // median extra step time while a persist runs
  double auto_persist_floor_s = 0;        // slowest recent persist: the interval is never shorter
  double auto_mtbf_s = 0;                 // M (CKPT_MTBF)
  std::uint64_t auto_checkpoints = 0;     // checkpoints measured
  std::string auto_interval_inputs;       // the log line: interval, source and every input
};

// What the last words did on this rank: what a program that recovers in place (slurm_ckpt.torch.run) needs to
// know to leave the failed group and form the next one.
struct LastWordsReport {
  bool armed = false;          // last words run for this job (CKPT_LAST_WORDS=on, a declared layout, > 1 rank)
  bool triggered = false;      // they started: a peer died, a notice came, or a trigger
  bool done = false;           // they ended on this rank (committed, written, or given up)
  bool lost_peer = false;      // a peer died: not a time-limit or signal stop
  bool counted_dead = false;   // the other ranks count this rank as dead: it must leave the job
  bool committed = false;      // the decider's word: the terminal checkpoint is committed
  std::uint64_t step = 0;      // the step of the terminal checkpoint (when one was decided)
  int root = -1;               // the rank that decided, among the survivors; -1 when no decision came
  std::vector<int> lost;       // the peers this rank knows died before the outcome was known, ascending
  double detect_unix = 0;      // when the failure was caught here (unix seconds)
  double decided_unix = 0;     // when the decision came
  double done_unix = 0;        // when the last words ended here
  std::string summary;         // the decision in one line
  std::map<int, int> stand_ins;  // dead rank -> the survivor that wrote its shard from the partner copy it holds
  std::vector<int> behind;       // the decider's only: survivors that hold no state of the step, ascending
};

// A checkpoint in memory (CKPT_MEMORY) this rank held when its last words ended, taken out of the Checkpointer so
// that it outlives it: a partner copy of a ward's shard, which a restart in place sends to the ward's replacement,
// or this rank's own staging, which it offers its next restore beside its live state. A restore checks every range
// against the checkpoint's checksums before it takes it (RestoreOptions::live).
struct MemoryCopy {
  int rank = -1;                          // whose state: a ward's, or this rank's own
  std::uint64_t step = 0;
  std::vector<store::StateRange> ranges;  // each range's name and offset into `data`: a partner copy's whole shard;
                                          // of this rank's own, a snapshot's host ranges, or its blobs
  std::shared_ptr<std::byte> data;        // owns the bytes
  std::uint64_t size = 0;
};

// ---- the checkpointer -------------------------------------------------------------------------------------------

// One per process and rank. Calls come from the training thread, except stats() which any thread may call.
class Checkpointer {
 public:
  // Reads the settings and, when a checkpoint dir is configured, starts the copy and persist threads, the
  // coordinator and the notice handlers. Fails on a bad setting.
  CKPT_HOOKS_API static Result<std::unique_ptr<Checkpointer>> create(const Options& options = {});
  // Closes when close() was not called, without waiting for other ranks: an error unwound the loop, and a writer
  // must not wait commit_timeout for ranks that may be gone. Call close() to wait for the last commit.
  CKPT_HOOKS_API ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // False when no checkpoint dir is configured; every call then succeeds and does nothing.
  CKPT_HOOKS_API bool enabled() const;
  CKPT_HOOKS_API const Config& config() const;

  // Adds a region, or replaces the one of the same name. Staging grows in the background when needed, from the
  // moment the restored state is loaded (see restore()): a restore from memory never waits for it.
  CKPT_HOOKS_API Status register_region(const RegionSpec& region);
  // Replaces every region at once (a helper re-registering a model whose tensors moved).
  CKPT_HOOKS_API Status set_regions(const std::vector<RegionSpec>& regions);
  // Copies a small named blob now; every later checkpoint saves its latest value (extras: step, RNG states).
  CKPT_HOOKS_API Status put_blob(std::string_view name, const void* data, std::size_t size,
                                 std::string_view meta_json = "{}");

  // Loads the newest complete checkpoint that verifies (CKPT_RESUME_STEP/PATH first), walking back and marking
  // FAILED the ones that do not; every rank of a job restores the same step, so all ranks call it together (each
  // reads and checks only its own shard). With `copy_into_regions`, fills every registered region from the region of the
  // same name (a missing one or a size mismatch is an error). Returns the step to resume from, 0 when none.
  // Must come before the first after_step. Without `copy_into_regions` the program loads from restored() and then
  // registers its regions again (or takes its first step): staging grows from then on.
  CKPT_HOOKS_API Result<std::uint64_t> restore(bool copy_into_regions = true);
  // A ZeRO-1 checkpoint written by another number of ranks is restored from the replica of rank % its world size
  // (the model); this rank's new partition of the optimizer state lies in the shards of its old owners. restore()
  // with `reshard_prefixes` reads the ranges of the other shards whose names start with one of them too (each
  // against its own checksum: "optim/<parameter>/" for each parameter of the new partition) and lists them in
  // restored(), in the same agreement as the rest: a bad range walks every rank back. Copying into the regions is
  // refused then (they are another partition's); the Python module builds the partition's state itself.
  CKPT_HOOKS_API Result<std::uint64_t> restore(bool copy_into_regions, const std::vector<std::string>& reshard_prefixes);
  // Both of the above, and memory this rank holds already (RestoreOptions::live).
  CKPT_HOOKS_API Result<std::uint64_t> restore(const RestoreOptions& options);
  // The regions of the checkpoint the last restore() loaded (blobs included), in shard order.
  CKPT_HOOKS_API const std::vector<RestoredRegion>& restored() const;

  // The guard: blocks until the snapshot in progress has copied every region (for device regions, makes their
  // compute streams wait for the copy instead). Call it before every parameter or optimizer update.
  CKPT_HOOKS_API Status before_update();
  // What after_step(step) will do; idempotent for one step (the decision is taken once and remembered).
  CKPT_HOOKS_API Result<Decision> poll(std::uint64_t step);
  // Call after each update with the number of completed updates. Starts a checkpoint when one is due and
  // returns true when the loop should stop (a terminal checkpoint was taken, or this rank missed the terminal step
  // the others took; close() then fails with why). Steps must increase.
  CKPT_HOOKS_API Result<bool> after_step(std::uint64_t step);
  // Training thread: a section of the current step's own work (no collective inside: a forward pass, a loss)
  // took `seconds`. With the update between before_update and after_step, which is timed anyway, it is the pace
  // the straggler detection compares across ranks (CKPT_STRAGGLER, ckpt/straggler.hpp).
  CKPT_HOOKS_API void time_section(double seconds);
  // Takes a checkpoint of `step` now. Collective: every rank must call it at the same step.
  CKPT_HOOKS_API Status save(std::uint64_t step, store::Kind kind = store::Kind::Periodic);
  // Waits for the last persist and commit and stops the threads. Idempotent; returns the first persist error.
  CKPT_HOOKS_API Status close();
  // Closes after a training error (a collective failed): does not wait for other ranks. With last words armed it
  // first waits (up to 2 s) for a failure to be detected and then for the last words to finish, so that this
  // rank's departure is not taken for another failure. Idempotent with close().
  CKPT_HOOKS_API Status abort();

  // Watches an NCCL communicator (an ncclComm_t) until close(): an asynchronous error aborts it (collectives blocked
  // on it return) and, with last words armed, starts them; last words started any other way abort it before
  // anything is saved. Uses the NCCL already in the process; fails with one line where there is none. Destroy the
  // communicator only after close(). A no-op when checkpointing is off.
  CKPT_HOOKS_API Status watch_nccl(void* comm);

  CKPT_HOOKS_API Stats stats() const;
  // What the last words did on this rank so far; any thread may call it.
  CKPT_HOOKS_API LastWordsReport last_words_report() const;
  // After the last words, once close() or abort() returned: the partner copies this rank holds (each checked again)
  // and its own staging's last two snapshots (each as two: its host ranges, and its blobs), moved out (see
  // MemoryCopy). Empty without the memory tier, when no last words
  // ran, or a second time.
  CKPT_HOOKS_API std::vector<MemoryCopy> release_memory_copies();

 private:
  struct Impl;
  explicit Checkpointer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::hooks
