// The libslurm backend: slurm_load_jobs, slurm_requeue, slurm_update_job, slurm_update_node.
#include <sys/wait.h>

#include <cerrno>
#include <ctime>
#include <mutex>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
}

#include "backend.hpp"
#include "slurm_handles.hpp"
#include "ckpt/parse.hpp"

namespace ckpt::controller {

namespace {

using ckpt::recovery::SlurmState;

std::string slurm_error_text() { return slurm_strerror(slurm_get_errno()); }

std::string str(const char* s) { return s ? s : ""; }

SlurmState state_of(std::uint32_t raw) {
  switch (raw & JOB_STATE_BASE) {
    case JOB_PENDING: return SlurmState::Pending;
    case JOB_RUNNING: return SlurmState::Running;
    case JOB_SUSPENDED: return SlurmState::Suspended;
    case JOB_COMPLETE: return SlurmState::Completed;
    case JOB_CANCELLED: return SlurmState::Cancelled;
    case JOB_FAILED: return SlurmState::Failed;
    case JOB_TIMEOUT: return SlurmState::Timeout;
    case JOB_NODE_FAIL: return SlurmState::NodeFail;
    case JOB_PREEMPTED: return SlurmState::Preempted;
    case JOB_BOOT_FAIL: return SlurmState::BootFail;
    case JOB_DEADLINE: return SlurmState::Deadline;
    case JOB_OOM: return SlurmState::OutOfMemory;
    default: return SlurmState::Unknown;
  }
}

SlurmJob convert(const slurm_job_info_t& j) {
  SlurmJob out;
  out.job_id = j.job_id;
  out.state = state_of(j.job_state);
  out.completing = (j.job_state & JOB_COMPLETING) != 0;
  out.held = out.state == SlurmState::Pending && j.priority == 0;
  out.restart_count = j.restart_cnt;
  out.user_id = j.user_id;
  out.group_id = j.group_id;
  out.submit_time = static_cast<double>(j.submit_time);
  const int status = static_cast<int>(j.exit_code);
  if (WIFSIGNALED(status)) {
    out.exit_signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    out.exit_code = WEXITSTATUS(status);
  }
  if (auto nodes = ckpt::recovery::expand_hostlist(str(j.nodes)); nodes) out.nodes = *nodes;
  out.tasks = j.num_tasks == NO_VAL ? 0 : j.num_tasks;
  out.tasks_per_node = j.ntasks_per_node >= NO_VAL16 ? 0 : j.ntasks_per_node;
  out.partition = str(j.partition);
  out.batch_host = str(j.batch_host);
  out.reason = str(j.state_desc);
  out.bad_constraints = j.state_reason == FAIL_BAD_CONSTRAINTS;
  out.excluded = str(j.exc_nodes);
  out.requeue_allowed = j.requeue != 0;
  out.begin_time = static_cast<double>(j.eligible_time);
  out.start_time = static_cast<double>(j.start_time);
  out.end_time = static_cast<double>(j.end_time);
  return out;
}

class LibslurmBackend final : public SlurmBackend {
 public:
  LibslurmBackend() {
    static std::once_flag once;
    std::call_once(once, [] { slurm_init(nullptr); });
  }
  const char* name() const override { return "libslurm"; }
  Capabilities capabilities() const override { return {}; }

  Result<std::vector<SlurmJob>> load_jobs() override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto msg = ckpt::toolkit::load_jobs();
    if (!msg) return Error{"slurm_load_jobs: " + slurm_error_text()};
    std::vector<SlurmJob> jobs;
    jobs.reserve(msg->record_count);
    for (std::uint32_t i = 0; i < msg->record_count; ++i) jobs.push_back(convert(msg->job_array[i]));
    return jobs;
  }

  Result<std::optional<SlurmJob>> load_job(std::uint32_t job_id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto msg = ckpt::toolkit::load_jobs(job_id);
    if (!msg) {
      if (slurm_get_errno() == ESLURM_INVALID_JOB_ID) return std::optional<SlurmJob>{};
      return Error{"slurm_load_job " + std::to_string(job_id) + ": " + slurm_error_text()};
    }
    std::optional<SlurmJob> job;
    for (std::uint32_t i = 0; i < msg->record_count; ++i) {
      if (msg->job_array[i].job_id == job_id) job = convert(msg->job_array[i]);
    }
    return job;
  }

  Result<std::vector<SlurmNode>> load_nodes(bool partitions) override {
    std::lock_guard<std::mutex> lock(mutex_);
    node_info_msg_t* msg = nullptr;
    if (slurm_load_node(0, &msg, SHOW_ALL) != SLURM_SUCCESS || msg == nullptr) {
      return Error{"slurm_load_node: " + slurm_error_text()};
    }
    // A node's partitions are filled in from the partitions' records (as sinfo does); without them, none is known.
    partition_info_msg_t* parts = nullptr;
    if (partitions && slurm_load_partitions(0, &parts, SHOW_ALL) == SLURM_SUCCESS && parts != nullptr) {
      slurm_populate_node_partitions(msg, parts);
    }
    std::vector<SlurmNode> nodes;
    for (std::uint32_t i = 0; i < msg->record_count; ++i) {
      const node_info_t& n = msg->node_array[i];
      if (n.name == nullptr) continue;
      SlurmNode out;
      out.name = n.name;
      out.address = str(n.node_addr);
      if (out.address.empty()) out.address = str(n.node_hostname);
      if (out.address.empty()) out.address = out.name;
      out.port = n.port;
      out.down = (n.node_state & NODE_STATE_BASE) == NODE_STATE_DOWN || (n.node_state & NODE_STATE_NO_RESPOND) != 0;
      out.drained = (n.node_state & NODE_STATE_DRAIN) != 0;
      out.reason = str(n.reason);
      out.partitions = ckpt::split(str(n.partitions), ',');
      std::erase(out.partitions, std::string());
      nodes.push_back(std::move(out));
    }
    slurm_free_node_info_msg(msg);
    if (parts != nullptr) slurm_free_partition_info_msg(parts);
    return nodes;
  }

  Status requeue(std::uint32_t job_id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (slurm_requeue(job_id, 0) != SLURM_SUCCESS) {
      return Status::failure("slurm_requeue " + std::to_string(job_id) + ": " + slurm_error_text());
    }
    return Status::success();
  }

  Status expedite(std::uint32_t job_id, const std::vector<std::string>& exclude, bool release,
                  std::uint32_t min_nodes, std::uint32_t min_tasks) override {
    std::lock_guard<std::mutex> lock(mutex_);
    job_desc_msg_t desc;
    slurm_init_job_desc_msg(&desc);
    desc.job_id = job_id;
    desc.begin_time = std::time(nullptr);
    std::string excluded = ckpt::recovery::join_nodes(exclude);
    desc.exc_nodes = excluded.data();
    if (release) desc.priority = INFINITE;
    if (min_nodes > 0) desc.min_nodes = min_nodes;  // max_nodes stays as submitted: the spares come back when free
    if (min_tasks > 0) desc.num_tasks = min_tasks;
    if (slurm_update_job(&desc) != SLURM_SUCCESS) {
      return Status::failure("slurm_update_job " + std::to_string(job_id) + ": " + slurm_error_text());
    }
    return Status::success();
  }

  Status hold(std::uint32_t job_id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    job_desc_msg_t desc;
    slurm_init_job_desc_msg(&desc);
    desc.job_id = job_id;
    desc.priority = 0;
    if (slurm_update_job(&desc) != SLURM_SUCCESS) {
      return Status::failure("hold of job " + std::to_string(job_id) + ": " + slurm_error_text());
    }
    return Status::success();
  }

  Status set_node_down(const std::string& node, const std::string& reason) override {
    return update_node(node, NODE_STATE_DOWN, reason);
  }
  Status drain_node(const std::string& node, const std::string& reason) override {
    return update_node(node, NODE_STATE_DRAIN, reason);
  }
  Status resume_node(const std::string& node) override { return update_node(node, NODE_RESUME, ""); }

  std::optional<std::uint32_t> slurm_user_uid() override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto conf = ckpt::toolkit::load_ctl_conf();
    if (!conf) return std::nullopt;
    return conf->slurm_user_id;
  }

  std::optional<std::string> proctrack_type() override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto conf = ckpt::toolkit::load_ctl_conf();
    if (!conf) return std::nullopt;
    if (conf->proctrack_type == nullptr) return std::optional<std::string>{};
    return std::optional<std::string>(conf->proctrack_type);
  }

 private:
  Status update_node(const std::string& node, std::uint32_t state, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    update_node_msg_t msg;
    slurm_init_update_node_msg(&msg);
    std::string names = node;
    std::string why = reason;
    msg.node_names = names.data();
    msg.node_state = state;
    if (!why.empty()) msg.reason = why.data();
    if (slurm_update_node(&msg) != SLURM_SUCCESS) {
      return Status::failure("slurm_update_node " + node + ": " + slurm_error_text());
    }
    return Status::success();
  }

  std::mutex mutex_;  // libslurm's client calls are not documented as thread-safe: one at a time
};

}  // namespace

std::string proctrack_warning(const std::optional<std::string>& proctrack_type) {
  if (!proctrack_type || *proctrack_type != "proctrack/linuxproc") return {};
  return "Slurm's ProctrackType=proctrack/linuxproc loses processes whose parent died: an srun left by a requeued "
         "batch script can cancel the next run's step and cost a second restart (the plugin makes each batch step "
         "adopt such orphans so Slurm still ends them); proctrack/cgroup tracks every process";
}

std::unique_ptr<SlurmBackend> make_libslurm_backend() { return std::make_unique<LibslurmBackend>(); }

}  // namespace ckpt::controller
