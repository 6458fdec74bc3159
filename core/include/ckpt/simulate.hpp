#pragma once
// A Monte-Carlo simulation of a job under exponential failures, to check the interval model and to show what
// "last words" (a terminal checkpoint written by the survivors) buys. Deterministic for a given seed.
//
// The simulated job needs `work_s` seconds of compute. It runs segments of τ seconds of compute, each followed
// by a checkpoint costing δ. Failures arrive as a Poisson process with mean gap M, during compute, checkpoints
// and restarts alike. A failure loses everything since the last checkpoint, then the job restarts, which takes R
// (a failure during a restart starts it over). A fraction p of failures is catchable: under the last-words
// policy the survivors then write a terminal checkpoint (cost δ, inside the grace window, not interrupted)
// that keeps the work since the last checkpoint, but only when that work is worth more than δ.
// Under the memory-tier policy a checkpoint also lives in peers' memory every τ_m of compute (each stalling training
// δ_m): a further fraction of failures (a survivor torn mid-update, a shard no live rank holds) is caught from it,
// keeping the work up to the last memory checkpoint.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt::simulate {

enum class Policy {
  Fixed,      // a given interval
  Young,      // √(2δM)
  Daly,       // Daly's higher-order optimum
  LastWords,  // Daly's interval plus a terminal checkpoint on catchable failures
  InPlace,    // last words, and restart in place (cost inplace_restart_s) while the allocation holds a spare
  MemoryTier, // in place, and memory checkpoints (memory_interval_s) that the last words fall back on
};

// "fixed", "young", "daly", "last-words", "in-place", "memory-tier".
const char* to_string(Policy policy);

struct Config {
  double cost_s = 0;     // δ
  double restart_s = 0;  // R
  double mtbf_s = 0;     // M
  double work_s = 0;     // compute the job needs
  double catchable = 0;  // p: fraction of failures that leave time for last words
  std::uint64_t seed = 1;
  // Set: replay instead of drawing, failures at these wall times (seconds from the start, ascending; empty: none).
  // A failure that falls inside a restart strikes as soon as the restart ends, as an injector that kills a running
  // job would have it; after the last one the job runs without failures. Catchability is still drawn with p.
  std::optional<std::vector<double>> failure_times;
  std::uint64_t max_events = 100'000'000;  // segments plus failures; guards against jobs that never finish
  // Restart in place: the first `spares` failures of an allocation restart in inplace_restart_s; the next one
  // takes the requeue (restart_s), which brings a new allocation with `spares` spares again.
  double inplace_restart_s = 0;
  std::uint64_t spares = 1;
  // The memory tier (Policy::MemoryTier): a memory checkpoint every memory_interval_s of compute, each stalling
  // training for memory_cost_s. Of the failures, `catchable` are caught from live state (nothing lost), up to
  // `memory_catchable` (>= catchable) more from the memory tier (losing the compute since the last memory
  // checkpoint); the rest lose the work since the last periodic checkpoint. 0: no memory tier.
  double memory_interval_s = 0;
  double memory_cost_s = 0;
  double memory_catchable = 0;
};

// Whether a policy writes last words (LastWords, InPlace, MemoryTier) and restarts in place (InPlace, MemoryTier).
bool writes_last_words(Policy policy);
bool restarts_in_place(Policy policy);

// Accepts δ >= 0, R >= 0, M > 0 (all finite), work > 0, 0 <= p <= 1, failure times finite, >= 0 and ascending,
// τ_m >= 0 and δ_m >= 0 finite, p <= p_m <= 1 where τ_m > 0; the error names the bad input. run() with
// Policy::MemoryTier also needs τ_m > 0.
Status check(const Config& config);

// The interval a policy uses; `fixed_s` is used only by Policy::Fixed. Expects a checked config.
double policy_interval(const Config& config, Policy policy, double fixed_s = 0);

// What one simulated run did. wall = work + checkpoint + rework + restart + last_words + memory (up to rounding).
struct Outcome {
  Policy policy = Policy::Fixed;
  double interval_s = 0;
  double work_s = 0;              // useful compute, the job's length
  double wall_s = 0;              // wall time it took
  double checkpoint_s = 0;        // periodic checkpoint writes, including ones cut short by a failure
  double rework_s = 0;            // compute (and checkpoint time) thrown away by failures
  double restart_s = 0;           // time spent restarting, including restarts cut short
  double last_words_s = 0;        // time spent writing terminal checkpoints
  std::uint64_t checkpoints = 0;  // periodic checkpoints completed
  std::uint64_t failures = 0;
  std::uint64_t last_words = 0;  // failures whose work a terminal checkpoint kept
  std::uint64_t in_place = 0;    // failures recovered in place (InPlace, MemoryTier)
  double memory_s = 0;             // training stalled by memory checkpoints, in kept work (rework holds the rest)
  std::uint64_t from_memory = 0;   // failures whose terminal checkpoint came from the memory tier

  // Useful fraction of wall time.
  double goodput() const { return wall_s > 0 ? work_s / wall_s : 0; }
  // 1 − goodput.
  double waste_fraction() const { return 1 - goodput(); }
  // Lost work: wall time that was not useful work.
  double lost_s() const { return wall_s - work_s; }
};

// Runs the job once with the policy's interval. Fails on a bad config, an interval that is not positive and
// finite, or a run that exceeds max_events (the interval is so long that segments almost never complete).
Result<Outcome> run(const Config& config, Policy policy, double fixed_s = 0);

// The first-order model's waste fraction at interval τ for a policy: δ/τ + (τ/2 + R)/M, where under last words
// a catchable failure costs min(u, δ) (u ~ U[0, τ], the work at risk) instead of u, and in place R is the mean
// restart over an allocation's life: (s·R_in + R)/(s + 1) for s spares. Under the memory tier the intervals are
// counted in wall time (τ·(1 + δ_m/τ_m)), a failure caught from the memory tier costs min(τ/2, τ_m/2 + δ), and
// the stall takes its share δ_m/(τ_m + δ_m) of what is left.
double model_waste(const Config& config, Policy policy, double interval_s);

// The lost work the first-order model predicts for the whole job: the wall time is work/(1 − waste), so the
// loss is work·waste/(1 − waste); +inf when the model predicts no progress.
double model_lost_s(const Config& config, Policy policy, double interval_s);

// The exact expected waste fraction of this simulator without last words: every segment (τ of work, or the
// remainder, plus δ) costs M·e^{R/M}·(e^{(τ+δ)/M} − 1) of wall time on average (Daly's exact expression).
double exact_waste(const Config& config, double interval_s);

// One point of a waste-versus-interval sweep.
struct SweepPoint {
  double interval_s = 0;
  double simulated = 0;  // simulated waste fraction (fixed policy, same seed for every point)
  double model = 0;      // model_waste
  double exact = 0;      // exact_waste
};

// Simulates `points` log-spaced fixed intervals from lo_s to hi_s (lo_s > 0, hi_s > lo_s, points >= 2).
Result<std::vector<SweepPoint>> sweep(const Config& config, double lo_s, double hi_s, int points);

// A self-contained SVG plot of waste against interval (log scale): simulated points, the model curve, the exact
// curve and markers at Young's and Daly's intervals.
std::string render_svg(const Config& config, const std::vector<SweepPoint>& points);

}  // namespace ckpt::simulate
