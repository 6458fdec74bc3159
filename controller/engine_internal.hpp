#pragma once
// What the engine's source files share and nothing else sees: the per-job runtime state that is never persisted,
// the request queue's entries, and small helpers. engine.cpp runs cycles and requests, engine_events.cpp applies
// events and admin requests, engine_recovery.cpp decides recoveries and reconciles with Slurm, engine_views.cpp
// answers reads; the intent runner (intent_runner.cpp) takes a requeue's steps through the engine's Host methods. What to do
// is decided in ckpt/recovery_plan.hpp; these files perform it. All of it runs on the engine's thread under its
// lock, except the detached probes and checkpoint reads.
#include <pwd.h>

#include <algorithm>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "task_pool.hpp"

namespace ckpt::controller {

namespace rec = ckpt::recovery;
using nlohmann::json;
using rec::EventType;
using rec::Intent;
using rec::SlurmState;

// What the engine keeps about a job between cycles but never persists: it is rebuilt after a restart.
struct Engine::Runtime {
  double next_check = 0;
  std::future<std::pair<rec::NodeEvidence, std::string>> probe;
  bool probe_started = false;
  bool probe_done = false;
  rec::NodeEvidence evidence;          // what the probes of the failure's silent nodes found
  bool awaiting_ckpt_run = false;      // the failure waits for ckpt-run's relaunch or hand-over (noted once)
  std::future<CheckpointView> checkpoints;  // read with the owner's permissions, off the engine's lock
  bool checkpoints_started = false;
  double reuse_checked = 0;      // when Slurm was last asked whether this id still names the same job
  double watch_until = 0;        // poll Slurm every cycle until then (a requeued job about to run)
  int expedite_retries = 0;
  bool cannot_start_told = false;  // the history says once why Slurm cannot start the pending run
  double terminal_since = 0;     // when it reached a terminal state (for eviction from memory)
};

namespace engine_detail {

inline constexpr double kCheckpointReadTimeout_s = 10;
inline constexpr std::size_t kRejectedPerJob = 20;
inline constexpr std::size_t kRejectedJobs = 1024;

inline std::string fmt_time(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", t);
  return buf;
}

inline std::string list(const std::vector<std::string>& v) { return rec::nodes_or_none(v); }

inline std::optional<std::uint32_t> uid_of(const std::string& user) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return std::nullopt;
  return found->pw_uid;
}

// The pools the engine's off-thread work runs on (task_pool.hpp), made on first use and never destroyed (a
// process that exits does not wait for a probe or a read in progress): at most 8 probes and 8 checkpoint reads
// (each a child process) at a time, whatever the number of failing jobs.
inline TaskPool& probe_pool() {
  static auto* pool = new TaskPool(8);
  return *pool;
}
inline TaskPool& reader_pool() {
  static auto* pool = new TaskPool(8);
  return *pool;
}

inline bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace engine_detail

}  // namespace ckpt::controller
