#include "last_words_runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <thread>

#include "ckpt/recovery.hpp"

#include "coordinator.hpp"
#include "heartbeat.hpp"
#include "log.hpp"
#include "notice.hpp"

namespace ckpt::hooks {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kCoordBits = 21;
constexpr std::uint64_t kCoordMask = (std::uint64_t{1} << kCoordBits) - 1;
constexpr std::uint32_t kMidUpdate = 1;
constexpr std::uint32_t kCannotWrite = 2;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Ends the process `grace` from now unless it has exited by then. Detached: it outlives the LastWords object,
// which the program's close() destroys on its way out, and exiting normally first simply ends it.
void end_process_after(std::chrono::milliseconds grace, int rank, std::string lost) {
  std::thread([grace, rank, lost = std::move(lost)] {
    std::this_thread::sleep_for(grace);
    // Straight to stderr, not through the log sink: a sink may wait on a lock the stuck program holds.
    char line[320];
    int n = std::snprintf(line, sizeof line,
                          "ckpt: rank %d: last words: done, and the program has not exited %.1f s after losing %s (its "
                          "teardown waits on the lost peer): ending it with exit status %d\n",
                          rank, std::chrono::duration<double>(grace).count(), lost.c_str(),
                          ckpt::recovery::kExitPeerLost);
    if (n > 0) (void)!::write(2, line, std::min<std::size_t>(static_cast<std::size_t>(n), sizeof line - 1));
    ::_exit(ckpt::recovery::kExitPeerLost);
  }).detach();
}

}  // namespace

bool last_words_armed(const Config& config) {
  return config.last_words && config.layout_declared && config.world_size > 1 && !config.dir.empty();
}

store::Manifest last_words_manifest(const Config& config, std::uint64_t step, store::Kind kind) {
  store::Manifest m;
  m.step = step;
  m.kind = kind;
  m.world_size = config.world_size;
  m.layout = config.layout;
  for (int r = 0; r < config.world_size; ++r) m.ranks.push_back(config.layout.coord_of(r));
  if (config.rank >= 0 && config.rank < config.world_size) m.ranks[static_cast<std::size_t>(config.rank)] = config.coord;
  return m;
}

std::uint64_t pack_coord(const store::RankCoord& c) {
  return (static_cast<std::uint64_t>(c.dp) & kCoordMask) | ((static_cast<std::uint64_t>(c.tp) & kCoordMask) << kCoordBits) |
         ((static_cast<std::uint64_t>(c.pp) & kCoordMask) << (2 * kCoordBits));
}

store::RankCoord unpack_coord(int rank, std::uint64_t packed) {
  return {rank, static_cast<int>(packed & kCoordMask), static_cast<int>((packed >> kCoordBits) & kCoordMask),
          static_cast<int>((packed >> (2 * kCoordBits)) & kCoordMask)};
}

// ---- UpdateTracker ----------------------------------------------------------------------------------------------

bool UpdateTracker::enter_update() {
  std::lock_guard<std::mutex> lock(mu_);
  if (frozen_) return false;
  progress_.mid_update = true;
  return true;
}

void UpdateTracker::finish_step(std::uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_ = {step, false};
}

UpdateTracker::Progress UpdateTracker::freeze() {
  std::lock_guard<std::mutex> lock(mu_);
  frozen_ = true;
  return progress_;
}

UpdateTracker::Progress UpdateTracker::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

bool UpdateTracker::frozen() const {
  std::lock_guard<std::mutex> lock(mu_);
  return frozen_;
}

// ---- LastWords --------------------------------------------------------------------------------------------------

struct LastWords::Impl {
  Config config;
  Timing timing;
  UpdateTracker* tracker = nullptr;
  WriteShard write;
  Prepare prepare;
  std::unique_ptr<heartbeat::Mesh> mesh;
  std::uint64_t notices_seen = 0;
  int rank = 0;

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool stopping = false;                      // guarded by mu
  bool triggered = false;                     // guarded by mu
  std::string trigger_why;                    // guarded by mu
  Clock::time_point trigger_time;             // guarded by mu
  std::map<int, heartbeat::Frame> reports;    // guarded by mu: rank -> its report
  std::map<int, bool> wrote;                  // guarded by mu: writer rank -> durable
  std::vector<bool> dead;                     // guarded by mu: died (not left in order)
  LastWordsOutcome outcome;                   // guarded by mu
  std::thread thread;

  void fire(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (triggered) return;
      triggered = true;
      trigger_why = why;
      trigger_time = Clock::now();
      outcome.triggered = true;
      outcome.detect_unix = unix_now();
    }
    cv.notify_all();
  }

  // Mesh thread.
  void on_event(const heartbeat::Event& e) {
    using Kind = heartbeat::Event::Kind;
    if (e.kind == Kind::PeerLeft) {
      cv.notify_all();
      return;
    }
    if (e.kind == Kind::PeerDead) {
      {
        std::lock_guard<std::mutex> lock(mu);
        dead[static_cast<std::size_t>(e.peer)] = true;
      }
      char line[160];
      std::snprintf(line, sizeof line, "last words: rank %d is dead (%s), detected at unix %.3f", e.peer,
                    e.why.c_str(), unix_now());
      log::warn(rank, line);
      fire("rank " + std::to_string(e.peer) + " died");
      cv.notify_all();
      return;
    }
    if (e.frame.type == heartbeat::kReport) {
      {
        std::lock_guard<std::mutex> lock(mu);
        reports[e.peer] = e.frame;
      }
      fire("rank " + std::to_string(e.peer) + " started its last words");
      cv.notify_all();
    } else if (e.frame.type == heartbeat::kWrote) {
      {
        std::lock_guard<std::mutex> lock(mu);
        wrote[e.peer] = e.frame.flags == 1;
      }
      cv.notify_all();
    }
  }

  void run() {
    Clock::time_point t0;
    {
      std::unique_lock<std::mutex> lock(mu);
      while (!stopping && !triggered) {
        cv.wait_for(lock, std::chrono::milliseconds(50));
        if (config.signals && notice::count() > notices_seen && !triggered) {
          lock.unlock();
          fire("signal " + std::to_string(notice::last_signal()));
          lock.lock();
        }
      }
      if (!triggered) return;
      t0 = trigger_time;
      log::info(rank, "last words: " + trigger_why);
    }
    const int world = config.world_size;
    // 1. Freeze and report.
    UpdateTracker::Progress me = tracker->freeze();
    bool ready = true;
    if (prepare && !me.mid_update) {
      // Half the deadline at most: the write and the commit need the rest.
      if (Status s = prepare(t0 + timing.deadline / 2); !s) {
        log::error(rank, "last words: this rank cannot write its state: " + s.error());
        ready = false;
      }
    }
    heartbeat::Frame report;
    report.type = heartbeat::kReport;
    report.a = me.step;
    report.flags = (me.mid_update ? kMidUpdate : 0) | (ready ? 0 : kCannotWrite);
    {
      std::lock_guard<std::mutex> lock(mu);
      report.from = rank;
      reports[rank] = report;
    }
    mesh->broadcast(report);
    // 2. Gather: every peer reported or is gone. A frozen peer is declared dead after dead_after; a live one may
    // take half the deadline to copy its device state before it reports.
    const auto gather_until =
        t0 + std::max<std::chrono::milliseconds>(timing.dead_after + std::chrono::milliseconds(500),
                                                 timing.deadline / 2 + std::chrono::milliseconds(300));
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_until(lock, gather_until, [&] {
        if (stopping) return true;
        std::vector<bool> alive = mesh->alive();
        for (int p = 0; p < world; ++p) {
          if (!reports.count(p) && alive[static_cast<std::size_t>(p)]) return false;
        }
        return true;
      });
    }
    std::vector<last_words::RankReport> rankreports;
    std::vector<std::string> unable;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (int p = 0; p < world; ++p) {
        last_words::RankReport r;
        r.coord = p == rank ? config.coord : unpack_coord(p, mesh->hellos()[static_cast<std::size_t>(p)]);
        auto it = reports.find(p);
        if (it != reports.end()) {
          r.alive = (it->second.flags & kCannotWrite) == 0;
          if (!r.alive) unable.push_back("rank " + std::to_string(p) + " cannot write its state (counted as lost)");
          r.mid_update = (it->second.flags & kMidUpdate) != 0;
          r.step = it->second.a;
        }
        rankreports.push_back(r);
      }
    }
    // 3. Decide.
    last_words::Plan plan = last_words::plan(config.layout, rankreports);
    int lowest_alive = -1;
    for (int p = 0; p < world && lowest_alive < 0; ++p) {
      if (rankreports[static_cast<std::size_t>(p)].alive) lowest_alive = p;
    }
    const bool speaker = lowest_alive == rank;
    log::info(rank, plan.summary);  // "last words: writing ..." or "last words: not writing ..."
    for (const std::string& why : unable) log::info(rank, "last words: " + why);
    for (const std::string& why : plan.reasons) {
      if (speaker) {
        log::info(rank, "last words: " + why);
      } else {
        log::debug(rank, "last words: " + why);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      outcome.step = plan.step;
      outcome.summary = plan.summary;
    }
    if (!plan.write) return finish();
    if (store::read_manifest(config.dir, plan.step)) {
      if (speaker) {
        log::info(rank, "last words: step " + std::to_string(plan.step) + " is committed already; nothing to write");
      }
      return finish();
    }
    // 4. Write.
    const auto deadline = t0 + timing.deadline;
    auto mine = plan.writers.find(rank);
    if (mine != plan.writers.end()) {
      Status s = write(plan.step, mine->second);
      if (!s) log::error(rank, "last words: the terminal shard of step " + std::to_string(plan.step) + " failed: " + s.error());
      heartbeat::Frame done;
      done.type = heartbeat::kWrote;
      done.a = plan.step;
      done.flags = s ? 1 : 0;
      {
        std::lock_guard<std::mutex> lock(mu);
        wrote[rank] = static_cast<bool>(s);
        outcome.wrote = static_cast<bool>(s);
      }
      mesh->broadcast(done);
    }
    // 5. Commit: the lowest writer, once every writer's shard is durable.
    if (plan.writers.empty() || plan.writers.begin()->first != rank) return finish();
    bool all = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_until(lock, deadline, [&] {
        if (stopping) return true;
        for (const auto& [w, keys] : plan.writers) {
          if (!wrote.count(w)) return false;
        }
        return true;
      });
      all = true;
      for (const auto& [w, keys] : plan.writers) {
        auto it = wrote.find(w);
        if (it == wrote.end() || !it->second) {
          all = false;
          log::warn(rank, "last words: rank " + std::to_string(w) + (it == wrote.end() ? " did not finish its shard in time" : " failed its shard"));
        }
      }
    }
    if (!all) {
      log::warn(rank, "last words: the terminal checkpoint of step " + std::to_string(plan.step) + " is not committed");
      return finish();
    }
    if (Status s = store::commit(config.dir, last_words_manifest(config, plan.step, store::Kind::Terminal),
                                  nullptr, run_fence(config));
        !s) {
      log::error(rank, "last words: not committed: " + s.error());
      return finish();
    }
    double took = seconds_since(t0);
    char line[200];
    std::snprintf(line, sizeof line,
                  "last words: committed the terminal checkpoint of step %llu, %.3f s after the failure was detected",
                  static_cast<unsigned long long>(plan.step), took);
    log::info(rank, line);
    {
      std::lock_guard<std::mutex> lock(mu);
      outcome.committed = true;
      outcome.commit_s = took;
    }
    finish();
  }

  void finish() {
    std::string lost;
    {
      std::lock_guard<std::mutex> lock(mu);
      outcome.done = true;
      for (std::size_t p = 0; p < dead.size(); ++p) {
        if (dead[p]) lost += (lost.empty() ? "rank " : ", rank ") + std::to_string(p);
      }
    }
    cv.notify_all();
    if (!lost.empty() && timing.exit_grace.count() > 0) end_process_after(timing.exit_grace, rank, lost);
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
    mesh.reset();  // its thread calls on_event: stopped before the state it uses goes
  }
};

LastWords::LastWords(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

LastWords::~LastWords() = default;

Result<std::unique_ptr<LastWords>> LastWords::start(const Config& config, const std::string& rendezvous_dir,
                                                     UpdateTracker& tracker, WriteShard write, Prepare prepare) {
  return start(config, rendezvous_dir, tracker, std::move(write), std::move(prepare), Timing{});
}

Result<std::unique_ptr<LastWords>> LastWords::start(const Config& config, const std::string& rendezvous_dir,
                                                     UpdateTracker& tracker, WriteShard write, Prepare prepare,
                                                     Timing timing) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->timing = timing;
  impl->tracker = &tracker;
  impl->write = std::move(write);
  impl->prepare = std::move(prepare);
  impl->rank = config.rank;
  impl->notices_seen = notice::count();
  impl->dead.assign(static_cast<std::size_t>(config.world_size), false);
  heartbeat::Settings s;
  s.rank = config.rank;
  s.world_size = config.world_size;
  s.rendezvous_dir = rendezvous_dir;
  s.hello = pack_coord(config.coord);
  s.period = timing.period;
  s.dead_after = timing.dead_after;
  s.connect_timeout = timing.connect_timeout;
  Impl* p = impl.get();
  auto mesh = heartbeat::Mesh::start(s, [p](const heartbeat::Event& e) { p->on_event(e); });
  if (!mesh) return Error{mesh.error()};
  impl->mesh = std::move(mesh).value();
  impl->thread = std::thread([p] { p->run(); });
  if (config.rank == 0) {
    log::info(0, "last words armed: heartbeat mesh of " + std::to_string(config.world_size) + " ranks (" +
                     std::to_string(timing.period.count()) + " ms heartbeats, dead after " +
                     std::to_string(timing.dead_after.count()) + " ms, commit within " +
                     std::to_string(timing.deadline.count()) + " ms)");
  }
  return std::unique_ptr<LastWords>(new LastWords(std::move(impl)));
}

void LastWords::trigger(const std::string& why) { impl_->fire(why); }

bool LastWords::triggered() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->triggered;
}

bool LastWords::wait_triggered(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, timeout, [&] { return impl_->triggered; });
}

bool LastWords::wait_done(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, timeout, [&] { return impl_->outcome.done || impl_->stopping; });
}

LastWordsOutcome LastWords::outcome() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->outcome;
}

void LastWords::leave() { impl_->mesh->say_bye(); }

}  // namespace ckpt::hooks
