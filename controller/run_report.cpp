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
#include "ckpt/parse.hpp"
#include "ckpt/posix.hpp"
#include "http.hpp"
#include "log.hpp"
#include "munge_auth.hpp"

namespace ckpt::controller {

namespace rec = ckpt::recovery;
using nlohmann::json;

namespace {

// A plan names a rendezvous address and a spare per lost rank: far below this even at 16k ranks.
constexpr std::size_t kMaxControlFileBytes = 4 * 1024 * 1024;

// An event of this job as sent from this node, by this run, now.
rec::Event event_from_here(rec::EventType type, std::uint32_t job) {
  rec::Event e;
  e.type = type;
  e.job_id = job;
  const char* restarts = std::getenv("SLURM_RESTART_COUNT");
  auto count = ckpt::parse_uint(restarts ? restarts : "0");
  e.restart_count = count ? static_cast<std::uint32_t>(*count) : 0;
  const char* node = std::getenv("SLURMD_NODENAME");
  e.node = node ? node : "unknown";
  e.uid = getuid();
  e.time = ckpt::unix_seconds();
  return e;
}

// Signs the event with MUNGE and POSTs it; `what` names it in the error lines.
void post_event(const std::string& url, const rec::Event& e, const std::string& what) {
  auto cred = munge_encode_payload(rec::to_json(e), munge_socket_from_slurm());
  if (!cred) {
    log_error("cannot tell the controller about " + what + ": " + cred.error());
    return;
  }
  HttpRequest req;
  req.method = "POST";
  req.url = url + "/v1/events";
  req.body = *cred;
  req.content_type = "text/plain";
  req.timeout_s = 2;
  HttpResponse res = http_request(req);
  if (!res.ok()) log_error("the controller did not take " + what + ": " + (res.error.empty() ? res.body : res.error));
}

// A JSON object from a file of the control dir; nullopt when missing, too large or not an object.
std::optional<json> read_json_object(int dir_fd, const std::string& name) {
  auto text = ckpt::posix::read_small_file(dir_fd, name, kMaxControlFileBytes);
  if (!text.ok()) return std::nullopt;
  json j = json::parse(*text.value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

// A time of the phases file: 0 when absent or null (the root did not get there), nullopt when not a time.
std::optional<double> time_of(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0.0;
  if (!it->is_number()) return std::nullopt;
  const double t = it->get<double>();
  if (!std::isfinite(t) || t < 0) return std::nullopt;
  return t;
}

bool generation_is(const json& j, std::uint32_t generation) {
  auto it = j.find("generation");
  return it != j.end() && it->is_number_unsigned() && it->get<std::uint64_t>() == generation;
}

// The plan's lost ranks, and the nodes that lost all their ranks; false when the list is malformed or a rank has
// no known node. A node whose other ranks train on is alive: a process failed there, not the node.
bool read_lost(const json& plan, const std::map<int, std::string>& node_of_rank, InPlaceRecovery& r) {
  auto lost = plan.find("lost");
  if (lost == plan.end() || !lost->is_array() || lost->empty()) return false;
  for (const auto& rank : *lost) {
    if (!rank.is_number_integer()) return false;
    const auto value = rank.get<std::int64_t>();
    if (value < 0 || value > std::numeric_limits<int>::max()) return false;
    if (node_of_rank.count(static_cast<int>(value)) == 0) return false;
    r.lost_ranks.push_back(static_cast<int>(value));
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

// The plan's takeover ({"<rank>": "<node>.<local id>"}) as rank -> node; false when malformed.
bool read_takeover(const json& plan, InPlaceRecovery& r) {
  auto takeover = plan.find("takeover");
  if (takeover == plan.end() || !takeover->is_object()) return false;
  for (const auto& [rank_text, slot] : takeover->items()) {
    auto rank = ckpt::parse_uint(rank_text);
    if (!rank || *rank > static_cast<std::uint64_t>(std::numeric_limits<int>::max()) || !slot.is_string()) return false;
    const std::string text = slot.get<std::string>();
    const std::string node = text.substr(0, text.rfind('.'));
    auto names = rec::expand_hostlist(node, 1);
    if (!names || names->size() != 1 || (*names)[0] != node) return false;
    r.replacement_node[static_cast<int>(*rank)] = node;
  }
  return true;
}

// The phases file's times and step; false when one is malformed or detection or the first step is missing.
bool read_phases(const json& phases, InPlaceRecovery& r) {
  const std::pair<const char*, double rec::InPlacePhases::*> fields[] = {
      {"detect", &rec::InPlacePhases::detected},   {"decided", &rec::InPlacePhases::agreed},
      {"last_words_done", &rec::InPlacePhases::last_words_done}, {"group", &rec::InPlacePhases::regrouped},
      {"restored", &rec::InPlacePhases::restored}, {"first_step", &rec::InPlacePhases::resumed}};
  for (const auto& [key, field] : fields) {
    auto t = time_of(phases, key);
    if (!t) return false;
    r.phases.*field = *t;
  }
  if (r.phases.detected == 0 || r.phases.resumed == 0) return false;
  auto step = phases.find("step");
  if (step != phases.end() && !step->is_null()) {
    if (!step->is_number_unsigned()) return false;
    r.resume_step = step->get<std::uint64_t>();
  }
  return true;
}

}  // namespace

std::string munge_socket_from_slurm() {
  slurm_conf_t* conf = nullptr;
  if (slurm_load_ctl_conf(0, &conf) != SLURM_SUCCESS || conf == nullptr) return {};
  std::string info = conf->authinfo ? conf->authinfo : "";
  slurm_free_ctl_conf(conf);
  auto pos = info.find("socket=");
  if (pos == std::string::npos) return {};
  auto end = info.find(',', pos);
  return info.substr(pos + 7, end == std::string::npos ? std::string::npos : end - pos - 7);
}

std::uint32_t slurm_user_uid() {
  slurm_conf_t* conf = nullptr;
  if (slurm_load_ctl_conf(0, &conf) != SLURM_SUCCESS || conf == nullptr) return 0;
  const std::uint32_t uid = conf->slurm_user_id;
  slurm_free_ctl_conf(conf);
  return uid;
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
  ckpt::posix::Fd dir(::open(inplace_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return std::nullopt;
  const std::string name = "gen-" + std::to_string(generation);
  try {
    auto plan = read_json_object(dir.get(), name + ".plan");
    auto phases = read_json_object(dir.get(), name + ".phases");
    if (!plan || !phases || plan->contains("abandon")) return std::nullopt;
    if (!generation_is(*plan, generation) || !generation_is(*phases, generation)) return std::nullopt;
    InPlaceRecovery r;
    r.generation = generation;
    if (!read_lost(*plan, node_of_rank, r) || !read_takeover(*plan, r) || !read_phases(*phases, r)) {
      return std::nullopt;
    }
    return r;
  } catch (const std::exception&) {
    return std::nullopt;  // a value of a type the checks above let through but json cannot convert
  }
}

}  // namespace ckpt::controller
