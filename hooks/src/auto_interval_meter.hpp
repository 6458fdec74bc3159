#pragma once
// CKPT_INTERVAL=auto on rank 0 (it alone decides timed checkpoints, so only it measures): the interval chooser
// (interval::AutoInterval) fed by the step meter (interval::StepMeter), which takes a checkpoint's cost as its
// stall plus its interference, the extra step time while its persist runs over the median step without one.
//
// Call order, all on the training thread: create() at the checkpointer's creation, resume() once with the job's
// dir; then on_guard() when the guard blocked, on_snapshot() after each snapshot's stall and on_step() once per
// step; measurements_due() after an on_step() that recomputed the interval.
#include <chrono>
#include <optional>
#include <string>

#include "ckpt/clock.hpp"
#include "ckpt/hooks.hpp"
#include "ckpt/interval.hpp"

namespace ckpt::hooks {

class AutoIntervalMeter {
 public:
  // The file in <CKPT_DIR>/.control that keeps the measurements, so that a restarted job picks its interval from
  // the costs the job already measured instead of starting again from the initial interval.
  static constexpr const char* kFile = "auto-interval.json";

  static Result<AutoIntervalMeter> create(const Config& config);

  // The measurements of the job's earlier runs; what it could not use is logged and ignored.
  void resume(const std::string& dir, int rank);
  void on_guard(double waited_s) { meter_.on_guard(waited_s); }
  void on_snapshot(double now_s, std::uint64_t persisted, std::uint64_t failed) {
    meter_.on_snapshot(now_s, persisted, failed);
  }
  // Once per step: true when the measured checkpoint's persist is done and its costs recomputed the interval;
  // an error names a measurement the chooser refused.
  Result<bool> on_step(double now_s, const interval::StepMeter::Worker& worker);
  // The measurements to keep in .control, at most once a minute (each write costs two fsyncs that contend with
  // the persists; a restart that misses the last minute's measurements loses little).
  std::optional<std::string> measurements_due();

  double interval_s() const { return chooser_.interval_s(); }
  const interval::AutoInterval::Inputs& inputs() const { return chooser_.inputs(); }
  std::string describe() const { return chooser_.describe(); }

 private:
  explicit AutoIntervalMeter(interval::AutoInterval chooser) : chooser_(std::move(chooser)) {}

  interval::AutoInterval chooser_;
  interval::StepMeter meter_{steady_seconds()};
  std::optional<std::chrono::steady_clock::time_point> kept_;  // when the measurements were last kept
};

// The auto interval within the site's bounds.
interval::AutoInterval::Config auto_interval_config(const Config& config);

}  // namespace ckpt::hooks
