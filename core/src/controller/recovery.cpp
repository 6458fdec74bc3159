// The recovery policy: classification of endings, the restart budget, bad nodes and the state machine's table.
#include "ckpt/recovery.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <set>

namespace ckpt::recovery {

// ---- names ----------------------------------------------------------------------------------------------------

const char* to_string(SlurmState state) {
  switch (state) {
    case SlurmState::Pending: return "PENDING";
    case SlurmState::Running: return "RUNNING";
    case SlurmState::Suspended: return "SUSPENDED";
    case SlurmState::Completed: return "COMPLETED";
    case SlurmState::Cancelled: return "CANCELLED";
    case SlurmState::Failed: return "FAILED";
    case SlurmState::Timeout: return "TIMEOUT";
    case SlurmState::NodeFail: return "NODE_FAIL";
    case SlurmState::Preempted: return "PREEMPTED";
    case SlurmState::BootFail: return "BOOT_FAIL";
    case SlurmState::Deadline: return "DEADLINE";
    case SlurmState::OutOfMemory: return "OUT_OF_MEMORY";
    case SlurmState::Unknown: break;
  }
  return "UNKNOWN";
}

SlurmState parse_slurm_state(std::string_view text) {
  static constexpr std::array<SlurmState, 12> all = {
      SlurmState::Pending,  SlurmState::Running,   SlurmState::Suspended, SlurmState::Completed,
      SlurmState::Cancelled, SlurmState::Failed,   SlurmState::Timeout,   SlurmState::NodeFail,
      SlurmState::Preempted, SlurmState::BootFail, SlurmState::Deadline,  SlurmState::OutOfMemory};
  for (SlurmState s : all) {
    if (text == to_string(s)) return s;
  }
  if (text == "COMPLETE") return SlurmState::Completed;
  if (text == "OOM") return SlurmState::OutOfMemory;
  return SlurmState::Unknown;
}

bool is_finished(SlurmState state) {
  switch (state) {
    case SlurmState::Pending:
    case SlurmState::Running:
    case SlurmState::Suspended:
    case SlurmState::Unknown: return false;
    default: return true;
  }
}

const char* to_string(Ending ending) {
  switch (ending) {
    case Ending::NodeFailure: return "node failure";
    case Ending::TaskCrash: return "task crash";
    case Ending::TimeLimit: return "time limit";
    case Ending::Preemption: return "preemption";
    case Ending::OutOfMemory: return "out of memory";
    case Ending::UserCancel: return "user cancel";
    case Ending::CleanExit: return "clean exit";
    case Ending::DoNotRestart: return "do-not-restart exit";
  }
  return "?";
}

const char* to_string(JobState state) {
  switch (state) {
    case JobState::Running: return "running";
    case JobState::Failing: return "failing";
    case JobState::Relaunching: return "relaunching";
    case JobState::Requeueing: return "requeueing";
    case JobState::Pending: return "pending";
    case JobState::Completed: return "completed";
    case JobState::Cancelled: return "cancelled";
    case JobState::GaveUp: return "gave-up";
    case JobState::Gone: return "gone";
  }
  return "?";
}

std::optional<JobState> parse_job_state(std::string_view text) {
  static constexpr std::array<JobState, 9> all = {JobState::Running,   JobState::Failing, JobState::Relaunching,
                                                  JobState::Requeueing, JobState::Pending, JobState::Completed,
                                                  JobState::Cancelled, JobState::GaveUp,  JobState::Gone};
  for (JobState s : all) {
    if (text == to_string(s)) return s;
  }
  return std::nullopt;
}

bool is_terminal(JobState state) {
  return state == JobState::Completed || state == JobState::Cancelled || state == JobState::GaveUp ||
         state == JobState::Gone;
}

const char* to_string(Intent::Phase phase) {
  switch (phase) {
    case Intent::Phase::Requeue: return "requeue";
    case Intent::Phase::MarkDown: return "mark-down";
    case Intent::Phase::WaitCompleting: return "wait-completing";
    case Intent::Phase::Update: return "update";
    case Intent::Phase::Done: return "done";
  }
  return "?";
}

std::optional<Intent::Phase> parse_intent_phase(std::string_view text) {
  static constexpr std::array<Intent::Phase, 5> all = {Intent::Phase::Requeue, Intent::Phase::MarkDown,
                                                       Intent::Phase::WaitCompleting, Intent::Phase::Update,
                                                       Intent::Phase::Done};
  for (auto p : all) {
    if (text == to_string(p)) return p;
  }
  return std::nullopt;
}

double credential_safe_start(double ended) { return std::floor(ended) + 2.0; }

// ---- classification -----------------------------------------------------------------------------------------------

std::optional<Ending> classify(const EndingFacts& facts) {
  const SlurmJob* slurm = facts.slurm ? &*facts.slurm : nullptr;
  const bool finished = slurm && is_finished(slurm->state);

  if (slurm && slurm->state == SlurmState::Cancelled) return Ending::UserCancel;
  const bool asked_not_to = std::any_of(facts.failures.begin(), facts.failures.end(), [](const TaskFailure& f) {
    return f.signal == 0 && f.exit_code == kExitNoRestart;
  });
  if (finished && (asked_not_to || (slurm->exit_signal == 0 && slurm->exit_code == kExitNoRestart))) {
    return Ending::DoNotRestart;
  }
  // The batch script ended well: whatever failed inside, the script dealt with it.
  if (finished && slurm->state == SlurmState::Completed && slurm->exit_code == 0 && slurm->exit_signal == 0) {
    return Ending::CleanExit;
  }
  if (!facts.dead_nodes.empty() && !asked_not_to) return Ending::NodeFailure;
  if (!finished) return std::nullopt;  // task failures on live nodes: the script decides what comes next

  switch (slurm->state) {
    case SlurmState::NodeFail:
    case SlurmState::BootFail: return Ending::NodeFailure;
    case SlurmState::Timeout:
    case SlurmState::Deadline: return Ending::TimeLimit;
    case SlurmState::Preempted: return Ending::Preemption;
    case SlurmState::OutOfMemory: return Ending::OutOfMemory;
    default: break;
  }
  return Ending::TaskCrash;
}

bool restartable(Ending ending) {
  switch (ending) {
    case Ending::NodeFailure:
    case Ending::TaskCrash:
    case Ending::TimeLimit:
    case Ending::Preemption: return true;
    default: return false;
  }
}

Ending ending_of_clean_exit(const std::optional<TimeLimitStop>& stop, std::uint32_t job_id,
                            std::uint32_t restart_count) {
  if (!stop || stop->job_id != std::to_string(job_id) || stop->restart_count != restart_count) {
    return Ending::CleanExit;
  }
  return Ending::TimeLimit;
}

bool spends_budget(Ending ending) { return ending != Ending::Preemption; }

// ---- budget -------------------------------------------------------------------------------------------------------

namespace {

std::string step_text(std::optional<std::uint64_t> step) {
  return step ? "step " + std::to_string(*step) : std::string("none");
}

}  // namespace

RestartVerdict decide_restart(Ending ending, const Budget& budget, std::optional<std::uint64_t> newest_complete,
                              bool needs_checkpoint) {
  RestartVerdict verdict;
  verdict.after = budget;
  switch (ending) {
    case Ending::UserCancel: verdict.reason = "cancelled by its user: never requeued"; return verdict;
    case Ending::CleanExit: verdict.reason = "ended cleanly"; return verdict;
    case Ending::DoNotRestart:
      verdict.reason = "a rank exited with " + std::to_string(kExitNoRestart) + ", the code that asks not to restart";
      return verdict;
    case Ending::OutOfMemory:
      verdict.reason = "ran out of memory: a restart with the same layout would run out again";
      return verdict;
    default: break;
  }
  if (needs_checkpoint && !newest_complete) {
    verdict.reason = std::string(to_string(ending)) + ", and the job needs a checkpoint to restart but none is complete";
    return verdict;
  }
  Budget after = budget;
  const bool progressed = newest_complete && (!budget.progress_step || *newest_complete > *budget.progress_step);
  if (progressed) after.without_progress = 0;
  if (spends_budget(ending)) {
    if (after.without_progress >= after.max_restarts) {
      verdict.reason = std::string(to_string(ending)) + " after " + std::to_string(after.without_progress) +
                       " restarts without progress (budget " + std::to_string(after.max_restarts) +
                       "; newest complete checkpoint: " + step_text(newest_complete) + ")";
      return verdict;
    }
    ++after.without_progress;
  }
  ++after.restarts;
  if (newest_complete) after.progress_step = newest_complete;
  verdict.restart = true;
  verdict.reason = std::string(to_string(ending)) + ": restart " + std::to_string(after.restarts) + " (" +
                   std::to_string(after.without_progress) + " of " + std::to_string(after.max_restarts) +
                   " without progress; resumes from " + step_text(newest_complete) + ")";
  verdict.after = after;
  return verdict;
}

// ---- bad nodes ------------------------------------------------------------------------------------------------------

std::vector<BadNode> add_bad_nodes(std::vector<BadNode> current, const std::vector<std::string>& nodes,
                                   const std::string& reason, double now, double ttl_s) {
  for (const auto& name : nodes) {
    auto it = std::find_if(current.begin(), current.end(), [&](const BadNode& b) { return b.node == name; });
    if (it == current.end()) {
      current.push_back(BadNode{name, reason, now, now + ttl_s});
    } else {
      if (it->expires <= now) {  // had expired: a new episode
        it->reason = reason;
        it->since = now;
      }
      it->expires = now + ttl_s;
    }
  }
  return current;
}

std::vector<std::string> active_bad_nodes(const std::vector<BadNode>& nodes, double now) {
  std::set<std::string> names;
  for (const auto& b : nodes) {
    if (b.expires > now) names.insert(b.node);
  }
  return {names.begin(), names.end()};
}

bool forget_bad_node(std::vector<BadNode>& nodes, const std::string& node, double now) {
  bool was_active = false;
  for (auto& b : nodes) {
    if (b.node != node || b.expires <= now) continue;
    b.expires = now;
    was_active = true;
  }
  return was_active;
}

// ---- the state machine -----------------------------------------------------------------------------------------------

const std::vector<std::pair<JobState, JobState>>& transition_table() {
  using S = JobState;
  static const std::vector<std::pair<S, S>> table = {
      // A running job fails, is relaunched inside its allocation, is requeued by the controller or by Slurm,
      // or ends.
      {S::Running, S::Failing}, {S::Running, S::Relaunching}, {S::Running, S::Requeueing}, {S::Running, S::Pending},
      {S::Running, S::Completed}, {S::Running, S::Cancelled}, {S::Running, S::GaveUp}, {S::Running, S::Gone},
      // A failing job is decided on; a false alarm (the step was replaced) returns to running.
      {S::Failing, S::Running}, {S::Failing, S::Relaunching}, {S::Failing, S::Requeueing}, {S::Failing, S::Pending},
      {S::Failing, S::Completed}, {S::Failing, S::Cancelled}, {S::Failing, S::GaveUp}, {S::Failing, S::Gone},
      // ckpt-run starts the new step, fails again, or hands over to a requeue.
      {S::Relaunching, S::Running}, {S::Relaunching, S::Failing}, {S::Relaunching, S::Requeueing},
      {S::Relaunching, S::Pending}, {S::Relaunching, S::Completed}, {S::Relaunching, S::Cancelled},
      {S::Relaunching, S::GaveUp}, {S::Relaunching, S::Gone},
      // The requeue is carried out, or Slurm refuses it, or the user cancels meanwhile.
      {S::Requeueing, S::Pending}, {S::Requeueing, S::Running}, {S::Requeueing, S::Cancelled},
      {S::Requeueing, S::GaveUp}, {S::Requeueing, S::Gone},
      // Slurm starts the job again; a held requeue needs a release; the new run may end before it is seen.
      {S::Pending, S::Running}, {S::Pending, S::Requeueing}, {S::Pending, S::Failing}, {S::Pending, S::Cancelled},
      {S::Pending, S::GaveUp}, {S::Pending, S::Gone},
      // Ended jobs come back only when a person requeues them (or an admin releases one the controller gave up).
      {S::Completed, S::Running}, {S::Completed, S::Gone},
      {S::Cancelled, S::Running}, {S::Cancelled, S::Gone},
      {S::GaveUp, S::Requeueing}, {S::GaveUp, S::Running}, {S::GaveUp, S::Cancelled}, {S::GaveUp, S::Gone},
  };
  return table;
}

bool transition_allowed(JobState from, JobState to) {
  const auto& table = transition_table();
  return std::find(table.begin(), table.end(), std::make_pair(from, to)) != table.end();
}

Status check_transition(JobState from, JobState to) {
  if (transition_allowed(from, to)) return Status::success();
  return Status::failure(std::string("illegal transition ") + to_string(from) + " -> " + to_string(to));
}

}  // namespace ckpt::recovery
