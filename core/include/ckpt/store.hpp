#pragma once
// The checkpoint store: on-disk layout, crash-safe commit, newest-complete resolution with walk-back, retention.
//
// Layout under a checkpoint root (CKPT_DIR):
//   <root>/latest                     the committed step dir name, replaced atomically after each commit
//   <root>/<step, 12 digits>/         one directory per checkpoint, e.g. 000000000200
//       rank-00003.shard              the bytes of every state region rank 3 wrote, back to back
//       rank-00003.rec                its ShardRecord (JSON), written atomically after the shard is durable
//       MANIFEST.json                 written last, atomically: without it the checkpoint is incomplete
//       FAILED                        marker: verification or a restore failed; never used again, never deleted
//   <root>/.control/                  the library's own small files; epoch.json names the newest run (fencing)
//
// The decisions (parsing, completeness, which checkpoint to use, what to delete) are pure functions over in-memory
// data; the functions that touch the file system are separate and marked as such.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/result.hpp"

namespace ckpt::store {

// ---- records ------------------------------------------------------------------------------------------------

// One named byte range inside a shard file, with opaque user metadata (dtype, shape, ...).
struct StateRange {
  std::string name;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  nlohmann::json meta = nlohmann::json::object();
  // XXH3-64 of the range's own bytes: a reader of some ranges of a shard checks what it read without reading the
  // rest (read_range). Absent in checkpoints written before it existed.
  std::optional<std::uint64_t> checksum;
};

// Where a tensor region's block lies in the whole tensor, and who else holds it: what a restore onto another layout
// and an export need beyond the region's own dtype and shape. Recorded in the range's metadata as
// {"global_shape": [...], "offset": [...], "replica_group": "dp" | "rank"}; every field optional (checkpoints
// written before them, and regions that are no tensor, have none). Without "global_shape" the region is the whole
// tensor.
struct TensorChunk {
  std::vector<std::uint64_t> shape;         // the region's own block ("shape")
  std::vector<std::uint64_t> global_shape;  // the whole tensor; equal to `shape` when the region is all of it
  std::vector<std::uint64_t> offset;        // where the block starts in it, per dimension (zeros when whole)
  // "dp": every data-parallel replica holds the same block (the model, plain optimizer state); "rank": this rank
  // alone holds it (a ZeRO-1 partition); empty: not said.
  std::string replica_group;
  bool whole() const { return shape == global_shape; }
};
// The chunk a region's metadata declares; nullopt when it declares no shape (a region that is no tensor). An error
// names the field: a global shape of another rank than the shape, a block that lies outside the global shape, an
// unknown replica group.
Result<std::optional<TensorChunk>> tensor_chunk(const nlohmann::json& meta);

// What one writer put in one shard file.
struct ShardRecord {
  int rank = 0;                       // the rank that wrote it
  std::string file;                   // relative name inside the step dir, validated
  std::uint64_t size = 0;             // bytes
  std::uint64_t checksum = 0;         // XXH3-64 of the whole file
  std::vector<StateRange> states;
  std::vector<std::string> covers;    // state-shard keys it holds (see required_state_keys); may be empty
};

// Parallel layout of the job. ZeRO-1 shards optimizer state across data-parallel ranks.
struct RankCoord {
  int rank = 0, dp = 0, tp = 0, pp = 0;
};

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  bool zero1 = false;
  int world_size() const { return dp * tp * pp; }
  // Where `rank` sits when the job does not say: tp varies fastest, then dp, then pp.
  RankCoord coord_of(int rank) const { return {rank, (rank / tp) % dp, rank % tp, rank / (tp * dp)}; }
};

enum class Kind { Periodic, Terminal };

struct Manifest {
  std::uint64_t step = 0;
  Kind kind = Kind::Periodic;
  double wall_time = 0;               // seconds since the epoch when committed
  int world_size = 1;
  Layout layout;
  std::vector<RankCoord> ranks;       // one per rank of the job that wrote it
  std::vector<ShardRecord> shards;    // every shard with its checksum
};

// Serialization. Parsers never throw and reject unsafe names ("..", absolute, separators).
std::string to_json(const ShardRecord& record);
std::string to_json(const Manifest& manifest);
Result<ShardRecord> parse_shard_record(std::string_view text);
Result<Manifest> parse_manifest(std::string_view text);

// A file name safe to join under a step dir: no '/', not "." or "..", not empty, no NUL.
bool is_safe_name(std::string_view name);
// "000000000200" for step 200; the inverse rejects anything but exactly 12 digits.
std::string step_dir_name(std::uint64_t step);
std::optional<std::uint64_t> parse_step_dir_name(std::string_view name);
std::string shard_file_name(int rank);   // "rank-00003.shard"
std::string record_file_name(int rank);  // "rank-00003.rec"

// ---- the commit decision (pure) ------------------------------------------------------------------------------

// The state-shard keys a complete copy of the network must contain: "model/pp<p>/tp<t>" for every stage and
// tensor slice, plus "optim/pp<p>/tp<t>/dp<d>" for every optimizer shard when the layout is ZeRO-1, or
// "optim/pp<p>/tp<t>" for every optimizer slice when it is not. Model keys first, in (pp, tp[, dp]) order.
std::vector<std::string> required_state_keys(const Layout& layout);
// The keys a rank holds: its model slice, and its optimizer shard (ZeRO-1) or full optimizer slice.
std::vector<std::string> state_keys_of_rank(const Layout& layout, const RankCoord& coord);

struct CommitDecision {
  bool complete = false;
  std::string reason;  // why not, or a short summary when complete
};

// Is a checkpoint with these shard records complete?
//  - Periodic: exactly one record for every rank 0..world_size-1.
//  - Terminal (written by survivors): every required state key covered by exactly one written shard.
CommitDecision decide_commit(Kind kind, const Layout& layout, int world_size, const std::vector<ShardRecord>& present);

// ---- the index (pure) ------------------------------------------------------------------------------------------

enum class State { Complete, Incomplete, Corrupt, Failed };
const char* to_string(State state);

// What a scan found for one step dir.
struct Entry {
  std::uint64_t step = 0;
  State state = State::Incomplete;
  std::optional<Manifest> manifest;   // present when the manifest parsed
  std::string detail;                 // why corrupt / failed / incomplete
  std::uint64_t bytes = 0;            // bytes on disk in the step dir
  double mtime = 0;                   // newest mtime in the step dir, seconds since the epoch
};

// The steps to try in order for a resume: complete and not failed, newest first.
std::vector<std::uint64_t> resume_candidates(const std::vector<Entry>& entries);

// Which step dirs retention deletes: keeps the newest `keep` complete ones; never the newest verified one
// (`newest_verified`, when known); nothing at all while a checkpoint newer than the newest complete one is
// incomplete (a save may be in flight); incomplete leftovers older than the newest complete one; never FAILED ones.
std::vector<std::uint64_t> plan_gc(const std::vector<Entry>& entries, std::uint64_t keep,
                                   std::optional<std::uint64_t> newest_verified);

// ---- fencing of stale runs (pure) ------------------------------------------------------------------------------
//
// A requeued job runs again against the same checkpoint dir while ranks of its earlier run may still be alive (a
// frozen node that thaws). Each run has an epoch, the job's restart count. A run that starts raises the dir's
// epoch record (.control/epoch.json: max of the record and its own, never lowered within a job), and every change
// a run makes through the store carries its Fence: the store refuses it when the record names a newer run.

// The run a store call acts for. A call without one (the CLI, tools) is never fenced.
struct Fence {
  std::string job_id;       // may be empty (no Slurm job)
  std::uint64_t epoch = 0;  // the job's restart count
  std::uint64_t generation = 0;  // restart in place: the group's generation within the run (0 otherwise)
};

// The newest run that started in a checkpoint dir.
struct EpochRecord {
  std::string job_id;
  std::uint64_t epoch = 0;
  std::string run_id;  // informational, for log lines
  std::uint64_t generation = 0;  // Fence::generation; newer than any earlier generation of the same epoch
};
std::string to_json(const EpochRecord& record);
// Never throws; rejects anything but an object with a string job_id and a whole-number epoch.
Result<EpochRecord> parse_epoch_record(std::string_view text);

// The one-line refusal when `run` may no longer change the dir ("run 0 of job 42 is fenced: run 1 has started"),
// or nullopt when it may: no record, or a record of the same job at `run`'s epoch or an older one. A record of
// another job fences too: that job started in this dir after `run` did.
std::optional<std::string> fence_refusal(const Fence& run, const std::optional<EpochRecord>& record);

// What a run that starts does with the record: Write it (none yet, an older epoch of its job, another job's, or
// unreadable), Keep it (its own epoch), or nothing, being Fenced (a newer epoch of its job has started).
enum class EpochAction { Write, Keep, Fenced };
EpochAction plan_epoch_raise(const Fence& run, const std::optional<EpochRecord>& record);

// ---- file system -----------------------------------------------------------------------------------------------
//
// The functions that change the dir take an optional Fence (see above) and, when given one, refuse with
// fence_refusal's line once a newer run has started; the check runs just before the irreversible step (the rename
// that publishes a file, the rename that deletes a step dir).

// Lists every step dir under root (other names are ignored). Does not read shard bytes.
Result<std::vector<Entry>> scan(const std::string& root);

// The step dirs above `step` with neither a manifest nor a FAILED mark: saves that died. Two name lookups per step
// dir and nothing per rank, so a restart of a large job does not stat every shard to find them.
Result<std::vector<std::uint64_t>> dead_saves_above(const std::string& root, std::uint64_t step);

// Verifies one checkpoint: manifest parses and is complete, every shard exists with its size and checksum.
// The error names the shard that is wrong. `checksums=false` checks sizes only.
Status verify(const std::string& root, std::uint64_t step, bool checksums = true);

// Writes the FAILED marker for a step (atomic, idempotent; safe when several nodes do it at once).
Status mark_failed(const std::string& root, std::uint64_t step, std::string_view reason,
                   const std::optional<Fence>& fence = std::nullopt);

struct ResumeChoice {
  std::optional<std::uint64_t> step;  // absent: nothing to resume from
  std::string path;                   // the step dir
  std::vector<std::string> log;       // one line per checkpoint skipped and why, then the choice
  std::optional<Manifest> manifest;   // the chosen checkpoint's manifest (records-only resolve)
  bool timed_out = false;             // the deadline passed before a choice was made
};
// Newest complete checkpoint that verifies; each newer one that fails verification is marked FAILED (when
// `mark` is true, and `fence` is not fenced) and skipped. Never deletes anything.
ResumeChoice resolve_resume(const std::string& root, bool mark = true,
                            const std::optional<Fence>& fence = std::nullopt);

struct ResolveOptions {
  bool mark = true;
  std::optional<Fence> fence;
  // False: check_records only. Nothing but manifests is read and no shard is opened; each rank then checks the
  // bytes it loads (read_shard). True: verify, every byte of every shard.
  bool checksums = true;
  std::vector<std::uint64_t> skip;  // steps passed over unread (a restore already found them bad)
  // Checked between step dirs: once passed, the resolve stops with no choice and timed_out set.
  std::optional<std::chrono::steady_clock::time_point> deadline;
};
ResumeChoice resolve_resume(const std::string& root, const ResolveOptions& options);

// Phases of a save, reported to an optional observer; fault-injection tests kill the process at each.
// ShardsDurable fires once per writer, after its shard and record are durable. ManifestHalfWritten (between
// ShardsDurable and ManifestTempWritten in time) fires with half of the temp manifest written.
enum class SavePhase {
  ShardOpened,
  ShardHalfWritten,
  ShardsDurable,
  ManifestTempWritten,
  ManifestRenamed,
  Committed,
  ManifestHalfWritten,
};
using PhaseObserver = std::function<void(SavePhase)>;

// Writes one rank's shard: regions are appended, then finish() fsyncs the file, renames it into place and
// writes its record atomically. Never follows a symlink: the step dir is opened with O_NOFOLLOW and files are
// created relative to it with O_EXCL|O_NOFOLLOW.
class ShardWriter {
 public:
  // Creates <root>/<step> if needed (mode 0700) and opens this rank's shard for writing. Refuses a step that is
  // committed or marked FAILED, and a step dir that is a symlink. With a fence, refuses a fenced run here and
  // again in finish(), just before the shard and its record are renamed into place.
  static Result<ShardWriter> open(const std::string& root, std::uint64_t step, int rank,
                                  PhaseObserver observer = nullptr, std::optional<Fence> fence = std::nullopt);
  ShardWriter(ShardWriter&&) noexcept;
  ShardWriter& operator=(ShardWriter&&) noexcept;
  ~ShardWriter();

  // Appends one named region. `covers` keys are added to the record's coverage.
  Status append(std::string_view name, const void* data, std::uint64_t length,
                nlohmann::json meta = nlohmann::json::object());
  void add_covers(const std::vector<std::string>& keys);
  // Makes the shard and its record durable; returns the record.
  Result<ShardRecord> finish();
  // Whether the shard is written with O_DIRECT (through an aligned bounce buffer); false where the file system
  // refuses it, and after a direct write was refused and the rest went buffered.
  bool direct() const;

 private:
  ShardWriter() = default;
  struct Impl;
  Impl* impl_ = nullptr;
};

// Commits a checkpoint whose shards are durable: reads the records present, checks decide_commit, writes
// MANIFEST.json atomically (exclusive temp, fsync, rename, fsync dir), then replaces `latest` atomically.
// Fails without writing a manifest when the checkpoint is not complete, or when `fence` is fenced (checked before
// each of the two renames; a record below the fence's epoch is raised again first).
//
// `writers`, when given, are the only ranks whose records count. Last words name theirs: a periodic persist of
// the same step that was cut short may have left other ranks' records in the step dir, and a terminal checkpoint
// must not take a state key from two of them. The others' files stay where they are, out of the manifest.
Status commit(const std::string& root, const Manifest& manifest_without_shards, PhaseObserver observer = nullptr,
              const std::optional<Fence>& fence = std::nullopt,
              const std::optional<std::vector<int>>& writers = std::nullopt);

// Commits with records its caller gathered (every one durable before it was passed on): checks decide_commit over
// `manifest.shards` and writes the manifest and `latest` as commit does, without listing the step dir or reading
// a record file. The committing rank of a large job reads a constant number of files this way.
Status commit_gathered(const std::string& root, const Manifest& manifest, PhaseObserver observer = nullptr,
                       const std::optional<Fence>& fence = std::nullopt);

// ---- a job whose ranks agree over a tree ------------------------------------------------------------------------
//
// Records travel up the tree through one file per gathering rank and step (.control/gathered-<step dir>-<rank>):
// a rank reads its direct members' records and its child ranks' gathered files, so no rank reads more than a
// constant number of files per checkpoint. Retention is shared out: the committing rank renames each step dir it
// drops to .gc-<step dir> (one rename; the checkpoint is gone from the index at once), every rank removes its own
// two files from it and its gathered file of that step, and the next round removes the empty dir (or what is
// left).

Status write_gathered(const std::string& root, std::uint64_t step, int rank, const std::vector<ShardRecord>& records);
// The records `rank` gathered for `step`; an error when its file holds another step's.
Result<std::vector<ShardRecord>> read_gathered(const std::string& root, std::uint64_t step, int rank);
// Retention after `committed` was committed: plan_gc over the step dirs as their MANIFEST and FAILED names say
// (nothing is parsed; the newest verified is `committed`), each dropped step dir renamed to .gc-<step dir>, and
// the dirs an earlier round retired removed. Returns the steps retired now. A fenced run retires nothing.
Result<std::vector<std::uint64_t>> retire(const std::string& root, std::uint64_t keep, std::uint64_t committed,
                                          const std::optional<Fence>& fence = std::nullopt);
// Removes `rank`'s shard and record from retired `step`, and the records it gathered for it (missing ones are no
// error).
Status remove_retired_own(const std::string& root, std::uint64_t step, int rank);

// ---- resuming: the cheap check at job start, each rank's own read ---------------------------------------------
//
// At job start the plugin (on every node) and the leading rank check manifests only: check_records. Each rank
// then reads exactly the shard it restores with read_shard, which checks its size and checksum while reading, so
// every byte of a checkpoint is read once per resume.

// The step is not FAILED, its manifest parses, names the step and lists a complete set of shards (decide_commit).
// Reads the FAILED marker and the manifest only. `definite` (when given) is set when the checkpoint itself is at
// fault, not this process's access to it.
Result<Manifest> check_records(const std::string& root, std::uint64_t step, bool* definite = nullptr);

// Which rank's shard a rank restores from a committed checkpoint (pure).
struct RestoreSource {
  int rank = -1;          // the writer of the shard to load; -1 when none fits (error says why)
  std::string error;
  bool definite = false;  // the checkpoint is at fault (walk back past it), not the shape of this run
  bool replica = false;   // another world size: a data-parallel replica is loaded
  // A ZeRO-1 checkpoint of another world size: the replica holds the model, not this rank's optimizer partition,
  // whose ranges lie in the shards of their owners then (locate_ranges).
  bool reshard = false;
  // Another split of its tensors (tensor parallelism onto another tp, or onto or off pure data parallelism): no
  // shard is loaded whole; each tensor is assembled from the saved blocks it needs (plan_relayout).
  bool relayout = false;
};
// Its own shard in a checkpoint of the same world size; the replica of rank % world_size of a pure data-parallel
// checkpoint of another size, ZeRO-1 included (`reshard`); in a terminal checkpoint without its shard, the one
// shard covering all its state keys (`layout` and `coord` are this run's, and must be the checkpoint's layout).
// Tensor parallelism on either side of another world size, or another tp at the same size: `relayout`. Pipeline
// stages and ZeRO-1 under tensor parallelism restore onto their own layout only.
RestoreSource restore_source(const Manifest& manifest, int world_size, int rank, const Layout& layout,
                             const RankCoord& coord);

// The ranges of a checkpoint whose names start with one of `prefixes`, each with the index of its shard in
// manifest.shards, in manifest order; a shard listed in `skip` (the one a rank loaded whole) is passed over. What
// a rank of a resharded ZeRO-1 job reads of the other shards: "optim/<parameter>/" for each parameter of its new
// partition. An error when two shards hold a range of one name (the owner of a partition is one rank).
Result<std::vector<std::pair<std::size_t, StateRange>>> locate_ranges(const Manifest& manifest,
                                                                      const std::vector<std::string>& prefixes,
                                                                      std::optional<std::size_t> skip = std::nullopt);

// ---- onto another split: each wanted block assembled from the saved blocks it intersects (pure) ---------------
//
// A tensor saved in blocks (TensorChunk) restores onto another split of it. Each saved range a rank needs is read
// whole, since its checksum covers it whole, from one of the shards that hold it: replicas of a block (its
// data-parallel copies) are shared out by rank. The bytes a job reads are then one copy of what it holds: a
// wanted block that joins saved blocks reads each once; saved blocks that several ranks' blocks split are read by
// each of them.

// One saved range that a wanted block takes bytes from, and the box of the global tensor they share.
struct BlockRead {
  std::size_t shard = 0;                  // its shard's index in manifest.shards
  StateRange range;                       // read whole and checked against its checksum
  TensorChunk saved;                      // its block
  std::vector<std::uint64_t> lo, extent;  // the shared box, in the global tensor's coordinates
};

// What a rank restores of one name: the block it wants and the reads it is made of. A range that is no tensor
// (a blob: optimizer metadata, RNG states) is one read of the whole range, with no box.
struct RelayoutPiece {
  std::string name;
  nlohmann::json meta;                    // the saved metadata with the wanted block's "shape" and "offset"
  std::optional<TensorChunk> want;        // nullopt: no tensor
  std::uint64_t bytes = 0;                // the wanted block's size
  std::uint64_t element_size = 0;         // bytes per element (tensors)
  std::vector<BlockRead> reads;
};

// Every name the checkpoint holds, as `rank` of this run restores it. The block it wants of a tensor: the one this
// run declares for that name in `declared` (region name -> its metadata, tensor_chunk's fields); else the block
// of the tensor a saved range's "split_like" names (an optimizer state tensor shaped like its parameter is split
// as the parameter is), when that tensor has the same global shape; else the whole tensor. A range that is no
// tensor (a blob) comes from the shard of rank % the checkpoint's world size, else the first that holds it. An
// error names the tensor: another global shape or element size than saved, a part no saved block holds, saved
// blocks that overlap, metadata that does not parse; under tensor parallelism, a tensor saved without its place
// in the whole (global_shape), or a region this run registers that was saved as no tensor.
Result<std::vector<RelayoutPiece>> plan_relayout(const Manifest& manifest,
                                                 const std::map<std::string, nlohmann::json>& declared, int rank);

// Copies `read`'s box from the saved block's bytes (`saved`, read.range.length of them) into the wanted block's
// (`wanted`), both row-major with `element_size` bytes per element.
void copy_box(const BlockRead& read, const std::byte* saved, const TensorChunk& want, std::byte* wanted,
              std::uint64_t element_size);

// The ranges of its replica's shard a rank of a resharded ZeRO-1 job reads, as indexes into record.states: all
// but the other partitions ("replica_group": "rank" ranges whose names start with none of `prefixes`), so that
// across the job each partition's bytes are read once.
std::vector<std::size_t> replica_ranges(const ShardRecord& record, const std::vector<std::string>& prefixes);

// One rank's record of a committed step (rank-<r>.rec): what a rank that loads its own shard needs, without
// reading the manifest's record of every rank.
// `definite` (when given) is set when the record itself is missing or wrong.
Result<ShardRecord> read_record(const std::string& root, std::uint64_t step, int rank, bool* definite = nullptr);

struct ShardRead {
  Status status;
  bool definite = false;        // the shard is at fault (missing, short, checksum), not this process's access
  std::uint64_t bytes = 0;      // shard bytes read
  int retries = 0;              // transient errors retried
};
struct ShardReadOptions {
  // A transient error (EACCES, ESTALE, ETIMEDOUT, EIO, EAGAIN, ...) on open or read is retried this many times,
  // after a pause that starts at `backoff` and doubles; the read goes on where it stopped.
  int retries = 3;
  std::chrono::milliseconds backoff{100};
  // Fault injection for tests: called before each open ("open") and read ("read"); a nonzero errno fails it.
  std::function<int(std::string_view op)> inject;
};
// Reads `record`'s shard of `step` into `dest` (record.size bytes) and checks its size and XXH3 checksum over the
// bytes as they arrive.
ShardRead read_shard(const std::string& root, std::uint64_t step, const ShardRecord& record, void* dest,
                     const ShardReadOptions& options = {});

// Reads one range of `record`'s shard of `step` into `dest` (range.length bytes) and checks it against the range's
// own checksum; the shard's size is checked against the record too. A range without a checksum (an older
// checkpoint) is refused: only the whole shard's checksum can vouch for it (read_shard, stream_shard).
ShardRead read_range(const std::string& root, std::uint64_t step, const ShardRecord& record, const StateRange& range,
                     void* dest, const ShardReadOptions& options = {});

// Assembles a planned block (a RelayoutPiece's `reads`, for the wanted block `want`) into `into`: each saved range
// read whole and checked against its own checksum, straight into `into` when it is the wanted block itself, else
// into `scratch` and its box copied over (copy_box). A blob (`want` nullopt) is its one range as it lies. Stops at
// the first failed read; `bytes` counts what was read.
ShardRead read_block(const std::string& root, const Manifest& manifest, const std::vector<BlockRead>& reads,
                     const std::optional<TensorChunk>& want, std::uint64_t element_size, std::byte* into,
                     std::vector<std::byte>& scratch);

// Reads `record`'s shard of `step` in file order through `sink`, in chunks of at most 8 MiB (their offset in the
// file, their bytes), with the size and checksum checks of read_shard: the sink sees every byte once, and only a
// success says they were the checkpoint's. A sink that returns false ends the read (a failure, not definite).
using ShardSink = std::function<bool(std::uint64_t offset, const char* data, std::size_t size)>;
ShardRead stream_shard(const std::string& root, std::uint64_t step, const ShardRecord& record, const ShardSink& sink,
                       const ShardReadOptions& options = {});
// One range of the shard through `sink` (offsets in the file), checked against the range's own checksum, as
// read_range reads it.
ShardRead stream_range(const std::string& root, std::uint64_t step, const ShardRecord& record, const StateRange& range,
                       const ShardSink& sink, const ShardReadOptions& options = {});

// Bytes a rank already holds in memory under a range's name: a survivor of a restart in place holds the state it
// just checkpointed.
struct LiveRange {
  std::string name;
  const void* data = nullptr;
  std::size_t size = 0;
  // The XXH3-64 its holder recorded for these bytes (a node tier's snapshot), where it has one.
  std::optional<std::uint64_t> recorded;
};
// For each range of `record.states`, the index in `live` of memory that holds that range's bytes exactly: the
// same name and length, and an XXH3-64 equal to the range's own checksum; where `live` names a range more than once
// (a survivor's live tensor, then its staging's copy), the first that matches. Memory whose recorded checksum is the
// range's is tried before memory without one, and memory recorded with another checksum is never hashed: a
// relaunch's fresh tensors are not hashed in vain where the node tier holds the range. A range without a checksum
// (an older checkpoint) never matches. Reads nothing but `live`'s memory.
std::vector<std::optional<std::size_t>> match_live_ranges(const ShardRecord& record,
                                                          const std::vector<LiveRange>& live);

// Reads a shard's records back for a restore; the caller verifies first (see verify / resolve_resume).
Result<std::vector<ShardRecord>> read_records(const std::string& root, std::uint64_t step);

// Deletes what plan_gc selects. With dry_run, only returns it. Reads the newest complete checkpoints' bytes to
// find the newest verified one; when none verifies it deletes nothing and says so. `keep` must be at least 1.
// With a fence, a fenced run deletes nothing (checked before each step dir is removed).
Result<std::vector<std::uint64_t>> gc(const std::string& root, std::uint64_t keep, bool dry_run,
                                      const std::optional<Fence>& fence = std::nullopt);

// ---- names, reading back, discarding a dead save ----------------------------------------------------------------

// The manifest, the FAILED marker (both in a step dir) and the latest pointer (in the root).
inline constexpr std::string_view kManifestName = "MANIFEST.json";
inline constexpr std::string_view kFailedName = "FAILED";
inline constexpr std::string_view kLatestName = "latest";
// The largest step a 12-digit step dir name holds; writers refuse larger ones.
inline constexpr std::uint64_t kMaxStep = 999'999'999'999;

// "periodic" or "terminal".
const char* to_string(Kind kind);
// The enumerator's name, e.g. "ShardsDurable".
const char* to_string(SavePhase phase);

// The manifest of a committed checkpoint, parsed and checked against its step dir name. Does not verify shards.
Result<Manifest> read_manifest(const std::string& root, std::uint64_t step);

// The newest committed checkpoint's step as the root's `latest` pointer names it, when that step's manifest reads;
// nothing otherwise. A cheap hint (one small file and one manifest), not a resolution: nothing is verified.
std::optional<std::uint64_t> latest_committed_step(const std::string& root);

// The records of the shards written so far (the rank-*.rec files), sorted by rank: what commit decides on.
Result<std::vector<ShardRecord>> read_present_records(const std::string& root, std::uint64_t step);

// Removes a step dir that has no manifest, e.g. a save that died before a restart. A save that writes a step
// again must call this first (on one rank, before any ShardWriter::open), or records of the dead save could be
// committed with the new ones. Refuses a committed, FAILED or corrupt step dir; a missing one is success.
Status discard_incomplete(const std::string& root, std::uint64_t step,
                          const std::optional<Fence>& fence = std::nullopt);

// Small files of the library's own under <root>/.control that outlive a run (what CKPT_INTERVAL=auto measured).
// Removes `name` in the dir `parent` and everything below it, never following a symlink (a symlink is removed, not
// what it points to). Success when it does not exist.
Status remove_tree(const std::string& parent, const std::string& name);

// `name` must be a safe name. The write is atomic (temp file, fsync, rename, fsync of the dir); the read returns
// nullopt when the file does not exist and an error when it cannot be read or is over 1 MiB.
// A fenced run's write is refused (checked just before the rename).
Status write_control_file(const std::string& root, std::string_view name, std::string_view content,
                          const std::optional<Fence>& fence = std::nullopt);
Result<std::optional<std::string>> read_control_file(const std::string& root, std::string_view name);
// Creates the control file `name` only when nobody has: the first of racing creators (on any host that shares the
// dir) wins and gets true; every later one gets false and the winner's file stays as it was. A fenced run's claim
// is refused. Last words claim their run's terminal checkpoint with it: one side of a partition writes, never two.
Result<bool> claim_control_file(const std::string& root, std::string_view name, std::string_view content,
                                const std::optional<Fence>& fence = std::nullopt);
// The claim's name for one run (job id, restart count, in-place generation).
std::string last_words_claim_name(const Fence& run);

// The control file that holds the dir's EpochRecord.
inline constexpr std::string_view kEpochName = "epoch.json";
// A run that starts: raises the dir's epoch record to `run` (plan_epoch_raise), creating the root and .control
// when needed. Fails with fence_refusal's line when a newer run of the job has started. `run_id` is recorded for
// log lines. Idempotent: every rank of a run may call it; only a change writes.
Status raise_epoch(const std::string& root, const Fence& run, std::string_view run_id = {});
// The dir's epoch record; nullopt when no run has recorded one.
Result<std::optional<EpochRecord>> read_epoch(const std::string& root);

}  // namespace ckpt::store
