#pragma once
// Staging memory and the snapshot copy: where each region lands, memory faulted in once and reused, and a small
// pool of threads that copies a snapshot in chunks while training goes on.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/hooks.hpp"

namespace ckpt::hooks {

// Anonymous memory, mapped once and faulted in at allocation (MAP_POPULATE): a first touch costs several times
// the copy that later reuses the page, so it must not happen inside a snapshot.
class HostBuffer {
 public:
  HostBuffer() = default;
  // Maps and populates `bytes` (rounded up to a page); 0 gives an empty buffer. Fails with a "ckpt:" line.
  static Result<HostBuffer> allocate(std::size_t bytes);
  // Maps the file `fd` (the node tier's): with `writable`, sized to `bytes` (rounded up to a page), its pages
  // allocated (fallocate: a full file system fails here, not at a later fault) and populated, MAP_SHARED so that
  // the bytes outlive the process; without, the first `bytes` of it read-only. Fails with a line.
  static Result<HostBuffer> map_file(int fd, std::size_t bytes, bool writable);
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  // Memory of this process alone (allocate()), not a file's pages.
  bool anonymous() const { return anonymous_; }
  // The node tier's file this buffer maps, once the tier hands it over (NodeTier::hand_over); empty otherwise.
  const std::string& file() const { return file_; }
  void set_file(std::string path) { file_ = std::move(path); }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool anonymous_ = false;
  std::string file_;
};

// The buffers of a generation that ended in place, kept for the next one: its staging and the memory tier's held
// copies take them instead of mapping and faulting in the same gigabytes again (0.3 s of CPU per GiB on a 2-core
// VM, spent in the new generation's first step). One per process. Opened when the last words hand their memory
// over (Checkpointer::release_memory_copies); a buffer comes back once the program lets go of the last view of
// it, so nothing that still reads it is written over. Closed at the next Checkpointer's third snapshot or its
// close, when every buffer it will ask for has been asked for. Two kinds: anonymous memory, and the node tier's
// files (a taker renames the file as its own; one nobody takes is removed with its mapping). A request it cannot
// fill lets go of every buffer of its kind first: the process never holds a kept buffer beside a new one, so never
// more than the last generation did.
class BufferReserve {
 public:
  static BufferReserve& process();
  // From now on, buffers given back are kept.
  void open();
  // Keeps `buffer` while open (anonymous memory, or a node tier's file); else lets it go (a file's too). Any thread.
  void give(HostBuffer buffer);
  // Anonymous memory of at least `bytes`: the smallest kept buffer of at most 1/16 more (or a page), else a new
  // mapping, made after letting go of every anonymous buffer kept.
  Result<HostBuffer> take_or_allocate(std::size_t bytes);
  // A kept node tier file of at least `bytes` (at most 1/16 more) whose path begins with `prefix`, still mapped;
  // nothing (after letting go of every file kept) when there is none.
  std::optional<HostBuffer> take_file(std::size_t bytes, const std::string& prefix);
  // What a reserve did between its open and its close.
  struct Use {
    std::size_t taken = 0;   // bytes the next generation took
    std::size_t unused = 0;  // bytes let go untaken (a miss, or the close)
  };
  // Lets go of what is kept; later buffers given back are let go at once. What it did since it was opened, once.
  Use close();
  std::size_t kept_bytes() const;

 private:
  std::optional<HostBuffer> take(std::size_t bytes, bool file, const std::string& prefix);

  mutable std::mutex mu_;
  bool open_ = false;              // guarded by mu_
  std::vector<HostBuffer> kept_;   // guarded by mu_
  Use use_;                        // guarded by mu_
};

// One named byte range of a shard, pointing into staging or into a blob the job owns.
struct Piece {
  std::string name;
  const std::byte* data = nullptr;
  std::size_t size = 0;
  nlohmann::json meta;
};

// Regions start at multiples of this in staging: whole cache lines for the copy threads.
inline constexpr std::size_t kStagingAlign = 64;

// Where one region lands: in host staging for host regions, in pinned staging for device regions.
struct Slot {
  std::size_t region = 0;  // index into the region list
  std::size_t offset = 0;
  std::size_t size = 0;
};

struct StagingPlan {
  std::vector<Slot> host;    // host regions, in registration order
  std::vector<Slot> device;  // device regions, in registration order
  std::size_t host_bytes = 0;
  std::size_t device_bytes = 0;
};

// Lays the regions out back to back, each aligned to kStagingAlign: at most 63 bytes of padding per region.
StagingPlan plan_staging(const std::vector<RegionSpec>& regions);

struct CopyChunk {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  std::size_t size = 0;
};

// Splits copies into chunks of at most `chunk` bytes (chunk > 0) so that threads share big regions.
std::vector<CopyChunk> split_copies(const std::vector<CopyChunk>& copies, std::size_t chunk);

// Test seam: called before each chunk is copied, on whichever thread copies it; null (the default) for none.
// Set it only while no batch is running.
void set_copy_hook_for_testing(void (*hook)());

// Copies one batch of chunks at a time on its threads; the caller may help. With 0 threads, start() copies
// everything on the calling thread.
class CopyPool {
 public:
  explicit CopyPool(unsigned threads);
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  // Starts copying a batch and returns at once. The previous batch must be finished.
  void start(std::vector<CopyChunk> chunks);
  // Copies chunks no thread has taken yet on the calling thread, then blocks until the batch is finished.
  void help_and_wait();
  // Blocks until the batch is finished, without helping.
  void wait();
  // True when no batch is running.
  bool idle() const;
  // Seconds from start() to the last chunk of the most recent finished batch.
  double last_batch_seconds() const;
  unsigned threads() const { return static_cast<unsigned>(threads_.size()); }

 private:
  struct Batch {
    std::vector<CopyChunk> chunks;   // written before the batch is published, read-only after
    std::atomic<std::size_t> next{0};
    std::size_t remaining = 0;       // guarded by mu_
    std::chrono::steady_clock::time_point started;
  };
  void run(Batch& batch);
  void worker();

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::shared_ptr<Batch> batch_;     // guarded by mu_
  std::uint64_t generation_ = 0;     // guarded by mu_
  bool stop_ = false;                // guarded by mu_
  double last_seconds_ = 0;          // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace ckpt::hooks
