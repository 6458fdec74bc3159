#pragma once
// Stragglers: ranks that run slower than the job's best (a throttled GPU, a bad link, a noisy neighbour) and so
// hold back every synchronous step. Measured, summed up a tree and judged here; the hooks carry it out.
//
// Who does what, in this order, once per window of `window_steps` steps:
//   (every rank)  PaceMeter::on_work() for each timed section of a step (the update between before_update and
//                 after_step; the forward pass and the program's own sections where it marks them), then
//                 PaceMeter::on_step(); every `window_steps` steps it returns the rank's Pace: the median of its
//                 steps' work times. Only local work is timed: a collective waits for the slowest rank, so a
//                 step's wall time is the same everywhere and names nobody.
//   (every rank)  sends its Pace up the heartbeat tree (overlay.hpp); a leader merges what its down links sent
//                 with its own (merge()): the fastest and the slowest rank of its subtree, one 40-byte frame
//                 whatever the world size.
//   (the root)    Detector::on_window() scores the slowest rank against the job's fastest (best / own: 1 is as
//                 fast as the best, 0.5 half its speed) and flags its node once it stayed below the threshold for
//                 `windows` windows in a row, the same rank each time. One flag per slow spell: a rank is flagged
//                 again only after a window at or above the threshold.
// A window's figures are medians, so one slow step (a checkpoint's copy, a page fault, a collective hiccup) moves
// nothing; a loaded host whose ranks are all slower moves the best too, so only a rank slower than its peers counts.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt::straggler {

// What the job does about a flagged node.
enum class Action {
  Report,   // a `ckpt:` line, the controller's history, /metrics and status page
  Exclude,  // Report, and the controller leaves the node out of the job's next runs
  Swap,     // Exclude; and under ckpt-run with a free warm spare, the node's ranks end at a step boundary so that
            // the spare takes them over in place (kExitSwappedOut)
};
const char* to_string(Action action);

struct Policy {
  bool enabled = true;
  double threshold = 0.7;  // a score below this is slow; in (0, 1)
  int windows = 3;         // consecutive slow windows before a node is flagged
  int window_steps = 4;    // steps per window: 3 windows fit in the 20 steps a slow node may cost
  Action action = Action::Report;
};

// What --ckpt-straggler and CKPT_STRAGGLER take: "off", or a threshold with an optional action: "0.7",
// "0.6,exclude", "0.6,swap". The error names the value and what is accepted; windows and window_steps come from `base`.
Result<Policy> parse_policy(std::string_view text, Policy base = {});
// The spelling parse_policy reads back: "off", "0.7,report".
std::string format_policy(const Policy& policy);

// The pace of a subtree in one window: its fastest and its slowest rank's median work time per step.
struct Pace {
  std::uint64_t window = 0;  // step / window_steps of the window's last step
  double best_s = 0;
  int best_rank = -1;
  double worst_s = 0;
  int worst_rank = -1;
  int ranks = 0;             // how many ranks it sums up
};

// The pace of two disjoint subtrees of the same window together.
Pace merge(const Pace& a, const Pace& b);

// best / worst, in (0, 1]; 1 when there is nothing to compare.
double score(const Pace& pace);

// One rank's timing of its own work, step by step.
class PaceMeter {
 public:
  explicit PaceMeter(int window_steps) : window_steps_(window_steps < 1 ? 1 : window_steps) {}
  // A timed section of the current step took `seconds`.
  void on_work(double seconds);
  // The step `step` ended. At the window's last step (step % window_steps == window_steps - 1), the rank's Pace
  // for it, when at least half the window's steps had timed work; nullopt otherwise.
  std::optional<Pace> on_step(std::uint64_t step, int rank);

 private:
  int window_steps_;
  double current_s_ = 0;
  bool current_timed_ = false;
  std::vector<double> steps_s_;  // the window's steps so far
};

// A flagged node's evidence.
struct Flag {
  int rank = -1;            // the slowest rank (its node is the one to act on)
  double score = 0;         // the last window's
  double worst_score = 1;   // the lowest of the spell's windows
  int windows = 0;          // in a row below the threshold
  std::uint64_t first_window = 0, last_window = 0;
  std::string describe(int window_steps) const;  // "0.48 of the job's best for 3 windows, steps 10-24 (rank 4)"
};

// The root's judgement, window by window.
class Detector {
 public:
  explicit Detector(Policy policy) : policy_(policy) {}
  // The whole job's pace of a window; a Flag the first time a rank stays slow for policy.windows windows.
  // Windows must come in increasing order; an older or repeated one is ignored.
  std::optional<Flag> on_window(const Pace& job);

 private:
  Policy policy_;
  std::optional<std::uint64_t> last_window_;
  Flag spell_;            // the current run of slow windows (rank -1: none)
  bool flagged_ = false;  // spell_ was flagged already
};

// The rule nvidia-resiliency-ext's straggler detector applies, for comparison in bench/straggler: a rank whose
// relative score (the best median over its own) falls below `threshold` in a single report is a straggler.
bool single_window_rule(const Pace& job, double threshold);

}  // namespace ckpt::straggler
