#pragma once
// When a checkpoint is taken: the scheduling decision each rank makes at every step, pure. The Checkpointer
// (hooks) gathers the inputs (its clock, the signals seen, the coordinator's answer) and carries the outcome out.
//
// A step is decided in two halves, because a request goes through the coordinator before anyone acts on it:
//   1. requests(): what this rank asks the job for. Rank 0 alone asks, so that one request goes out: a terminal
//      checkpoint when a signal came or the time limit is within the grace time (once), and a periodic one when
//      the interval has run out (with `auto`, not while the previous persist still runs: the persist floor).
//      Every rank acts on a signal of its own. A request names step + lead, a step every rank has not passed yet.
//   2. decision(): whether this step is checkpointed, from the interval in steps and what the coordinator says
//      was requested for it.
// A terminal request that reaches a rank after it passed the step (a lead too short for the path) is missed there:
// the ranks that took it stop at it, so no later checkpoint can complete. The rank that missed it asks for no
// terminal of its own and stops at its next step without one, instead of waiting out the commit timeout alone.
#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/options.hpp"
#include "ckpt/store.hpp"

namespace ckpt::schedule {

// What the rank knows at `step`, before it asks anything.
struct Inputs {
  std::uint64_t step = 0;
  int rank = 0;
  std::uint64_t lead = 0;                   // how far ahead a request names its step (0 for a world of one)
  Interval interval;                        // CKPT_INTERVAL
  double interval_s = 0;                    // the timed interval in force (the auto choice, or the seconds given)
  bool auto_interval = false;               // CKPT_INTERVAL=auto: the persist floor applies
  double since_checkpoint_s = 0;            // since the last snapshot started
  bool persist_busy = false;                // a persist is queued or running
  int signal = 0;                           // a signal this checkpointer has not acted on yet; 0: none
  double now_unix = 0;
  std::optional<std::uint64_t> end_time;    // the job's time limit, unix seconds
  std::uint64_t grace_s = 0;                // CKPT_GRACE
  std::optional<std::uint64_t> missed_terminal;  // a terminal step asked for after this rank passed it
};

// What the rank remembers from step to step (the Checkpointer keeps it; requests() updates it).
struct State {
  bool notice_sent = false;                     // the terminal request went out (at most once)
  std::optional<std::uint64_t> time_request;    // the periodic step rank 0 asked for, until it passes
};

struct Requests {
  std::optional<std::uint64_t> terminal;        // ask for a terminal checkpoint of this step
  bool for_time_limit = false;                  // ... because of the time limit (continued in a new allocation)
  std::string why;                              // for the log line
  std::optional<std::uint64_t> periodic;        // ask for a periodic checkpoint of this step
};

// The requests of this step; updates `state`.
Requests requests(const Inputs& in, State& state);

struct Decision {
  bool snapshot = false;   // a checkpoint of this step is taken
  bool stop = false;       // it is terminal (or the terminal step was missed): the loop stops after this step
  store::Kind kind = store::Kind::Periodic;
};

// The step's decision from the interval in steps, the coordinator's answer for it (nullopt: nothing asked) and a
// terminal step this rank missed (then: stop, no snapshot).
Decision decision(std::uint64_t step, const Interval& interval, std::optional<store::Kind> requested,
                  std::optional<std::uint64_t> missed_terminal = std::nullopt);

}  // namespace ckpt::schedule
