#pragma once
// The controller's view of Slurm: a small interface with two real implementations, libslurm (on the cluster)
// and slurmrestd over HTTP with a JWT (off the cluster). The same engine drives both.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/recovery.hpp"
#include "ckpt/result.hpp"

namespace ckpt::controller {

using ckpt::recovery::SlurmJob;
using ckpt::recovery::SlurmNode;

struct Capabilities {
  bool requeue = true;     // can requeue a running or finished batch job
  bool node_state = true;  // can mark nodes DOWN, drain and resume them
};

class SlurmBackend {
 public:
  virtual ~SlurmBackend() = default;
  virtual const char* name() const = 0;
  virtual Capabilities capabilities() const = 0;
  // Every job Slurm knows.
  virtual Result<std::vector<SlurmJob>> load_jobs() = 0;
  // One job; an empty optional when Slurm does not know it (any more).
  virtual Result<std::optional<SlurmJob>> load_job(std::uint32_t job_id) = 0;
  // With `partitions`, each node's partitions too (libslurm: one more RPC).
  virtual Result<std::vector<SlurmNode>> load_nodes(bool partitions = false) = 0;
  // Requeues the job (Slurm's restart count goes up at once).
  virtual Status requeue(std::uint32_t job_id) = 0;
  // StartTime=now and ExcNodeList=exclude (empty clears it); releases the job too when `release`; MinNodes=min_nodes
  // and NumTasks=min_tasks where they are not 0 (a job that may start without some of its spares).
  virtual Status expedite(std::uint32_t job_id, const std::vector<std::string>& exclude, bool release,
                          std::uint32_t min_nodes = 0, std::uint32_t min_tasks = 0) = 0;
  // Holds a pending job (priority 0), so that Slurm does not start it again.
  virtual Status hold(std::uint32_t job_id) = 0;
  virtual Status set_node_down(const std::string& node, const std::string& reason) = 0;
  virtual Status drain_node(const std::string& node, const std::string& reason) = 0;
  virtual Status resume_node(const std::string& node) = 0;
  // SlurmUser's uid, when the backend can tell.
  virtual std::optional<std::uint32_t> slurm_user_uid() = 0;
  // Slurm's ProctrackType ("proctrack/cgroup"), when the backend can tell.
  virtual std::optional<std::string> proctrack_type() { return std::nullopt; }
};

// One line when Slurm's process tracking lets a requeued batch script's srun outlive it (proctrack/linuxproc
// loses processes whose parent died: that srun then cancels the next run's step of the same id); "" otherwise.
std::string proctrack_warning(const std::optional<std::string>& proctrack_type);

// libslurm: reads SLURM_CONF like every Slurm client. Calls slurm_init once.
std::unique_ptr<SlurmBackend> make_libslurm_backend();

struct RestSettings {
  std::string url;          // http://host:port, no trailing slash
  std::string user;         // X-SLURM-USER-NAME
  std::string token;        // X-SLURM-USER-TOKEN; never logged
  double timeout_s = 5;
  // When set, the token comes from this file: read again whenever the file changes and once more when
  // slurmrestd answers 401 or 403 (tokens from `scontrol token` expire).
  std::string token_file;
};

// The JWT in `path` (the bare token or scontrol's "SLURM_JWT=..." line). Refuses a file that is not a regular
// file, or that group or others may read or write, with one line naming the file and its mode. Never prints the token.
Result<std::string> read_rest_token_file(const std::string& path);
std::unique_ptr<SlurmBackend> make_rest_backend(const RestSettings& settings);

}  // namespace ckpt::controller
