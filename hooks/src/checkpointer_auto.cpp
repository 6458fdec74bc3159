// CKPT_INTERVAL=auto: rank 0 alone decides timed checkpoints, so only it measures. observe_step runs on the
// training thread once per step (the step time into a baseline or the interference of a persist); the measurements
// are kept in <CKPT_DIR>/.control by a task on the worker thread.
#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <vector>

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

// Once per step: the step's time (after_step to after_step, less the guard's stall) goes to the baseline when no
// persist runs, and its excess over the baseline's median to the interference while one does. When the measured
// checkpoint's persist is done, the interval is recomputed.
void Checkpointer::Impl::observe_step() {
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

}  // namespace ckpt::hooks
