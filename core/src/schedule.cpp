// When a checkpoint is taken (schedule.hpp).
#include "ckpt/schedule.hpp"

namespace ckpt::schedule {

Requests requests(const Inputs& in, State& state) {
  Requests out;
  if (in.missed_terminal) state.notice_sent = true;  // the job's terminal step is known and passed: none of its own
  if (!state.notice_sent) {
    // Every rank has the same end time; rank 0 alone acts on it so that one request goes out.
    const bool time_up = in.rank == 0 && in.end_time &&
                         in.now_unix >= static_cast<double>(*in.end_time) - static_cast<double>(in.grace_s);
    if (in.signal != 0 || time_up) {
      state.notice_sent = true;
      out.terminal = in.step + in.lead;
      out.for_time_limit = in.signal == 0;
      out.why = in.signal != 0 ? "signal " + std::to_string(in.signal)
                               : "the job's time limit is within the grace time";
    }
  }
  if (in.interval.kind != Interval::Kind::Steps && in.rank == 0) {
    if (state.time_request && *state.time_request < in.step) state.time_request.reset();
    // The persist floor: with `auto`, no snapshot is asked for while the previous persist is running.
    if (!state.time_request && in.since_checkpoint_s >= in.interval_s && !(in.auto_interval && in.persist_busy)) {
      state.time_request = in.step + in.lead;
      out.periodic = state.time_request;
    }
  }
  return out;
}

Decision decision(std::uint64_t step, const Interval& interval, std::optional<store::Kind> requested,
                  std::optional<std::uint64_t> missed_terminal) {
  Decision d;
  if (missed_terminal && *missed_terminal < step) {  // the others stopped there: a snapshot here cannot complete
    d.stop = true;
    return d;
  }
  if (interval.kind == Interval::Kind::Steps && interval.value > 0 && step % interval.value == 0) d.snapshot = true;
  if (requested) {
    d.snapshot = true;
    if (*requested == store::Kind::Terminal) {
      d.kind = store::Kind::Terminal;
      d.stop = true;
    }
  }
  return d;
}

}  // namespace ckpt::schedule
