// Last words on this rank's side (last_words_runtime.hpp): arming them at create (training thread), and on the
// last-words thread, with training frozen outside an update, the device state copied to host memory and this
// rank's live state written as a terminal shard.
#include <algorithm>
#include <chrono>
#include <mutex>

#include "checkpointer_impl.hpp"
#include "ckpt/posix.hpp"
#include "log.hpp"

namespace ckpt::hooks {

namespace {

using posix::join;

}  // namespace

Result<std::unique_ptr<LastWords>> Checkpointer::Impl::start_last_words(bool speak) {
  Impl* p = this;
  // Committed before Slurm's SIGKILL: 90% of KillWait, from the detection.
  LastWords::Timing timing;
  timing.speak = speak;
  timing.deadline = std::chrono::milliseconds(std::max<std::uint64_t>(config.kill_wait_s * 900, 1000));
  timing.exit_grace = std::chrono::milliseconds(config.exit_grace_s * 1000);
  // Heartbeats every fifteenth of the silence limit (100 ms for the default 1.5 s), at most 50 per second.
  timing.dead_after = std::chrono::milliseconds(config.heartbeat_timeout_ms);
  timing.period = std::max(std::chrono::milliseconds(20), timing.dead_after / 15);
  // A later generation of restart in place joins ranks that are up and connected already: a replacement that dies
  // meanwhile must cost seconds, not the first start's two minutes (run() then calls the roll).
  if (config.generation > 0) {
    timing.connect_timeout = std::max(std::chrono::milliseconds(20000), timing.dead_after * 10);
  }
  // The mesh dir is per run (the run id carries the restart count): a stale rank of an earlier run publishes
  // and reads addresses in its own run's dir, and a newer run's ranks refuse its handshake, since the per-run
  // secret in their mesh dir is not the one it holds (heartbeat.hpp).
  return LastWords::start(
      config, join(join(config.dir, ".control"), config.run_id + "-mesh"), tracker,
      [p](std::uint64_t step, const std::vector<std::string>& keys) { return p->write_terminal(step, keys); },
      [p](Clock::time_point deadline) { return p->rescue_device_state(deadline); }, timing);
}

void Checkpointer::Impl::free_rescued() {
  if (rescued.buffer.data != nullptr && device && !rescued.in_staging) device->free_pinned(rescued.buffer.data);
  rescued.buffer = {};
  rescued.in_staging = false;
}

// The last-words thread, training frozen outside an update, before this rank reports: the device regions into
// host memory, as they were after the last update, by `deadline`. A rank that cannot do it reports that it
// cannot write, so that the survivors elect another replica.
Status Checkpointer::Impl::rescue_device_state(Clock::time_point deadline) {
  free_rescued();
  rescued.offsets.assign(regions.size(), 0);
  std::size_t total = 0;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].memory != Memory::Device) continue;
    rescued.offsets[i] = total;
    total += regions[i].size;
  }
  if (total == 0) return Status::success();
  auto t0 = Clock::now();
  // The snapshot's pinned staging when no persist is reading it (training is frozen: none will start), since
  // pinning tens of GiB takes seconds; otherwise memory of its own.
  bool in_staging = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    in_staging = queue.idle() && staging.pinned.size >= total;
    staging.lent = in_staging;
  }
  Result<void*> buffer = in_staging ? Result<void*>(staging.pinned.data) : device->alloc_pinned(total);
  if (!buffer) return Status::failure(buffer.error());
  std::vector<DeviceCopy> copies;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const RegionSpec& r = regions[i];
    if (r.memory != Memory::Device || r.size == 0) continue;
    copies.push_back({static_cast<std::byte*>(*buffer) + rescued.offsets[i], r.data, r.size, r.stream});
  }
  if (Status s = device->rescue(copies, deadline); !s) {
    // The copy may still land in the buffer: it is left allocated.
    return s;
  }
  rescued.buffer = {*buffer, total};
  rescued.in_staging = in_staging;
  log::info(rank, "last words: copied " + mib(total) + " of device state to host memory in " +
                      std::to_string(static_cast<int>(seconds_since(t0) * 1000)) + " ms");
  return Status::success();
}

// The last-words thread, training frozen outside an update: this rank's live state, consistent at `step`, as a
// terminal shard covering `keys` (device regions from what rescue_device_state copied).
Status Checkpointer::Impl::write_terminal(std::uint64_t step, const std::vector<std::string>& keys) {
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const RegionSpec& r = regions[i];
    const std::byte* data = static_cast<const std::byte*>(r.data);
    if (r.memory == Memory::Device) {
      if (rescued.offsets.size() != regions.size() || (rescued.buffer.data == nullptr && r.size > 0)) {
        return Status::failure("region '" + r.name + "' is device memory and was not copied to the host");
      }
      data = static_cast<const std::byte*>(rescued.buffer.data) + rescued.offsets[i];
    }
    pieces.push_back({r.name, data, r.size, region_meta[i]});
  }
  for (const Blob& b : blobs) pieces.push_back({b.name, b.bytes.data(), b.bytes.size(), b.meta});
  if (Status s = write_pieces(step, pieces, keys); !s) return s;
  log::info(rank, "last words: wrote the terminal shard of step " + std::to_string(step) + " (" +
                      std::to_string(keys.size()) + " state keys)");
  return Status::success();
}

}  // namespace ckpt::hooks
