// What ckpt-run tells the recovery controller (run_report.hpp).
#include "run_report.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>

#include <slurm/slurm.h>

#include <nlohmann/json.hpp>

#include "ckpt/clock.hpp"
#include "ckpt/inplace.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/posix.hpp"
#include "http.hpp"
#include "log.hpp"
#include "munge_auth.hpp"
#include "events.hpp"
#include "slurm_handles.hpp"

namespace ckpt::run {
using namespace ckpt::toolkit;  // MUNGE, HTTP

namespace rec = ckpt::recovery;
using nlohmann::json;

namespace {

// An event of this job as sent from this node, by this run, now.
rec::Event event_from_here(rec::EventType type, std::uint32_t job) {
  const char* restarts = std::getenv("SLURM_RESTART_COUNT");
  auto count = ckpt::parse_uint(restarts ? restarts : "0");
  return ckpt::toolkit::event_from_here(type, job, count && *count <= 0xffffffffULL ? static_cast<std::uint32_t>(*count) : 0);
}

// Signs the event with MUNGE and POSTs it; `what` names it in the error line.
void post_event(const std::string& url, const rec::Event& e, const std::string& what) {
  if (Status s = ckpt::toolkit::post_event(url, e, munge_socket_from_slurm()); !s) {
    log_error("cannot tell the controller about " + what + ": " + s.error());
  }
}

// The plan's lost ranks, and the nodes that lost all their ranks; false when none is listed or a rank has no known
// node. A node whose other ranks train on is alive: a process failed there, not the node.
bool read_lost(const ckpt::inplace::Plan& plan, const std::map<int, std::string>& node_of_rank, InPlaceRecovery& r) {
  if (plan.lost.empty()) return false;
  for (int rank : plan.lost) {
    if (node_of_rank.count(rank) == 0) return false;
    r.lost_ranks.push_back(rank);
  }
  for (int rank : r.lost_ranks) {
    const std::string& node = node_of_rank.at(rank);
    const bool whole = std::all_of(node_of_rank.begin(), node_of_rank.end(), [&](const auto& other) {
      return other.second != node ||
             std::find(r.lost_ranks.begin(), r.lost_ranks.end(), other.first) != r.lost_ranks.end();
    });
    if (whole && std::find(r.failed_nodes.begin(), r.failed_nodes.end(), node) == r.failed_nodes.end()) {
      r.failed_nodes.push_back(node);
    }
  }
  return true;
}

}  // namespace

std::string munge_socket_from_slurm() {
  auto conf = load_ctl_conf();
  return conf ? ckpt::authinfo_socket(conf->authinfo ? conf->authinfo : "") : std::string();
}

std::uint32_t slurm_user_uid() {
  auto conf = load_ctl_conf();
  return conf ? conf->slurm_user_id : 0;
}

namespace {

// A name for srun's --exclude: a node name as events carry them, and never one that reads as an option.
bool host_name_ok(const std::string& n) {
  return rec::safe_node_name(n) && std::isalnum(static_cast<unsigned char>(n[0]));
}

}  // namespace

std::optional<JobView> parse_job_view(const json& j) {
  if (!j.is_object()) return std::nullopt;
  JobView v;
  auto text = [&](const char* key, std::string& out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return true;
    if (!it->is_string() || it->get_ref<const std::string&>().size() > 4096) return false;
    out = it->get<std::string>();
    return true;
  };
  if (!text("state", v.state) || !text("reason", v.reason)) return std::nullopt;
  if (auto it = j.find("relaunch_step"); it != j.end() && !it->is_null()) {
    if (!it->is_number_unsigned() || it->get<std::uint64_t>() > std::numeric_limits<std::uint32_t>::max()) {
      return std::nullopt;
    }
    v.relaunch_step = it->get<std::uint32_t>();
  }
  if (auto it = j.find("exclude"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > 65536) return std::nullopt;
    for (const auto& n : *it) {
      if (!n.is_string() || !host_name_ok(n.get<std::string>())) return std::nullopt;
      v.exclude.push_back(n.get<std::string>());
    }
  }
  if (auto it = j.find("clock"); it != j.end() && it->is_object()) {
    if (auto d = it->find("decided"); d != it->end() && !d->is_null()) {
      if (!d->is_number() || !std::isfinite(d->get<double>())) return std::nullopt;
      v.decided = d->get<double>();
    }
  }
  if (v.state == "relaunching" && !v.relaunch_step) return std::nullopt;
  return v;
}

std::optional<JobView> read_job_view(const std::string& url, const std::string& job) {
  static const std::string socket = munge_socket_from_slurm();
  static const std::uint32_t slurm_uid = slurm_user_uid();
  const std::string path = "/v1/jobs/" + job;
  auto cred = munge_encode_payload(read_credential_payload(path), socket);
  if (!cred) {
    log_limited(LogLevel::Warning, "munge", "cannot ask the controller about job " + job + ": " + cred.error());
    return std::nullopt;
  }
  HttpRequest req;
  req.url = url + path;
  req.timeout_s = 1;
  req.headers.emplace_back(kCredentialHeader, *cred);
  HttpResponse res = http_request(req);
  if (!res.ok()) return std::nullopt;
  auto sig = res.headers.find(header_key(kReplyCredentialHeader));
  if (Status s = check_reply_credential(sig == res.headers.end() ? "" : sig->second, *cred, res.body, slurm_uid, socket);
      !s) {
    log_limited(LogLevel::Warning, "reply-credential",
                "ignoring the answer from " + url + " about job " + job + ": " + s.error());
    return std::nullopt;
  }
  return parse_job_view(json::parse(res.body, nullptr, false));
}

void hand_over(const Settings& s, std::uint32_t job, const std::string& why) {
  rec::Event e = event_from_here(rec::EventType::Handover, job);
  e.detail = why;
  post_event(s.url, e, "the hand-over");
}

void report_relaunch(const std::string& url, std::uint32_t job, const std::vector<std::string>& failed_nodes,
                     std::uint32_t last_step, std::optional<std::uint64_t> resume_step) {
  rec::Event e = event_from_here(rec::EventType::Relaunch, job);
  e.step_id = last_step;
  e.failed_nodes = rec::join_nodes(failed_nodes);
  e.resume_step = resume_step;
  post_event(url, e, "the relaunch of the node steps");
}

void report_in_place(const std::string& url, std::uint32_t job, const InPlaceRecovery& recovery) {
  rec::Event e = event_from_here(rec::EventType::InPlace, job);
  e.failed_nodes = rec::join_nodes(recovery.failed_nodes);
  e.generation = recovery.generation;
  e.resume_step = recovery.resume_step;
  e.phases = recovery.phases;
  post_event(url, e, "in-place recovery " + std::to_string(recovery.generation));
}

std::optional<InPlaceRecovery> read_in_place_phases(const std::string& inplace_dir, std::uint32_t generation,
                                                    const std::map<int, std::string>& node_of_rank) {
  auto records = ckpt::inplace::Records::open(inplace_dir, /*create=*/false);
  if (!records) return std::nullopt;
  auto phases = records->read_phases(generation);
  if (!phases) return std::nullopt;
  return read_in_place_phases(*records, generation, *phases, node_of_rank);
}

std::optional<InPlaceRecovery> read_in_place_phases(const ckpt::inplace::Records& records, std::uint32_t generation,
                                                    const ckpt::inplace::Phases& phases,
                                                    const std::map<int, std::string>& node_of_rank) {
  auto plan = records.read_plan(generation);
  if (!plan || plan->abandons()) return std::nullopt;
  InPlaceRecovery r;
  r.generation = generation;
  if (!read_lost(*plan, node_of_rank, r)) return std::nullopt;
  for (const auto& [rank, slot] : plan->takeover) r.replacement_node[rank] = ckpt::inplace::parse_slot(slot)->first;
  r.world_before = plan->world_before;
  r.world = plan->world;
  r.phases = phases.as_report();
  if (r.phases.detected == 0 || r.phases.resumed == 0) return std::nullopt;
  r.resume_step = phases.step;
  return r;
}

}  // namespace ckpt::run
