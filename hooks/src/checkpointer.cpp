// The two-phase checkpoint engine.
//
// Threads: the training thread calls the API; the copy pool copies host regions into staging during a snapshot;
// one persist thread ("worker") grows staging in the background, writes shards through ckpt::store, publishes them
// to the coordinator and, on the writer, commits. Staging belongs to the worker whenever it has a task queued or
// running; the training thread touches staging only after wait_idle(), which is what back-pressure is.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>

#include "ckpt/hooks.hpp"
#include "ckpt/interval.hpp"
#include "continuation.hpp"
#include "coordinator.hpp"
#include "device.hpp"
#include "last_words_runtime.hpp"
#include "log.hpp"
#include "nccl_watch.hpp"
#include "notice.hpp"
#include "staging.hpp"

namespace ckpt::hooks {

namespace {

using store::errno_text;
using store::join;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kCopyChunk = 16u << 20;  // big enough to amortize scheduling, small enough to share
// The persist thread runs at the lowest priority. Buffered writes cost a lot of system CPU (page-cache
// allocation runs at first-touch speed on some VMs: ~2.6 s per GiB here); training must win a contended core.
constexpr int kPersistNice = 19;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

// A small named value saved with every checkpoint (extras).
struct Blob {
  std::string name;
  std::vector<std::byte> bytes;
  nlohmann::json meta;
};

// One named byte range of a shard, pointing into staging or into a blob the job owns.
struct Piece {
  std::string name;
  const std::byte* data = nullptr;
  std::size_t size = 0;
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
};

struct PinnedBuffer {
  void* data = nullptr;
  std::size_t size = 0;
};

// The auto interval within the site's bounds. Until δ is measured it waits a tenth of the MTBF (at most 30 min)
// for the first checkpoint: that bounds the work at risk early on, and that checkpoint measures δ.
interval::AutoInterval::Config auto_interval_config(const Config& config) {
  interval::AutoInterval::Config c;
  c.mtbf_s = static_cast<double>(config.mtbf_s);
  c.min_interval_s = static_cast<double>(config.min_interval_s);
  c.max_interval_s = static_cast<double>(config.max_interval_s);
  c.initial_interval_s = std::max(c.min_interval_s, std::min(1800.0, c.mtbf_s / 10));
  if (c.max_interval_s > 0) c.initial_interval_s = std::min(c.initial_interval_s, c.max_interval_s);
  return c;
}

}  // namespace

struct Checkpointer::Impl {
  Config config;
  store::PhaseObserver observer;
  bool enabled = false;
  int rank = 0;
  std::unique_ptr<Coordinator> coord;
  std::unique_ptr<CopyPool> pool;
  std::unique_ptr<DeviceBackend> device;  // created at the first device region
  UpdateTracker tracker;                  // step and mid-update, for the last words
  std::unique_ptr<LastWords> last_words;  // armed: see last_words_runtime.hpp
  std::unique_ptr<NcclWatch> nccl;        // communicators handed to watch_nccl; reset before last_words
  bool handlers = false;
  std::uint64_t notices_seen = 0;  // notice::count() at start: only later signals are for this checkpointer

  // ---- training thread ----
  std::vector<RegionSpec> regions;
  std::vector<nlohmann::json> region_meta;  // parsed meta_json, parallel to regions
  std::vector<Blob> blobs;
  bool started = false;
  bool snapshot_active = false;       // host copies running; before_update has not passed yet
  bool device_guard_pending = false;  // device copies queued; the compute streams do not wait yet
  std::optional<std::uint64_t> last_step;
  std::optional<std::pair<std::uint64_t, Decision>> cached;
  bool stopped = false;
  std::optional<std::uint64_t> time_limit_stop;  // rank 0: the terminal step taken for the time limit
  bool notice_sent = false;
  bool closed = false;
  Status close_status;
  std::vector<RestoredRegion> restored;
  Clock::time_point last_checkpoint_time = Clock::now();
  std::optional<std::uint64_t> time_request;  // the step rank 0 asked for by the clock, until it passes
  double interval_s = 0;
  Clock::time_point backpressure_logged;  // when the last back-pressure line went out
  // CKPT_INTERVAL=auto, on rank 0 only (it alone decides timed checkpoints): δ is the stall plus the interference,
  // the extra step time while a persist runs over the median step time without one.
  std::optional<interval::AutoInterval> auto_interval;
  std::optional<Clock::time_point> auto_saved;  // when the measurements were last kept in .control
  std::deque<double> quiet_steps;             // recent step times with no persist in flight
  Clock::time_point step_end = Clock::now();  // when the last after_step returned
  double guard_s = 0;                         // before_update stalls since then: not step time
  double interference_s = 0;                  // of the checkpoint being measured
  std::uint64_t persists_seen = 0;            // persisted + failed when that checkpoint started
  std::uint64_t persisted_seen = 0;           // persisted then
  bool measuring = false;

  // ---- staging: the worker's while it has tasks, the training thread's after wait_idle() ----
  HostBuffer host;
  PinnedBuffer pinned;

  // ---- last words: the device regions copied to host memory when they start (the last-words thread's) ----
  std::vector<void*> device_streams;  // the compute streams of the device regions, marked after every update
  PinnedBuffer rescued;
  bool rescued_in_staging = false;  // `rescued` is the snapshot's pinned staging, not an allocation of its own
  bool staging_lent = false;        // guarded by mu: the last words hold the pinned staging; nothing may grow it
  std::vector<std::size_t> rescued_at;  // per region: its offset in `rescued` (device regions only)

  // ---- the worker ----
  struct Task {
    bool persist = false;
    std::function<void()> run;
  };
  std::thread worker;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> tasks;       // guarded by mu
  bool busy = false;            // guarded by mu
  int persists_pending = 0;     // guarded by mu: persist tasks queued or running
  bool stopping = false;        // guarded by mu
  Stats stats;                  // guarded by mu
  std::pair<std::size_t, std::size_t> staging_asked;  // guarded by mu: host and pinned staging bytes wanted
  Status first_error;           // guarded by mu

  ~Impl() {
    free_pinned();
    free_rescued();
  }

  Stats stats_copy() const {
    std::lock_guard<std::mutex> lock(mu);
    return stats;
  }

  // ---- worker ----------------------------------------------------------------------------------------------

  void worker_loop() {
    // Linux nice values are per thread; a failure only costs some interference.
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kPersistNice);
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !tasks.empty(); });
        if (tasks.empty()) return;
        task = std::move(tasks.front());
        tasks.pop_front();
        busy = true;
      }
      task.run();
      {
        std::lock_guard<std::mutex> lock(mu);
        busy = false;
        if (task.persist) --persists_pending;
      }
      cv.notify_all();
    }
  }

  void enqueue(bool persist, std::function<void()> run) {
    {
      std::lock_guard<std::mutex> lock(mu);
      tasks.push_back({persist, std::move(run)});
      if (persist) ++persists_pending;
    }
    cv.notify_all();
  }

  // Blocks until the worker has nothing to do; returns whether a persist was what it waited for.
  bool wait_idle() {
    std::unique_lock<std::mutex> lock(mu);
    bool persist = persists_pending > 0;
    cv.wait(lock, [&] { return tasks.empty() && !busy; });
    return persist;
  }

  void record_error(const std::string& message) {
    log::error(rank, message);
    std::lock_guard<std::mutex> lock(mu);
    ++stats.failed;
    if (first_error) first_error = Status::failure(log::prefixed(message));
  }

  // ---- staging ---------------------------------------------------------------------------------------------

  void free_pinned() {
    if (pinned.data != nullptr && device) device->free_pinned(pinned.data);
    pinned = {};
  }

  void free_rescued() {
    if (rescued.data != nullptr && device && !rescued_in_staging) device->free_pinned(rescued.data);
    rescued = {};
    rescued_in_staging = false;
  }

  void update_staging_stats() {
    std::lock_guard<std::mutex> lock(mu);
    stats.staging_bytes = host.size() + pinned.size;
  }

  // Worker or training thread (the latter only after wait_idle): host staging of at least `bytes`.
  Status grow_host(std::size_t bytes) {
    if (host.size() >= bytes) return Status::success();
    host = HostBuffer();  // release first: staging must never be twice the state
    auto buffer = HostBuffer::allocate(bytes);
    if (!buffer) return Status::failure(buffer.error());
    host = std::move(buffer).value();
    update_staging_stats();
    return Status::success();
  }

  Status grow_pinned(std::size_t bytes) {
    if (pinned.size >= bytes) return Status::success();
    free_pinned();
    auto p = device->alloc_pinned(bytes);
    if (!p) return Status::failure(p.error());
    pinned = {*p, bytes};
    update_staging_stats();
    return Status::success();
  }

  // Raises the staging sizes wanted; true when they grew (a grow task must be queued).
  bool ask_staging(std::size_t host_bytes, std::size_t pinned_bytes) {
    std::lock_guard<std::mutex> lock(mu);
    if (host_bytes <= staging_asked.first && pinned_bytes <= staging_asked.second) return false;
    staging_asked = {std::max(staging_asked.first, host_bytes), std::max(staging_asked.second, pinned_bytes)};
    return true;
  }

  // Training thread: asks the worker for staging the current regions need, so no snapshot has to fault it in.
  // A task grows to the latest size asked when it runs, so a burst of registrations maps staging once.
  void plan_growth() {
    StagingPlan plan = plan_staging(regions);
    if (ask_staging(plan.host_bytes, plan.device_bytes)) {
      enqueue(false, [this] {
        std::pair<std::size_t, std::size_t> target;
        {
          std::lock_guard<std::mutex> lock(mu);
          target = staging_asked;
          if (staging_lent) target.second = 0;  // the last words are copying into it
        }
        if (Status s = grow_host(target.first); !s) log::error(rank, s.error() + " (retried at the next snapshot)");
        if (target.second > 0) {
          if (Status s = grow_pinned(target.second); !s) {
            log::error(rank, s.error() + " (retried at the next snapshot)");
          }
        }
      });
    }
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

  // ---- regions -----------------------------------------------------------------------------------------------

  Result<nlohmann::json> check_region(const RegionSpec& r) {
    const std::string at = "ckpt: region '" + r.name + "': ";
    if (r.name.empty()) return Error{"ckpt: a region needs a name"};
    if (r.data == nullptr && r.size > 0) return Error{at + "no data pointer"};
    for (const Blob& b : blobs) {
      if (b.name == r.name) return Error{at + "a blob has that name"};
    }
    nlohmann::json meta = nlohmann::json::parse(r.meta_json, nullptr, false);
    if (meta.is_discarded()) return Error{at + "metadata is not JSON: " + r.meta_json};
    if (r.memory == Memory::Device && !device) {
      auto backend = make_device_backend();
      if (!backend) return Error{at + backend.error().substr(6)};
      device = std::move(backend).value();
    }
    return meta;
  }

  // ---- scheduling ---------------------------------------------------------------------------------------------

  std::uint64_t lead() const { return config.world_size == 1 ? 0 : config.agree_lead; }

  // Training thread: the coordinator namespace, leftovers of dead saves, the interval clock.
  void start(std::uint64_t step) {
    started = true;
    if (Status s = coord->begin(step); !s) log::error(rank, s.error());
    last_checkpoint_time = Clock::now();
    if (rank != 0) return;
    // A save that died before a restart left step dirs without a manifest; their records must never be committed
    // with a new save of the same step (the writer would see them as published). Ranks run in lockstep, so no
    // other rank writes a shard before rank 0 has started training.
    auto entries = store::scan(config.dir);
    if (!entries) return;  // a new dir; ShardWriter creates it
    for (const store::Entry& e : *entries) {
      if (e.state != store::State::Incomplete || e.step <= step) continue;
      if (Status s = store::discard_incomplete(config.dir, e.step, run_fence(config)); !s) {
        log::warn(rank, s.error());
      } else {
        log::info(rank, "discarded the incomplete checkpoint of step " + std::to_string(e.step));
      }
    }
  }

  Decision decide(std::uint64_t step) {
    Decision d;
    if (!notice_sent) {
      int sig = config.signals && notice::count() > notices_seen ? notice::last_signal() : 0;
      // Every rank has the same end time; rank 0 alone acts on it so that one request goes out.
      bool time_up = rank == 0 && config.end_time &&
                     unix_now() >= static_cast<double>(*config.end_time) - static_cast<double>(config.grace_s);
      if (sig != 0 || time_up) {
        notice_sent = true;
        std::uint64_t at = step + lead();
        if (sig == 0) time_limit_stop = at;  // continued in a new allocation once committed (continuation.hpp)
        std::string why = sig != 0 ? "signal " + std::to_string(sig) : "the job's time limit is within the grace time";
        log::info(rank, why + ": terminal checkpoint at step " + std::to_string(at) + ", then stop");
        if (Status s = coord->request(at, store::Kind::Terminal); !s) log::error(rank, s.error());
      }
    }
    if (config.interval.kind != Interval::Kind::Steps && rank == 0) {
      if (time_request && *time_request < step) time_request.reset();
      // The persist floor: with `auto`, no snapshot is asked for while the previous persist is running.
      if (!time_request && seconds_since(last_checkpoint_time) >= interval_s && !(auto_interval && persist_busy())) {
        time_request = step + lead();
        if (Status s = coord->request(*time_request, store::Kind::Periodic); !s) log::error(rank, s.error());
      }
    }
    if (config.interval.kind == Interval::Kind::Steps && step % config.interval.value == 0) d.snapshot = true;
    if (auto kind = coord->requested(step)) {
      d.snapshot = true;
      if (*kind == store::Kind::Terminal) {
        d.kind = store::Kind::Terminal;
        d.stop = true;
      }
    }
    return d;
  }

  // ---- CKPT_INTERVAL=auto (rank 0, training thread) -----------------------------------------------------------

  bool persist_busy() const {
    std::lock_guard<std::mutex> lock(mu);
    return persists_pending > 0;
  }

  // Uses the auto interval's current choice, logs it and shows it in the stats.
  void publish_auto_interval() {
    const interval::AutoInterval::Inputs& in = auto_interval->inputs();
    interval_s = in.interval_s;
    std::string line = auto_interval->describe();
    log::info(rank, "CKPT_INTERVAL=auto: " + line);
    std::lock_guard<std::mutex> lock(mu);
    stats.auto_interval_s = in.interval_s;
    stats.auto_cost_s = in.cost_s;
    stats.auto_stall_s = in.stall_s;
    stats.auto_interference_s = in.interference_s;
    stats.auto_persist_floor_s = in.persist_floor_s;
    stats.auto_mtbf_s = in.mtbf_s;
    stats.auto_checkpoints = in.checkpoints;
    stats.auto_interval_inputs = std::move(line);
  }

  // CKPT_INTERVAL=auto keeps what it measured in <CKPT_DIR>/.control, so a restarted job picks its interval from
  // the costs the job already measured instead of starting again from the initial interval.
  static constexpr const char* kAutoMeasurements = "auto-interval.json";

  void resume_auto_measurements() {
    if (config.dir.empty()) return;
    auto text = store::read_control_file(config.dir, kAutoMeasurements);
    if (!text) {
      log::warn(rank, "CKPT_INTERVAL=auto: earlier measurements not used: " + text.error());
      return;
    }
    if (!*text) return;
    auto replayed = auto_interval->replay_measurements(**text);
    if (!replayed) {
      log::warn(rank, "CKPT_INTERVAL=auto: earlier measurements not used: .control/" + std::string(kAutoMeasurements) +
                          ": " + replayed.error());
      return;
    }
    log::info(rank, "CKPT_INTERVAL=auto: starting from " + std::to_string(*replayed) +
                        " checkpoint measurements of earlier runs");
  }

  // Worker thread, off the training thread, crash-safe; at most once a minute, since each write costs two fsyncs
  // that contend with the persists (a restart that misses the last minute's measurements loses little).
  void save_auto_measurements() {
    constexpr double kEvery = 60;
    if (auto_saved && seconds_since(*auto_saved) < kEvery) return;
    auto_saved = Clock::now();
    enqueue(false, [this, text = auto_interval->measurements_json()] {
      if (Status s = store::write_control_file(config.dir, kAutoMeasurements, text, run_fence(config)); !s) {
        log::warn(rank, "CKPT_INTERVAL=auto: cannot keep the measurements for a restart: " + s.error());
      }
    });
  }

  // Once per step: the step's time (after_step to after_step, less the guard's stall) goes to the baseline when no
  // persist runs, and its excess over the baseline's median to the interference while one does. When the measured
  // checkpoint's persist is done, the interval is recomputed.
  void observe_step() {
    constexpr std::size_t kQuietWindow = 31;
    double dt = std::max(0.0, seconds_since(step_end) - guard_s);
    guard_s = 0;
    int pending = 0;
    std::uint64_t done = 0;
    std::uint64_t persisted = 0;
    double stall = 0;
    double persist_s = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      pending = persists_pending;
      done = stats.persisted + stats.failed;
      persisted = stats.persisted;
      stall = stats.last_stall_s;
      persist_s = stats.last_persist_s;
    }
    step_end = Clock::now();
    bool finished = measuring && pending == 0 && done > persists_seen;
    if (measuring && !finished) {
      if (!quiet_steps.empty()) {
        std::vector<double> sorted(quiet_steps.begin(), quiet_steps.end());
        std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
        interference_s += std::max(0.0, dt - sorted[sorted.size() / 2]);
      }
    } else if (pending == 0) {
      quiet_steps.push_back(dt);
      if (quiet_steps.size() > kQuietWindow) quiet_steps.pop_front();
    }
    if (!finished) return;
    measuring = false;
    // A failed persist measured nothing: its time is not the store's speed.
    if (persisted <= persisted_seen) return;
    if (Status s = auto_interval->observe_checkpoint(stall, interference_s, persist_s); !s) {
      log::warn(rank, "CKPT_INTERVAL=auto: " + s.error());
      return;
    }
    publish_auto_interval();
    save_auto_measurements();
  }

  // ---- the snapshot (training thread) -------------------------------------------------------------------------

  // The guard: waits for the host copies, queues the device guard. Returns the seconds it blocked.
  double guard() {
    auto t0 = Clock::now();
    if (snapshot_active) {
      pool->help_and_wait();  // the training thread copies what no copy thread has taken yet
      snapshot_active = false;
    }
    if (device_guard_pending) {
      device_guard_pending = false;
      if (Status s = device->guard(); !s) record_error(s.error());
    }
    return seconds_since(t0);
  }

  // One line for the first wait, then at most one a minute with the totals: an interval that is too short
  // makes every checkpoint wait, and the log must stay readable.
  void report_backpressure(std::uint64_t step, double waited) {
    std::uint64_t waits = 0;
    double total = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      waits = stats.backpressure_waits;
      total = stats.backpressure_s;
    }
    if (waits > 1 && seconds_since(backpressure_logged) < 60) return;
    backpressure_logged = Clock::now();
    std::string line = "back-pressure: the checkpoint of step " + std::to_string(step) + " waited " + secs(waited) +
                       " for the previous persist; the interval is shorter than a persist takes";
    if (waits > 1) line += " (" + std::to_string(waits) + " waits, " + secs(total) + " in all)";
    log::warn(rank, line);
  }

  void snapshot(std::uint64_t step, store::Kind kind) {
    auto t0 = Clock::now();
    guard();  // a snapshot nobody guarded (no before_update since) must finish before staging is reused
    auto t_wait = Clock::now();
    bool waited_for_persist = wait_idle();
    double waited = seconds_since(t_wait);

    auto job = std::make_shared<PersistJob>();
    job->step = step;
    job->kind = kind;
    StagingPlan plan = plan_staging(regions);
    Status ready = Status::success();
    if (host.size() < plan.host_bytes) {
      log::info(rank, "allocating " + mib(plan.host_bytes) + " of staging inside the snapshot of step " +
                          std::to_string(step) + " (register state earlier to allocate it in the background)");
      ready = grow_host(plan.host_bytes);
    }
    if (ready && pinned.size < plan.device_bytes) ready = grow_pinned(plan.device_bytes);
    (void)ask_staging(plan.host_bytes, plan.device_bytes);  // allocated above: no grow task

    if (!ready) {
      job->error = "no staging memory: " + ready.error();
    } else {
      std::vector<CopyChunk> async;
      std::vector<DeviceCopy> device_copies;
      bool device_sync = false;
      std::vector<Piece> pieces(regions.size());
      for (const Slot& s : plan.host) {
        const RegionSpec& r = regions[s.region];
        std::byte* dst = host.data() + s.offset;
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
        std::byte* dst = static_cast<std::byte*>(pinned.data) + s.offset;
        device_copies.push_back({dst, r.data, r.size, r.stream});
        device_sync = device_sync || r.sync;
        pieces[s.region] = {r.name, dst, r.size, region_meta[s.region]};
      }
      job->pieces = std::move(pieces);
      job->blobs = blobs;
      for (const Blob& b : job->blobs) job->pieces.push_back({b.name, b.bytes.data(), b.bytes.size(), b.meta});
      for (const Piece& p : job->pieces) job->bytes += p.size;
      if (!device_copies.empty()) {
        if (Status s = device->snapshot(device_copies); !s) {
          job->error = s.error();
        } else {
          job->device_copy = true;
          device_guard_pending = true;
          // Device state that changes outside updates: the compute streams wait for the copy right away.
          if (device_sync) guard();
        }
      }
      if (job->error.empty() && !async.empty()) {
        pool->start(split_copies(async, kCopyChunk));
        job->host_copy = true;
        snapshot_active = true;
      }
    }
    last_checkpoint_time = t0;
    if (auto_interval) {
      measuring = true;
      interference_s = 0;
      step_end = Clock::now();  // the snapshot's stall is δ's stall part, not step time
    }
    double stall = seconds_since(t0);
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.snapshots;
      stats.last_snapshot_step = step;
      persists_seen = stats.persisted + stats.failed;
      persisted_seen = stats.persisted;
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
    enqueue(true, [this, job] { persist(*job); });
  }

  // ---- the persist (worker) -----------------------------------------------------------------------------------

  // The state keys this rank's record covers (store::state_keys_of_rank): every key is covered exactly once per
  // checkpoint, so a terminal one passes decide_commit. Replicas hold copies of the model and optimizer slices;
  // the replica dp 0 claims them. A ZeRO-1 optimizer shard lives on one rank only and is always claimed.
  // (Last words write their own covers: the keys each survivor was elected for.)
  std::vector<std::string> covers() const {
    std::vector<std::string> keys = store::state_keys_of_rank(config.layout, config.coord);
    if (config.coord.dp == 0) return keys;
    keys.erase(std::remove_if(keys.begin(), keys.end(),
                              [](const std::string& k) { return k.find("/dp") == std::string::npos; }),
               keys.end());
    return keys;
  }

  store::Manifest manifest(const PersistJob& job) const {
    return last_words_manifest(config, job.step, job.kind);
  }

  // This rank's shard of `step`: the pieces in order, claiming `keys`.
  Status write_pieces(std::uint64_t step, const std::vector<Piece>& pieces, const std::vector<std::string>& keys) {
    auto writer = store::ShardWriter::open(config.dir, step, rank, observer, run_fence(config));
    if (!writer) return Status::failure(writer.error());
    for (const Piece& p : pieces) {
      if (Status s = writer->append(p.name, p.data, p.size, p.meta); !s) return s;
    }
    writer->add_covers(keys);
    auto record = writer->finish();
    if (!record) return Status::failure(record.error());
    return Status::success();
  }

  Status write_shard(const PersistJob& job) {
    if (!job.error.empty()) return Status::failure(job.error);
    return write_pieces(job.step, job.pieces, covers());
  }

  // The last-words thread, training frozen outside an update, before this rank reports: the device regions into
  // host memory, as they were after the last update, by `deadline`. A rank that cannot do it reports that it
  // cannot write, so that the survivors elect another replica.
  Status rescue_device_state(Clock::time_point deadline) {
    free_rescued();
    rescued_at.assign(regions.size(), 0);
    std::size_t total = 0;
    for (std::size_t i = 0; i < regions.size(); ++i) {
      if (regions[i].memory != Memory::Device) continue;
      rescued_at[i] = total;
      total += regions[i].size;
    }
    if (total == 0) return Status::success();
    auto t0 = Clock::now();
    // The snapshot's pinned staging when no persist is reading it (training is frozen: none will start), since
    // pinning tens of GiB takes seconds; otherwise memory of its own.
    bool in_staging = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      in_staging = tasks.empty() && !busy && pinned.size >= total;
      staging_lent = in_staging;
    }
    Result<void*> buffer = in_staging ? Result<void*>(pinned.data) : device->alloc_pinned(total);
    if (!buffer) return Status::failure(buffer.error());
    std::vector<DeviceCopy> copies;
    for (std::size_t i = 0; i < regions.size(); ++i) {
      const RegionSpec& r = regions[i];
      if (r.memory != Memory::Device || r.size == 0) continue;
      copies.push_back({static_cast<std::byte*>(*buffer) + rescued_at[i], r.data, r.size, r.stream});
    }
    if (Status s = device->rescue(copies, deadline); !s) {
      // The copy may still land in the buffer: it is left allocated.
      return s;
    }
    rescued = {*buffer, total};
    rescued_in_staging = in_staging;
    log::info(rank, "last words: copied " + mib(total) + " of device state to host memory in " +
                        std::to_string(static_cast<int>(seconds_since(t0) * 1000)) + " ms");
    return Status::success();
  }

  // The last-words thread, training frozen outside an update: this rank's live state, consistent at `step`, as a
  // terminal shard covering `keys` (device regions from what rescue_device_state copied).
  Status write_terminal(std::uint64_t step, const std::vector<std::string>& keys) {
    std::vector<Piece> pieces;
    for (std::size_t i = 0; i < regions.size(); ++i) {
      const RegionSpec& r = regions[i];
      const std::byte* data = static_cast<const std::byte*>(r.data);
      if (r.memory == Memory::Device) {
        if (rescued_at.size() != regions.size() || (rescued.data == nullptr && r.size > 0)) {
          return Status::failure("region '" + r.name + "' is device memory and was not copied to the host");
        }
        data = static_cast<const std::byte*>(rescued.data) + rescued_at[i];
      }
      pieces.push_back({r.name, data, r.size, region_meta[i]});
    }
    for (const Blob& b : blobs) pieces.push_back({b.name, b.bytes.data(), b.bytes.size(), b.meta});
    if (Status s = write_pieces(step, pieces, keys); !s) return s;
    log::info(rank, "last words: wrote the terminal shard of step " + std::to_string(step) + " (" +
                        std::to_string(keys.size()) + " state keys)");
    return Status::success();
  }

  void persist(const PersistJob& job) {
    const std::string at = "step " + std::to_string(job.step) + ": ";
    auto t0 = Clock::now();
    if (job.host_copy) pool->wait();
    double copy_s = job.host_copy ? pool->last_batch_seconds() : 0;
    Status outcome = Status::success();
    if (job.device_copy) outcome = device->wait();
    auto t_write = Clock::now();
    if (outcome) outcome = write_shard(job);
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
    Status published = coord->publish(job.step, outcome);
    if (!published) record_error(at + published.error());
    if (rank != 0 || !outcome || !published) return;

    auto timeout = std::chrono::milliseconds(config.commit_timeout_s * 1000);
    if (Status all = coord->wait_all(job.step, timeout); !all) {
      record_error(at + "not committed: " + all.error());
      return;
    }
    if (Status s = store::commit(config.dir, manifest(job), observer, run_fence(config)); !s) {
      record_error(s.error());
      return;
    }
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
    if (job.kind == store::Kind::Terminal && time_limit_stop == job.step) {
      continue_after_time_limit(TimeLimitStop{config.dir, config.job_id, config.restart_count, job.step,
                                              config.resume_step, config.max_restarts, config.requeue});
    }
  }

  // Retention after a commit; gc() re-reads the newest checkpoint to verify it, so it runs only when the plan
  // (with the step just committed as the newest verified one) deletes something.
  void collect_garbage(std::uint64_t committed) {
    auto entries = store::scan(config.dir);
    if (!entries) return;
    if (store::plan_gc(*entries, config.keep, committed).empty()) return;
    auto deleted = store::gc(config.dir, config.keep, false, run_fence(config));
    if (!deleted) {
      log::warn(rank, "retention: " + deleted.error());
      return;
    }
    for (std::uint64_t step : *deleted) log::debug(rank, "retention deleted step " + std::to_string(step));
  }

  // ---- restore (training thread) ------------------------------------------------------------------------------

  // Reads this rank's shard of `step` under `root` into host staging; a definite error means the checkpoint is bad.
  Status load_shard(const std::string& root, std::uint64_t step, bool& definite) {
    definite = false;
    const std::string at = "ckpt: step " + std::to_string(step) + ": ";
    auto m = store::read_manifest(root, step);
    if (!m) return Status::failure(at + m.error());
    int source = rank;
    if (m->world_size != config.world_size) {
      // Pure data parallelism: every shard holds a full replica, so a job relaunched on fewer or more nodes can
      // go on from any of them (per-rank extras such as RNG states come from the replica it loads).
      const store::Layout& l = m->layout;
      if (l.tp != 1 || l.pp != 1 || l.zero1 || m->world_size < 1) {
        return Status::failure(at + "written by " + std::to_string(m->world_size) + " ranks (tp " +
                               std::to_string(l.tp) + ", pp " + std::to_string(l.pp) + (l.zero1 ? ", ZeRO-1" : "") +
                               "); this run has " + std::to_string(config.world_size));
      }
      source = rank % m->world_size;
      if (rank == 0) {
        log::warn(rank, "step " + std::to_string(step) + " was written by " + std::to_string(m->world_size) +
                            " data-parallel ranks; this run has " + std::to_string(config.world_size) +
                            ": rank r loads the replica of rank r % " + std::to_string(m->world_size));
      }
    }
    const store::ShardRecord* record = nullptr;
    for (const store::ShardRecord& r : m->shards) {
      if (r.rank == source) record = &r;
    }
    if (record == nullptr && m->kind == store::Kind::Terminal && m->world_size == config.world_size) {
      // Last words: only survivors wrote, each state key once; this rank loads the shard that covers its keys.
      if (Status s = terminal_source(*m, record); !s) {
        definite = true;
        return Status::failure(at + s.error());
      }
    }
    if (record == nullptr) {
      definite = true;
      return Status::failure(at + "no shard for rank " + std::to_string(source));
    }
    if (Status s = grow_host(static_cast<std::size_t>(record->size)); !s) return s;
    (void)ask_staging(host.size(), 0);
    const std::string path = join(join(root, store::step_dir_name(step)), record->file);
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return Status::failure(at + "cannot open " + path + ": " + errno_text(errno));
    std::uint64_t done = 0;
    while (done < record->size) {
      std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(record->size - done, 1u << 30));
      ssize_t n = ::pread(fd, host.data() + done, want, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int err = errno;
        ::close(fd);
        definite = n == 0;
        return Status::failure(at + "cannot read " + path + ": " + (n == 0 ? "file too short" : errno_text(err)));
      }
      done += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
    // Verified before, but what is loaded is what counts: the same checksum over the bytes in memory.
    if (XXH3_64bits(host.data(), static_cast<std::size_t>(record->size)) != record->checksum) {
      definite = true;
      return Status::failure(at + record->file + ": checksum mismatch after loading");
    }
    restored.clear();
    for (const store::StateRange& s : record->states) {
      if (s.offset > record->size || s.length > record->size - s.offset) {
        definite = true;
        return Status::failure(at + "region '" + s.name + "' lies outside its shard");
      }
      restored.push_back({s.name, s.meta.dump(), host.data() + s.offset, static_cast<std::size_t>(s.length)});
    }
    return Status::success();
  }

  // The shard of a terminal checkpoint that covers every state key of this rank (a rank of the same layout).
  Status terminal_source(const store::Manifest& m, const store::ShardRecord*& record) const {
    const store::Layout& l = m.layout;
    if (l.dp != config.layout.dp || l.tp != config.layout.tp || l.pp != config.layout.pp || l.zero1 != config.layout.zero1) {
      return Status::failure("a terminal checkpoint of another layout (dp " + std::to_string(l.dp) + ", tp " +
                             std::to_string(l.tp) + ", pp " + std::to_string(l.pp) + ")");
    }
    std::vector<std::string> keys = store::state_keys_of_rank(config.layout, config.coord);
    record = nullptr;
    for (const store::ShardRecord& r : m.shards) {
      if (std::find(r.covers.begin(), r.covers.end(), keys.front()) != r.covers.end()) record = &r;
    }
    if (record == nullptr) return Status::failure("no shard covers " + keys.front());
    for (const std::string& key : keys) {
      if (std::find(record->covers.begin(), record->covers.end(), key) == record->covers.end()) {
        // A plan never splits a rank's keys among ranks other than itself (ZeRO-1 shards have no other copy).
        return Status::failure(key + " lies in another shard than " + keys.front() + ": not a last-words plan");
      }
    }
    if (record->rank != rank) {
      log::info(rank, "terminal checkpoint of step " + std::to_string(m.step) + ": loading the shard of rank " +
                          std::to_string(record->rank) + " (it covers " + keys.front() + ")");
    }
    return Status::success();
  }

  // The first candidate: the plugin's choice when it gave one, and it verifies.
  std::optional<std::pair<std::string, std::uint64_t>> plugin_choice() {
    std::string root = config.dir;
    std::optional<std::uint64_t> step = config.resume_step;
    if (!config.resume_path.empty()) {
      auto slash = config.resume_path.find_last_of('/');
      auto parsed = store::parse_step_dir_name(config.resume_path.substr(slash + 1));
      if (!parsed) {
        log::warn(rank, "CKPT_RESUME_PATH=" + config.resume_path + " is not a step dir; ignored");
      } else {
        root = slash == 0 ? "/" : config.resume_path.substr(0, slash);
        step = parsed;
      }
    }
    if (!step) return std::nullopt;
    if (Status s = store::verify(root, *step); !s) {
      log::warn(rank, "the checkpoint the job was given (step " + std::to_string(*step) + ") does not verify: " +
                          s.error() + "; looking for another");
      return std::nullopt;
    }
    return std::make_pair(root, *step);
  }

  Result<std::uint64_t> restore(bool copy_into_regions) {
    if (started) return Error{"ckpt: restore() must come before the first after_step()"};
    wait_idle();
    std::optional<std::pair<std::string, std::uint64_t>> choice = plugin_choice();
    std::vector<std::uint64_t> failed;
    bool loaded = false;
    while (!loaded) {
      if (!choice) {
        struct stat st {};
        if (::stat(config.dir.c_str(), &st) != 0 && errno == ENOENT) break;  // a first run: nothing to look at
        store::ResumeChoice resolved = store::resolve_resume(config.dir, true, run_fence(config));
        for (const std::string& line : resolved.log) {
          if (rank == 0) {
            log::info(rank, line);
          } else {
            log::debug(rank, line);
          }
        }
        if (!resolved.step) break;
        if (std::find(failed.begin(), failed.end(), *resolved.step) != failed.end()) {
          return Error{"ckpt: step " + std::to_string(*resolved.step) + " failed to load and could not be marked FAILED"};
        }
        choice = std::make_pair(config.dir, *resolved.step);
      }
      bool definite = false;
      Status status = load_shard(choice->first, choice->second, definite);
      if (status) {
        loaded = true;
        break;
      }
      if (!definite) return Error{status.error()};
      log::warn(rank, status.error() + "; marking it FAILED and walking back");
      (void)store::mark_failed(choice->first, choice->second, status.error(), run_fence(config));
      failed.push_back(choice->second);
      choice.reset();
      restored.clear();
    }
    const std::uint64_t step = loaded ? choice->second : 0;
    if (copy_into_regions && loaded) {
      for (const RegionSpec& r : regions) {
        auto it = std::find_if(restored.begin(), restored.end(), [&](const RestoredRegion& x) { return x.name == r.name; });
        if (it == restored.end()) {
          return Error{"ckpt: step " + std::to_string(step) + " has no region '" + r.name + "'"};
        }
        if (it->size != r.size) {
          return Error{"ckpt: region '" + r.name + "' is " + std::to_string(r.size) + " bytes; step " +
                       std::to_string(step) + " has " + std::to_string(it->size)};
        }
        if (r.size == 0) continue;
        if (r.memory == Memory::Host) {
          std::memcpy(r.data, it->data, r.size);
        } else if (Status s = device->upload(r.data, it->data, r.size); !s) {
          return Error{s.error()};
        }
      }
    }
    if (loaded) log::info(rank, "restored step " + std::to_string(step) + " from " + choice->first);
    start(step);
    return step;
  }

  // With wait_for_peers false (the loop was unwound by an error, close() never called), the writer does not wait
  // for ranks that may be gone; this rank's own shard is still finished.
  Status close(bool wait_for_peers) {
    if (closed) return close_status;
    closed = true;
    if (!enabled) return close_status;
    nccl.reset();  // stops polling; the program destroys its communicators after close()
    if (last_words) {
      // A training error on an armed job is most likely a dead peer (gloo resets within ~50 ms, the mesh needs up
      // to its silence limit): wait for the last words before this rank goes, or peers would count it dead too.
      if (!wait_for_peers || last_words->triggered()) {
        wait_for_peers = false;
        if (last_words->wait_triggered(std::chrono::milliseconds(2000))) {
          (void)last_words->wait_done(std::chrono::milliseconds(10000));
        }
      } else {
        last_words->leave();
      }
      last_words.reset();
    }
    if (!wait_for_peers) coord->cancel();
    guard();
    wait_idle();
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
    pool.reset();
    if (handlers) notice::release_handlers();
    handlers = false;
    coord.reset();
    free_pinned();
    free_rescued();
    std::lock_guard<std::mutex> lock(mu);
    close_status = first_error;
    return close_status;
  }
};

// ---- the public API ---------------------------------------------------------------------------------------------

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Checkpointer::~Checkpointer() {
  if (!impl_) return;
  if (Status s = impl_->close(false); !s) log::error(impl_->rank, "at close: " + s.error());
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
      // The newest run to start owns the dir: raising the epoch record fences every rank of an earlier run of this
      // job (a node that froze and thaws) out of it. Here, before restore can mark a checkpoint FAILED. The other
      // ranks do not write it (one write per run, not one per rank); until rank 0 has, they are not fenced either.
      const store::Fence fence = run_fence(*config);
      if (Status s = store::raise_epoch(config->dir, fence, config->run_id); !s) {
        if (auto refusal = fenced(config->dir, fence)) return Error{"ckpt: " + *refusal};
        log::warn(0, s.error() + "; this run cannot fence out earlier runs of the job");
      }
    }
    auto coord = make_coordinator(*config);
    if (!coord) return Error{coord.error()};
    impl->coord = std::move(coord).value();
    switch (config->interval.kind) {
      case Interval::Kind::Seconds: impl->interval_s = static_cast<double>(config->interval.value); break;
      case Interval::Kind::Steps: break;
      case Interval::Kind::Auto:
      {
        auto chooser = interval::AutoInterval::create(auto_interval_config(*config));
        if (!chooser) return Error{"ckpt: CKPT_INTERVAL=auto: " + chooser.error()};
        impl->interval_s = chooser->interval_s();
        if (config->rank == 0) {
          impl->auto_interval.emplace(std::move(chooser).value());
          impl->resume_auto_measurements();
          impl->publish_auto_interval();
        }
        break;
      }
    }
    impl->pool = std::make_unique<CopyPool>(config->copy_threads);
    if (config->signals) {
      notice::acquire_handlers();
      impl->handlers = true;
      impl->notices_seen = notice::count();
    }
    impl->worker = std::thread([p = impl.get()] { p->worker_loop(); });
    if (last_words_armed(*config)) {
      Impl* p = impl.get();
      // Committed before Slurm's SIGKILL: 90% of KillWait, from the detection.
      LastWords::Timing timing;
      timing.deadline = std::chrono::milliseconds(std::max<std::uint64_t>(config->kill_wait_s * 900, 1000));
      timing.exit_grace = std::chrono::milliseconds(config->exit_grace_s * 1000);
      // The mesh dir is per run (the run id carries the restart count): a stale rank of an earlier run publishes
      // and reads addresses in its own run's dir, and a newer run's ranks refuse its handshake, since the per-run
      // secret in their mesh dir is not the one it holds (heartbeat.hpp).
      auto lw = LastWords::start(
          *config, join(join(config->dir, ".control"), config->run_id + "-mesh"), impl->tracker,
          [p](std::uint64_t step, const std::vector<std::string>& keys) { return p->write_terminal(step, keys); },
          [p](Clock::time_point deadline) { return p->rescue_device_state(deadline); }, timing);
      if (!lw) {
        impl->close(false);
        return Error{lw.error()};
      }
      impl->last_words = std::move(lw).value();
    } else if (config->last_words && !config->layout_declared && config->world_size > 1 && config->rank == 0) {
      // Without a layout the survivors cannot tell whether they hold a complete copy, so nothing is armed.
      log::warn(0, "last words are on but the job declared no layout, so they are off: declare it with "
                   "CKPT_LAYOUT=dp=<n>,tp=<n>,pp=<n> (or layout= in slurm_ckpt.torch.Checkpointer, which declares "
                   "dp=<world size> by itself for a DistributedDataParallel model)");
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
  if (!meta) return Status::failure(meta.error());
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
    if (!meta) return Status::failure(meta.error());
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

Result<std::uint64_t> Checkpointer::restore(bool copy_into_regions) {
  if (!impl_->enabled) return std::uint64_t{0};
  if (impl_->closed) return Error{"ckpt: restore() after close()"};
  try {
    auto step = impl_->restore(copy_into_regions);
    if (step) impl_->tracker.finish_step(*step);
    return step;
  } catch (const std::exception& e) {
    return Error{std::string("ckpt: restore failed: ") + e.what()};
  }
}

const std::vector<RestoredRegion>& Checkpointer::restored() const { return impl_->restored; }

Status Checkpointer::before_update() {
  Impl& m = *impl_;
  if (m.last_words && !m.tracker.enter_update()) {
    (void)m.last_words->wait_done(std::chrono::milliseconds(10000));
    return Status::failure("ckpt: training is stopped: " + m.last_words->outcome().summary);
  }
  if (!m.snapshot_active && !m.device_guard_pending) return Status::success();
  double waited = m.guard();
  std::lock_guard<std::mutex> lock(m.mu);
  m.stats.last_stall_s += waited;
  m.guard_s += waited;
  m.stats.total_stall_s += waited;
  return Status::success();
}

Result<Decision> Checkpointer::poll(std::uint64_t step) {
  Impl& m = *impl_;
  if (!m.enabled) return Decision{};
  if (m.closed) return Error{"ckpt: poll() after close()"};
  if (m.cached && m.cached->first == step) return m.cached->second;
  if (m.last_step && step <= *m.last_step) {
    return Error{"ckpt: step " + std::to_string(step) + " follows step " + std::to_string(*m.last_step) +
                 ": steps must increase"};
  }
  if (!m.started) m.start(0);
  Decision d = m.decide(step);
  m.cached = std::make_pair(step, d);
  return d;
}

Result<bool> Checkpointer::after_step(std::uint64_t step) {
  Impl& m = *impl_;
  if (!m.enabled) return false;
  auto d = poll(step);
  if (!d) return Error{d.error()};
  m.tracker.finish_step(step);
  if (m.last_words && m.device && !m.device_streams.empty()) {
    if (Status s = m.device->mark_updates(m.device_streams); !s) m.record_error(s.error());
  }
  m.cached.reset();
  if (m.auto_interval) m.observe_step();
  m.last_step = step;
  if (m.stopped) return true;
  if (d->snapshot) m.snapshot(step, d->kind);
  if (d->stop) m.stopped = true;
  return m.stopped;
}

Status Checkpointer::save(std::uint64_t step, store::Kind kind) {
  Impl& m = *impl_;
  if (!m.enabled) return Status::success();
  if (m.closed) return Status::failure("ckpt: save() after close()");
  if (auto last = m.stats_copy().last_snapshot_step; last && step <= *last) {
    return Status::failure("ckpt: save(" + std::to_string(step) + "): step " + std::to_string(*last) +
                           " was saved already");
  }
  if (!m.started) m.start(0);
  m.snapshot(step, kind);
  if (kind == store::Kind::Terminal) m.stopped = true;
  return Status::success();
}

Status Checkpointer::close() { return impl_->close(true); }

Status Checkpointer::abort() { return impl_->close(false); }

Status Checkpointer::watch_nccl(void* comm) {
  Impl& d = *impl_;
  if (!d.enabled || d.closed) return Status::success();
  if (!d.nccl) {
    NcclWatch::Hooks hooks;
    LastWords* words = d.last_words.get();
    const int rank = d.rank;
    hooks.on_error = [words, rank](const std::string& why) {
      log::error(rank, why);
      if (words != nullptr) words->trigger(why);
    };
    if (words != nullptr) hooks.abort_requested = [words] { return words->triggered(); };
    auto watch = NcclWatch::start(std::move(hooks), std::chrono::milliseconds(50));
    if (!watch) return Status::failure(watch.error());
    d.nccl = std::move(watch).value();
  }
  return d.nccl->add(comm);
}

Stats Checkpointer::stats() const { return impl_->stats_copy(); }

}  // namespace ckpt::hooks
