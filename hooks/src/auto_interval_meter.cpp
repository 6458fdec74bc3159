#include "auto_interval_meter.hpp"

#include <algorithm>

#include "ckpt/clock.hpp"
#include "ckpt/store.hpp"
#include "log.hpp"

namespace ckpt::hooks {

// Until δ is measured it waits a tenth of the MTBF (at most 30 min) for the first checkpoint: that bounds the work
// at risk early on, and that checkpoint measures δ.
interval::AutoInterval::Config auto_interval_config(const Config& config) {
  interval::AutoInterval::Config c;
  c.mtbf_s = static_cast<double>(config.mtbf_s);
  c.min_interval_s = static_cast<double>(config.min_interval_s);
  c.max_interval_s = static_cast<double>(config.max_interval_s);
  c.initial_interval_s = std::max(c.min_interval_s, std::min(1800.0, c.mtbf_s / 10));
  if (c.max_interval_s > 0) c.initial_interval_s = std::min(c.initial_interval_s, c.max_interval_s);
  return c;
}

Result<AutoIntervalMeter> AutoIntervalMeter::create(const Config& config) {
  auto chooser = interval::AutoInterval::create(auto_interval_config(config));
  if (!chooser) return Error{chooser.error()};
  return AutoIntervalMeter(std::move(chooser).value());
}

void AutoIntervalMeter::resume(const std::string& dir, int rank) {
  if (dir.empty()) return;
  auto text = store::read_control_file(dir, kFile);
  if (!text) {
    log::warn(rank, "CKPT_INTERVAL=auto: earlier measurements not used: " + text.error());
    return;
  }
  if (!*text) return;
  auto replayed = chooser_.replay_measurements(**text);
  if (!replayed) {
    log::warn(rank, "CKPT_INTERVAL=auto: earlier measurements not used: .control/" + std::string(kFile) + ": " +
                        replayed.error());
    return;
  }
  log::info(rank, "CKPT_INTERVAL=auto: starting from " + std::to_string(*replayed) +
                      " checkpoint measurements of earlier runs");
}

Result<bool> AutoIntervalMeter::on_step(double now_s, const interval::StepMeter::Worker& worker) {
  auto measured = meter_.on_step(now_s, worker);
  if (!measured) return false;
  if (Status s = chooser_.observe_checkpoint(measured->stall_s, measured->interference_s, measured->persist_s); !s) {
    return Error{s.error()};
  }
  return true;
}

std::optional<std::string> AutoIntervalMeter::measurements_due() {
  constexpr double kEvery = 60;
  if (kept_ && seconds_since(*kept_) < kEvery) return std::nullopt;
  kept_ = std::chrono::steady_clock::now();
  return chooser_.measurements_json();
}

}  // namespace ckpt::hooks
