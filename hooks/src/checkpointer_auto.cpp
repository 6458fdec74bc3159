// CKPT_INTERVAL=auto, rank 0, training thread: the meter's choice published in the stats and the log, and the
// measurements kept in <CKPT_DIR>/.control by a task on the persist thread (auto_interval_meter.hpp).
#include <mutex>

#include "checkpointer_impl.hpp"
#include "log.hpp"

namespace ckpt::hooks {

void Checkpointer::Impl::publish_auto_interval() {
  const interval::AutoInterval::Inputs& in = auto_meter->inputs();
  sched.interval_s = in.interval_s;
  std::string line = auto_meter->describe();
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

void Checkpointer::Impl::observe_step() {
  interval::StepMeter::Worker counts;
  // The pending count first: a persist that ends between the two reads is then seen as still pending with its
  // counts already raised (as under one lock), never as done without them.
  counts.pending = queue.persists_pending();
  {
    std::lock_guard<std::mutex> lock(mu);
    counts.persisted = stats.persisted;
    counts.failed = stats.failed;
    counts.last_stall_s = stats.last_stall_s;
    counts.last_persist_s = stats.last_persist_s;
  }
  auto recomputed = auto_meter->on_step(steady_seconds(), counts);
  if (!recomputed) {
    log::warn(rank, "CKPT_INTERVAL=auto: " + recomputed.error());
    return;
  }
  if (!*recomputed) return;
  publish_auto_interval();
  if (auto text = auto_meter->measurements_due()) {
    queue.enqueue(false, [this, text = std::move(*text)] {
      if (Status s = store::write_control_file(config.dir, AutoIntervalMeter::kFile, text, run_fence(config)); !s) {
        log::warn(rank, "CKPT_INTERVAL=auto: cannot keep the measurements for a restart: " + s.error());
      }
    });
  }
}

}  // namespace ckpt::hooks
