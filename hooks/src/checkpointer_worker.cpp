// The persist thread's tasks (persist_queue.hpp): the staging it grows in the background, and the persist of one
// checkpoint (shard, publication, and on the writer the commit and retention). Runs on the worker thread, except
// ask_staging and plan_growth (training thread) and record_error (any thread).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <xxhash.h>

#include "checkpointer_impl.hpp"
#include "ckpt/memtier.hpp"
#include "ckpt/parse.hpp"
#include "continuation.hpp"
#include "log.hpp"

namespace ckpt::hooks {

Checkpointer::Impl::~Impl() {
  free_pinned();
  free_rescued();
}

Stats Checkpointer::Impl::stats_copy() const {
  std::lock_guard<std::mutex> lock(mu);
  Stats s = stats;
  s.memory_tier_off = tier_too_big;
  return s;
}

void Checkpointer::Impl::record_error(const std::string& message) {
  log::error(rank, message);
  std::lock_guard<std::mutex> lock(mu);
  ++stats.failed;
  if (first_error) first_error = Status::failure(log::prefixed(message));
}

// ---- staging ---------------------------------------------------------------------------------------------

void Checkpointer::Impl::free_pinned() {
  if (staging.pinned.data != nullptr && device) device->free_pinned(staging.pinned.data);
  staging.pinned = {};
}

void Checkpointer::Impl::update_staging_stats() {
  std::lock_guard<std::mutex> lock(mu);
  stats.staging_bytes = staging.host.size() + staging.spare.size() + staging.pinned.size;
}

// The node tier, where the job asks for the memory tier (node_tier.hpp). A dir that is refused leaves staging
// anonymous, with one line.
void Checkpointer::Impl::open_node_tier() {
  if (config.memory_bytes == 0 || config.node_dir.empty() || config.job_id.empty()) return;
  NodeTier::Identity identity{config.job_id, config.restart_count, {}, config.dir, rank, {}, config.run_id,
                              config.world_size};
  if (const char* gtids = std::getenv("SLURM_GTIDS")) {  // this step's ranks on this node, from slurmstepd
    for (const std::string& id : split(gtids, ',')) {
      if (auto n = parse_uint(id); n && *n < (1u << 24)) identity.node_ranks.push_back(static_cast<int>(*n));
    }
  }
  auto opened = NodeTier::open(config.node_dir, identity);
  if (!opened) {
    log::warn(rank, "node tier off: " + opened.error() + "; staging stays in this process's memory");
    return;
  }
  node = std::move(opened).value();
  log::debug(rank, "node tier: staging in " + node->path());
}

// A staging buffer: the node tier's file where there is one, else anonymous memory (a buffer the last generation
// left, where it did: BufferReserve). A node tier that cannot grow (its file system full) is said once; staging goes
// on in anonymous memory.
Result<HostBuffer> Checkpointer::Impl::new_staging(std::size_t bytes) {
  if (node && bytes > 0) {
    auto buffer = node->allocate(bytes);
    if (buffer) return buffer;
    log::warn(rank, "node tier: " + buffer.error() + "; this buffer is in process memory");
  }
  return BufferReserve::process().take_or_allocate(bytes);
}

// What this generation took of the buffers the last one left (BufferReserve), once it is known.
void Checkpointer::Impl::say_reserve_use(const BufferReserve::Use& use) const {
  if (use.taken == 0 && use.unused == 0) return;
  log::info(rank, "in place: staging and held copies took " + mib(use.taken) +
                      " the last generation left, instead of mapping them again (" + mib(use.unused) + " unused)");
}

// Worker or training thread (the latter only after wait_idle): host staging of at least `bytes`.
Status Checkpointer::Impl::grow_host(std::size_t bytes) {
  if (staging.host.size() >= bytes) return Status::success();
  {
    std::lock_guard<std::mutex> lock(mu);
    whole_snapshot.reset();  // it lay in the buffer released here
  }
  if (node) node->drop(staging.host.data());
  staging.host = HostBuffer();  // release first: staging must never be twice the state (the tier's spare aside)
  auto buffer = new_staging(bytes);
  if (!buffer) return Status::failure(buffer.error());
  staging.host = std::move(buffer).value();
  update_staging_stats();
  return Status::success();
}

// The memory tier's second snapshot buffer (Staging::spare), grown beside the first so that no snapshot maps it.
Status Checkpointer::Impl::grow_spare(std::size_t bytes) {
  if (!tier || staging.spare.size() >= bytes) return Status::success();
  {
    std::lock_guard<std::mutex> lock(mu);
    previous_snapshot.reset();  // it lay in the buffer released here
  }
  if (node) node->drop(staging.spare.data());
  staging.spare = HostBuffer();
  auto buffer = new_staging(bytes);
  if (!buffer) return Status::failure(buffer.error());
  staging.spare = std::move(buffer).value();
  update_staging_stats();
  return Status::success();
}

Status Checkpointer::Impl::grow_pinned(std::size_t bytes) {
  if (staging.pinned.size >= bytes) return Status::success();
  free_pinned();
  auto p = device->alloc_pinned(bytes);
  if (!p) return Status::failure(p.error());
  staging.pinned = {*p, bytes};
  update_staging_stats();
  return Status::success();
}

// Raises the staging sizes wanted; true when they grew (a grow task must be queued).
bool Checkpointer::Impl::ask_staging(std::size_t host_bytes, std::size_t pinned_bytes) {
  std::lock_guard<std::mutex> lock(mu);
  if (host_bytes <= staging.asked.first && pinned_bytes <= staging.asked.second) return false;
  staging.asked = {std::max(staging.asked.first, host_bytes), std::max(staging.asked.second, pinned_bytes)};
  return true;
}

// Training thread: asks the worker for staging the current regions need, so no snapshot has to fault it in.
// A task grows to the latest size asked when it runs, so a burst of registrations maps staging once.
void Checkpointer::Impl::plan_growth() {
  StagingPlan plan = plan_staging(regions);
  if (ask_staging(plan.host_bytes, plan.device_bytes)) staging.growth_pending = true;
  if (life.started) release_growth();  // a registration after the restore: the state is loaded
  std::uint64_t state = 0;
  device_streams.clear();
  for (const RegionSpec& r : regions) {
    state += r.size;
    if (r.memory == Memory::Device &&
        std::find(device_streams.begin(), device_streams.end(), r.stream) == device_streams.end()) {
      device_streams.push_back(r.stream);
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  stats.state_bytes = state;
}

// Training thread: the restore is done and its state loaded; staging grows now, in the background.
void Checkpointer::Impl::release_growth() {
  staging.growth_held = false;
  if (!staging.growth_pending) return;
  staging.growth_pending = false;
  queue_growth();
}

// Training thread: a task that grows staging to the sizes asked when it runs.
void Checkpointer::Impl::queue_growth() {
  queue.enqueue(false, [this] {
    std::pair<std::size_t, std::size_t> target;
    {
      std::lock_guard<std::mutex> lock(mu);
      target = staging.asked;
      if (staging.lent) target.second = 0;  // the last words are copying into it
    }
    if (Status s = grow_host(target.first); !s) log::error(rank, s.error() + " (retried at the next snapshot)");
    if (Status s = grow_spare(target.first); !s) log::error(rank, s.error() + " (retried at the next snapshot)");
    if (target.second > 0) {
      if (Status s = grow_pinned(target.second); !s) log::error(rank, s.error() + " (retried at the next snapshot)");
    }
  });
}

// ---- the persist (worker) -----------------------------------------------------------------------------------

// The state keys this rank's record covers (store::state_keys_of_rank): every key is covered exactly once per
// checkpoint, so a terminal one passes decide_commit. Replicas hold copies of the model and optimizer slices;
// the replica dp 0 claims them. A ZeRO-1 optimizer shard lives on one rank only and is always claimed.
// (Last words write their own covers: the keys each survivor was elected for.)
std::vector<std::string> Checkpointer::Impl::covers() const {
  std::vector<std::string> keys = store::state_keys_of_rank(config.layout, config.coord);
  if (config.coord.dp == 0) return keys;
  keys.erase(std::remove_if(keys.begin(), keys.end(),
                            [](const std::string& k) { return k.find("/dp") == std::string::npos; }),
             keys.end());
  return keys;
}

store::Manifest Checkpointer::Impl::manifest(const PersistJob& job) const {
  return last_words_manifest(config, job.step, job.kind);
}

// This rank's shard of `step`: the pieces in order, claiming `keys`.
Status Checkpointer::Impl::write_pieces(std::uint64_t step, const std::vector<Piece>& pieces,
                                        const std::vector<std::string>& keys, store::ShardRecord* written,
                                        int as_rank) {
  auto writer = store::ShardWriter::open(config.dir, step, as_rank < 0 ? rank : as_rank, observer, run_fence(config));
  if (!writer) return Status::failure(writer.error());
  for (const Piece& p : pieces) {
    if (Status s = writer->append(p.name, p.data, p.size, p.meta); !s) return s;
  }
  writer->add_covers(keys);
  auto record = writer->finish();
  if (!record) return Status::failure(record.error());
  if (written != nullptr) *written = std::move(*record);
  return Status::success();
}

Status Checkpointer::Impl::write_shard(const PersistJob& job, store::ShardRecord* written) {
  if (!job.error.empty()) return Status::failure(job.error);
  return write_pieces(job.step, job.pieces, covers(), written);
}

bool Checkpointer::Impl::commit_when_all_wrote(const PersistJob& job) {
  auto timeout = std::chrono::milliseconds(config.commit_timeout_s * 1000);
  if (Status all = coord->wait_all(job.step, timeout); !all) {
    record_error("step " + std::to_string(job.step) + ": not committed: " + all.error());
    return false;
  }
  // The records came up with the counts: the commit reads no record file.
  auto records = coord->records(job.step);
  if (!records) {
    record_error(records.error());
    return false;
  }
  store::Manifest m = manifest(job);
  m.shards = std::move(*records);
  Status committed = store::commit_gathered(config.dir, m, observer, run_fence(config));
  if (!committed) record_error(committed.error());
  return committed.ok();
}

// Worker, memory tier: the snapshot is whole in staging, which the last words may now write from, and its copy
// goes to the partner. A failed copy costs only this memory checkpoint: the partner keeps the one before.
void Checkpointer::Impl::keep_in_memory(const std::shared_ptr<const PersistJob>& job,
                                        const std::vector<std::uint64_t>& sums) {
  {
    std::lock_guard<std::mutex> lock(mu);
    whole_snapshot = job;
  }
  if (!tier_checked) {
    // Once the state is known: two snapshots in staging, and a held and an incoming copy per ward of about this
    // rank's size. Where that does not fit, every rank turns the tier off: a ward whose holder cannot keep its
    // copy has its shard nowhere else, and memory checkpoints serve only where every rank takes them.
    tier_checked = true;
    const std::uint64_t staging_bytes = 2 * staging.host.size() + staging.pinned.size;
    const std::uint64_t need = memtier::tier_bytes(staging_bytes, job->bytes, tier->settings().wards.size());
    if (need > config.memory_bytes) watch.last_words->tier_off(rank, need, config.memory_bytes);
    tier->set_staging_bytes(staging_bytes);
  }
  if (tier_too_big) {
    if (!tier_stopped) tier->stop();
    tier_stopped = true;
    return;
  }
  if (tier->settings().partner < 0) return;
  auto t0 = Clock::now();
  Status sent = tier->send(job->step, job->pieces, sums);
  const double took = seconds_since(t0);
  std::uint64_t failures = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (sent) {
      ++stats.partner_copies;
      stats.last_partner_s = took;
    } else {
      failures = ++stats.partner_failures;
    }
  }
  if (sent) return;
  // The partner's own budget (its staging is larger than this rank's estimate): the tier is off for the job.
  if (auto need = tier->partner_needs()) {
    watch.last_words->tier_off(tier->settings().partner, *need, config.memory_bytes);
    return;
  }
  // The first failure and then one in a hundred: a partner that is gone fails every copy. At the end of training
  // the partner may have closed first, or finished first and left the network in order: no fault then.
  if (failures == 1 || failures % 100 == 0) {
    (closing || partner_left() ? log::debug : log::warn)(
        rank, "memory tier: the copy of step " + std::to_string(job->step) + " to rank " +
                  std::to_string(tier->settings().partner) + " failed (" + std::to_string(failures) +
                  " so far): " + sent.error());
  }
}

bool Checkpointer::Impl::partner_left() const {
  return watch.last_words->network().left(tier->settings().partner);
}

void Checkpointer::Impl::persist(const std::shared_ptr<const PersistJob>& whole) {
  const PersistJob& job = *whole;
  const std::string at = "step " + std::to_string(job.step) + ": ";
  auto t0 = Clock::now();
  if (job.host_copy) pool->wait();
  double copy_s = job.host_copy ? pool->last_batch_seconds() : 0;
  Status outcome = job.error.empty() ? Status::success() : Status::failure(job.error);
  if (job.device_copy) outcome = device->wait();
  // Each piece's XXH3-64, once: the node tier's index keeps it and the partner's copy carries it.
  std::vector<std::uint64_t> sums;
  if (node && outcome) {
    sums.reserve(job.pieces.size());
    for (const Piece& p : job.pieces) sums.push_back(XXH3_64bits(p.data, p.size));
    node->whole(job.step, job.pieces, sums);
  }
  if (tier && outcome) keep_in_memory(whole, sums);
  if (job.memory_only) {
    std::lock_guard<std::mutex> lock(mu);
    stats.last_copy_s = copy_s;
    ++memory_jobs_done;
    return;
  }
  auto t_write = Clock::now();
  store::ShardRecord record;
  if (outcome) outcome = write_shard(job, &record);
  double persist_s = seconds_since(t_write);
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.last_copy_s = copy_s;
    if (outcome) {
      ++stats.persisted;
      stats.last_persist_s = persist_s;
      stats.last_persist_bytes = job.bytes;
    }
  }
  if (!outcome) record_error(at + "persist failed: " + outcome.error());
  // Every rank publishes every checkpoint, failed or not: collective coordinators count on it.
  if (outcome) coord->note_record(job.step, record);
  Status published = coord->publish(job.step, outcome);
  if (!published) record_error(at + published.error());
  if (rank != 0 || !outcome || !published) return;
  if (!commit_when_all_wrote(job)) return;
  double commit_s = seconds_since(t0);
  {
    std::lock_guard<std::mutex> lock(mu);
    ++stats.committed;
    stats.last_committed_step = job.step;
    stats.last_commit_s = commit_s;
  }
  double rate = persist_s > 0 ? static_cast<double>(job.bytes) / persist_s / 1e9 : 0;
  char line[256];
  std::snprintf(line, sizeof line, "committed %s checkpoint of step %llu: %s per rank, persist %.3f s (%.2f GB/s)",
                store::to_string(job.kind), static_cast<unsigned long long>(job.step), mib(job.bytes).c_str(),
                persist_s, rate);
  log::info(rank, line);
  collect_garbage(job.step);
  if (job.kind == store::Kind::Terminal && sched.time_limit_stop == job.step) {
    continue_after_time_limit(TimeLimitStop{config.dir, config.job_id, config.restart_count, job.step,
                                            config.resume_step, config.max_restarts, config.requeue,
                                            config.generation});
  }
}

// Retention after a commit, shared out: store::retire renames each dropped step dir away, and every rank removes its
// own files of it (the coordinator tells them).
void Checkpointer::Impl::collect_garbage(std::uint64_t committed) {
  auto retired = store::retire(config.dir, config.keep, committed, run_fence(config));
  if (!retired) {
    log::warn(rank, "retention: " + retired.error());
    return;
  }
  for (std::uint64_t step : *retired) log::debug(rank, "retention retired step " + std::to_string(step));
  if (!retired->empty()) coord->retired(*retired);
}

}  // namespace ckpt::hooks
