// Reads: status, jobs, one job, its history and the Prometheus text, limited to what the reader may see
// (engine_internal.hpp).
#include "engine_internal.hpp"

#include "ckpt/recovery_plan.hpp"
#include "log.hpp"

namespace ckpt::controller {
using namespace ckpt::toolkit;  // the log

using namespace engine_detail;

// ---- views ---------------------------------------------------------------------------------------------------------

namespace {

// The record's slow-node reports, oldest first, as the job's record has them in JSON.
json slow_nodes(const std::vector<rec::SlowNode>& reports) {
  json out = json::array();
  for (const auto& s : reports) {
    out.push_back(json{{"node", s.node}, {"score", s.score}, {"time", s.time}, {"action", s.action}});
  }
  return out;
}

json job_summary(const rec::JobRecord& r, double now) {
  return json{{"job_id", r.job_id},
              {"state", rec::to_string(r.state)},
              {"restart_count", r.restart_count},
              {"restarts", r.budget.restarts},
              {"restarts_without_progress", r.budget.without_progress},
              {"max_restarts", r.budget.max_restarts},
              {"progress_step", r.budget.progress_step ? json(*r.budget.progress_step) : json(nullptr)},
              {"excluded_nodes", rec::active_bad_nodes(r.bad_nodes, now)},
              {"slow_nodes", slow_nodes(r.slow_nodes)},
              {"ending", r.ending ? rec::to_string(*r.ending) : ""},
              {"reason", r.reason},
              {"updated", r.updated}};
}

// The last finished recovery by phase, as history's "running again" line has it; null while none finished.
json last_recovery(const rec::RecoveryClock& clock) {
  if (clock.failed <= 0 || clock.launched <= 0) return nullptr;
  json phases = json::object();
  for (const auto& phase : rec::recovery_phases(clock)) phases[phase.name] = phase.seconds;
  return json{{"path", clock.path.empty() ? "requeue" : clock.path},
              {"total_s", clock.launched - clock.failed},
              {"phases_s", phases}};
}

}  // namespace

rec::ReadAccess Engine::read_access(std::optional<std::uint32_t> uid) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<std::uint32_t> privileged = trusted_uids_;
  privileged.insert(admin_uids_.begin(), admin_uids_.end());
  return rec::read_access(uid, privileged);
}

json Engine::status_json(double now, const rec::ReadAccess& access) {
  std::lock_guard<std::mutex> lock(mutex_);
  json counts = json::object();
  json gave_up = json::array();
  std::map<std::string, json> bad;
  for (const auto& [id, r] : jobs_) {
    counts[rec::to_string(r.state)] = counts.value(rec::to_string(r.state), 0) + 1;
    if (!access.may_see(r.uid, r.uid_known)) continue;
    if (r.state == JobState::GaveUp) gave_up.push_back(json{{"job_id", id}, {"reason", r.reason}, {"time", r.updated}});
    for (const auto& b : r.bad_nodes) {
      if (b.expires <= now) continue;
      json& entry = bad[b.node];
      if (entry.is_null()) entry = json{{"node", b.node}, {"reason", b.reason}, {"expires", b.expires}, {"jobs", json::array()}};
      entry["jobs"].push_back(id);
      entry["expires"] = std::max(entry["expires"].get<double>(), b.expires);
    }
  }
  json bad_list = json::array();
  for (auto& [n, j] : bad) bad_list.push_back(j);
  return json{{"backend", backend_.name()},
              {"can_requeue", caps_.requeue},
              {"can_change_nodes", caps_.node_state},
              {"uptime_s", now - started_},
              {"jobs", counts},
              {"gave_up", gave_up},
              {"excluded_nodes", bad_list}};
}

json Engine::jobs_json(double now, const rec::ReadAccess& access) {
  std::lock_guard<std::mutex> lock(mutex_);
  json out = json::array();
  for (const auto& [id, r] : jobs_) {
    if (access.may_see(r.uid, r.uid_known)) out.push_back(job_summary(r, now));
  }
  return out;
}

std::optional<json> Engine::job_json(std::uint32_t job_id, double now, const rec::ReadAccess& access) {
  std::lock_guard<std::mutex> lock(mutex_);
  const JobRecord* r = find(job_id);
  std::optional<JobRecord> stored;
  if (r == nullptr) {
    auto loaded = db_.load_job(job_id);
    if (!loaded || !*loaded) return std::nullopt;
    stored = **loaded;
    r = &*stored;
  }
  if (!access.may_see(r->uid, r->uid_known)) return std::nullopt;
  json j = json::parse(rec::to_json(*r));
  j["summary"] = job_summary(*r, now);
  j["exclude"] = rec::active_bad_nodes(r->bad_nodes, now);
  j["last_recovery"] = last_recovery(r->clock);
  return j;
}

Result<std::optional<json>> Engine::history_json(std::uint32_t job_id, const rec::ReadAccess& access) {
  std::lock_guard<std::mutex> lock(mutex_);
  const JobRecord* r = find(job_id);
  std::optional<JobRecord> stored;
  if (r == nullptr) {
    auto loaded = db_.load_job(job_id);
    if (!loaded) return Error{loaded.error()};
    if (!*loaded) return std::optional<json>{};
    stored = **loaded;
    r = &*stored;
  }
  if (!access.may_see(r->uid, r->uid_known)) return std::optional<json>{};
  flush();
  auto lines = db_.history(job_id);
  if (!lines) return Error{lines.error()};
  if (auto it = rejected_.find(job_id); it != rejected_.end()) {
    lines->insert(lines->end(), it->second.begin(), it->second.end());
    std::stable_sort(lines->begin(), lines->end(), [](const HistoryLine& a, const HistoryLine& b) { return a.time < b.time; });
  }
  json out = json::array();
  for (const auto& h : *lines) {
    out.push_back(json{{"time", h.time}, {"restart_count", h.restart_count}, {"kind", h.kind}, {"text", h.text}});
  }
  return std::optional<json>(std::move(out));
}

std::string Engine::metrics_text(double now) {
  std::string out = metrics_.render();
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, int> counts;
  std::set<std::string> excluded;
  for (const auto& [id, r] : jobs_) {
    ++counts[rec::to_string(r.state)];
    for (const auto& n : rec::active_bad_nodes(r.bad_nodes, now)) excluded.insert(n);
  }
  out += "# HELP ckpt_controller_jobs Jobs tracked, by recovery state\n# TYPE ckpt_controller_jobs gauge\n";
  for (const char* state : {"running", "failing", "relaunching", "requeueing", "pending", "completed", "cancelled",
                            "gave-up", "gone"}) {
    out += std::string("ckpt_controller_jobs{state=\"") + state + "\"} " + std::to_string(counts[state]) + "\n";
  }
  out += "# HELP ckpt_controller_excluded_nodes Nodes currently excluded from at least one job\n"
         "# TYPE ckpt_controller_excluded_nodes gauge\n";
  out += "ckpt_controller_excluded_nodes " + std::to_string(excluded.size()) + "\n";
  out += "# HELP ckpt_controller_node_excluded A node currently excluded from at least one job\n"
         "# TYPE ckpt_controller_node_excluded gauge\n";
  for (const auto& n : excluded) out += "ckpt_controller_node_excluded{node=\"" + n + "\"} 1\n";
  return out;
}

std::size_t Engine::tracked_jobs() {
  std::lock_guard<std::mutex> lock(mutex_);
  return jobs_.size();
}

}  // namespace ckpt::controller
