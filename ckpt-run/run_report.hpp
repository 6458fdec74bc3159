#pragma once
// What ckpt-run tells the recovery controller: a hand-over to a requeue, and a recovery made in place. Each is an
// event signed with MUNGE as the job's owner and POSTed to <url>/v1/events; a failure is logged, never fatal.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/inplace.hpp"
#include "ckpt/recovery.hpp"
#include "run_settings.hpp"

namespace ckpt::run {

// One in-place recovery, as its root wrote it into the run's control dir (gen-<G>.plan and gen-<G>.phases).
struct InPlaceRecovery {
  std::uint32_t generation = 0;
  std::vector<int> lost_ranks;              // as the plan lists them
  std::vector<std::string> failed_nodes;    // the nodes that lost all their ranks, each once, in rank order
  std::optional<std::uint64_t> resume_step; // the checkpoint step training resumed from
  ckpt::recovery::InPlacePhases phases;     // when each phase ended (0 where the root did not say)
  std::map<int, std::string> replacement_node;  // the plan's takeover: rank -> the spare node now running it
  int world_before = 0;                     // a plan that shrank (--ckpt-shrink): the world it shrank from
  int world = 0;                            // the world the recovery formed
};

// The MUNGE socket of Slurm's AuthInfo ("socket=..."); empty for libmunge's default.
std::string munge_socket_from_slurm();
// SlurmUser's uid (the controller may run as it), from Slurm's config; 0 when it cannot be read.
std::uint32_t slurm_user_uid();

// What ckpt-run takes from the controller's view of its job, every field type-checked.
struct JobView {
  std::string state;                          // "relaunching", "gave-up", "running", ...
  std::string reason;
  std::optional<std::uint32_t> relaunch_step;  // with "relaunching": the failed step to kill
  std::vector<std::string> exclude;            // node names, each a valid host name
  double decided = 0;                          // clock.decided: when the controller decided
};
// nullopt when `j` is no object or any field ckpt-run reads has the wrong type or range.
std::optional<JobView> parse_job_view(const nlohmann::json& j);
// The controller's view of `job`, read with a MUNGE credential as the job's owner and believed only when the
// answer carries the controller's own credential bound to that request and body (munge_auth.hpp): nullopt for
// no answer, an unsigned or mis-signed one (logged, rate-limited) or a malformed view.
std::optional<JobView> read_job_view(const std::string& url, const std::string& job);

// Tells the controller that relaunching inside the allocation is not possible: requeue the job.
void hand_over(const Settings& s, std::uint32_t job, const std::string& why);

// Tells the controller that ckpt-run relaunches its node steps inside the allocation (the survivors gave up
// recovering in place), leaving `failed_nodes` out and ending the steps up to `last_step` itself (their tasks' exits
// are no new failure); `resume_step`: the dir's newest complete checkpoint. It spends a restart (or gives up on the
// job, which ckpt-run sees in the job's view).
void report_relaunch(const std::string& url, std::uint32_t job, const std::vector<std::string>& failed_nodes,
                     std::uint32_t last_step, std::optional<std::uint64_t> resume_step);

// Tells the controller that the job recovered in place: it records the recovery, excludes the failed nodes and
// spends a restart (or gives up on the job, which ckpt-run sees in the job's view).
void report_in_place(const std::string& url, std::uint32_t job, const InPlaceRecovery& recovery);

// Recovery `generation` of the in-place run whose files are in `inplace_dir`, once its first step is done (both
// files are there); nullopt when a file is missing, too large or malformed, the plan abandons the recovery, or a
// lost rank has no node in `node_of_rank`.
std::optional<InPlaceRecovery> read_in_place_phases(const std::string& inplace_dir, std::uint32_t generation,
                                                    const std::map<int, std::string>& node_of_rank);
// The same from records opened already and the phases read from them: one look at the dir.
std::optional<InPlaceRecovery> read_in_place_phases(const ckpt::inplace::Records& records, std::uint32_t generation,
                                                    const ckpt::inplace::Phases& phases,
                                                    const std::map<int, std::string>& node_of_rank);

}  // namespace ckpt::run
