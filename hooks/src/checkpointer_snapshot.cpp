// The snapshot, on the training thread: staging made ready, the host regions handed to the copy pool and the
// device regions to the device backend, the guard that waits for them before the next update, and the persist
// queued for the worker. Back-pressure (waiting for the previous persist) is measured and reported here.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "checkpointer_impl.hpp"
#include "log.hpp"

namespace ckpt::hooks {

namespace {

constexpr std::size_t kCopyChunk = 16u << 20;  // big enough to amortize scheduling, small enough to share

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

}  // namespace

// The guard: waits for the host copies, queues the device guard. Returns the seconds it blocked.
double Checkpointer::Impl::guard() {
  auto t0 = Clock::now();
  if (staging.host_copying) {
    pool->help_and_wait();  // the training thread copies what no copy thread has taken yet
    staging.host_copying = false;
  }
  if (staging.device_guard_pending) {
    staging.device_guard_pending = false;
    if (Status s = device->guard(); !s) record_error(s.error());
  }
  return seconds_since(t0);
}

// One line for the first wait, then at most one a minute with the totals: an interval that is too short
// makes every checkpoint wait, and the log must stay readable.
void Checkpointer::Impl::report_backpressure(std::uint64_t step, double waited) {
  std::uint64_t waits = 0;
  double total = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    waits = stats.backpressure_waits;
    total = stats.backpressure_s;
  }
  if (waits > 1 && seconds_since(sched.backpressure_logged) < 60) return;
  sched.backpressure_logged = Clock::now();
  std::string line = "back-pressure: the checkpoint of step " + std::to_string(step) + " waited " + secs(waited) +
                     " for the previous one's persist or copies; the interval is shorter than they take";
  if (waits > 1) line += " (" + std::to_string(waits) + " waits, " + secs(total) + " in all)";
  log::warn(rank, line);
}

// The memory tier: staging is about to lose the snapshot before the last one (step p's). A ward that dies now must
// have left its copy of p here, or its copy and the survivors' staging (this step and p) would share no step and
// the last words could write none. The ward took that snapshot before the collectives of the steps since, so its
// copy is on the way: waited for, as for this rank's own previous copy (the persist above). A ward whose copy does
// not come within the links' time limit is named in a warning, and the snapshots go on without waiting for it
// until a copy of it comes.
double Checkpointer::Impl::wait_for_ward_copies(std::uint64_t step) {
  std::uint64_t previous = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!whole_snapshot) return 0;
    previous = whole_snapshot->step;
  }
  const auto t0 = Clock::now();
  const std::vector<int> owing = tier->wait_for_wards(previous, tier->settings().io_timeout, [this] {
    return tracker.frozen() || closing.load() || tier_too_big.load();
  });
  const double waited = seconds_since(t0);
  if (waited >= 0.001) {
    log::debug(rank, "memory tier: the snapshot of step " + std::to_string(step) + " waited " + secs(waited) +
                         " for the wards' copies of step " + std::to_string(previous));
  }
  if (owing.empty() || tracker.frozen() || closing) return waited;
  std::string who;
  for (int w : owing) who += (who.empty() ? "" : ", ") + std::to_string(w);
  log::warn(rank, "memory tier: the snapshot of step " + std::to_string(step) + " goes on without rank(s) " + who +
                      "'s copy of step " + std::to_string(previous) + " (none came within " +
                      std::to_string(tier->settings().io_timeout.count()) +
                      " ms): should such a rank die now, this rank holds its copy of an older step only");
  return waited;
}

void Checkpointer::Impl::snapshot(std::uint64_t step, store::Kind kind, bool memory_only) {
  // The memory tier: once the last words froze training, staging is what they may write from (the step they
  // reported); a step that ended after the freeze is not copied over it.
  if (tier && tracker.frozen()) return;
  auto t0 = Clock::now();
  guard();  // a snapshot nobody guarded (no before_update since) must finish before staging is reused
  auto t_wait = Clock::now();
  bool waited_for_persist = queue.wait_idle();
  if (tier && !tier_too_big) {
    // Back-pressure too: the previous memory checkpoint is not done until its copies are where they go.
    if (wait_for_ward_copies(step) >= 0.001) waited_for_persist = true;
    if (tracker.frozen()) return;  // the last words write from staging as it is
  }
  // By its third snapshot this generation has grown its staging and taken its wards' first copies: what the last
  // one left and nothing took is let go.
  if (++life.snapshots == 3) say_reserve_use(BufferReserve::process().close());
  double waited = seconds_since(t_wait);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (tier) {
      // The last snapshot stays whole in the buffer swapped out; the one before it is overwritten from here on.
      // Pinned staging (device regions) is not doubled: a snapshot with ranges there is not kept.
      const auto* pinned = static_cast<const std::byte*>(staging.pinned.data);
      auto in_pinned = [&](const Piece& p) { return p.data >= pinned && p.data < pinned + staging.pinned.size; };
      const bool keeps_device = whole_snapshot && pinned != nullptr &&
                                std::any_of(whole_snapshot->pieces.begin(), whole_snapshot->pieces.end(), in_pinned);
      previous_snapshot = keeps_device ? nullptr : std::move(whole_snapshot);
      std::swap(staging.host, staging.spare);
    }
    whole_snapshot.reset();  // staging is overwritten from here on
  }

  if (node) node->release_found();  // what restore() took from an earlier process is in the regions by now
  auto job = std::make_shared<PersistJob>();
  job->step = step;
  job->kind = kind;
  job->memory_only = memory_only;
  StagingPlan plan = plan_staging(regions);
  Status ready = Status::success();
  if (staging.host.size() < plan.host_bytes) {
    log::info(rank, "allocating " + mib(plan.host_bytes) + " of staging inside the snapshot of step " +
                        std::to_string(step) + " (register state earlier to allocate it in the background)");
    ready = grow_host(plan.host_bytes);
  }
  if (ready && staging.pinned.size < plan.device_bytes) ready = grow_pinned(plan.device_bytes);
  (void)ask_staging(plan.host_bytes, plan.device_bytes);  // allocated above: no grow task

  if (!ready) {
    job->error = "no staging memory: " + ready.error();
  } else {
    if (node) node->overwriting(staging.host.data());
    start_copies(*job, plan);
  }
  if (!memory_only) sched.last_checkpoint = t0;  // a memory checkpoint is not one the interval counts from
  const double snapshot_end = steady_seconds();
  double stall = seconds_since(t0);
  {
    std::lock_guard<std::mutex> lock(mu);
    sched.last_snapshot_memory = memory_only;
    if (memory_only) {
      ++stats.memory_checkpoints;  // not one the auto interval measures: it writes no shard
      sched.memory_stall_s = stall;
      if (sched.memory_meter) sched.memory_meter->on_snapshot(snapshot_end, memory_jobs_done, 0);
    } else {
      ++stats.snapshots;
      stats.last_snapshot_step = step;
      if (auto_meter) auto_meter->on_snapshot(snapshot_end, stats.persisted, stats.failed);
    }
    stats.last_stall_s = stall;
    stats.total_stall_s += stall;
    if (waited_for_persist) {
      ++stats.backpressure_waits;
      stats.backpressure_s += waited;
      stats.last_backpressure_s = waited;
    }
  }
  if (waited_for_persist) report_backpressure(step, waited);
  if (!job->error.empty()) log::error(rank, "the snapshot of step " + std::to_string(step) + " failed: " + job->error);
  queue.enqueue(!memory_only, [this, job] { persist(job); });
}

void Checkpointer::Impl::start_copies(PersistJob& job, const StagingPlan& plan) {
  std::vector<CopyChunk> async;
  std::vector<DeviceCopy> device_copies;
  bool device_sync = false;
  std::vector<Piece> pieces(regions.size());
  for (const Slot& s : plan.host) {
    const RegionSpec& r = regions[s.region];
    std::byte* dst = staging.host.data() + s.offset;
    if (r.size == 0) {
      // nothing to copy
    } else if (r.sync) {
      std::memcpy(dst, r.data, r.size);  // small state that changes outside updates: copied now
    } else {
      async.push_back({dst, static_cast<const std::byte*>(r.data), r.size});
    }
    pieces[s.region] = {r.name, dst, r.size, region_meta[s.region]};
  }
  for (const Slot& s : plan.device) {
    const RegionSpec& r = regions[s.region];
    std::byte* dst = static_cast<std::byte*>(staging.pinned.data) + s.offset;
    device_copies.push_back({dst, r.data, r.size, r.stream});
    device_sync = device_sync || r.sync;
    pieces[s.region] = {r.name, dst, r.size, region_meta[s.region]};
  }
  job.pieces = std::move(pieces);
  job.blobs = blobs;
  for (const Blob& b : job.blobs) job.pieces.push_back({b.name, b.bytes.data(), b.bytes.size(), b.meta});
  for (const Piece& p : job.pieces) job.bytes += p.size;
  if (!device_copies.empty()) {
    if (Status s = device->snapshot(device_copies); !s) {
      job.error = s.error();
    } else {
      job.device_copy = true;
      staging.device_guard_pending = true;
      // Device state that changes outside updates: the compute streams wait for the copy right away.
      if (device_sync) guard();
    }
  }
  if (job.error.empty() && !async.empty()) {
    pool->start(split_copies(async, kCopyChunk));
    job.host_copy = true;
    staging.host_copying = true;
  }
}

}  // namespace ckpt::hooks
