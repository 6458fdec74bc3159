#pragma once
// The node tier (CKPT_MEMORY in a Slurm job; CKPT_NODE_DIR, /dev/shm by default): the staging buffers live in files
// of a node-local memory file system instead of anonymous memory, so the last snapshots outlive the process. When
// ckpt-run relaunches the job's ranks inside the allocation, a rank that comes back on the same node offers the
// ranges it finds there to restore(), which takes a range only where its bytes hash to the agreed checkpoint's
// recorded checksum (store::match_live_ranges) and reads the rest from the checkpoint dir. Same RAM as before: a
// tmpfs page is the page the anonymous mapping would have been; nothing is copied.
//
// Files, in <node_dir>/slurm-ckpt.<uid>.<job id>/ (0700 and the job user's own; a dir of that name that is anyone
// else's, or a symlink, is refused with one line and staging stays anonymous):
//   <d>.rank-<r>.<token>.<n>  a staging buffer, mapped MAP_SHARED (d: the XXH3-64 of the checkpoint dir, so that
//                             two steps of one allocation training into different dirs never meet; token: the
//                             creating process's, random)
//   <d>.rank-<r>.json         the index: the job, restart count, host, checkpoint dir, rank and writing process it
//                             belongs to, and per buffer its file and, once a snapshot is whole in it, that
//                             snapshot's step, launch (run id) and world size, its pieces (name, offset, size,
//                             XXH3-64, meta) and, inline, the small pieces that lie outside staging (the blobs).
//   A buffer may also hold the copy of a ward's snapshot this rank keeps as its partner (memory_tier.hpp): its
//   entry names the ward. A relaunched holder never restores from it: it serves it to the ward's own relaunched
//   process when that finds nothing of its own on its node (a node that replaced a dead one).
// The index is rewritten (atomically) before a snapshot overwrites a buffer and after it is whole in it. A
// relaunched rank maps the buffers of an index only when it names this job and its restart count, this host, this
// checkpoint dir and this rank; another run's index is said in one line, and its files are removed. A relaunch that
// moved or shrank the job leaves files of ranks that no longer run on this node: where this launch's ranks on the
// node are known (SLURM_GTIDS) and the process that wrote such an index is gone, its ranges are offered to restore
// too (what data-parallel ranks hold alike is the same bytes, and a range is taken only where it hashes to this
// rank's own recorded checksum), never as a snapshot to resume from, and its files go with this rank's. The
// plugin removes the dir when the job ends on the node (slurm_spank_job_epilog, as the job's user), and before the
// job's first task on the node (slurm_spank_job_prolog: an earlier job with the same id left it, its epilog failed).
//
// Threads: the worker (allocate, drop, whole) and the training thread (overwriting, found, adopt_fetched,
// release_found; allocate and drop after wait_idle); the memory tier's receivers (allocate, drop, overwriting,
// held_copy, with_ward_copy). Every function is thread-safe.
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/posix.hpp"
#include "ckpt/store.hpp"
#include "staging.hpp"

namespace ckpt::hooks {

class NodeTier {
 public:
  // Whose buffers these are: an index that names anything else is another run's.
  struct Identity {
    std::string job;
    std::uint64_t restart = 0;  // SLURM_RESTART_COUNT: a requeued job is another run, though its id is the same
    std::string host;
    std::string checkpoint_dir;
    int rank = 0;
    std::vector<int> node_ranks;  // this launch's ranks on this node (SLURM_GTIDS); empty: not known
    std::string launch;           // this launch's run id: the snapshots of one launch are one timeline
    int world_size = 1;
  };

  // A snapshot an earlier process left whole, as restore() may resume from it when it is newer than the checkpoint
  // dir's: every piece with the XXH3-64 it had when it was whole.
  struct SnapshotPiece {
    std::string name;
    nlohmann::json meta;
    const std::byte* data = nullptr;
    std::size_t size = 0;
    std::uint64_t checksum = 0;
  };
  struct Snapshot {
    std::uint64_t step = 0;
    std::string launch;
    int world_size = 0;
    std::vector<SnapshotPiece> pieces;
  };

  // The job's dir's name under the node dir.
  static std::string dir_name(uid_t uid, const std::string& job);
  // What the names of a rank's files in it begin with: "<XXH3-64 of the checkpoint dir>.rank-<r>.".
  static std::string file_prefix(const std::string& checkpoint_dir, int rank);
  // Opens (making it) the job's dir under `node_dir` and reads what an earlier process of this job left for this
  // rank. Fails with one line when the dir is refused; the caller then keeps staging anonymous.
  static Result<std::unique_ptr<NodeTier>> open(const std::string& node_dir, const Identity& identity);
  ~NodeTier();
  NodeTier(const NodeTier&) = delete;
  NodeTier& operator=(const NodeTier&) = delete;

  const std::string& path() const { return path_; }

  // A staging buffer of at least `bytes`, backed by a file here: one the last generation of this process handed
  // over (BufferReserve), renamed as this tier's, or a new one. Fails (/dev/shm full) with a line.
  Result<HostBuffer> allocate(std::size_t bytes);
  // After the last words of a restart in place: `buffer`, one of this tier's, goes to the program (a MemoryCopy)
  // and from there to the next generation. Its file is named on it and outlives remove_all(); the reserve that
  // takes it back removes or renames it.
  void hand_over(HostBuffer& buffer);
  // The buffer at `data` is about to be released: its file goes.
  void drop(const std::byte* data);
  // A snapshot starts writing into the buffer at `data`: the index no longer lists what it held.
  void overwriting(const std::byte* data);
  // The snapshot of `step` is whole: the pieces that lie in a buffer here are listed for it, each with its XXH3-64
  // (`sums`, one per piece); the small ones that lie elsewhere (blobs) are copied into the index.
  void whole(std::uint64_t step, const std::vector<Piece>& pieces, const std::vector<std::uint64_t>& sums);

  // Holder: the buffer at `data` now holds `ward`'s copy of `step` whole, `ranges` at their offsets in it, each with
  // its checksum.
  void held_copy(const std::byte* data, int ward, std::uint64_t step, const std::vector<store::StateRange>& ranges);
  // Holder: `use` on a copy of `ward`'s snapshot, of `world_size` ranks, that an earlier process of this rank kept
  // here (`step` of `launch`, or the newest), under the lock (release_found() waits for it). False, `use` not
  // called: there is none.
  bool with_ward_copy(int ward, int world_size, std::optional<std::uint64_t> step, const std::string& launch,
                      const std::function<void(const Snapshot&)>& use) const;
  // A snapshot of this rank fetched from the copy its partner kept (`bytes` holds its pieces): among
  // found_snapshots() as if an earlier process had left it on this node, until release_found(). Its ranges are not
  // added to found(), which the restore has read by then: the caller offers them itself.
  void adopt_fetched(Snapshot snapshot, HostBuffer bytes);

  // What an earlier process of this job left for this rank, as memory restore() may take ranges from. Valid until
  // release_found().
  std::vector<store::LiveRange> found() const;
  // The whole snapshots among them, newest first. Valid until release_found().
  const std::vector<Snapshot>& found_snapshots() const { return snapshots_; }
  // The one of `step` taken by `launch` (any launch where it is empty), or null. Valid until release_found().
  const Snapshot* find_snapshot(std::uint64_t step, const std::string& launch) const {
    for (const Snapshot& s : snapshots_) {
      if (s.step == step && (launch.empty() || s.launch == launch)) return &s;
    }
    return nullptr;
  }
  // Unmaps what found() offered and removes its files (the first snapshot of this process, or close()).
  void release_found();
  // Removes every file of this rank here, its index too (a restart in place: the process keeps its state itself),
  // but those handed over. Mappings still held elsewhere keep their bytes until they are unmapped.
  void remove_all();
  // After the last words of a restart in place, the tier of the Checkpointer that ended: its files stay, the same
  // pages as the mappings the process took out, until this process opens its next node tier (its next generation
  // goes on in place), which removes them first. A process that gives up instead leaves them to ckpt-run's relaunch
  // inside the allocation, which restores from them.
  static void keep_until_next_open(std::unique_ptr<NodeTier> tier);

 private:
  struct Buffer {
    std::string file;
    const std::byte* data = nullptr;
    std::size_t size = 0;
    bool whole = false;
    std::uint64_t step = 0;
    std::vector<store::LiveRange> pieces;  // data points into the buffer
    std::vector<std::uint64_t> sums;       // one per piece
    std::vector<nlohmann::json> metas;     // one per piece
    nlohmann::json blobs;                  // the snapshot's pieces outside staging, inline; null: none or too big
    int ward = -1;                         // whole with a ward's copy (held_copy), not a snapshot of this rank's
    bool handed_over = false;              // hand_over(): its file is the reserve's to remove
  };
  struct WardCopy {
    int ward = -1;
    Snapshot snapshot;
  };
  NodeTier() = default;
  void adopt_earlier();   // open(): the index an earlier process left
  bool of_this_run(const nlohmann::json& index) const;
  std::string take_buffers(const nlohmann::json& index, const std::vector<std::string>& files, bool own);
  std::optional<HostBuffer> map_entry(const nlohmann::json& entry, const std::vector<std::string>& files);
  void take_entry(const nlohmann::json& entry, const HostBuffer& map, bool own);  // one mapped buffer's pieces
  void take_ward_copy(const nlohmann::json& entry, const HostBuffer& map);        // one mapped buffer's ward copy
  void remove_left_behind();  // open(): what ranks that no longer run on this node left
  bool offer_departed(const nlohmann::json& index, int other, const std::vector<std::string>& files);
  void write_index();     // mu_ held
  std::string index_name() const;

  Identity identity_;
  std::string path_;
  std::string token_;
  posix::Fd dir_;
  mutable std::mutex mu_;
  std::vector<Buffer> buffers_;           // guarded by mu_: this process's
  std::uint64_t next_file_ = 0;           // guarded by mu_
  std::vector<HostBuffer> found_maps_;    // guarded by mu_: an earlier process's buffers, read-only
  std::vector<std::string> found_files_;  // guarded by mu_
  nlohmann::json found_entries_ = nlohmann::json::array();  // guarded by mu_: their index entries, kept listed
  std::vector<store::LiveRange> found_;   // guarded by mu_
  std::vector<Snapshot> snapshots_;       // set by open(), cleared by release_found() (training thread)
  std::vector<std::vector<std::byte>> found_blobs_;  // what the inline pieces of snapshots_ and found_ point into
  std::vector<WardCopy> ward_copies_;     // guarded by mu_: an earlier process's copies of its wards, newest first
};

}  // namespace ckpt::hooks
