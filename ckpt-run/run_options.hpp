#pragma once
// ckpt-run's own options, which come before the srun command line: one table for its usage text, its parser and
// its man page (man/ generates ckpt-run(1) from it).
#include <array>
#include <string_view>

namespace ckpt::run {

struct RunOptionSpec {
  const char* name;   // "--min-nodes"
  const char* arg;    // what the value looks like: "N"
  const char* usage;  // what it does, for --help and the man page
};

inline constexpr std::array<RunOptionSpec, 5> kRunOptions{{
    {"--controller", "URL",
     "The recovery controller (default: $CKPT_CONTROLLER_URL, which the plugin sets from the site's controller=). "
     "Only answers signed by the controller (MUNGE, as root or SlurmUser) are believed. Without a reachable "
     "controller the step runs once and ckpt-run returns its status"},
    {"--min-nodes", "N",
     "Fewest nodes the relaunched step may run on: without spare nodes, -N shrinks down to N (default: never "
     "shrink)"},
    {"--max-relaunches", "N",
     "Relaunches within the allocation (of the step, or of the node steps under --spares) before handing the job "
     "over to a requeue (default 100)"},
    {"--spares", "N",
     "Restart in place: one step per node of the -N nodes, each with the srun line's tasks per node, plus N spare "
     "nodes of the allocation whose processes wait, framework loaded, to take a dead node's ranks over (the program "
     "runs slurm_ckpt.torch.run). When a node dies the survivors stay alive and go on with a spare, without a "
     "relaunch or a requeue. When they cannot (no spare ready, or a survivor stuck in a collective) they say so and "
     "exit 75, and ckpt-run relaunches the node steps inside the allocation: every rank on its node, a spare node in "
     "place of the nodes whose ranks were lost, each rank restoring from what its node's tier (or its partner's node) kept; "
     "with no spare node left it hands the job over to a requeue. Default: "
     "$CKPT_SPARES when above 0 (the job's spares option of the SPANK plugin). At most $CKPT_MAX_SPARES when it is "
     "set (the site's max_spares)"},
    {"--decision-wait", "DURATION",
     "How long after the step ended to wait for the controller's decision before returning its status "
     "(default 5s)"},
}};

// The table's entry for `name`; nullptr when ckpt-run has no such option.
inline const RunOptionSpec* run_option(std::string_view name) {
  for (const auto& spec : kRunOptions) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

}  // namespace ckpt::run
