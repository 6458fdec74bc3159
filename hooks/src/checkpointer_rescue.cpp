// Last words on this rank's side (last_words_runtime.hpp): arming them at create (training thread), and on the
// last-words thread, with training frozen outside an update, the device state copied to host memory and this
// rank's live state written as a terminal shard.
#include <algorithm>
#include <chrono>
#include <mutex>

#include <cstdlib>

#include "checkpointer_impl.hpp"
#include "ckpt/memtier.hpp"
#include "ckpt/posix.hpp"
#include "heartbeat.hpp"
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
    // Not with the memory tier: staging holds the snapshot the last words may write from.
    in_staging = !tier && queue.idle() && staging.pinned.size >= total;
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

// ---- the memory tier ----------------------------------------------------------------------------------------------

namespace {

// Ranks per node where the launcher says and every node has as many (srun's block distribution, torchrun's local
// world): the partner sits `distance` nodes of them further (ckpt::memtier::stride_partner); 0 where unknown.
int ranks_per_node() {
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "LOCAL_WORLD_SIZE"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    if (auto n = memtier::uniform_tasks_per_node(v)) return *n;
    return 0;
  }
  return 0;
}

}  // namespace

void Checkpointer::Impl::start_memory_tier() {
  if (config.memory_bytes == 0 || !watch.last_words) return;
  auto off = [&](const std::string& why) {
    watch.last_words->network().set_partner_acceptor(nullptr);  // a partner link held since the join is refused
    // Every rank finds the same: rank 0 says it for the job.
    if (rank == 0) log::warn(0, "memory tier off: " + why + "; checkpoints go to the checkpoint dir alone");
  };
  if (!watch.last_words->speaks()) {
    return off("it serves the last words, which are off (CKPT_LAST_WORDS=on and a declared layout arm them)");
  }
  const int per_node = ranks_per_node();
  if (per_node <= 0) {
    return off("the ranks per node are not the same on every node, or not known (SLURM_STEP_TASKS_PER_NODE, "
               "LOCAL_WORLD_SIZE)");
  }
  heartbeat::Mesh& mesh = watch.last_words->network();
  MemoryTier::Settings s;
  s.rank = rank;
  s.world_size = config.world_size;
  s.max_bytes = config.memory_bytes;
  s.node = node.get();  // held copies outlive the process there, for a ward relaunched on a replaced node
  s.partner = memtier::stride_partner(rank, config.world_size, per_node, config.memory_distance);
  s.wards = memtier::stride_wards(rank, config.world_size, per_node, config.memory_distance);
  // The pairing assumes ranks fill nodes in order; the published node names check it for this rank's partner.
  if (s.partner >= 0) {
    const std::string mine = mesh.node_of(rank);
    const std::string theirs = mesh.node_of(s.partner);
    if (mine.empty() || theirs.empty() || mine == theirs) {
      log::warn(rank, "memory tier: rank " + std::to_string(s.partner) + ", the partner the layout gives, runs on " +
                          (theirs.empty() ? std::string("an unknown node") : "node " + theirs) +
                          (mine == theirs && !mine.empty() ? ", this rank's own" : "") +
                          ": this rank keeps its memory checkpoints in its own staging only");
      s.partner = -1;
    }
  } else {
    off("the job runs on one node: a partner copy must be on another node");
  }
  tier = MemoryTier::start(s, mesh);
  if (config.memory_interval != kMemoryIntervalAuto) {
    std::lock_guard<std::mutex> lock(mu);
    stats.memory_interval = config.memory_interval;
  } else if (rank == 0) {
    sched.memory_meter.emplace(steady_seconds());
  }
  watch.last_words->set_memory(LastWords::MemoryHooks{
      [this] {
        std::vector<std::uint64_t> steps;
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& job : {whole_snapshot, previous_snapshot}) {
          if (job) steps.push_back(job->step);
        }
        return steps;
      },
      [this] {
        tier->freeze();
        return tier->verified_copies();
      },
      [this](std::uint64_t step, const std::vector<std::string>& keys) { return write_from_staging(step, keys); },
      [this](int ward, std::uint64_t step, const std::vector<std::string>& keys) {
        return write_from_copy(ward, step, keys);
      },
      [this](int who, std::uint64_t need, std::uint64_t budget) { on_tier_off(who, need, budget); }});
  if (rank == 0) {
    log::info(0, "memory tier: a checkpoint in memory " +
                     (config.memory_interval == kMemoryIntervalAuto
                          ? std::string("at Young's interval for its measured cost, as often as the copies keep up "
                                        "at most (auto)")
                          : "every " + std::to_string(config.memory_interval) + " step(s)") +
                     ", its copy on the rank " + std::to_string(per_node * config.memory_distance) +
                     " ranks on (" + std::to_string(config.memory_distance) + " node(s) away), within " +
                     mib(config.memory_bytes) + " per rank");
  }
}

void Checkpointer::Impl::on_tier_off(int who, std::uint64_t need, std::uint64_t budget) {
  tier_too_big = true;  // no memory checkpoint from the next step on; the worker closes the tier's links
  const auto why = memtier::refuse(need, budget, who);
  if (rank == 0 && why) log::warn(0, *why);
}

Status Checkpointer::Impl::write_from_staging(std::uint64_t step, const std::vector<std::string>& keys) {
  std::shared_ptr<const PersistJob> job;
  {
    std::lock_guard<std::mutex> lock(mu);
    job = whole_snapshot && whole_snapshot->step == step ? whole_snapshot : previous_snapshot;
  }
  if (!job || job->step != step) return Status::failure("staging does not hold step " + std::to_string(step) + " whole");
  if (Status s = write_pieces(step, job->pieces, keys); !s) return s;
  log::info(rank, "last words: wrote the terminal shard of step " + std::to_string(step) + " from staging (" +
                      std::to_string(keys.size()) + " state keys)");
  return Status::success();
}

Status Checkpointer::Impl::write_from_copy(int ward, std::uint64_t step, const std::vector<std::string>& keys) {
  if (!tier) return Status::failure("no memory tier");
  Status s = tier->with_copy(ward, step, [&](const MemoryTier::Copy& copy) {
    std::vector<Piece> pieces;
    pieces.reserve(copy.ranges.size());
    for (const store::StateRange& r : copy.ranges) pieces.push_back({r.name, copy.data + r.offset, r.length, r.meta});
    return write_pieces(step, pieces, keys, nullptr, ward);
  });
  if (!s) return s;
  log::info(rank, "last words: wrote rank " + std::to_string(ward) + "'s terminal shard of step " +
                      std::to_string(step) + " from its partner copy (" + std::to_string(keys.size()) +
                      " state keys)");
  return Status::success();
}

}  // namespace ckpt::hooks
