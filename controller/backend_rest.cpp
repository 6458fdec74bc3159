// The slurmrestd backend (openapi/v0.0.38) over libcurl with a JWT. For controllers that run off the cluster.
// v0.0.38 has no requeue operation and no node update, so this backend cannot requeue a job or change node
// states: the engine then relies on Slurm's own node-failure requeue and only expedites it (StartTime=now,
// ExcNodeList), which it can do here. The token is sent in a header and never logged.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include <nlohmann/json.hpp>

#include "backend.hpp"
#include "http.hpp"
#include "log.hpp"

namespace ckpt::controller {
using namespace ckpt::toolkit;  // MUNGE, HTTP

namespace {

using nlohmann::json;
using ckpt::recovery::SlurmState;

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::int64_t integer(const json& j, const char* key, std::int64_t fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
}

SlurmJob convert(const json& j) {
  SlurmJob out;
  out.job_id = static_cast<std::uint32_t>(integer(j, "job_id"));
  // job_state_string() shows a flag (COMPLETING, REQUEUED, ...) instead of the base state while one is set.
  const std::string state = text(j, "job_state");
  if (state == "COMPLETING" || state == "SIGNALING" || state == "STAGE_OUT") {
    out.completing = true;
    out.state = SlurmState::Unknown;
  } else if (state == "REQUEUED" || state == "REQUEUE_FED") {
    out.completing = true;
    out.state = SlurmState::Pending;
  } else if (state == "REQUEUE_HOLD" || state == "SPECIAL_EXIT" || state == "RESV_DEL_HOLD") {
    out.state = SlurmState::Pending;
    out.held = true;
  } else if (state == "CONFIGURING" || state == "RESIZING") {
    out.state = SlurmState::Running;
  } else if (state == "STOPPED") {
    out.state = SlurmState::Suspended;
  } else {
    out.state = ckpt::recovery::parse_slurm_state(state);
  }
  auto priority = j.find("priority");
  if (out.state == SlurmState::Pending && priority != j.end() && priority->is_number_integer() &&
      priority->get<std::int64_t>() == 0) {
    out.held = true;
  }
  out.restart_count = static_cast<std::uint32_t>(integer(j, "restart_cnt"));
  out.user_id = static_cast<std::uint32_t>(integer(j, "user_id"));
  out.group_id = static_cast<std::uint32_t>(integer(j, "group_id"));
  out.submit_time = static_cast<double>(integer(j, "submit_time"));
  const int status = static_cast<int>(integer(j, "exit_code"));
  if (WIFSIGNALED(status)) {
    out.exit_signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    out.exit_code = WEXITSTATUS(status);
  }
  if (auto nodes = ckpt::recovery::expand_hostlist(text(j, "nodes")); nodes) out.nodes = *nodes;
  out.tasks = static_cast<std::uint32_t>(integer(j, "tasks"));
  out.tasks_per_node = static_cast<std::uint32_t>(integer(j, "tasks_per_node"));
  if (out.tasks_per_node >= 0xfffe) out.tasks_per_node = 0;  // NO_VAL16: not given
  out.partition = text(j, "partition");
  out.batch_host = text(j, "batch_host");
  out.reason = text(j, "state_description");
  out.bad_constraints = text(j, "state_reason") == "BadConstraints";
  out.excluded = text(j, "excluded_nodes");
  auto requeue = j.find("requeue");
  out.requeue_allowed = requeue == j.end() || !requeue->is_boolean() || requeue->get<bool>();
  out.begin_time = static_cast<double>(integer(j, "eligible_time"));
  out.start_time = static_cast<double>(integer(j, "start_time"));
  out.end_time = static_cast<double>(integer(j, "end_time"));
  return out;
}

class RestBackend final : public SlurmBackend {
 public:
  explicit RestBackend(RestSettings settings) : settings_(std::move(settings)) {}
  const char* name() const override { return "rest"; }
  Capabilities capabilities() const override { return Capabilities{false, false}; }

  Result<std::vector<SlurmJob>> load_jobs() override {
    auto body = call("GET", "/slurm/v0.0.38/jobs", "");
    if (!body) return Error{body.error()};
    std::vector<SlurmJob> jobs;
    for (const auto& j : (*body)["jobs"]) jobs.push_back(convert(j));
    return jobs;
  }

  Result<std::optional<SlurmJob>> load_job(std::uint32_t job_id) override {
    auto body = call("GET", "/slurm/v0.0.38/job/" + std::to_string(job_id), "");
    if (!body) {
      // v0.0.38 answers an unknown job with an error "Invalid job id specified".
      if (body.error().find("Invalid job id") != std::string::npos) return std::optional<SlurmJob>{};
      return Error{body.error()};
    }
    std::optional<SlurmJob> job;
    for (const auto& j : (*body)["jobs"]) {
      SlurmJob one = convert(j);
      if (one.job_id == job_id) job = one;
    }
    return job;
  }

  Result<std::vector<SlurmNode>> load_nodes(bool /*partitions: listed with the nodes*/) override {
    auto body = call("GET", "/slurm/v0.0.38/nodes", "");
    if (!body) return Error{body.error()};
    std::vector<SlurmNode> nodes;
    for (const auto& n : (*body)["nodes"]) {
      SlurmNode out;
      out.name = text(n, "name");
      out.address = text(n, "address");
      if (out.address.empty()) out.address = text(n, "hostname");
      if (out.address.empty()) out.address = out.name;
      out.port = static_cast<int>(integer(n, "port"));
      const std::string state = text(n, "state");
      out.down = state == "down";
      if (auto flags = n.find("state_flags"); flags != n.end() && flags->is_array()) {
        for (const auto& f : *flags) {
          if (!f.is_string()) continue;
          if (f == "NOT_RESPONDING") out.down = true;
          if (f == "DRAIN") out.drained = true;
        }
      }
      if (state == "drain" || state == "draining" || state == "drained") out.drained = true;
      if (auto parts = n.find("partitions"); parts != n.end() && parts->is_array()) {
        for (const auto& p : *parts) {
          if (p.is_string()) out.partitions.push_back(p.get<std::string>());
        }
      }
      out.reason = text(n, "reason");
      if (!out.name.empty()) nodes.push_back(std::move(out));
    }
    return nodes;
  }

  Status requeue(std::uint32_t /*job_id*/) override {
    return Status::failure("slurmrestd openapi/v0.0.38 has no requeue operation");
  }

  Status expedite(std::uint32_t job_id, const std::vector<std::string>& exclude, bool release,
                  std::uint32_t min_nodes, std::uint32_t min_tasks) override {
    json body = {{"begin_time", "now"}, {"exclude_nodes", ckpt::recovery::join_nodes(exclude)}};
    if (release) body["hold"] = false;
    if (min_nodes > 0) body["minimum_nodes"] = min_nodes;
    if (min_tasks > 0) body["tasks"] = min_tasks;
    auto r = call("POST", "/slurm/v0.0.38/job/" + std::to_string(job_id), body.dump());
    if (!r) return Status::failure("update of job " + std::to_string(job_id) + ": " + r.error());
    return Status::success();
  }

  Status hold(std::uint32_t job_id) override {
    auto r = call("POST", "/slurm/v0.0.38/job/" + std::to_string(job_id), R"({"hold":true})");
    if (!r) return Status::failure("hold of job " + std::to_string(job_id) + ": " + r.error());
    return Status::success();
  }

  Status set_node_down(const std::string& node, const std::string&) override { return no_node_update(node); }
  Status drain_node(const std::string& node, const std::string&) override { return no_node_update(node); }
  Status resume_node(const std::string& node) override { return no_node_update(node); }
  std::optional<std::uint32_t> slurm_user_uid() override { return std::nullopt; }

 private:
  static Status no_node_update(const std::string& node) {
    return Status::failure("slurmrestd openapi/v0.0.38 cannot change the state of node " + node);
  }

  // The token to send: the file's again when it changed since it was last read (or when `force`).
  Status refresh_token(bool force) {
    if (settings_.token_file.empty()) return Status::success();
    struct stat st {};
    if (stat(settings_.token_file.c_str(), &st) != 0) {
      return Status::failure("rest_token_file: cannot read " + settings_.token_file + ": " + std::strerror(errno));
    }
    if (!force && st.st_ino == token_ino_ && st.st_mtim.tv_sec == token_mtime_.tv_sec &&
        st.st_mtim.tv_nsec == token_mtime_.tv_nsec && st.st_size == token_size_) {
      return Status::success();
    }
    auto token = read_rest_token_file(settings_.token_file);
    if (!token) return Status::failure(token.error());
    if (*token != settings_.token) log_info("rest_token_file: read a new token from " + settings_.token_file);
    settings_.token = *token;
    token_ino_ = st.st_ino;
    token_mtime_ = st.st_mtim;
    token_size_ = st.st_size;
    return Status::success();
  }

  // One call; the JSON answer, or an error from the transport, the HTTP status or Slurm's "errors" list. A 401 or
  // 403 is tried once more with the token file read again.
  Result<json> call(const std::string& method, const std::string& path, const std::string& body) {
    std::lock_guard<std::mutex> lock(token_mutex_);
    if (auto s = refresh_token(false); !s) return Error{s.error()};
    auto first = call_once(method, path, body);
    if (first || settings_.token_file.empty() || !refused_) return first;
    if (auto s = refresh_token(true); !s) return Error{s.error()};
    return call_once(method, path, body);
  }

  Result<json> call_once(const std::string& method, const std::string& path, const std::string& body) {
    refused_ = false;
    HttpRequest request;
    request.method = method;
    request.url = settings_.url + path;
    request.headers = {{"X-SLURM-USER-NAME", settings_.user}, {"X-SLURM-USER-TOKEN", settings_.token}};
    request.body = body;
    request.timeout_s = settings_.timeout_s;
    HttpResponse response = http_request(request);
    if (!response.error.empty()) return Error{"slurmrestd " + method + " " + path + ": " + response.error};
    json answer = json::parse(response.body, nullptr, false);
    std::string slurm_error;
    if (!answer.is_discarded() && answer.is_object()) {
      if (auto errors = answer.find("errors"); errors != answer.end() && errors->is_array()) {
        for (const auto& e : *errors) {
          std::string what = text(e, "error");
          if (what.empty()) what = text(e, "description");
          if (!what.empty()) slurm_error += (slurm_error.empty() ? "" : "; ") + what;
        }
      }
    }
    if (!slurm_error.empty()) return Error{"slurmrestd " + method + " " + path + ": " + slurm_error};
    if (response.status == 401 || response.status == 403) {
      refused_ = true;
      return Error{"slurmrestd refused the token for user " + settings_.user + " (HTTP " +
                   std::to_string(response.status) + ")"};
    }
    if (response.status < 200 || response.status >= 300) {
      return Error{"slurmrestd " + method + " " + path + ": HTTP " + std::to_string(response.status)};
    }
    if (answer.is_discarded() || !answer.is_object()) return Error{"slurmrestd " + path + ": answer is not JSON"};
    return answer;
  }

  RestSettings settings_;
  std::mutex token_mutex_;
  ino_t token_ino_ = 0;
  timespec token_mtime_{};
  off_t token_size_ = -1;
  bool refused_ = false;
};

}  // namespace

Result<std::string> read_rest_token_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return Error{"rest_token_file: cannot read " + path + ": " + std::strerror(errno)};
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 64 * 1024) {
    close(fd);
    return Error{"rest_token_file: " + path + " is not a regular file of at most 64 KiB"};
  }
  if ((st.st_mode & 077) != 0) {
    close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Error{"rest_token_file: " + path + " has mode " + mode +
                 ": group or others may read it; refusing the token (chmod 600 it)"};
  }
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  close(fd);
  std::string token = text.substr(0, text.find('\n'));
  if (token.rfind("SLURM_JWT=", 0) == 0) token = token.substr(10);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) return Error{"rest_token_file: " + path + " holds no token"};
  if (token.find_first_of(" \t\r") != std::string::npos) return Error{"rest_token_file: the token has spaces"};
  return token;
}

std::unique_ptr<SlurmBackend> make_rest_backend(const RestSettings& settings) {
  return std::make_unique<RestBackend>(settings);
}

}  // namespace ckpt::controller
