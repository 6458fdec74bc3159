#include "last_words_runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "ckpt/clock.hpp"
#include "ckpt/format.hpp"
#include "ckpt/recovery.hpp"
#include "ckpt/store.hpp"

#include "coordinator.hpp"
#include "heartbeat.hpp"
#include "last_words_frames.hpp"
#include "log.hpp"
#include "notice.hpp"
#include "rendezvous.hpp"

namespace ckpt::hooks {

namespace {

using Clock = std::chrono::steady_clock;
using heartbeat::HeldFrame;
using heartbeat::ReportFrame;
using heartbeat::StandInFrame;
constexpr std::size_t kMaxEarlyCoordination = 4096;  // frames held until the coordinator attaches

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

// ---- LastWords --------------------------------------------------------------------------------------------------
//
// Threads: the mesh's threads deliver events (on_event): reports and shard outcomes are stored and passed up,
// decisions and outcomes stored and flooded on. The last-words thread (run) walks the phases; its waits are on `cv`.
// Locks: `mu` may be held while calling the mesh (the mesh never calls back holding its own lock).

struct LastWords::Impl {
  Config config;
  Timing timing;
  UpdateTracker* tracker = nullptr;
  WriteShard write;
  Prepare prepare;
  MemoryHooks memory;  // guarded by mu
  std::optional<heartbeat::TierOffFrame> tier_off;  // guarded by mu: why the job's memory tier went off (once)
  std::unique_ptr<heartbeat::Mesh> mesh;
  std::atomic<heartbeat::Mesh*> published{nullptr};  // `mesh`, once start() returned it
  std::uint64_t notices_seen = 0;
  int rank = 0;

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool stopping = false;                      // guarded by mu
  // How the last words started here (guarded by mu).
  struct Trigger {
    bool fired = false;
    bool alarm_sent = false;  // this rank flooded the alarm (once)
    std::string why;
    Clock::time_point at;
  } trigger;
  // What this rank knows of the others (guarded by mu).
  struct Tally {
    std::map<int, ReportFrame> reports;     // rank -> its report (this rank's subtree, all at root)
    std::map<int, std::vector<HeldFrame>> held;  // rank -> what it holds in memory (memory tier), sent before it
    std::map<int, bool> wrote;              // writer rank -> its terminal shard is durable
    std::set<int> accounted;                // ranks that reported or are gone
    std::set<int> gone;
    std::vector<int> died;                  // ranks lost (not left in order)
    std::vector<int> died_before_outcome;   // those lost before the outcome was known here
  } tally;
  // The decision, as the root sent it (or made it, at the root); guarded by mu.
  struct RootDecision {
    bool came = false;     // the header came
    bool write = false;
    bool durable = false;  // at the root: the decided step is committed already (no write needed)
    std::uint64_t step = 0;
    int root = -1;
    std::vector<int> stages;  // per stage, the dp index that writes; -1 unknown
    std::uint32_t stand_ins_expected = 0;
    std::map<int, StandInFrame> stand_ins;  // ward -> who writes its shard from a partner copy
  } decision;
  std::set<int> wards_written;                // guarded by mu: the wards whose shard this rank wrote (or began)
  bool ended = false;                         // guarded by mu: the root's outcome came
  bool ended_committed = false;
  LastWordsOutcome outcome;                   // guarded by mu
  // The frames of the other users of the network (guarded by mu): the coordinator's and the pace tree's.
  struct Handlers {
    std::function<void(const heartbeat::Frame&, int)> coordination;
    std::function<void(const heartbeat::Frame&, int)> pace;
    // Coordination frames that came before the handler was set (a neighbour that got "go" and counted its
    // restore before this rank attached its coordinator): delivered when it is set, never dropped.
    std::vector<std::pair<heartbeat::Frame, int>> early_coordination;
  } handlers;
  std::thread thread;

  std::atomic<bool> abandoned{false};                 // the mesh never started
  heartbeat::Mesh* net() { return published.load(); }
  // An event may arrive between the mesh's barrier and start() handing the mesh over: it waits for that.
  // Bounded: when start fails, the mesh's destructor joins the thread that waits here.
  bool wait_published() {
    for (int i = 0; published.load() == nullptr; ++i) {
      if (abandoned || i > 2000) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  bool decision_complete_locked() const {
    return decision.came && std::none_of(decision.stages.begin(), decision.stages.end(), [](int d) { return d < -1; }) &&
           decision.stand_ins.size() >= decision.stand_ins_expected;  // more: a writer died, a copy stands in
  }

  // Starts the last words here; `alarm`: tell every rank (a signal, a trigger, an alarm passed on).
  void fire(const std::string& why, bool alarm, int from = -1) {
    if (!timing.speak) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!trigger.fired) {
        trigger.fired = true;
        trigger.why = why;
        trigger.at = Clock::now();
        outcome.triggered = true;
        outcome.detect_unix = unix_seconds();
      }
      if (alarm && !trigger.alarm_sent) {
        trigger.alarm_sent = true;
        net()->flood(heartbeat::AlarmFrame{from < 0 ? rank : from}.to_frame(), from);
      }
    }
    cv.notify_all();
  }

  void send_decision_locked(int only) {
    auto out = [&](const heartbeat::Frame& f) { only >= 0 ? (void)net()->send(only, f) : net()->flood(f); };
    out(heartbeat::DecisionFrame{decision.root, decision.step, decision.stages.size(), decision.write,
                                 static_cast<std::uint32_t>(decision.stand_ins.size())}
            .to_frame());
    for (std::size_t p = 0; p < decision.stages.size(); ++p) {
      out(heartbeat::StageFrame{static_cast<int>(p), decision.stages[p], decision.step}.to_frame());
    }
    for (const auto& [ward, stand_in] : decision.stand_ins) out(stand_in.to_frame());
  }

  void send_outcome_locked(int only) {
    const heartbeat::Frame f = heartbeat::OutcomeFrame{decision.step, ended_committed}.to_frame();
    only >= 0 ? (void)net()->send(only, f) : net()->flood(f);
  }

  void account_locked(int r) {
    if (r >= 0 && r < config.world_size) tally.accounted.insert(r);
  }

  // Mesh threads: a frame for the coordinator, held until it attaches.
  void to_coordination(const heartbeat::Frame& f, int from) {
    std::function<void(const heartbeat::Frame&, int)> to;
    {
      std::lock_guard<std::mutex> lock(mu);
      to = handlers.coordination;
      if (!to) {
        auto& early = handlers.early_coordination;
        if (early.size() < kMaxEarlyCoordination) early.emplace_back(f, from);
        return;
      }
    }
    to(f, from);
  }

  // Mesh threads.
  void on_event(const heartbeat::Event& e) {
    using Kind = heartbeat::Event::Kind;
    // Before start() returns the mesh, links come up (nothing to tell them yet) and peers may die (noted without
    // the mesh); frames come only after every rank joined, so waiting for the mesh then is short.
    if (e.kind == Kind::LinkUp && net() == nullptr) return;
    if (e.kind == Kind::Frame && !wait_published()) return;
    switch (e.kind) {
      case Kind::PeerLeft: {
        std::lock_guard<std::mutex> lock(mu);
        tally.gone.insert(e.peer);
        account_locked(e.peer);
        cv.notify_all();
        return;
      }
      case Kind::PeerDead: {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (e.peer != rank) {
            tally.gone.insert(e.peer);
            tally.died.push_back(e.peer);
            // A survivor that leaves once the outcome is out (to form the next group) is not a loss.
            if (!ended) tally.died_before_outcome.push_back(e.peer);
            account_locked(e.peer);
          } else {
            outcome.counted_dead = true;
          }
        }
        char line[200];
        const char* who = timing.speak ? "last words: " : "heartbeat network: ";
        if (e.peer == rank) {
          std::snprintf(line, sizeof line, "%sthe other ranks count this rank as dead (%s)", who, e.why.c_str());
        } else {
          std::snprintf(line, sizeof line, "%srank %d is dead (%s), detected at unix %.3f", who, e.peer,
                        e.why.c_str(), unix_seconds());
        }
        log::warn(rank, line);
        fire(e.peer == rank ? "this rank is counted as dead" : "rank " + std::to_string(e.peer) + " died", false);
        cv.notify_all();
        // The coordinator learns it too (from -1: no link brought it): a checkpoint waiting on that rank's count
        // ends now rather than at its timeout, which matters where nothing else ends it (the last words off).
        to_coordination(heartbeat::GoneFrame{e.peer, true}.to_frame(), -1);
        return;
      }
      case Kind::LinkUp: {
        // A neighbour made by a failure: it learns what this rank knows, and reports go up again.
        std::lock_guard<std::mutex> lock(mu);
        if (!trigger.fired) return;
        net()->send(e.peer, heartbeat::AlarmFrame{rank}.to_frame());
        if (decision.came) send_decision_locked(e.peer);
        if (ended) send_outcome_locked(e.peer);
        if (net()->links().up == e.peer) {
          for (const auto& [r, frames] : tally.held) {
            for (const HeldFrame& h : frames) net()->send(e.peer, h.to_frame());
          }
          for (const auto& [r, sent] : tally.reports) net()->send(e.peer, sent.to_frame());
          for (const auto& [r, ok] : tally.wrote) {
            net()->send(e.peer, heartbeat::WroteFrame{r, decision.step, ok}.to_frame());
          }
        }
        return;
      }
      case Kind::Frame:
        on_frame(e.frame, e.peer);
        return;
    }
  }

  // The job's memory tier goes off, once: the word goes on to every neighbour but `from` (-1: this rank's own
  // finding), then to the checkpointer.
  void turn_tier_off(const heartbeat::TierOffFrame& off, int from) {
    std::function<void(int, std::uint64_t, std::uint64_t)> to;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (tier_off) return;
      tier_off = off;
      to = memory.on_tier_off;  // none yet: set_memory() passes it on
      if (net() != nullptr) net()->flood(off.to_frame(), from);
    }
    if (to) to(off.rank, off.need, off.budget);
  }

  // Mesh threads: a last-words or coordination frame from the link to `from`.
  void on_frame(const heartbeat::Frame& f, int from) {
    switch (f.type) {
      case heartbeat::kAlarm:
        fire("rank " + std::to_string(heartbeat::AlarmFrame::from_frame(f).started_by) + " started its last words",
             true, from);
        return;
      case heartbeat::kReport: {
        const ReportFrame got = ReportFrame::from_frame(f);
        if (got.rank < 0 || got.rank >= config.world_size) return;
        std::lock_guard<std::mutex> lock(mu);
        if (!tally.reports.emplace(got.rank, got).second) return;
        account_locked(got.rank);
        net()->send_up(f);
        cv.notify_all();
        break;
      }
      case heartbeat::kHeld: {
        const HeldFrame got = HeldFrame::from_frame(f);
        if (got.rank < 0 || got.rank >= config.world_size || got.ward >= config.world_size) return;
        std::lock_guard<std::mutex> lock(mu);
        auto& frames = tally.held[got.rank];
        const bool seen = std::any_of(frames.begin(), frames.end(), [&](const HeldFrame& h) {
          return h.ward == got.ward && h.ward_step == got.ward_step && h.own_step == got.own_step;
        });
        if (seen || frames.size() >= 64) return;
        frames.push_back(got);
        net()->send_up(f);
        break;
      }
      case heartbeat::kStandIn: {
        const StandInFrame got = StandInFrame::from_frame(f);
        if (got.ward < 0 || got.ward >= config.world_size || got.holder < 0 || got.holder >= config.world_size) return;
        std::lock_guard<std::mutex> lock(mu);
        if (decision.stand_ins.size() >= static_cast<std::size_t>(config.world_size)) return;
        if (!decision.stand_ins.emplace(got.ward, got).second) return;
        if (decision.came && decision.write) outcome.stand_ins[got.ward] = got.holder;  // a late one: a writer died
        net()->flood(f, from);
        cv.notify_all();
        break;
      }
      case heartbeat::kWrote: {
        const auto got = heartbeat::WroteFrame::from_frame(f);
        if (got.rank < 0 || got.rank >= config.world_size) return;
        std::lock_guard<std::mutex> lock(mu);
        if (!note_written_locked(got.rank, got.durable)) return;
        net()->send_up(f);
        cv.notify_all();
        break;
      }
      case heartbeat::kDecision: {
        const auto got = heartbeat::DecisionFrame::from_frame(f);
        std::lock_guard<std::mutex> lock(mu);
        if (decision.came || got.stages != decision.stages.size()) return;
        decision.came = true;
        decision.write = got.write;
        decision.step = got.step;
        decision.root = got.root;
        decision.stand_ins_expected = got.stand_ins;
        outcome.root = got.root;
        outcome.decided_unix = unix_seconds();
        net()->flood(f, from);
        cv.notify_all();
        break;
      }
      case heartbeat::kStage: {
        const auto got = heartbeat::StageFrame::from_frame(f);
        std::lock_guard<std::mutex> lock(mu);
        if (got.stage < 0 || static_cast<std::size_t>(got.stage) >= decision.stages.size()) return;
        int& d = decision.stages[static_cast<std::size_t>(got.stage)];
        if (d >= -1) return;
        d = got.writer;
        net()->flood(f, from);
        cv.notify_all();
        break;
      }
      case heartbeat::kTierOff: {
        const auto got = heartbeat::TierOffFrame::from_frame(f);
        if (got.rank < 0 || got.rank >= config.world_size) return;
        turn_tier_off(got, from);
        return;
      }
      case heartbeat::kRequest:
      case heartbeat::kShardsDone:
      case heartbeat::kShardFailed:
      case heartbeat::kRetired:
      case heartbeat::kRestoreFile:
      case heartbeat::kRecount:
        to_coordination(f, from);
        return;
      case heartbeat::kPace:
      case heartbeat::kSwap: {
        std::function<void(const heartbeat::Frame&, int)> to;
        {
          std::lock_guard<std::mutex> lock(mu);
          to = handlers.pace;
        }
        if (to) to(f, from);
        return;
      }
      case heartbeat::kOutcome: {
        std::lock_guard<std::mutex> lock(mu);
        if (ended) return;
        ended = true;
        ended_committed = heartbeat::OutcomeFrame::from_frame(f).committed;
        net()->flood(f, from);
        cv.notify_all();
        break;
      }
      default:
        break;
    }
  }

  // Waits for the trigger: a peer's death, an alarm, a notice signal or trigger(). False when stopping first.
  bool wait_for_trigger(Clock::time_point& t0) {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping && !trigger.fired) {
      cv.wait_for(lock, std::chrono::milliseconds(50));
      if (timing.speak && config.signals && notice::count() > notices_seen && !trigger.fired) {
        lock.unlock();
        fire("signal " + std::to_string(notice::last_signal()), true);
        lock.lock();
      }
    }
    if (!trigger.fired) return false;
    t0 = trigger.at;
    log::info(rank, "last words: " + trigger.why);
    return true;
  }

  // No update starts from here on. Under pure data parallelism an update in progress needs no peer, so it is let
  // end (a third of the deadline at most, leaving the device copy and the commit theirs): this rank then reports
  // the step it ended, whole, rather than being disqualified as caught mid-update.
  UpdateTracker::Progress freeze_training(Clock::time_point t0) {
    if (!last_words::update_finishes_alone(config.layout)) return tracker->freeze();
    const UpdateTracker::Progress before = tracker->progress();
    UpdateTracker::Progress me = tracker->freeze(t0 + timing.deadline / 3);
    char line[160];
    if (before.mid_update && !me.mid_update) {
      std::snprintf(line, sizeof line, "last words: let the update of step %llu end before reporting, %.3f s after "
                    "the trigger", static_cast<unsigned long long>(me.step), seconds_since(t0));
      log::info(rank, line);
    } else if (me.mid_update) {
      std::snprintf(line, sizeof line, "last words: the update in progress did not end within %.3f s; reporting it "
                    "caught mid-update", std::chrono::duration<double>(timing.deadline / 3).count());
      log::info(rank, line);
    }
    return me;
  }

  // Phase 1: training frozen, the device state readied, this rank's report sent up.
  void report(Clock::time_point t0) {
    UpdateTracker::Progress me = freeze_training(t0);
    bool ready = true;
    if (prepare && !me.mid_update) {
      // Half the deadline at most: the write and the commit need the rest.
      if (Status s = prepare(t0 + timing.deadline / 2); !s) {
        log::error(rank, "last words: this rank cannot write its state: " + s.error());
        ready = false;
      }
    }
    ReportFrame mine;
    mine.rank = rank;
    mine.step = me.step;
    mine.coord = pack_coord(config.coord);
    mine.mid_update = me.mid_update;
    mine.can_write = ready;
    const std::vector<HeldFrame> held = memory_held();
    std::lock_guard<std::mutex> lock(mu);
    // Before the report: the root plans once it has a rank's report, and must know what that rank holds by then.
    tally.held[rank] = held;
    for (const HeldFrame& h : held) net()->send_up(h.to_frame());
    tally.reports.emplace(rank, mine);
    account_locked(rank);
    net()->send_up(mine.to_frame());
    cv.notify_all();
  }

  // What this rank holds in memory (the memory tier), as the frames that go up before its report; none without it.
  std::vector<HeldFrame> memory_held() {
    MemoryHooks mem;
    {
      std::lock_guard<std::mutex> lock(mu);
      mem = memory;
    }
    if (!mem.own_steps || !mem.held) return {};
    // The newest own step rides with every copy's frame; each older one in a frame of its own.
    const std::vector<std::uint64_t> own = mem.own_steps();
    HeldFrame base;
    base.rank = rank;
    if (!own.empty()) base.own_step = own.front();
    std::vector<HeldFrame> out;
    for (const auto& [ward, step] : mem.held()) {
      HeldFrame h = base;
      h.ward = ward;
      h.ward_step = step;
      out.push_back(h);
    }
    if (out.empty()) out.push_back(base);
    for (std::size_t i = 1; i < own.size(); ++i) {
      HeldFrame h = base;
      h.own_step = own[i];
      out.push_back(h);
    }
    std::string line = "last words: memory: ";
    if (own.empty()) line += "staging holds no whole step";
    for (std::size_t i = 0; i < own.size(); ++i) {
      line += (i == 0 ? "staging holds step " : ", step ") + std::to_string(own[i]);
    }
    for (const HeldFrame& h : out) {
      if (h.ward >= 0) line += ", the copy of rank " + std::to_string(h.ward) + "'s step " + std::to_string(h.ward_step);
    }
    log::info(rank, line);
    return out;
  }

  // The reports as the plan takes them (mu held): every rank's, a missing one dead at its coordinate. `unable`
  // gets a line for each rank that said it cannot write its state.
  std::vector<last_words::RankReport> reports_locked(std::vector<std::string>* unable) const {
    std::vector<last_words::RankReport> out;
    if (unable) unable->clear();
    for (const auto& [p, sent] : tally.reports) {
      last_words::RankReport r;
      r.coord = p == rank ? config.coord : unpack_coord(p, sent.coord);
      r.alive = sent.can_write && tally.gone.count(p) == 0;
      if (!sent.can_write && unable) {
        unable->push_back("rank " + std::to_string(p) + " cannot write its state (counted as lost)");
      }
      r.mid_update = sent.mid_update;
      r.step = sent.step;
      if (auto h = tally.held.find(p); h != tally.held.end()) {
        for (const HeldFrame& f : h->second) {
          if (f.own_step && std::find(r.memory_steps.begin(), r.memory_steps.end(), *f.own_step) == r.memory_steps.end()) {
            r.memory_steps.push_back(*f.own_step);
          }
          if (f.ward >= 0) r.held.emplace_back(f.ward, f.ward_step);
        }
      }
      out.push_back(r);
    }
    return fill_missing(std::move(out));
  }

  // Phase 2 at the root: every rank reported or is gone (or the gather time is up); plans once and floods the
  // decision. Elsewhere: waits for the decision. False when no decision came.
  bool decide(Clock::time_point t0) {
    // A frozen peer is declared dead after dead_after; a live one may take half the deadline to copy its device
    // state before it reports.
    const auto gather_until =
        t0 + std::max<std::chrono::milliseconds>(timing.dead_after + std::chrono::milliseconds(500),
                                                 timing.deadline / 2 + std::chrono::milliseconds(300));
    const auto deadline = t0 + timing.deadline;
    // Ranks that are alive report within milliseconds. Once they have had kSettle, a plan that already writes is
    // taken: waiting longer only serves ranks nobody has heard of (a dead node's, whose deaths take a chain of
    // probes, or frozen ones, whose silence takes dead_after), which at best adds the step one of them is ahead.
    constexpr auto kSettle = std::chrono::milliseconds(500);
    constexpr auto kProbeUnheard = std::chrono::milliseconds(300);  // the least a probe of the unheard waits
    std::vector<std::string> unable;
    auto current_reports = [&] { return reports_locked(&unable); };
    std::optional<last_words::Plan> early;
    auto next_try = t0 + kSettle;
    // The dir's newest committed step: no terminal checkpoint before it. Read by the root alone, once, and never
    // under mu: the mesh thread takes mu to deliver reports, and a slow read there would silence its heartbeats.
    std::optional<std::uint64_t> oldest;
    auto committed = [&] {
      if (!oldest) oldest = store::latest_committed_step(config.dir).value_or(0);
      return *oldest;
    };
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (stopping) return false;
      if (decision_complete_locked()) return true;
      const bool root = net()->links().is_root;
      const auto now = Clock::now();
      if (root && (tally.accounted.size() >= static_cast<std::size_t>(config.world_size) || now >= gather_until)) break;
      if (root && now >= next_try) {
        next_try = now + std::chrono::milliseconds(100);
        if (!oldest) {
          lock.unlock();
          (void)committed();
          lock.lock();
        }
        last_words::Plan trial = last_words::plan(config.layout, current_reports(), *oldest);
        if (trial.write) {
          early = std::move(trial);
          break;
        }
      }
      if (now >= deadline) {
        log::warn(rank, "last words: no decision reached this rank in time; not writing");
        return false;
      }
      cv.wait_until(lock, std::min({root ? gather_until : deadline, root ? next_try : deadline,
                                    now + std::chrono::milliseconds(50)}));
    }
    // Ranks the decision goes without and that no link reported dead: a dead node's members were linked to their
    // dead leader alone, and the mesh finds them one probe at a time, or never when the node froze (its kernel
    // accepts a dial, and nobody times their silence). Those whose process is gone or that do not answer a probe
    // within dead_after (less when the deadline is near) count as lost now, before the decision floods, so that
    // every survivor counts them: restart in place plans its spares from that, and the decision already goes
    // without them. A rank that is alive answers at once.
    std::vector<int> unheard;
    for (int p = 0; p < config.world_size; ++p) {
      if (p != rank && tally.accounted.count(p) == 0) unheard.push_back(p);
    }
    if (!unheard.empty()) {
      const auto to_deadline = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      const auto limit = std::clamp<std::chrono::milliseconds>(to_deadline / 2, kProbeUnheard,
                                                               std::max(kProbeUnheard, timing.dead_after));
      lock.unlock();
      (void)net()->probe(unheard, limit);
      lock.lock();
    }
    // This rank is the root: it decides, once.
    std::vector<last_words::RankReport> rankreports = early ? std::vector<last_words::RankReport>{} : current_reports();
    const int alive = config.world_size - static_cast<int>(tally.gone.size());
    lock.unlock();
    last_words::Plan plan = early ? std::move(*early) : last_words::plan(config.layout, rankreports, committed());
    log::info(rank, plan.summary);  // "last words: writing ..." or "last words: not writing ..."
    for (const std::string& why : unable) log::info(rank, "last words: " + why);
    for (const std::string& why : plan.reasons) log::info(rank, "last words: " + why);
    bool write_it = plan.write;
    bool already_durable = false;  // the survivors hold the decided step and it is in the dir: as good as written
    if (write_it && !claim_terminal(plan, alive)) write_it = false;
    // The dir's newest committed step was read above, its manifest with it; an older step's manifest is read here.
    if (write_it && ((plan.step > 0 && plan.step == committed()) || store::read_manifest(config.dir, plan.step))) {
      log::info(rank, "last words: step " + std::to_string(plan.step) + " is committed already; nothing to write");
      write_it = false;
      already_durable = true;
    }
    lock.lock();
    decision.durable = already_durable;
    decision.came = true;
    decision.write = write_it;
    decision.step = plan.step;
    decision.root = rank;
    outcome.root = rank;
    outcome.decided_unix = unix_seconds();
    decision.stages = plan.replica_of_stage;
    decision.stages.resize(static_cast<std::size_t>(std::max(config.layout.pp, 1)), -1);
    decision.stand_ins.clear();
    if (write_it) {
      for (const auto& [ward, holder] : plan.stand_ins) {
        auto it = tally.reports.find(ward);
        const store::RankCoord c = it != tally.reports.end() ? unpack_coord(ward, it->second.coord)
                                                             : config.layout.coord_of(ward);
        decision.stand_ins[ward] = StandInFrame{ward, holder, plan.step, pack_coord(c)};
      }
    }
    decision.stand_ins_expected = static_cast<std::uint32_t>(decision.stand_ins.size());
    if (write_it || already_durable) outcome.behind = last_words::behind(plan, rankreports);
    send_decision_locked(-1);
    cv.notify_all();
    return true;
  }

  // At most one side of a partition writes: each side sees the other die, and in pure data parallelism both may
  // hold a whole replica. The decider of each side claims the run's terminal checkpoint in the shared checkpoint
  // dir (store::claim_control_file: the first creator wins on every host); a side that finds the claim taken
  // writes nothing and its ranks leave as for any decision not to write. No checkpoint can mix both sides' shards.
  // A side without a strict majority of the ranks claims dead_after later, so that the majority side, which goes on
  // (restart in place) or holds the job's batch step, wins the race; a lone survivor of a real death still writes.
  bool claim_terminal(const last_words::Plan& plan, int alive) {
    const store::Fence run{config.job_id, config.restart_count, config.generation};
    if (2 * alive <= config.world_size) {
      log::info(rank, "last words: " + std::to_string(alive) + " of " + std::to_string(config.world_size) +
                          " ranks on this side, no majority: claiming the terminal checkpoint after " +
                          std::to_string(timing.dead_after.count()) + " ms");
      std::this_thread::sleep_for(timing.dead_after);
    }
    const std::string content = "{\"rank\":" + std::to_string(rank) + ",\"step\":" + std::to_string(plan.step) +
                                ",\"time\":" + std::to_string(unix_seconds()) + "}";
    auto won = store::claim_control_file(config.dir, store::last_words_claim_name(run), content, run);
    if (!won) {
      log::warn(rank, "last words: cannot claim the terminal checkpoint (" + won.error() + "); not writing");
      return false;
    }
    if (!*won) {
      auto other = store::read_control_file(config.dir, store::last_words_claim_name(run));
      log::warn(rank, "last words: the terminal checkpoint of this run is claimed already (by the other side of a "
                      "partition: " + (other && *other ? ckpt::printable(other->value().substr(0, 200)) : std::string("?")) +
                      "); not writing");
      return false;
    }
    return true;
  }

  // The plan needs a report per rank: the missing ones are dead, at their coordinate in the layout.
  std::vector<last_words::RankReport> fill_missing(std::vector<last_words::RankReport> got) const {
    std::vector<char> have(static_cast<std::size_t>(config.world_size), 0);
    for (const auto& r : got) {
      if (r.coord.rank >= 0 && r.coord.rank < config.world_size) have[static_cast<std::size_t>(r.coord.rank)] = 1;
    }
    for (int p = 0; p < config.world_size; ++p) {
      if (have[static_cast<std::size_t>(p)]) continue;
      last_words::RankReport r;
      r.coord = config.layout.coord_of(p);
      got.push_back(r);
    }
    return got;
  }

  // Phase 3: this rank's part of the decision, written and announced up: its own keys (from its live state, or
  // from staging where the decision took the step staging holds), unless a partner copy stands in for it, and the
  // shard of every ward it stands in for.
  void write_part() {
    std::vector<int> replica;
    std::uint64_t step = 0;
    std::map<int, StandInFrame> stand_ins;
    last_words::RankReport mine;
    MemoryHooks mem;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!decision.write) return;
      replica = decision.stages;
      step = decision.step;
      stand_ins = decision.stand_ins;
      outcome.step = step;
      mem = memory;
      if (auto it = tally.reports.find(rank); it != tally.reports.end()) {
        mine.alive = true;
        mine.mid_update = it->second.mid_update;
        mine.step = it->second.step;
      }
      if (auto h = tally.held.find(rank); h != tally.held.end()) {
        for (const HeldFrame& f : h->second) {
          if (f.own_step) mine.memory_steps.push_back(*f.own_step);
        }
      }
    }
    if (stand_ins.count(rank) == 0) {
      const std::vector<std::string> keys = last_words::writer_keys(config.layout, replica, config.coord);
      if (!keys.empty()) {
        Status s = Status::failure("neither its live state nor its staging holds step " + std::to_string(step));
        switch (last_words::source_for(mine, step)) {
          case last_words::WriteSource::Live:
            s = write(step, keys);
            break;
          case last_words::WriteSource::Staging:
            s = mem.write_staging ? mem.write_staging(step, keys) : Status::failure("no memory tier");
            break;
          case last_words::WriteSource::None:
            break;
        }
        announce_written(rank, step, s);
      }
    }
    for (const auto& [ward, stand_in] : stand_ins) write_ward(stand_in, replica, mem);
  }

  // The shard of a ward this rank stands in for, from its partner copy, once.
  void write_ward(const StandInFrame& stand_in, const std::vector<int>& replica, const MemoryHooks& mem) {
    if (stand_in.holder != rank) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!wards_written.insert(stand_in.ward).second) return;
    }
    const std::vector<std::string> keys =
        last_words::writer_keys(config.layout, replica, unpack_coord(stand_in.ward, stand_in.ward_coord));
    Status s = mem.write_ward ? mem.write_ward(stand_in.ward, stand_in.step, keys) : Status::failure("no memory tier");
    announce_written(stand_in.ward, stand_in.step, s);
  }

  // A stand-in the root named after the decision (a writer died since) that this rank has still to write; mu held.
  std::optional<StandInFrame> late_ward_locked() const {
    for (const auto& [ward, stand_in] : decision.stand_ins) {
      if (stand_in.holder == rank && wards_written.count(ward) == 0) return stand_in;
    }
    return std::nullopt;
  }

  // Writes each late stand-in of this rank's (lock held on entry and on return).
  void write_late_wards(std::unique_lock<std::mutex>& lock) {
    while (std::optional<StandInFrame> late = late_ward_locked()) {
      const std::vector<int> replica = decision.stages;
      const MemoryHooks mem = memory;
      lock.unlock();
      write_ward(*late, replica, mem);
      lock.lock();
    }
  }

  // At the root, mu held: writer `ward` died before its shard was durable, or failed it. A live rank holding its
  // partner copy of the step writes the shard in its place (flooded as a stand-in, as the decision's are); false
  // when none can.
  bool stand_in_late_locked(int ward, std::uint64_t step) {
    if (decision.stand_ins.count(ward) != 0) return false;  // its stand-in died or failed too
    const std::optional<int> holder = last_words::late_stand_in(reports_locked(nullptr), tally.gone, ward, step);
    if (!holder) return false;
    const bool failed = tally.wrote.erase(ward) != 0;  // the stand-in's outcome is the one that counts
    auto it = tally.reports.find(ward);
    const store::RankCoord c = it != tally.reports.end() ? unpack_coord(ward, it->second.coord)
                                                         : config.layout.coord_of(ward);
    const StandInFrame stand_in{ward, *holder, step, pack_coord(c)};
    decision.stand_ins[ward] = stand_in;
    outcome.stand_ins[ward] = *holder;
    log::info(rank, "last words: rank " + std::to_string(ward) +
                        (failed ? " failed its shard of step " + std::to_string(step)
                                : " died before its shard of step " + std::to_string(step) + " was durable") +
                        ": its partner copy on rank " + std::to_string(*holder) + " stands in");
    net()->flood(stand_in.to_frame(), -1);
    cv.notify_all();
    return true;
  }

  // A shard's outcome, once; a failed one may be followed by its stand-in's success (mu held). True when news.
  bool note_written_locked(int shard, bool durable) {
    auto [it, fresh] = tally.wrote.emplace(shard, durable);
    if (fresh) return true;
    if (it->second || !durable) return false;
    it->second = true;
    return true;
  }

  // `shard`'s terminal shard of `step` was written here (or failed): up to the root.
  void announce_written(int shard, std::uint64_t step, const Status& s) {
    if (!s) {
      log::error(rank, "last words: the terminal shard of step " + std::to_string(step) +
                           (shard == rank ? "" : " for rank " + std::to_string(shard)) + " failed: " + s.error());
    }
    const heartbeat::Frame done = heartbeat::WroteFrame{shard, step, static_cast<bool>(s)}.to_frame();
    std::lock_guard<std::mutex> lock(mu);
    (void)note_written_locked(shard, static_cast<bool>(s));
    if (shard == rank) outcome.wrote = static_cast<bool>(s);
    net()->send_up(done);
    cv.notify_all();
  }

  // Phase 4 at the root: once every writer's shard is durable, commits; then floods the outcome. Elsewhere: waits
  // for the outcome, passing shard outcomes up meanwhile.
  void commit_or_wait(Clock::time_point t0) {
    const auto deadline = t0 + timing.deadline;
    std::unique_lock<std::mutex> lock(mu);
    if (!net()->links().is_root) {
      // Until the outcome; a stand-in the root names meanwhile (a writer died) is written on the way.
      while (cv.wait_until(lock, deadline + std::chrono::milliseconds(500),
                           [&] { return stopping || ended || late_ward_locked(); }) &&
             !stopping && !ended) {
        write_late_wards(lock);
      }
      return;
    }
    const std::uint64_t step = decision.step;
    // A step committed already counts as the outcome: the survivors resume from it holding its state (what lets
    // a replacement take that state from a survivor rather than from the dir).
    bool committed = decision.durable;
    if (decision.write) {
      // The writers, from the decision: every rank whose part is not empty.
      std::vector<int> writers;
      for (int p = 0; p < config.world_size; ++p) {
        auto it = tally.reports.find(p);
        store::RankCoord c = it == tally.reports.end() ? config.layout.coord_of(p)
                                                 : (p == rank ? config.coord : unpack_coord(p, it->second.coord));
        bool elected = c.pp >= 0 && static_cast<std::size_t>(c.pp) < decision.stages.size() &&
                       decision.stages[static_cast<std::size_t>(c.pp)] == c.dp;
        if (elected || (config.layout.zero1 && it != tally.reports.end()) || decision.stand_ins.count(p) != 0) {
          writers.push_back(p);
        }
      }
      // Who writes each writer's shard: the rank itself, or the holder that stands in for it.
      auto author = [&](int w) {
        auto it = decision.stand_ins.find(w);
        return it == decision.stand_ins.end() ? w : it->second.holder;
      };
      auto missing = [&]() -> std::optional<int> {
        for (int w : writers) {
          if (!tally.wrote.count(w)) return w;
        }
        return std::nullopt;
      };
      // The first writer whose author died before its shard was durable, or that failed it with no stand-in yet.
      auto unwritten = [&]() -> std::optional<int> {
        for (int w : writers) {
          auto it = tally.wrote.find(w);
          if (it == tally.wrote.end() ? tally.gone.count(author(w)) != 0
                                      : !it->second && decision.stand_ins.count(w) == 0) {
            return w;
          }
        }
        return std::nullopt;
      };
      for (;;) {
        const bool woke = cv.wait_until(lock, deadline, [&] {
          return stopping || !missing() || unwritten() || late_ward_locked();
        });
        if (!woke || stopping) break;
        if (late_ward_locked()) {
          write_late_wards(lock);
          continue;
        }
        if (std::optional<int> w = unwritten()) {
          if (stand_in_late_locked(*w, step)) continue;
        }
        break;  // every writer answered, or one cannot be stood in for: no use waiting
      }
      bool all = true;
      for (int w : writers) {
        auto it = tally.wrote.find(w);
        if (it == tally.wrote.end() || !it->second) {
          all = false;
          log::warn(rank, "last words: rank " + std::to_string(w) +
                              (author(w) != w ? " (by its partner copy on rank " + std::to_string(author(w)) + ")"
                                              : std::string()) +
                              (it != tally.wrote.end() ? " failed its shard"
                                                 : tally.gone.count(author(w)) ? " died before its shard was durable"
                                                                 : " did not finish its shard in time"));
        }
      }
      lock.unlock();
      if (!all) {
        log::warn(rank, "last words: the terminal checkpoint of step " + std::to_string(step) + " is not committed");
      } else if (Status s = store::commit(config.dir, last_words_manifest(config, step, store::Kind::Terminal),
                                          nullptr, run_fence(config), writers);
                 !s) {
        log::error(rank, "last words: not committed: " + s.error());
      } else {
        committed = true;
        double took = seconds_since(t0);
        char line[200];
        std::snprintf(line, sizeof line,
                      "last words: committed the terminal checkpoint of step %llu, %.3f s after the failure was "
                      "detected",
                      static_cast<unsigned long long>(step), took);
        log::info(rank, line);
        lock.lock();
        outcome.committed = true;
        outcome.commit_s = took;
        lock.unlock();
      }
      lock.lock();
    }
    ended = true;
    ended_committed = committed;
    send_outcome_locked(-1);
  }

  void run() {
    Clock::time_point t0;
    if (!wait_for_trigger(t0)) return;
    report(t0);
    if (!decide(t0)) return finish();
    {
      std::lock_guard<std::mutex> lock(mu);
      outcome.step = decision.step;
      for (const auto& [ward, stand_in] : decision.stand_ins) outcome.stand_ins[ward] = stand_in.holder;
      if (decision.root != rank) {
        outcome.summary = std::string("last words: ") + (decision.write ? "writing" : "not writing") +
                          " a terminal checkpoint at step " + std::to_string(decision.step) + " (rank " +
                          std::to_string(decision.root) + " decided)";
        log::debug(rank, outcome.summary);
      }
    }
    write_part();
    commit_or_wait(t0);
    finish();
  }

  void finish() {
    std::string lost;
    std::vector<int> lost_ranks;
    bool decider = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      outcome.done = true;
      outcome.done_unix = unix_seconds();
      outcome.ended_committed = ended_committed;
      outcome.lost = tally.died_before_outcome;
      std::sort(outcome.lost.begin(), outcome.lost.end());
      for (int p : tally.died) lost += (lost.empty() ? "rank " : ", rank ") + std::to_string(p);
      lost_ranks = tally.died;
      decider = decision.root == rank;
    }
    if (decider && !lost_ranks.empty()) record_lost_peers(lost_ranks);
    cv.notify_all();
    if (!lost.empty() && timing.exit_grace.count() > 0) end_process_after(timing.exit_grace, rank, lost);
  }

  // The decider tells the recovery controller where the lost ranks ran (.control/peer-lost.json, kPeerLostFile):
  // a rank that hangs on a live host never reports, and its step never ends by itself (recovery::hung_nodes).
  // Before the survivors exit, so the record is there when their exits are reported.
  void record_lost_peers(const std::vector<int>& ranks) {
    auto* m = published.load();
    if (config.dir.empty() || m == nullptr) return;
    ckpt::recovery::PeerLost record;
    record.job_id = config.job_id;
    record.restart_count = static_cast<std::uint32_t>(config.restart_count);
    record.time = unix_seconds();
    for (int p : ranks) {
      std::string node = m->node_of(p);
      if (!node.empty() && std::find(record.nodes.begin(), record.nodes.end(), node) == record.nodes.end()) {
        record.nodes.push_back(std::move(node));
      }
    }
    if (record.nodes.empty()) return;
    const store::Fence fence{config.job_id, config.restart_count, config.generation};
    if (Status st = store::write_control_file(config.dir, ckpt::recovery::kPeerLostFile,
                                              ckpt::recovery::to_json(record) + "\n", fence);
        !st) {
      log::warn(rank, "last words: cannot record the lost peers' nodes: " + st.error());
    }
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
    mesh.reset();  // its threads call on_event: stopped before the state it uses goes
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
  impl->decision.stages.assign(static_cast<std::size_t>(std::max(config.layout.pp, 1)), -2);
  heartbeat::Settings s;
  s.rank = config.rank;
  s.world_size = config.world_size;
  s.rendezvous_dir = rendezvous_dir;
  s.rendezvous = rendezvous_for(config);
  s.hello = pack_coord(config.coord);
  s.period = timing.period;
  s.dead_after = timing.dead_after;
  s.connect_timeout = timing.connect_timeout;
  s.hold_partner_links = config.memory_bytes > 0;  // the memory tier starts just after the join (or says it is off)
  s.watched = config.inplace_watch;
  Impl* p = impl.get();
  auto mesh = heartbeat::Mesh::start(s, [p](const heartbeat::Event& e) { p->on_event(e); });
  if (!mesh) {
    impl->abandoned = true;
    return Error{mesh.error()};
  }
  impl->mesh = std::move(mesh).value();
  impl->published = impl->mesh.get();
  impl->thread = std::thread([p] { p->run(); });
  if (config.rank == 0 && timing.speak) {
    log::info(0, "last words armed: heartbeat network of " + std::to_string(config.world_size) + " ranks (" +
                     std::to_string(timing.period.count()) + " ms heartbeats, dead after " +
                     std::to_string(timing.dead_after.count()) + " ms, commit within " +
                     std::to_string(timing.deadline.count()) + " ms)");
  } else if (config.rank == 0) {
    log::debug(0, "heartbeat network of " + std::to_string(config.world_size) + " ranks for the coordination (" +
                      std::to_string(timing.period.count()) + " ms heartbeats; last words off)");
  }
  return std::unique_ptr<LastWords>(new LastWords(std::move(impl)));
}

void LastWords::trigger(const std::string& why) { impl_->fire(why, true); }

bool LastWords::speaks() const { return impl_->timing.speak; }

bool LastWords::triggered() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->trigger.fired;
}

bool LastWords::wait_triggered(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, timeout, [&] { return impl_->trigger.fired; });
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

heartbeat::Mesh& LastWords::network() { return *impl_->mesh; }

void LastWords::set_pace(std::function<void(const heartbeat::Frame&, int from)> handler) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->handlers.pace = std::move(handler);
}

void LastWords::set_memory(MemoryHooks hooks) {
  std::optional<heartbeat::TierOffFrame> early;
  std::function<void(int, std::uint64_t, std::uint64_t)> to;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->memory = std::move(hooks);
    early = impl_->tier_off;
    to = impl_->memory.on_tier_off;
  }
  if (early && to) to(early->rank, early->need, early->budget);
}

void LastWords::tier_off(int rank, std::uint64_t need, std::uint64_t budget) {
  impl_->turn_tier_off(heartbeat::TierOffFrame{rank, need, budget}, -1);
}

void LastWords::set_coordination(std::function<void(const heartbeat::Frame&, int from)> handler) {
  std::vector<std::pair<heartbeat::Frame, int>> early;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->handlers.coordination = handler;
    early.swap(impl_->handlers.early_coordination);
  }
  if (!handler) return;
  for (const auto& [frame, from] : early) handler(frame, from);
}

}  // namespace ckpt::hooks
