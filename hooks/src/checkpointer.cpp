// The public API and the engine's lifecycle, all on the training thread: create, regions and blobs, restore's
// entry, the per-step decision (poll, after_step, save), close. Checkpointer::Impl and the threading model are in
// checkpointer_impl.hpp; its other jobs (worker, snapshot, auto interval, restore, last words) have their own files.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "checkpointer_impl.hpp"
#include "ckpt/recovery.hpp"
#include "ckpt/format.hpp"
#include "ckpt/memtier.hpp"
#include "ckpt/schedule.hpp"
#include "log.hpp"
#include "notice.hpp"

namespace ckpt::hooks {

namespace {

// A message leaves the library through the public methods: their errors start with "ckpt: ", which the
// messages built inside (and embedded in one another) do not carry.
Status surfaced(Status s) { return s ? s : Status::failure(log::prefixed(s.error())); }

template <class T>
Result<T> surfaced(Result<T> r) {
  if (r) return r;
  return Error{log::prefixed(r.error())};
}

// A phase of close() that took long says so when it ends: a rank that held up a recovery (which waits for every
// survivor's close) names where it was.
class SlowClosePhase {
 public:
  static constexpr double kSlowS = 5;
  SlowClosePhase(int rank, const char* what) : rank_(rank), what_(what), t0_(std::chrono::steady_clock::now()) {}
  ~SlowClosePhase() {
    const double took = seconds_since(t0_);
    if (took < kSlowS) return;
    char line[160];
    std::snprintf(line, sizeof line, "close: %s took %.1f s", what_, took);
    log::warn(rank_, line);
  }
  SlowClosePhase(const SlowClosePhase&) = delete;
  SlowClosePhase& operator=(const SlowClosePhase&) = delete;

 private:
  int rank_;
  const char* what_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

// ---- regions -------------------------------------------------------------------------------------------------

Result<nlohmann::json> Checkpointer::Impl::check_region(const RegionSpec& r) {
  const std::string at = "region '" + r.name + "': ";
  if (r.name.empty()) return Error{"a region needs a name"};
  if (r.data == nullptr && r.size > 0) return Error{at + "no data pointer"};
  for (const Blob& b : blobs) {
    if (b.name == r.name) return Error{at + "a blob has that name"};
  }
  nlohmann::json meta = nlohmann::json::parse(r.meta_json, nullptr, false);
  if (meta.is_discarded()) return Error{at + "metadata is not JSON: " + r.meta_json};
  if (auto chunk = store::tensor_chunk(meta); !chunk) return Error{at + "metadata: " + chunk.error()};
  if (r.memory == Memory::Device && !device) {
    auto backend = make_device_backend();
    if (!backend) return Error{at + backend.error()};
    device = std::move(backend).value();
  }
  return meta;
}

// ---- scheduling ---------------------------------------------------------------------------------------------

// Training thread: the coordinator namespace, leftovers of dead saves, the interval clock.
void Checkpointer::Impl::start(std::uint64_t step) {
  life.started = true;
  if (Status s = coord->begin(step); !s) log::error(rank, s.error());
  sched.last_checkpoint = Clock::now();
  // After a restore, rank 0 has done this before any rank learnt the step (restore()); without one, ranks run in
  // lockstep, so no other rank writes a shard before rank 0 has started training.
  if (rank != 0 || life.discarded_above) return;
  discard_incomplete_above(step);
}

// A save that died before a restart left step dirs without a manifest; their records must never be committed with
// a new save of the same step (the writer would see them as published), and no rank of this run may be writing
// into one while it goes. Rank 0 only.
void Checkpointer::Impl::discard_incomplete_above(std::uint64_t step) {
  life.discarded_above = true;
  auto dead = store::dead_saves_above(config.dir, step);
  if (!dead) return;  // a new dir; ShardWriter creates it
  for (std::uint64_t s_step : *dead) {
    if (Status s = store::discard_incomplete(config.dir, s_step, run_fence(config)); !s) {
      log::warn(rank, s.error());
    } else {
      log::info(rank, "discarded the incomplete checkpoint of step " + std::to_string(s_step));
    }
  }
}

// The step's scheduling decision (ckpt/schedule.hpp) from this rank's clock, signals and coordinator.
Decision Checkpointer::Impl::decide(std::uint64_t step) {
  schedule::Inputs in;
  in.step = step;
  in.rank = rank;
  in.lead = lead();
  in.interval = config.interval;
  in.interval_s = sched.interval_s;
  in.auto_interval = auto_meter.has_value();
  in.since_checkpoint_s = seconds_since(sched.last_checkpoint);
  // A lock: taken only when it counts.
  in.persist_busy = in.auto_interval && in.since_checkpoint_s >= sched.interval_s && queue.persists_pending() > 0;
  in.signal = config.signals && notice::count() > sched.notices_seen ? notice::last_signal() : 0;
  in.now_unix = unix_seconds();
  in.end_time = config.end_time;
  in.grace_s = config.grace_s;
  in.missed_terminal = coord->missed_terminal();
  const schedule::Requests asked = schedule::requests(in, sched.state);
  if (asked.terminal) {
    if (asked.for_time_limit) sched.time_limit_stop = *asked.terminal;  // continued in a new allocation once committed
    log::info(rank, asked.why + ": terminal checkpoint at step " + std::to_string(*asked.terminal) + ", then stop");
    if (Status s = coord->request(*asked.terminal, store::Kind::Terminal); !s) log::error(rank, s.error());
  }
  if (asked.periodic) {
    if (Status s = coord->request(*asked.periodic, store::Kind::Periodic); !s) log::error(rank, s.error());
  }
  const schedule::Decision d = schedule::decision(step, config.interval, coord->requested(step), in.missed_terminal);
  if (in.missed_terminal && d.stop && !d.snapshot && !sched.stopped) {
    record_error("the terminal checkpoint of step " + std::to_string(*in.missed_terminal) + " was asked for after "
                 "this rank had passed it: the other ranks stopped there, so this rank stops after step " +
                 std::to_string(step) + " without one");
  }
  Decision out;
  out.snapshot = d.snapshot;
  out.stop = d.stop;
  out.kind = d.kind;
  // The memory tier's own interval, in steps, on every rank alike: where the previous copy is still under way, the
  // snapshot waits for it (back-pressure), so that all ranks hold snapshots of the same steps.
  if (!out.snapshot && tier && !tier_too_big && memory_due(step)) {
    out.snapshot = true;
    out.memory_only = true;
  }
  return out;
}

bool Checkpointer::Impl::memory_due(std::uint64_t step) {
  if (config.memory_interval != kMemoryIntervalAuto) return step % config.memory_interval == 0;
  if (rank == 0) ask_memory_checkpoints(step);
  return coord->memory_requested(step);
}

void Checkpointer::Impl::ask_memory_checkpoints(std::uint64_t step) {
  const auto now = Clock::now();
  if (sched.last_decide) {
    interval::push_bounded(sched.step_times, std::chrono::duration<double>(now - *sched.last_decide).count(), 16);
    std::vector<double> sorted(sched.step_times.begin(), sched.step_times.end());
    std::sort(sorted.begin(), sorted.end());
    sched.step_s = sorted[(sorted.size() - 1) / 4];
  }
  sched.last_decide = now;
  memtier::AutoIntervalInputs in;
  in.step_s = sched.step_s;
  in.cost_s = sched.memory_cost_s;
  in.mtbf_s = static_cast<double>(config.mtbf_s);
  std::uint64_t before = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    in.busy_s = stats.last_copy_s + stats.last_partner_s;
    before = stats.memory_interval;
  }
  const std::uint64_t every = memtier::auto_interval(in);
  if (every != before) {
    std::lock_guard<std::mutex> lock(mu);
    stats.memory_interval = every;
  }
  // Said once measured, and again where the choice halves or doubles (every change goes to the debug log).
  const std::uint64_t said = sched.memory_said;
  const bool news = in.busy_s > 0 && (said == 0 || every >= 2 * said || 2 * every <= said);
  if (news || every != before) {
    (news ? log::info : log::debug)(
        0, "memory tier: a checkpoint in memory every " + std::to_string(every) + " step(s) (auto: a copy takes " +
               format_number(in.busy_s) + " s, a step " + format_number(sched.step_s) + " s, and one costs training " +
               (in.cost_s > 0 ? format_number(in.cost_s) + " s: Young's interval at MTBF " +
                                    format_number(in.mtbf_s) + " s is " +
                                    format_number(interval::young(in.cost_s, in.mtbf_s)) + " s)"
                              : "an amount not measured yet)"));
    if (news) sched.memory_said = every;
  }
  // Asked for `lead` steps ahead, so that the request reaches every rank before it passes the step.
  if (!sched.memory_next || *sched.memory_next <= step) sched.memory_next = step + std::max<std::uint64_t>(lead(), 1);
  while (*sched.memory_next <= step + lead()) {
    coord->request_memory(*sched.memory_next);
    *sched.memory_next += every;
  }
}

void Checkpointer::Impl::observe_memory_step() {
  interval::StepMeter::Worker counts;
  // Idle first, as observe_step reads the pending count first: a copy that ends between the reads is seen pending.
  counts.pending = queue.idle() ? 0 : 1;
  {
    std::lock_guard<std::mutex> lock(mu);
    counts.persisted = memory_jobs_done;  // a copy that failed still cost training its time
    counts.last_persist_s = stats.last_copy_s + stats.last_partner_s;
  }
  counts.last_stall_s = sched.memory_stall_s;
  auto measured = sched.memory_meter->on_step(steady_seconds(), counts);
  if (!measured) return;
  interval::push_bounded(sched.memory_costs, measured->stall_s + measured->interference_s, 5);
  sched.memory_cost_s = interval::median(sched.memory_costs);
}

// ---- close --------------------------------------------------------------------------------------------------

// With wait_for_peers false (the loop was unwound by an error, close() never called), the writer does not wait
// for ranks that may be gone; this rank's own shard is still finished.
Status Checkpointer::Impl::close(bool wait_for_peers) {
  if (life.closed) return life.close_status;
  life.closed = true;
  // What the last generation left and this one, ending before its third snapshot, did not take is let go.
  say_reserve_use(BufferReserve::process().close());
  closing = true;
  if (!enabled) return life.close_status;
  watch.nccl.reset();  // stops polling; the program destroys its communicators after close()
  if (watch.last_words) {
    const bool speaks = watch.last_words->speaks();  // false: the network alone, for the tree coordinator
    // A training error on an armed job is most likely a dead peer (gloo resets within ~50 ms, the mesh needs up
    // to its silence limit): wait for the last words before this rank goes, or peers would count it dead too.
    if (speaks && (!wait_for_peers || watch.last_words->triggered())) {
      SlowClosePhase phase(rank, "waiting for the last words");
      wait_for_peers = false;
      if (watch.last_words->wait_triggered(std::chrono::milliseconds(2000))) {
        (void)watch.last_words->wait_done(std::chrono::milliseconds(10000));
      }
    } else if (wait_for_peers) {
      // The last checkpoint's completion travels over the network: it stays up until this rank's part is done.
      SlowClosePhase phase(rank, "finishing the last checkpoint with the other ranks");
      guard();
      queue.wait_idle();
      coord->drain(std::chrono::milliseconds(config.commit_timeout_s * 1000));
      if (speaks && watch.last_words->triggered()) {
        wait_for_peers = false;
        (void)watch.last_words->wait_done(std::chrono::milliseconds(10000));
      } else {
        watch.last_words->leave();
      }
    }
    if (!wait_for_peers) coord->cancel();  // before the network goes: a commit waiting on it gives up as cancelled
    coord->detach();  // the persist thread may still publish; the network goes now
    if (tier) {
      SlowClosePhase phase(rank, "stopping the memory tier (a copy in flight, its links)");
      if (wait_for_peers) queue.wait_idle();  // an orderly close lets a copy in flight end first
      tier->stop();
    }
    watch.last_words->set_pace(nullptr);
    watch.pace.reset();
    std::lock_guard<std::mutex> lock(watch.mu);
    watch.final_outcome = watch.last_words->outcome();
    watch.last_words.reset();
  }
  if (!wait_for_peers) coord->cancel();
  {
    SlowClosePhase phase(rank, "the last snapshot and persist");
    guard();
    queue.wait_idle();
  }
  queue.stop();
  pool.reset();
  if (life.handlers) notice::release_handlers();
  life.handlers = false;
  coord.reset();
  free_pinned();
  free_rescued();
  std::lock_guard<std::mutex> lock(mu);
  life.close_status = first_error;
  return life.close_status;
}

// ---- the public API ---------------------------------------------------------------------------------------------

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Checkpointer::~Checkpointer() {
  if (!impl_) return;
  if (Status s = impl_->close(false); !s) log::error(impl_->rank, "at close: " + s.error());
}

// The newest run to start owns the dir: raising the epoch record fences every rank of an earlier run of this job
// (a node that froze and thaws) out of it. Rank 0 does it at creation, before restore can mark a checkpoint FAILED.
// The other ranks do not write it (one write per run, not one per rank); until rank 0 has, they are not fenced
// either. An error only when this run is the one fenced out.
namespace {
Status fence_earlier_runs(const Config& config) {
  const store::Fence fence = run_fence(config);
  if (Status s = store::raise_epoch(config.dir, fence, config.run_id); !s) {
    if (auto refusal = fenced(config.dir, fence)) return Status::failure("ckpt: " + *refusal);
    log::warn(0, s.error() + "; this run cannot fence out earlier runs of the job");
  }
  return Status::success();
}
}  // namespace

Status Checkpointer::Impl::start_interval() {
  switch (config.interval.kind) {
    case Interval::Kind::Seconds: sched.interval_s = static_cast<double>(config.interval.value); break;
    case Interval::Kind::Steps: break;
    case Interval::Kind::Auto:
    {
      auto meter = AutoIntervalMeter::create(config);
      if (!meter) return Status::failure("ckpt: CKPT_INTERVAL=auto: " + meter.error());
      sched.interval_s = meter->interval_s();
      if (config.rank == 0) {
        auto_meter.emplace(std::move(meter).value());
        auto_meter->resume(config.dir, rank);
        publish_auto_interval();
      }
      break;
    }
  }
  return Status::success();
}

Status Checkpointer::Impl::arm_last_words() {
  const bool armed = last_words_armed(config);
  if (!armed && config.last_words && !config.layout_declared && config.world_size > 1 && config.rank == 0) {
    // Without a layout the survivors cannot tell whether they hold a complete copy, so nothing is armed.
    log::warn(0, "last words are on but the job declared no layout, so they are off: declare it with "
                 "CKPT_LAYOUT=dp=<n>,tp=<n>,pp=<n> (or layout= in slurm_ckpt.torch.Checkpointer, which declares "
                 "dp=<world size> by itself for a DistributedDataParallel model)");
  }
  // The network runs for the tree coordinator of every multi-rank job, whether or not the last words speak on it.
  if (config.world_size == 1) return Status::success();
  auto lw = start_last_words(armed);
  if (!lw) return Status::failure(lw.error());
  {
    std::lock_guard<std::mutex> lock(watch.mu);
    watch.last_words = std::move(lw).value();
    watch.armed = armed;
  }
  coord->attach(*watch.last_words);
  start_memory_tier();
  if (armed && config.straggler.enabled) {
    watch.pace = std::make_shared<PaceTree>(config, watch.last_words->network());
    watch.last_words->set_pace([p = watch.pace](const heartbeat::Frame& f, int from) { p->on_frame(f, from); });
  }
  return Status::success();
}

Result<std::unique_ptr<Checkpointer>> Checkpointer::create(const Options& options) {
  try {
    auto config = load_config(options);
    if (!config) return Error{config.error()};
    log::set_level(config->log_level);
    auto impl = std::make_unique<Impl>();
    impl->config = *config;
    impl->observer = options.persist_observer;
    impl->rank = config->rank;
    impl->enabled = !config->dir.empty();
    if (!impl->enabled) {
      log::debug(impl->rank, "no checkpoint dir (CKPT_DIR); checkpointing is off");
      return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(impl)));
    }
    if (config->rank == 0) {
      if (Status s = fence_earlier_runs(*config); !s) return Error{s.error()};
      // A retired variable a job script may still set: say once that it no longer chooses anything.
      if (std::getenv("CKPT_COORDINATOR") != nullptr) {
        log::warn(0, "CKPT_COORDINATOR is no longer read: every job of more than one rank agrees over the heartbeat "
                     "network; CKPT_RENDEZVOUS=auto|files|pmix chooses how its ranks find each other");
      }
    }
    auto coord = make_coordinator(*config);
    if (!coord) return Error{coord.error()};
    impl->coord = std::move(coord).value();
    if (Status s = impl->start_interval(); !s) return Error{s.error()};
    impl->pool = std::make_unique<CopyPool>(config->copy_threads);
    impl->open_node_tier();
    if (config->signals) {
      notice::acquire_handlers();
      impl->life.handlers = true;
      impl->sched.notices_seen = notice::count();
    }
    impl->queue.start();
    if (Status s = impl->arm_last_words(); !s) {
      impl->close(false);
      return Error{s.error()};
    }
    if (config->rank == 0) {
      log::debug(0, "checkpoints in " + config->dir + " every " + format_interval(config->interval) + ", " +
                        std::to_string(config->world_size) + " ranks (" + config->rank_source + "), coordinator " +
                        impl->coord->name());
    }
    return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(impl)));
  } catch (const std::exception& e) {
    return Error{std::string("ckpt: cannot create a checkpointer: ") + e.what()};
  }
}

bool Checkpointer::enabled() const { return impl_->enabled; }

const Config& Checkpointer::config() const { return impl_->config; }

Status Checkpointer::register_region(const RegionSpec& region) {
  Impl& m = *impl_;
  if (!m.enabled) return Status::success();
  auto meta = m.check_region(region);
  if (!meta) return surfaced(Status::failure(meta.error()));
  auto it = std::find_if(m.regions.begin(), m.regions.end(), [&](const RegionSpec& r) { return r.name == region.name; });
  if (it != m.regions.end()) {
    *it = region;
    m.region_meta[static_cast<std::size_t>(it - m.regions.begin())] = *meta;
  } else {
    m.regions.push_back(region);
    m.region_meta.push_back(*meta);
  }
  m.plan_growth();
  return Status::success();
}

Status Checkpointer::set_regions(const std::vector<RegionSpec>& regions) {
  Impl& m = *impl_;
  if (!m.enabled) return Status::success();
  std::vector<nlohmann::json> metas;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    auto meta = m.check_region(regions[i]);
    if (!meta) return surfaced(Status::failure(meta.error()));
    for (std::size_t j = 0; j < i; ++j) {
      if (regions[j].name == regions[i].name) return Status::failure("ckpt: region '" + regions[i].name + "' given twice");
    }
    metas.push_back(*meta);
  }
  m.regions = regions;
  m.region_meta = std::move(metas);
  m.plan_growth();
  return Status::success();
}

Status Checkpointer::put_blob(std::string_view name, const void* data, std::size_t size, std::string_view meta_json) {
  Impl& m = *impl_;
  if (!m.enabled) return Status::success();
  if (name.empty()) return Status::failure("ckpt: a blob needs a name");
  if (data == nullptr && size > 0) return Status::failure("ckpt: blob '" + std::string(name) + "': no data");
  for (const RegionSpec& r : m.regions) {
    if (r.name == name) return Status::failure("ckpt: blob '" + std::string(name) + "': a region has that name");
  }
  nlohmann::json meta = nlohmann::json::parse(meta_json, nullptr, false);
  if (meta.is_discarded()) return Status::failure("ckpt: blob '" + std::string(name) + "': metadata is not JSON");
  const auto* bytes = static_cast<const std::byte*>(data);
  Blob blob{std::string(name), std::vector<std::byte>(bytes, bytes + size), std::move(meta)};
  auto it = std::find_if(m.blobs.begin(), m.blobs.end(), [&](const Blob& b) { return b.name == name; });
  if (it != m.blobs.end()) {
    *it = std::move(blob);
  } else {
    m.blobs.push_back(std::move(blob));
  }
  std::uint64_t total = 0;
  for (const Blob& b : m.blobs) total += b.bytes.size();
  std::lock_guard<std::mutex> lock(m.mu);
  m.stats.blob_bytes = total;
  return Status::success();
}

Result<std::uint64_t> Checkpointer::restore(bool copy_into_regions) { return restore(copy_into_regions, {}); }

Result<std::uint64_t> Checkpointer::restore(bool copy_into_regions, const std::vector<std::string>& reshard_prefixes) {
  RestoreOptions options;
  options.copy_into_regions = copy_into_regions;
  options.reshard_prefixes = reshard_prefixes;
  return restore(options);
}

Result<std::uint64_t> Checkpointer::restore(const RestoreOptions& options) {
  if (!impl_->enabled) return std::uint64_t{0};
  // This restore's only: a later one without them must not reuse them.
  impl_->request.reshard_prefixes = options.reshard_prefixes;
  impl_->request.live.clear();
  for (const RegionSpec& r : options.live) {
    if (r.memory == Memory::Host) impl_->request.live.push_back({r.name, r.data, r.size, {}});
  }
  // After the program's own: what an earlier process of this job left in the node tier.
  if (impl_->node) {
    for (store::LiveRange& r : impl_->node->found()) impl_->request.live.push_back(std::move(r));
  }
  if (impl_->life.closed) return Error{"ckpt: restore() after close()"};
  try {
    auto step = impl_->restore(options.copy_into_regions);
    impl_->request.live.clear();
    if (step) impl_->tracker.finish_step(*step);
    return surfaced(std::move(step));
  } catch (const std::exception& e) {
    return Error{std::string("ckpt: restore failed: ") + e.what()};
  }
}

const std::vector<RestoredRegion>& Checkpointer::restored() const { return impl_->restored.regions; }

Status Checkpointer::before_update() {
  Impl& m = *impl_;
  if (m.watch.pace) m.watch.update_started_s = steady_seconds();
  if (m.watch.last_words && !m.tracker.enter_update()) {
    (void)m.watch.last_words->wait_done(std::chrono::milliseconds(10000));
    return Status::failure("ckpt: training is stopped: " + m.watch.last_words->outcome().summary);
  }
  if (!m.staging.host_copying && !m.staging.device_guard_pending) return Status::success();
  double waited = m.guard();
  std::lock_guard<std::mutex> lock(m.mu);
  m.stats.last_stall_s += waited;
  if (m.auto_meter) m.auto_meter->on_guard(waited);
  if (m.sched.memory_meter) {
    m.sched.memory_meter->on_guard(waited);
    if (m.sched.last_snapshot_memory) m.sched.memory_stall_s += waited;
  }
  m.stats.total_stall_s += waited;
  return Status::success();
}

Result<Decision> Checkpointer::poll(std::uint64_t step) {
  Impl& m = *impl_;
  if (!m.enabled) return Decision{};
  if (m.life.closed) return Error{"ckpt: poll() after close()"};
  if (m.sched.cached && m.sched.cached->first == step) return m.sched.cached->second;
  if (m.sched.last_step && step <= *m.sched.last_step) {
    return Error{"ckpt: step " + std::to_string(step) + " follows step " + std::to_string(*m.sched.last_step) +
                 ": steps must increase"};
  }
  if (!m.life.started) m.start(0);
  m.release_growth();
  Decision d = m.decide(step);
  m.sched.cached = std::make_pair(step, d);
  return d;
}

Result<bool> Checkpointer::after_step(std::uint64_t step) {
  Impl& m = *impl_;
  if (!m.enabled) return false;
  auto d = poll(step);
  if (!d) return Error{d.error()};
  // The device's update events first: last words may be waiting for this update to end, and copy the device
  // state as soon as finish_step() says it has.
  if (m.watch.last_words && m.watch.last_words->speaks() && m.device && !m.device_streams.empty()) {
    if (Status s = m.device->mark_updates(m.device_streams); !s) m.record_error(s.error());
  }
  m.tracker.finish_step(step);
  if (m.watch.pace) {
    if (m.watch.update_started_s >= 0) m.watch.pace->on_work(steady_seconds() - m.watch.update_started_s);
    m.watch.update_started_s = -1;
    m.watch.pace->on_step(step);
    if (m.watch.pace->leaving()) m.leave_for_spare(step);
  }
  m.sched.cached.reset();
  if (m.auto_meter) m.observe_step();
  if (m.sched.memory_meter) m.observe_memory_step();
  m.sched.last_step = step;
  if (m.sched.stopped) return true;
  if (d->snapshot) m.snapshot(step, d->kind, d->memory_only);
  if (d->stop) m.sched.stopped = true;
  return m.sched.stopped;
}

// Training thread, at the boundary after `step`: every update of this rank is done, and its peers (faster) wait in
// the next step's collective, between updates, so their last words hold this very step. A persist in flight is
// let finish first: the other ranks' commit counts this rank's shard.
void Checkpointer::Impl::leave_for_spare(std::uint64_t step) {
  if (queue.persists_pending() > 0) return;  // the next boundary, then
  log::warn(rank, watch.pace->leaving_why() + " (after step " + std::to_string(step) + "; exit " +
                      std::to_string(ckpt::recovery::kExitSwappedOut) + ")");
  std::fflush(nullptr);
  ::_exit(ckpt::recovery::kExitSwappedOut);
}

void Checkpointer::time_section(double seconds) {
  if (impl_->watch.pace) impl_->watch.pace->on_work(seconds);
}

Status Checkpointer::save(std::uint64_t step, store::Kind kind) {
  Impl& m = *impl_;
  if (!m.enabled) return Status::success();
  if (m.life.closed) return Status::failure("ckpt: save() after close()");
  if (auto last = m.stats_copy().last_snapshot_step; last && step <= *last) {
    return Status::failure("ckpt: save(" + std::to_string(step) + "): step " + std::to_string(*last) +
                           " was saved already");
  }
  if (!m.life.started) m.start(0);
  m.release_growth();
  m.snapshot(step, kind);
  if (kind == store::Kind::Terminal) m.sched.stopped = true;
  return Status::success();
}

Status Checkpointer::close() { return surfaced(impl_->close(true)); }

Status Checkpointer::abort() { return surfaced(impl_->close(false)); }

Status Checkpointer::watch_nccl(void* comm) {
  Impl& d = *impl_;
  if (!d.enabled || d.life.closed) return Status::success();
  if (!d.watch.nccl) {
    NcclWatch::Hooks hooks;
    LastWords* words = d.watch.last_words.get();
    const int rank = d.rank;
    hooks.on_error = [words, rank](const std::string& why) {
      log::error(rank, why);
      if (words != nullptr) words->trigger(why);
    };
    if (words != nullptr) hooks.abort_requested = [words] { return words->triggered(); };
    auto watch = NcclWatch::start(std::move(hooks), std::chrono::milliseconds(50));
    if (!watch) return Status::failure(watch.error());
    d.watch.nccl = std::move(watch).value();
  }
  return d.watch.nccl->add(comm);
}

Stats Checkpointer::stats() const { return impl_->stats_copy(); }

LastWordsReport Checkpointer::last_words_report() const {
  const Impl& m = *impl_;
  LastWordsOutcome o;
  LastWordsReport r;
  {
    std::lock_guard<std::mutex> lock(m.watch.mu);
    r.armed = m.watch.armed;
    o = m.watch.last_words ? m.watch.last_words->outcome() : m.watch.final_outcome;
  }
  r.triggered = o.triggered;
  r.done = o.done;
  r.lost_peer = !o.lost.empty();
  r.counted_dead = o.counted_dead;
  r.committed = o.ended_committed || o.committed;
  r.step = o.step;
  r.root = o.root;
  r.lost = o.lost;
  r.detect_unix = o.detect_unix;
  r.decided_unix = o.decided_unix;
  r.done_unix = o.done_unix;
  r.summary = o.summary;
  r.stand_ins = o.stand_ins;
  r.behind = o.behind;
  return r;
}

namespace {

// A buffer the last words hand over: once the program lets go of it, the next generation may take it.
std::shared_ptr<HostBuffer> handed_over(HostBuffer buffer) {
  return std::shared_ptr<HostBuffer>(new HostBuffer(std::move(buffer)), [](HostBuffer* b) {
    BufferReserve::process().give(std::move(*b));
    delete b;
  });
}

}  // namespace

std::vector<MemoryCopy> Checkpointer::release_memory_copies() {
  Impl& m = *impl_;
  std::vector<MemoryCopy> out;
  if (!m.tier || !m.life.closed || !m.tier->frozen()) return out;
  BufferReserve::process().open();
  for (MemoryTier::Kept& kept : m.tier->release()) {
    if (m.node) m.node->hand_over(kept.buffer);
    auto owner = handed_over(std::move(kept.buffer));
    std::shared_ptr<std::byte> data(owner, owner->data());
    out.push_back(MemoryCopy{kept.ward, kept.step, std::move(kept.ranges), std::move(data), kept.size});
  }
  // Closed: no thread writes staging any more. Its last two snapshots: their host ranges where they lie, and their
  // blobs (the optimizer's and the program's small pickles) copied beside them. Device ranges are left to the
  // restore.
  std::shared_ptr<const PersistJob> last, before;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    last.swap(m.whole_snapshot);
    before.swap(m.previous_snapshot);
  }
  for (auto [job, buffer] : {std::make_pair(last, &m.staging.host), std::make_pair(before, &m.staging.spare)}) {
    if (!job || buffer->size() == 0) continue;
    const std::byte* base = buffer->data();
    const std::size_t size = buffer->size();
    MemoryCopy copy, blobs;
    copy.rank = blobs.rank = m.rank;
    copy.step = blobs.step = job->step;
    std::vector<const Piece*> blob_pieces;
    for (const Piece& p : job->pieces) {
      const bool in_blob = std::any_of(job->blobs.begin(), job->blobs.end(), [&](const Blob& b) {
        return p.data >= b.bytes.data() && p.data + p.size <= b.bytes.data() + b.bytes.size();
      });
      if (in_blob) {
        blob_pieces.push_back(&p);
        blobs.size += p.size;
      }
      if (p.data < base || p.data + p.size > base + size) continue;
      store::StateRange r;
      r.name = p.name;
      r.offset = static_cast<std::uint64_t>(p.data - base);
      r.length = p.size;
      copy.ranges.push_back(std::move(r));
    }
    if (m.node) m.node->hand_over(*buffer);
    auto owner = handed_over(std::move(*buffer));
    copy.data = std::shared_ptr<std::byte>(owner, owner->data());
    copy.size = owner->size();
    out.push_back(std::move(copy));
    if (blobs.size == 0) continue;
    auto small = HostBuffer::allocate(blobs.size);
    if (!small) continue;  // the restore reads them
    auto held = std::make_shared<HostBuffer>(std::move(small).value());
    std::uint64_t at = 0;
    for (const Piece* p : blob_pieces) {
      std::memcpy(held->data() + at, p->data, p->size);
      store::StateRange r;
      r.name = p->name;
      r.offset = at;
      r.length = p->size;
      blobs.ranges.push_back(std::move(r));
      at += p->size;
    }
    blobs.data = std::shared_ptr<std::byte>(held, held->data());
    out.push_back(std::move(blobs));
  }
  // This process goes on in place with what it just took out, and the node tier's files hold the same pages. They
  // stay until its next Checkpointer opens the node tier: where the survivors give up instead, ckpt-run relaunches
  // the node steps inside the allocation and the relaunched ranks restore from them.
  if (m.node) NodeTier::keep_until_next_open(std::move(m.node));
  return out;
}

}  // namespace ckpt::hooks
