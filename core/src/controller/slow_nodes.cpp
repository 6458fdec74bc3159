// Slow-node reports applied to a job's record: what the job's root rank says about a node that ran slower than the
// job's best for several windows (recovery_plan.hpp: apply_slow_node).
#include <algorithm>

#include "ckpt/format.hpp"
#include "ckpt/recovery_plan.hpp"

namespace ckpt::recovery {

namespace {

bool of_allocation(const JobRecord& r, const std::string& node) {
  return std::find(r.nodes.begin(), r.nodes.end(), node) != r.nodes.end();
}

// "0.48 of the job's best (0.48 of the job's best for 3 windows up to step 25 (rank 4))".
std::string measured(const Event& e) {
  return format_number(e.score) + " of the job's best" + (e.detail.empty() ? "" : " (" + e.detail + ")");
}

}  // namespace

void record_slow_node(std::vector<SlowNode>& slow_nodes, SlowNode report) {
  std::erase_if(slow_nodes, [&](const SlowNode& s) { return s.node == report.node; });
  slow_nodes.push_back(std::move(report));
  if (slow_nodes.size() > kMaxSlowNodesPerRecord) {
    slow_nodes.erase(slow_nodes.begin(),
                     slow_nodes.begin() + static_cast<std::ptrdiff_t>(slow_nodes.size() - kMaxSlowNodesPerRecord));
  }
}

void apply_slow_node(JobRecord& r, const Event& e, EventEffects& fx, double now) {
  const std::string about = describe(e) + ": slow node " + e.slow_node;
  // The owner's word: it may speak only of the job's own nodes (an allocation not known yet has none), never name
  // another job's node and make it excluded, listed or alerted about.
  if (!of_allocation(r, e.slow_node)) {
    fx.note = about + " is not a node of the job's allocation; ignored";
    return;
  }
  if (is_terminal(r.state)) {
    fx.note = about + ": " + measured(e) + "; the job is " + to_string(r.state) + ", not recorded";
    return;
  }
  const bool exclude = e.action == kSlowNodeExclude;
  fx.note = about + ": " + measured(e) + (exclude ? ", excluding it from the job's next runs" : "");
  SlowNode report{e.slow_node, e.score, now, e.action};
  record_slow_node(r.slow_nodes, report);
  fx.slow_node = report;
  // Only out of this job's next runs, for the bad-node TTL: a user's measurement is no evidence to mark a node DOWN
  // or drain it for everyone (a job can make its own node slow).
  if (exclude) {
    fx.exclude = {e.slow_node};
    fx.exclude_reason = std::string(kSlowNodeReason) + " by job " + std::to_string(r.job_id) + " (" + format_number(e.score) +
                        " of the job's best)";
  }
}

}  // namespace ckpt::recovery
