#pragma once
// The optimal checkpoint interval: Young's and Daly's formulas, the first-order loss model, and AutoInterval,
// the clock-free estimator behind --ckpt-interval=auto.
//
// Notation: δ = cost of one checkpoint (time training loses to it), R = cost of a restart, M = mean time between
// failures of the job, τ = the interval between checkpoints. With checkpoints evenly spaced and failures landing
// uniformly inside an interval, a job of length T loses (T/τ)·δ + (T/M)·(τ/2 + R).
//
// All times are seconds as doubles. M may be +infinity (a job that never fails).
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/result.hpp"

namespace ckpt::interval {

// The inputs of the loss model.
struct Params {
  double cost_s = 0;     // δ
  double restart_s = 0;  // R
  double mtbf_s = 0;     // M
};

// Accepts δ >= 0, R >= 0 (both finite) and M > 0 (may be +inf); the error names the bad input and its value.
Status check(const Params& params);

// Young: τ = √(2δM). Returns +inf when M is +inf, 0 when δ is 0. Expects inputs that pass check().
double young(double cost_s, double mtbf_s);

// Daly: τ = √(2δM)·[1 + ⅓·√(δ/2M) + (δ/2M)/9] − δ for δ < 2M, and τ = M otherwise. Same limits as young().
double daly(double cost_s, double mtbf_s);

// Fraction of wall time lost at interval τ: δ/τ + (τ/2 + R)/M. Returns +inf for τ <= 0 unless δ is 0
// (then the checkpoint term vanishes); the failure term vanishes when M is +inf. May exceed 1 for bad τ.
double waste_fraction(const Params& params, double interval_s);

// Fraction of wall time that is useful work at interval τ: 1 − waste, clamped to [0, 1].
double goodput(const Params& params, double interval_s);

// Both optima and the loss at each, for reports.
struct Optimum {
  Params params;
  double young_s = 0;
  double daly_s = 0;
  double young_waste = 0;  // waste_fraction at young_s
  double daly_waste = 0;   // waste_fraction at daly_s
};

// Checks the parameters and computes both optima; the error is check()'s.
Result<Optimum> optimize(const Params& params);

// The running estimates the choosers keep: the median of a window of samples (0 for none; the mean of the two
// middle ones for an even count), and a sample added to a window that keeps the last `window` of them.
double median(const std::deque<double>& samples);
void push_bounded(std::deque<double>& samples, double value, std::size_t window);

// M for a job of `nodes` nodes that fail independently, each with MTBF `node_mtbf_s`: node_mtbf / nodes.
// Fails on nodes == 0 or node_mtbf <= 0.
Result<double> job_mtbf(double node_mtbf_s, unsigned long long nodes);

// Chooses the interval for --ckpt-interval=auto from measurements, without reading any clock: the caller
// measures, this class decides. Not thread-safe; one instance per job, owned by the hooks library.
//
// δ is a robust running estimate (median of the last `window` checkpoints) of what training actually sees per
// checkpoint: the stall plus the interference of the background persist. The persist time is a floor: the next
// snapshot is never scheduled before the slowest recent persist could have finished.
class AutoInterval {
 public:
  struct Config {
    double mtbf_s = 24 * 3600;         // used until set_mtbf(); the same cautious guess as BuiltinDefaults
    double initial_interval_s = 1800;  // used until the first checkpoint is measured: δ is unknown before
    double min_interval_s = 60;        // a tiny δ must not turn into a checkpoint storm (SitePolicy's minimum)
    double max_interval_s = 0;         // 0: no maximum
    std::size_t window = 9;            // odd, so the median is one sample; small enough to follow a slower FS
  };

  // Where the chosen interval came from, for the log line.
  enum class Source { Initial, Daly, Minimum, Maximum, PersistFloor };

  // The chosen interval and everything that went into it.
  struct Inputs {
    double interval_s = 0;  // what the hooks should use
    Source source = Source::Initial;
    double daly_s = 0;  // Daly's τ for the current estimates (0 before the first measurement)
    double young_s = 0;
    double cost_s = 0;           // δ estimate: median of stall + interference
    double stall_s = 0;          // median stall
    double interference_s = 0;   // median interference
    double persist_floor_s = 0;  // slowest persist in the window
    double restart_s = 0;        // median restart, 0 before any
    double mtbf_s = 0;
    std::size_t checkpoints = 0;  // measurements seen in total
    double waste_fraction = 0;    // expected loss at interval_s, by the first-order model
  };

  // Uses the built-in Config.
  AutoInterval();
  // Uses `config` after checking it: positive finite min and initial intervals, max 0 or >= min, M > 0 (+inf
  // allowed), window >= 1. The error names the field and its value.
  static Result<AutoInterval> create(const Config& config);

  // Records one checkpoint: seconds training stalled, seconds it ran slower while the persist was in flight,
  // seconds the persist took. Negative or non-finite values are rejected and nothing is recorded.
  Status observe_checkpoint(double stall_s, double interference_s, double persist_s);
  // Records the time from a failure to training running again. Rejected like observe_checkpoint().
  Status observe_restart(double restart_s);
  // Sets M (e.g. from --ckpt-mtbf or node_mtbf / nodes). Rejects M <= 0 and NaN; +inf is allowed.
  Status set_mtbf(double mtbf_s);

  // The interval to use now.
  double interval_s() const { return inputs_.interval_s; }
  // The interval and its inputs.
  const Inputs& inputs() const { return inputs_; }
  // One log line: "interval 18m31s (daly) cost 30.0s (stall 12.0s + interference 18.0s) persist floor 95.0s ...".
  std::string describe() const;

  // The measurements in the window as JSON, for a restarted job to start from instead of the initial interval:
  // {"version": 1, "checkpoints": [[stall, interference, persist], ...], "restarts": [...]}, oldest first.
  std::string measurements_json() const;
  // Replays measurements_json() output through observe_checkpoint/observe_restart. Anything malformed or out of
  // range is an error naming it, and then nothing is recorded. Returns how many checkpoints it replayed.
  Result<std::size_t> replay_measurements(std::string_view json);

 private:
  explicit AutoInterval(const Config& config);
  void recompute();

  Config config_;
  std::deque<double> stall_;
  std::deque<double> interference_;
  std::deque<double> cost_;
  std::deque<double> persist_;
  std::deque<double> restart_;
  std::size_t checkpoints_ = 0;
  double mtbf_s_ = 0;
  Inputs inputs_;
};

// "initial", "daly", "minimum", "maximum", "persist floor".
const char* to_string(AutoInterval::Source source);

// A human duration for a τ that may be fractional or infinite: "18m31s", "0.5s", "inf".
std::string format_seconds(double seconds);

// What CKPT_INTERVAL=auto measures a checkpoint's cost from, on rank 0's training thread: a step's time
// (after_step to after_step, less what the guard stalled) goes to a quiet baseline while no persist runs, and its
// excess over the baseline's median to the interference while the measured checkpoint's persist runs. Times are
// steady-clock seconds handed in, so that the meter is tested without a clock.
class StepMeter {
 public:
  // The persist thread's counts, read once per step.
  struct Worker {
    int pending = 0;                  // persists queued or running
    std::uint64_t persisted = 0;      // persists done
    std::uint64_t failed = 0;         // persists that failed
    double last_stall_s = 0;          // the last snapshot's stall, guard waits included
    double last_persist_s = 0;        // the last persist's time
  };
  // One checkpoint's costs, for AutoInterval::observe_checkpoint.
  struct Measurement {
    double stall_s = 0, interference_s = 0, persist_s = 0;
  };

  explicit StepMeter(double now_s) : step_end_s_(now_s) {}
  // The training thread blocked `waited_s` in the guard: not step time.
  void on_guard(double waited_s) { guard_s_ += waited_s; }
  // A snapshot's stall ended at `now_s`; the worker's counts before its persist was queued.
  void on_snapshot(double now_s, std::uint64_t persisted, std::uint64_t failed);
  // Once per step, at `now_s`: the measured checkpoint's costs once its persist is done; nullopt before that,
  // and for a persist that failed (its time is not the store's speed).
  std::optional<Measurement> on_step(double now_s, const Worker& worker);

 private:
  static constexpr std::size_t kQuietWindow = 31;
  std::deque<double> quiet_;        // recent step times with no persist in flight
  double step_end_s_ = 0;           // when the last step ended
  double guard_s_ = 0;              // guard stalls since then
  double interference_s_ = 0;       // of the checkpoint being measured
  std::uint64_t persists_seen_ = 0; // persisted + failed when it started
  std::uint64_t persisted_seen_ = 0;
  bool measuring_ = false;
};

}  // namespace ckpt::interval
