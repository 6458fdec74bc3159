// The controller's data formats: Slurm hostlists, job events and the persisted job record (JSON).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <type_traits>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "ckpt/controller_limits.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/recovery.hpp"

namespace ckpt::recovery {

using nlohmann::json;

// ---- hostlists -------------------------------------------------------------------------------------------------

namespace {

// Splits at commas outside brackets.
Result<std::vector<std::string_view>> split_top(std::string_view list) {
  std::vector<std::string_view> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == '[') {
      if (++depth > 1) return Error{"nested '[' in hostlist"};
    } else if (c == ']') {
      if (--depth < 0) return Error{"unbalanced ']' in hostlist"};
    } else if (c == ',' && depth == 0) {
      parts.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) return Error{"unbalanced '[' in hostlist"};
  parts.push_back(list.substr(start));
  return parts;
}

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'; }

// A host name is at most 255 bytes (DNS: 253): with the count limit this bounds an expansion's memory, whatever a
// user writes in a node list that root expands (65,536 names of 255 bytes: 16 MiB).
constexpr std::size_t kMaxHostName = 255;
constexpr std::size_t kMaxHostlistText = 1 << 20;

Status expand_one(std::string_view item, std::vector<std::string>& out, std::size_t limit) {
  auto open = item.find('[');
  if (open == std::string_view::npos) {
    if (item.empty()) return Status::failure("empty name in hostlist");
    if (item.size() > kMaxHostName) return Status::failure("hostlist name longer than 255 bytes");
    if (!std::all_of(item.begin(), item.end(), name_char)) {
      return Status::failure("bad character in hostlist name '" + std::string(item) + "'");
    }
    if (out.size() >= limit) return Status::failure("hostlist has too many names");
    out.emplace_back(item);
    return Status::success();
  }
  auto close = item.find(']', open);
  if (close == std::string_view::npos) return Status::failure("unbalanced '[' in hostlist");
  std::string_view prefix = item.substr(0, open);
  std::string_view ranges = item.substr(open + 1, close - open - 1);
  std::string_view suffix = item.substr(close + 1);
  if (!std::all_of(prefix.begin(), prefix.end(), name_char)) return Status::failure("bad hostlist prefix");
  std::size_t pos = 0;
  while (pos <= ranges.size()) {
    auto comma = ranges.find(',', pos);
    if (comma == std::string_view::npos) comma = ranges.size();
    std::string_view range = ranges.substr(pos, comma - pos);
    auto dash = range.find('-');
    std::string_view lo_text = range.substr(0, dash);
    std::string_view hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
    auto lo = parse_uint(lo_text);
    auto hi = parse_uint(hi_text);
    if (!lo || !hi || *hi < *lo) return Status::failure("bad hostlist range '" + std::string(range) + "'");
    if (*hi - *lo >= limit) return Status::failure("hostlist has too many names");
    const std::size_t width = lo_text.size();
    for (std::uint64_t n = *lo; n <= *hi; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      // A suffix with brackets of its own is expanded (and bounded) by the recursive call.
      const std::size_t tail = suffix.find('[') == std::string_view::npos ? suffix.size() : 0;
      if (prefix.size() + digits.size() + tail > kMaxHostName) {
        return Status::failure("hostlist name longer than 255 bytes");
      }
      std::string name = std::string(prefix) + digits;
      if (suffix.find('[') != std::string_view::npos) {
        auto status = expand_one(name + std::string(suffix), out, limit);
        if (!status) return status;
      } else {
        if (!std::all_of(suffix.begin(), suffix.end(), name_char)) return Status::failure("bad hostlist suffix");
        if (out.size() >= limit) return Status::failure("hostlist has too many names");
        out.push_back(name + std::string(suffix));
      }
    }
    pos = comma + 1;
  }
  return Status::success();
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(std::string_view list, std::size_t limit) {
  std::vector<std::string> out;
  if (list.empty() || list == "(null)") return out;
  if (list.size() > kMaxHostlistText) return Error{"hostlist longer than 1 MiB"};
  auto parts = split_top(list);
  if (!parts) return Error{parts.error()};
  for (auto part : *parts) {
    auto status = expand_one(part, out, limit);
    if (!status) return Error{status.error()};
  }
  return out;
}

bool safe_node_name(const std::string& name) {
  return !name.empty() && name.size() <= kMaxHostName && std::all_of(name.begin(), name.end(), name_char);
}

std::string join_nodes(const std::vector<std::string>& nodes) {
  std::string out;
  for (const auto& n : nodes) {
    if (!out.empty()) out += ',';
    out += n;
  }
  return out;
}

// ---- events -----------------------------------------------------------------------------------------------------

const char* to_string(EventType type) {
  switch (type) {
    case EventType::JobStart: return "job_start";
    case EventType::TaskExit: return "task_exit";
    case EventType::JobEnd: return "job_end";
    case EventType::Handover: return "handover";
    case EventType::Relaunch: return "relaunch";
    case EventType::InPlace: return "in-place";
    case EventType::SlowNode: return "slow_node";
  }
  return "?";
}

namespace {

constexpr std::size_t kMaxEventBytes = 16 * 1024;
constexpr std::size_t kMaxFailedNodes = 4096;   // nodes one in-place recovery may name
constexpr double kLatestTime = 4102444800.0;    // 2100-01-01: a later "unix time" is garbage

bool safe_text(const std::string& text, std::size_t max) {
  return text.size() <= max && std::none_of(text.begin(), text.end(), [](char c) {
           return static_cast<unsigned char>(c) < 0x20 && c != '\t';
         });
}

template <class T>
T number(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) throw std::runtime_error(std::string(key) + " is not a number");
  if constexpr (std::is_floating_point_v<T>) {
    return it->get<T>();
  } else {
    if (it->is_number_float()) throw std::runtime_error(std::string(key) + " is not an integer");
    if (it->is_number_unsigned()) {
      auto v = it->get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
        throw std::runtime_error(std::string(key) + " is out of range");
      }
      return static_cast<T>(v);
    }
    auto v = it->get<std::int64_t>();
    if (v < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
        (v > 0 && static_cast<std::uint64_t>(v) > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))) {
      throw std::runtime_error(std::string(key) + " is out of range");
    }
    return static_cast<T>(v);
  }
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_string()) throw std::runtime_error(std::string(key) + " is not a string");
  return it->get<std::string>();
}

bool flag(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean()) throw std::runtime_error(std::string(key) + " is not a boolean");
  return it->get<bool>();
}

Status read_type(const json& j, Event& e) {
  std::string type = text(j, "type");
  if (type == "job_start") e.type = EventType::JobStart;
  else if (type == "task_exit") e.type = EventType::TaskExit;
  else if (type == "job_end") e.type = EventType::JobEnd;
  else if (type == "handover") e.type = EventType::Handover;
  else if (type == "in-place") e.type = EventType::InPlace;
  else if (type == "relaunch") e.type = EventType::Relaunch;
  else if (type == "slow_node") e.type = EventType::SlowNode;
  else return Status::failure("unknown event type '" + type.substr(0, 32) + "'");
  return Status::success();
}

// Which job, step and node sent the event, as whom and when; every type carries these.
Status read_origin(const json& j, Event& e) {
  e.job_id = number<std::uint32_t>(j, "job_id", 0);
  if (e.job_id == 0) return Status::failure("event has no job_id");
  e.step_id = number<std::uint32_t>(j, "step_id", kBatchStep);
  e.restart_count = number<std::uint32_t>(j, "restart_count", 0);
  if (e.restart_count > kMaxRestartCount) {
    return Status::failure("event has restart_count " + std::to_string(e.restart_count) + " (more than " +
                           std::to_string(kMaxRestartCount) + ")");
  }
  e.node = text(j, "node");
  if (!safe_node_name(e.node)) return Status::failure("event has a bad node name");
  e.uid = number<std::uint32_t>(j, "uid", 0);
  e.time = number<double>(j, "time", 0.0);
  if (!std::isfinite(e.time)) return Status::failure("event time is not finite");
  return Status::success();
}

// A task's exit, checked whatever the type as the in-place fields are.
Status read_exit_status(const json& j, Event& e) {
  e.rank = number<std::int64_t>(j, "rank", -1);
  e.exit_code = number<int>(j, "exit_code", 0);
  e.signal = number<int>(j, "signal", 0);
  if (e.exit_code < 0 || e.exit_code > 255 || e.signal < 0 || e.signal > 128) {
    return Status::failure("event has a bad exit status");
  }
  return Status::success();
}

// What a job's start tells of it (where it checkpoints, its budget, its size), checked whatever the type.
Status read_job_start(const json& j, Event& e) {
  e.ckpt_dir = text(j, "ckpt_dir");
  if (!safe_text(e.ckpt_dir, 4096) || (!e.ckpt_dir.empty() && e.ckpt_dir[0] != '/')) {
    return Status::failure("event has a bad ckpt_dir");
  }
  e.trusted_dirs = text(j, "trusted_dirs");
  if (!safe_text(e.trusted_dirs, 4096) || (!e.trusted_dirs.empty() && e.trusted_dirs[0] != '/')) {
    return Status::failure("event has bad trusted_dirs");
  }
  if (j.contains("max_restarts") && !j["max_restarts"].is_null()) {
    e.max_restarts = number<std::uint64_t>(j, "max_restarts", 0);
    if (*e.max_restarts > kMaxRestartBudget) {
      return Status::failure("event has max_restarts " + std::to_string(*e.max_restarts) + " (more than " +
                             std::to_string(kMaxRestartBudget) + ")");
    }
  }
  e.needs_checkpoint = flag(j, "needs_checkpoint");
  e.in_allocation = flag(j, "in_allocation");
  e.nnodes = number<std::uint32_t>(j, "nnodes", 0);
  e.spares = number<std::uint32_t>(j, "spares", 0);
  if (e.spares > kMaxNodesPerStep) return Status::failure("event has " + std::to_string(e.spares) + " spares");
  return Status::success();
}

// The phase times of an in-place recovery, in the order they happen, with their JSON names.
constexpr std::pair<const char*, double InPlacePhases::*> kPhaseFields[] = {
    {"detected", &InPlacePhases::detected},   {"agreed", &InPlacePhases::agreed},
    {"last_words_done", &InPlacePhases::last_words_done}, {"regrouped", &InPlacePhases::regrouped},
    {"restored", &InPlacePhases::restored},   {"resumed", &InPlacePhases::resumed}};

// The in-place fields, checked whatever the type (a field never carries junk); `in_place` requires them.
Status read_in_place(const json& j, Event& e) {
  const bool in_place = e.type == EventType::InPlace;
  e.failed_nodes = text(j, "failed_nodes");
  if (e.failed_nodes.size() > 4096) return Status::failure("event failed_nodes is longer than 4096 bytes");
  auto nodes = expand_hostlist(e.failed_nodes, kMaxFailedNodes);
  if (!nodes) {  // the hostlist's own error would echo the sender's text
    return Status::failure("event has bad failed_nodes (a Slurm hostlist of at most " +
                           std::to_string(kMaxFailedNodes) + " names of letters, digits, '-', '_' and '.')");
  }
  e.generation = number<std::uint32_t>(j, "generation", 0);
  if (in_place && e.generation == 0) return Status::failure("in-place event has no generation");
  if (j.contains("resume_step") && !j["resume_step"].is_null()) {
    e.resume_step = number<std::uint64_t>(j, "resume_step", 0);
  }
  for (const auto& [key, field] : kPhaseFields) {
    const double t = number<double>(j, key, 0.0);
    if (!std::isfinite(t) || t < 0 || t > kLatestTime) {
      return Status::failure(std::string("event ") + key + " is not a time between 1970 and 2100");
    }
    e.phases.*field = t;
  }
  if (in_place && (e.phases.detected == 0 || e.phases.resumed < e.phases.detected)) {
    return Status::failure("in-place event needs detected, and resumed not before it");
  }
  return Status::success();
}

// The slow-node fields, checked whatever the type as the in-place ones are; `slow` requires them.
Status read_slow_node(const json& j, Event& e) {
  const bool slow = e.type == EventType::SlowNode;
  e.slow_node = text(j, "slow_node");
  if ((slow || !e.slow_node.empty()) && !safe_node_name(e.slow_node)) {
    return Status::failure(slow && e.slow_node.empty() ? "slow_node event has no slow_node"
                                                       : "event has a bad slow_node name");
  }
  e.score = number<double>(j, "score", 0.0);
  // !(x > 0) refuses a NaN too, should one ever get here (JSON has none; an overflowing number does not parse).
  if ((slow || e.score != 0) && (!(e.score > 0) || e.score > 1)) {
    return Status::failure("event score is not a number in (0, 1]");
  }
  e.action = text(j, "action");
  if ((slow || !e.action.empty()) && e.action != kSlowNodeReport && e.action != kSlowNodeExclude) {
    return Status::failure(std::string("event action is not '") + kSlowNodeReport + "' or '" + kSlowNodeExclude +
                           "'");
  }
  return Status::success();
}

}  // namespace

std::string to_json(const Event& e) {
  json j = {{"v", 1},
            {"type", to_string(e.type)},
            {"job_id", e.job_id},
            {"step_id", e.step_id},
            {"restart_count", e.restart_count},
            {"node", e.node},
            {"uid", e.uid},
            {"time", e.time}};
  if (e.type == EventType::TaskExit) {
    j["rank"] = e.rank;
    j["exit_code"] = e.exit_code;
    j["signal"] = e.signal;
  }
  if (e.type == EventType::JobStart) {
    j["ckpt_dir"] = e.ckpt_dir;
    if (!e.trusted_dirs.empty()) j["trusted_dirs"] = e.trusted_dirs;
    if (e.max_restarts) j["max_restarts"] = *e.max_restarts;
    j["needs_checkpoint"] = e.needs_checkpoint;
    j["in_allocation"] = e.in_allocation;
    j["nnodes"] = e.nnodes;
    if (e.spares > 0) j["spares"] = e.spares;
  }
  if (e.type == EventType::InPlace) {
    j["failed_nodes"] = e.failed_nodes;
    j["generation"] = e.generation;
    if (e.resume_step) j["resume_step"] = *e.resume_step;
    for (const auto& [key, field] : kPhaseFields) j[key] = e.phases.*field;
  }
  if (e.type == EventType::Relaunch) {
    j["failed_nodes"] = e.failed_nodes;
    if (e.resume_step) j["resume_step"] = *e.resume_step;
  }
  if (e.type == EventType::SlowNode) {
    j["slow_node"] = e.slow_node;
    j["score"] = e.score;
    j["action"] = e.action;
  }
  if (!e.detail.empty()) j["detail"] = e.detail;
  return j.dump();
}

Result<Event> parse_event(std::string_view input) {
  if (input.size() > kMaxEventBytes) return Error{"event is larger than 16 KiB"};
  try {
    json j = json::parse(input.begin(), input.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Error{"event is not a JSON object"};
    if (number<int>(j, "v", 0) != 1) return Error{"unsupported event version"};
    Event e;
    if (Status s = read_type(j, e); !s) return Error{s.error()};
    if (Status s = read_origin(j, e); !s) return Error{s.error()};
    if (Status s = read_exit_status(j, e); !s) return Error{s.error()};
    if (Status s = read_job_start(j, e); !s) return Error{s.error()};
    e.detail = text(j, "detail");
    if (!safe_text(e.detail, 1024)) return Error{"event detail is too long or has control characters"};
    if (Status s = read_in_place(j, e); !s) return Error{s.error()};
    if (Status s = read_slow_node(j, e); !s) return Error{s.error()};
    if (e.type == EventType::Relaunch && e.step_id == kBatchStep) return Error{"relaunch event names no step"};
    return e;
  } catch (const std::exception& ex) {
    return Error{std::string("bad event: ") + ex.what()};
  }
}

// ---- the job record ---------------------------------------------------------------------------------------------

namespace {

json strings(const std::vector<std::string>& v) { return json(v); }

std::vector<std::string> strings_of(const json& j, const char* key) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) throw std::runtime_error(std::string(key) + " is not an array");
  for (const auto& v : *it) out.push_back(v.get<std::string>());
  return out;
}

json slow_nodes_json(const std::vector<SlowNode>& slow_nodes) {
  json out = json::array();
  for (const auto& s : slow_nodes) {
    out.push_back({{"node", s.node}, {"score", s.score}, {"time", s.time}, {"action", s.action}});
  }
  return out;
}

}  // namespace

std::string to_json(const JobRecord& r) {
  json j;
  j["job_id"] = r.job_id;
  j["state"] = to_string(r.state);
  j["uid"] = r.uid;
  j["uid_known"] = r.uid_known;
  j["gid"] = r.gid;
  j["submit_time"] = r.submit_time;
  j["ckpt_dir"] = r.ckpt_dir;
  j["trusted_dirs"] = r.trusted_dirs;
  j["needs_checkpoint"] = r.needs_checkpoint;
  j["restart_count"] = r.restart_count;
  if (r.spares > 0) j["spares"] = r.spares;
  j["budget"] = {{"max_restarts", r.budget.max_restarts},
                 {"restarts", r.budget.restarts},
                 {"without_progress", r.budget.without_progress},
                 {"progress_step", r.budget.progress_step ? json(*r.budget.progress_step) : json(nullptr)}};
  json failures = json::array();
  for (const auto& f : r.failures) {
    failures.push_back({{"step_id", f.step_id}, {"node", f.node}, {"rank", f.rank}, {"exit_code", f.exit_code},
                        {"signal", f.signal}, {"time", f.time}});
  }
  j["failures"] = failures;
  j["reporters"] = strings(r.reporters);
  j["replaced_in_place"] = strings(r.replaced_in_place);
  j["nodes"] = strings(r.nodes);
  j["batch_host"] = r.batch_host;
  json steps = json::object();
  for (const auto& [id, s] : r.steps) {
    steps[std::to_string(id)] = {{"in_allocation", s.in_allocation}, {"nodes", s.nodes}};
  }
  j["steps"] = steps;
  json bad = json::array();
  for (const auto& b : r.bad_nodes) {
    bad.push_back({{"node", b.node}, {"reason", b.reason}, {"since", b.since}, {"expires", b.expires}});
  }
  j["bad_nodes"] = bad;
  if (r.own_excluded) j["own_excluded"] = strings(*r.own_excluded);
  j["slow_nodes"] = slow_nodes_json(r.slow_nodes);
  if (r.intent) {
    const Intent& i = *r.intent;
    j["intent"] = {{"id", i.id},           {"phase", to_string(i.phase)},    {"requeue", i.requeue},
                   {"expected_restart", i.expected_restart}, {"exclude", i.exclude}, {"mark_down", i.mark_down},
                   {"drain", i.drain},     {"reason", i.reason},             {"created", i.created},
                   {"not_before", i.not_before}, {"min_nodes", i.min_nodes},
                   {"min_tasks", i.min_tasks}};
  }
  if (r.relaunch_step) j["relaunch_step"] = *r.relaunch_step;
  if (r.ended_steps) j["ended_steps"] = *r.ended_steps;
  j["handover"] = r.handover;
  j["end_reported"] = r.end_reported;
  j["reason"] = r.reason;
  if (r.ending) j["ending"] = to_string(*r.ending);
  j["clock"] = {{"failed", r.clock.failed}, {"decided", r.clock.decided}, {"slurm_done", r.clock.slurm_done},
                {"launched", r.clock.launched}, {"path", r.clock.path},
                {"last_words_done", r.clock.last_words_done}, {"restored", r.clock.restored}};
  j["lost_work_s"] = r.lost_work_s;
  j["created"] = r.created;
  j["updated"] = r.updated;
  return j.dump();
}

namespace {

void read_budget(const json& j, Budget& b) {
  auto it = j.find("budget");
  if (it == j.end() || !it->is_object()) return;
  b.max_restarts = number<std::uint64_t>(*it, "max_restarts", 3);
  b.restarts = number<std::uint64_t>(*it, "restarts", 0);
  b.without_progress = number<std::uint64_t>(*it, "without_progress", 0);
  if (it->contains("progress_step") && !(*it)["progress_step"].is_null()) {
    b.progress_step = number<std::uint64_t>(*it, "progress_step", 0);
  }
}

void read_failures(const json& j, std::vector<TaskFailure>& failures) {
  auto it = j.find("failures");
  if (it == j.end() || !it->is_array()) return;
  for (const auto& f : *it) {
    failures.push_back(TaskFailure{number<std::uint32_t>(f, "step_id", 0), text(f, "node"),
                                   number<std::int64_t>(f, "rank", -1), number<int>(f, "exit_code", 0),
                                   number<int>(f, "signal", 0), number<double>(f, "time", 0.0)});
  }
}

Status read_steps(const json& j, std::map<std::uint32_t, StepInfo>& steps) {
  auto it = j.find("steps");
  if (it == j.end() || !it->is_object()) return Status::success();
  for (const auto& [key, s] : it->items()) {
    auto id = parse_uint(key);
    if (!id || *id > 0xffffffffULL) return Status::failure("job record has a bad step id");
    steps[static_cast<std::uint32_t>(*id)] = StepInfo{flag(s, "in_allocation"), strings_of(s, "nodes")};
  }
  return Status::success();
}

void read_bad_nodes(const json& j, std::vector<BadNode>& bad_nodes) {
  auto it = j.find("bad_nodes");
  if (it == j.end() || !it->is_array()) return;
  for (const auto& b : *it) {
    bad_nodes.push_back(BadNode{text(b, "node"), text(b, "reason"), number<double>(b, "since", 0.0),
                                number<double>(b, "expires", 0.0)});
  }
}

// Absent from records stored before slow-node reports existed: none.
void read_slow_nodes(const json& j, std::vector<SlowNode>& slow_nodes) {
  auto it = j.find("slow_nodes");
  if (it == j.end() || !it->is_array()) return;
  for (const auto& s : *it) {
    slow_nodes.push_back(SlowNode{text(s, "node"), number<double>(s, "score", 0.0), number<double>(s, "time", 0.0),
                                  text(s, "action")});
  }
}

Status read_intent(const json& j, std::optional<Intent>& intent) {
  auto it = j.find("intent");
  if (it == j.end() || !it->is_object()) return Status::success();
  Intent i;
  i.id = number<std::uint64_t>(*it, "id", 0);
  auto phase = parse_intent_phase(text(*it, "phase"));
  if (!phase) return Status::failure("job record has a bad intent phase");
  i.phase = *phase;
  i.requeue = flag(*it, "requeue");
  i.expected_restart = number<std::uint32_t>(*it, "expected_restart", 0);
  i.exclude = strings_of(*it, "exclude");
  i.mark_down = strings_of(*it, "mark_down");
  i.drain = strings_of(*it, "drain");
  i.reason = text(*it, "reason");
  i.created = number<double>(*it, "created", 0.0);
  i.not_before = number<double>(*it, "not_before", 0.0);
  i.min_nodes = number<std::uint32_t>(*it, "min_nodes", 0);
  i.min_tasks = number<std::uint32_t>(*it, "min_tasks", 0);
  intent = i;
  return Status::success();
}

void read_ending(const json& j, std::optional<Ending>& ending) {
  std::string name = text(j, "ending");
  for (Ending e : {Ending::NodeFailure, Ending::TaskCrash, Ending::TimeLimit, Ending::Preemption,
                   Ending::OutOfMemory, Ending::UserCancel, Ending::CleanExit, Ending::DoNotRestart}) {
    if (name == to_string(e)) ending = e;
  }
}

void read_clock(const json& j, RecoveryClock& clock) {
  auto it = j.find("clock");
  if (it == j.end() || !it->is_object()) return;
  clock.failed = number<double>(*it, "failed", 0.0);
  clock.decided = number<double>(*it, "decided", 0.0);
  clock.slurm_done = number<double>(*it, "slurm_done", 0.0);
  clock.launched = number<double>(*it, "launched", 0.0);
  clock.path = text(*it, "path");
  clock.last_words_done = number<double>(*it, "last_words_done", 0.0);
  clock.restored = number<double>(*it, "restored", 0.0);
}

}  // namespace

Result<JobRecord> parse_job_record(std::string_view input) {
  try {
    json j = json::parse(input.begin(), input.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Error{"job record is not a JSON object"};
    JobRecord r;
    r.job_id = number<std::uint32_t>(j, "job_id", 0);
    auto state = parse_job_state(text(j, "state"));
    if (!state || r.job_id == 0) return Error{"job record has no valid job_id or state"};
    r.state = *state;
    r.uid = number<std::uint32_t>(j, "uid", 0);
    r.uid_known = flag(j, "uid_known");
    r.gid = number<std::uint32_t>(j, "gid", 0);
    r.submit_time = number<double>(j, "submit_time", 0.0);
    r.ckpt_dir = text(j, "ckpt_dir");
    r.trusted_dirs = text(j, "trusted_dirs");
    r.needs_checkpoint = flag(j, "needs_checkpoint");
    r.restart_count = number<std::uint32_t>(j, "restart_count", 0);
    r.spares = std::min(number<std::uint32_t>(j, "spares", 0), static_cast<std::uint32_t>(kMaxNodesPerStep));
    read_budget(j, r.budget);
    read_failures(j, r.failures);
    r.reporters = strings_of(j, "reporters");
    r.replaced_in_place = strings_of(j, "replaced_in_place");
    r.nodes = strings_of(j, "nodes");
    r.batch_host = text(j, "batch_host");
    if (Status s = read_steps(j, r.steps); !s) return Error{s.error()};
    read_bad_nodes(j, r.bad_nodes);
    if (j.contains("own_excluded") && j["own_excluded"].is_array()) r.own_excluded = strings_of(j, "own_excluded");
    read_slow_nodes(j, r.slow_nodes);
    if (Status s = read_intent(j, r.intent); !s) return Error{s.error()};
    if (j.contains("ended_steps") && !j["ended_steps"].is_null()) {
      r.ended_steps = number<std::uint32_t>(j, "ended_steps", 0);
    }
    if (j.contains("relaunch_step") && !j["relaunch_step"].is_null()) {
      r.relaunch_step = number<std::uint32_t>(j, "relaunch_step", 0);
    }
    r.handover = flag(j, "handover");
    r.end_reported = flag(j, "end_reported");
    r.reason = text(j, "reason");
    read_ending(j, r.ending);
    read_clock(j, r.clock);
    r.lost_work_s = number<double>(j, "lost_work_s", 0.0);
    r.created = number<double>(j, "created", 0.0);
    r.updated = number<double>(j, "updated", 0.0);
    return r;
  } catch (const std::exception& ex) {
    return Error{std::string("bad job record: ") + ex.what()};
  }
}

// ---- the survivors' record of lost peers --------------------------------------------------------------------------

std::string to_json(const PeerLost& lost) {
  return json{{"job_id", lost.job_id}, {"restart_count", lost.restart_count}, {"nodes", lost.nodes},
              {"time", lost.time}}.dump();
}

std::optional<PeerLost> parse_peer_lost(std::string_view input) {
  if (input.size() > kMaxEventBytes * 64) return std::nullopt;
  json j = json::parse(input.begin(), input.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  const json& id = j["job_id"];
  const json& count = j["restart_count"];
  const json& nodes = j["nodes"];
  if (!id.is_string() || !count.is_number_unsigned() || !nodes.is_array() || nodes.size() > kMaxNodesPerStep) {
    return std::nullopt;
  }
  PeerLost lost;
  lost.job_id = id.get<std::string>();
  if (!safe_text(lost.job_id, 64) || count.get<std::uint64_t>() > kMaxRestartCount) return std::nullopt;
  lost.restart_count = static_cast<std::uint32_t>(count.get<std::uint64_t>());
  for (const auto& n : nodes) {
    if (!n.is_string() || !safe_node_name(n.get<std::string>())) return std::nullopt;
    if (std::find(lost.nodes.begin(), lost.nodes.end(), n.get<std::string>()) == lost.nodes.end()) {
      lost.nodes.push_back(n.get<std::string>());
    }
  }
  if (j["time"].is_number() && std::isfinite(j["time"].get<double>())) lost.time = j["time"].get<double>();
  return lost;
}

}  // namespace ckpt::recovery
