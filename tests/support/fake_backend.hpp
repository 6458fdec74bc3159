#pragma once
// Slurm as an in-memory table, for the engine's unit tests and bench_controller: what the backends would return,
// and a record of what the engine asked of it. Header-only, so that a target with the controller's headers can
// include it without a library of its own.
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.hpp"
#include "ckpt/recovery.hpp"

namespace ckpt::controller::testing {

class FakeBackend final : public SlurmBackend {
 public:
  std::map<std::uint32_t, SlurmJob> jobs;
  std::vector<SlurmNode> nodes;
  Capabilities caps;
  std::size_t requeues = 0, updates = 0, holds = 0;
  std::vector<std::string> downed, drained, resumed;
  std::vector<std::string> last_exclude;  // the ExcNodeList of the last update
  std::uint32_t last_min_nodes = 0;
  std::uint32_t last_min_tasks = 0;
  bool refuse_requeue = false;            // Slurm answers the requeue with an error
  bool crash_after_requeue = false;       // Slurm requeues, then the controller dies before it hears the answer

  const char* name() const override { return "fake"; }
  Capabilities capabilities() const override { return caps; }
  Result<std::vector<SlurmJob>> load_jobs() override {
    std::vector<SlurmJob> out;
    out.reserve(jobs.size());
    for (const auto& [id, j] : jobs) out.push_back(j);
    return out;
  }
  Result<std::optional<SlurmJob>> load_job(std::uint32_t id) override {
    auto it = jobs.find(id);
    if (it == jobs.end()) return std::optional<SlurmJob>{};
    return std::optional<SlurmJob>(it->second);
  }
  Result<std::vector<SlurmNode>> load_nodes(bool /*partitions*/ = false) override { return nodes; }
  Status requeue(std::uint32_t id) override {
    ++requeues;
    if (refuse_requeue) return Status::failure("fake: requeue refused");
    auto& j = jobs[id];
    ++j.restart_count;
    j.state = ckpt::recovery::SlurmState::Pending;
    if (j.submit_time > 0) j.submit_time += 1;  // Slurm gives a requeued job a new submit time
    if (crash_after_requeue) {
      crash_after_requeue = false;
      throw std::runtime_error("fake: the controller died after the requeue");
    }
    return Status::success();
  }
  Status expedite(std::uint32_t id, const std::vector<std::string>& exclude, bool release,
                  std::uint32_t min_nodes = 0, std::uint32_t min_tasks = 0) override {
    ++updates;
    last_exclude = exclude;
    jobs[id].excluded = ckpt::recovery::join_nodes(exclude);  // Slurm's ExcNodeList is replaced
    last_min_nodes = min_nodes;
    last_min_tasks = min_tasks;
    if (min_tasks > 0) jobs[id].tasks = min_tasks;
    if (release) jobs[id].held = false;
    return Status::success();
  }
  Status hold(std::uint32_t id) override {
    ++holds;
    jobs[id].held = true;
    return Status::success();
  }
  Status set_node_down(const std::string& node, const std::string&) override {
    downed.push_back(node);
    for (auto& n : nodes) {
      if (n.name == node) n.down = true;
    }
    return Status::success();
  }
  Status drain_node(const std::string& node, const std::string&) override {
    drained.push_back(node);
    return Status::success();
  }
  Status resume_node(const std::string& node) override {
    resumed.push_back(node);
    return Status::success();
  }
  std::optional<std::uint32_t> slurm_user_uid() override { return 0; }
};

}  // namespace ckpt::controller::testing
