// CKPT_INTERVAL=auto: rank 0 alone decides timed checkpoints, so only it measures. observe_step runs on the
// training thread once per step (the step time into a baseline or the interference of a persist); the measurements
// are kept in <CKPT_DIR>/.control by a task on the worker thread.
#include <algorithm>
#include <chrono>
#include <mutex>

#include "checkpointer_impl.hpp"
#include "log.hpp"

namespace ckpt::hooks {

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

bool Checkpointer::Impl::persist_busy() const {
  std::lock_guard<std::mutex> lock(mu);
  return persists_pending > 0;
}

// Uses the auto interval's current choice, logs it and shows it in the stats.
void Checkpointer::Impl::publish_auto_interval() {
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

void Checkpointer::Impl::resume_auto_measurements() {
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
void Checkpointer::Impl::save_auto_measurements() {
  constexpr double kEvery = 60;
  if (auto_saved && seconds_since(*auto_saved) < kEvery) return;
  auto_saved = Clock::now();
  enqueue(false, [this, text = auto_interval->measurements_json()] {
    if (Status s = store::write_control_file(config.dir, kAutoMeasurements, text, run_fence(config)); !s) {
      log::warn(rank, "CKPT_INTERVAL=auto: cannot keep the measurements for a restart: " + s.error());
    }
  });
}

// Once per step: the step's time into the meter (interval::StepMeter); when the measured checkpoint's persist is
// done, its costs go to the auto interval, which is recomputed.
void Checkpointer::Impl::observe_step() {
  interval::StepMeter::Worker counts;
  {
    std::lock_guard<std::mutex> lock(mu);
    counts.pending = persists_pending;
    counts.persisted = stats.persisted;
    counts.failed = stats.failed;
    counts.last_stall_s = stats.last_stall_s;
    counts.last_persist_s = stats.last_persist_s;
  }
  auto measured = meter.on_step(steady_seconds(), counts);
  if (!measured) return;
  if (Status s = auto_interval->observe_checkpoint(measured->stall_s, measured->interference_s, measured->persist_s);
      !s) {
    log::warn(rank, "CKPT_INTERVAL=auto: " + s.error());
    return;
  }
  publish_auto_interval();
  save_auto_measurements();
}

}  // namespace ckpt::hooks
