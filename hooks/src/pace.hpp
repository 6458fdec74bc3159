#pragma once
// Straggler detection at run time, over the heartbeat network (ckpt/straggler.hpp decides; this carries it out).
//
// Who calls what:
//   (training thread, every rank)  on_work() for each timed section, on_step() after each step. At a window's end
//                                  the rank's pace goes into its own window's tally.
//   (mesh threads, leaders)        on_frame() with a PaceFrame from a down link, into the same tally.
//   A tally is complete when this rank's own pace and one from each of its down links (as the network's view has
//   them then) are in; it goes up as one PaceFrame, so every rank sends one frame per window, whatever the world
//   size. A window still open when this rank's next-but-one closes goes up with what it has (a late or gone link).
//   (the root)                     judges each complete window (straggler::Detector); a flag becomes one `ckpt:`
//                                  line and, with a controller, a slow_node event (reporter thread: a slow or
//                                  absent controller never holds training or the mesh up).
//   With the swap action, in an in-place run with a free warm spare, the root also floods a SwapFrame naming the
//   node; each rank on that node is then `leaving()`, and the training thread ends it at its next step boundary
//   (after_step, kExitSwappedOut), where the survivors' state is a whole step: they recover in place from it as
//   from a crash, and the spare takes the ranks over.
// Runs only where the heartbeat network does: a job with last words armed.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ckpt/hooks.hpp"
#include "ckpt/recovery.hpp"
#include "ckpt/straggler.hpp"
#include "heartbeat.hpp"

namespace ckpt::hooks {

namespace heartbeat {

// A subtree's pace of one window, sent up: a = window, b = best (low 32 bits) and worst (high 32 bits) median work
// per step in microseconds, flags = the best rank, subject = the worst rank, spare = ranks summed up.
struct PaceFrame {
  straggler::Pace pace;

  Frame to_frame() const;
  static PaceFrame from_frame(const Frame& f);
};

// A node's ranks are to hand over to a spare: a = XXH64 of the node's name (as the mesh publishes it), subject =
// the slow rank that named it.
struct SwapFrame {
  std::uint64_t node_hash = 0;
  int rank = -1;

  Frame to_frame() const;
  static SwapFrame from_frame(const Frame& f);
};
std::uint64_t node_hash(const std::string& node);

}  // namespace heartbeat

class PaceTree {
 public:
  // What the root does with a flag: by default a log line and a report to config.controller_url.
  using OnFlag = std::function<void(const straggler::Flag& flag, const std::string& node)>;

  PaceTree(const Config& config, heartbeat::Mesh& mesh, OnFlag on_flag = nullptr);
  ~PaceTree();
  PaceTree(const PaceTree&) = delete;
  PaceTree& operator=(const PaceTree&) = delete;

  // Training thread.
  void on_work(double seconds);
  void on_step(std::uint64_t step);
  // Mesh threads: a kPace or kSwap frame from the link to `from`.
  void on_frame(const heartbeat::Frame& frame, int from);
  // How many nodes the root flagged so far (0 elsewhere).
  int flags() const;
  // Any thread: this rank's node was named for a swap; the training thread ends the process at a step boundary.
  bool leaving() const { return leaving_.load(); }
  // Why, for the line the process ends with.
  std::string leaving_why() const;

 private:
  struct Tally {
    straggler::Pace pace;
    bool own = false;
    std::vector<int> from;  // down links heard from
  };
  void add_locked(const straggler::Pace& pace, int from);
  // Sends up (or judges, at the root) every complete tally and those older than `stale_before`.
  void settle_locked(std::optional<std::uint64_t> stale_before);
  void judge(const straggler::Pace& job);
  void report(const straggler::Flag& flag, const std::string& node);
  // The root, for the swap action: whether a spare of this in-place run is free now (one read of its records).
  bool spare_free() const;
  void on_swap(const heartbeat::SwapFrame& swap, int from);
  void leave_if_named_locked(const heartbeat::SwapFrame& swap);
  void reporter_loop();

  Config config_;
  heartbeat::Mesh& mesh_;
  OnFlag on_flag_;
  straggler::PaceMeter meter_;  // training thread only
  std::string own_node_;        // as the mesh published it
  std::atomic<bool> leaving_{false};
  std::string leaving_why_;     // guarded by mu_
  bool swap_seen_ = false;      // guarded by mu_: a SwapFrame was flooded on once

  mutable std::mutex mu_;
  std::map<std::uint64_t, Tally> tallies_;       // guarded by mu_
  std::optional<std::uint64_t> settled_;         // guarded by mu_: the newest window sent up or judged
  straggler::Detector detector_;                 // guarded by mu_
  int flags_ = 0;                                // guarded by mu_

  std::condition_variable reports_cv_;
  std::deque<ckpt::recovery::Event> reports_;    // guarded by mu_: slow-node events, for the reporter thread
  bool stopping_ = false;                        // guarded by mu_
  std::thread reporter_;
};

}  // namespace ckpt::hooks
