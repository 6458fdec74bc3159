#pragma once
// How the ranks of a job agree on checkpoint steps and learn that every shard of a step is durable.
//
// The training loop asks for a checkpoint a few steps ahead (request) and checks every step whether one is due
// (requested); ranks run in lockstep within a step or two (data-parallel training reduces every step), so a request
// for step s + lead reaches every rank before it passes s + lead. After a rank's shard is durable its persist thread
// publishes the outcome; the writer (rank 0) waits for every rank, then commits through ckpt::store.
//
// Two implementations of one design: SingleCoordinator (one process) and TreeCoordinator (the heartbeat network,
// coordinator_tree.cpp: every job of more than one rank, whether or not its last words are armed). Commit,
// retention and restore take the same path with either: the writer commits the records the coordinator hands it,
// retires step dirs and lets every rank remove its own files, and a multi-rank restore counts its rounds through
// the coordinator's tally. PMIx, where a job has it, serves only the network's rendezvous (rendezvous.hpp): it
// stays out of the failure path, because Slurm's PMIx server kills the whole step when a rank inside a collective
// dies.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/hooks.hpp"
#include "restore_agreement.hpp"

namespace ckpt::hooks {

class LastWords;

// The run this process belongs to, as the store fences it: the job and its restart count. Every change the hooks
// make to the checkpoint dir carries it (ckpt/store.hpp, "fencing of stale runs").
inline store::Fence run_fence(const Config& config) {
  return store::Fence{config.job_id, config.restart_count, config.generation};
}

// The refusal line when a newer run than `fence`'s has started in `dir`; nullopt when none has, or when the
// record cannot be read (the store's own checks refuse then).
inline std::optional<std::string> fenced(const std::string& dir, const store::Fence& fence) {
  auto record = store::read_epoch(dir);
  if (!record) return std::nullopt;
  return store::fence_refusal(fence, *record);
}

class Coordinator {
 public:
  virtual ~Coordinator() = default;
  // "single" or "tree", for log lines.
  virtual const char* name() const = 0;

  // Training thread, once the resume step is known: requests and reports of other runs must not be seen.
  virtual Status begin(std::uint64_t resume_step) = 0;
  // Training thread. Asks every rank to checkpoint at `step`; any rank may ask, asking twice is harmless.
  virtual Status request(std::uint64_t step, store::Kind kind) = 0;
  // Training thread, every step: the request for exactly this step, if any rank made one (terminal wins).
  virtual std::optional<store::Kind> requested(std::uint64_t step) = 0;
  // Training thread, every step before requested(): a terminal step asked for after this rank had passed it. The
  // ranks that took it stop there; this one stops too (schedule.hpp).
  virtual std::optional<std::uint64_t> missed_terminal() { return std::nullopt; }
  // CKPT_MEMORY_INTERVAL=auto, rank 0: a memory checkpoint of `step` on every rank (flooded like a request).
  virtual void request_memory(std::uint64_t /*step*/) {}
  // Every rank, once per step after requested(): whether a memory checkpoint of `step` was asked for.
  virtual bool memory_requested(std::uint64_t /*step*/) { return false; }
  // Persist thread, every rank, just before a successful publish: the record of this rank's durable shard.
  virtual void note_record(std::uint64_t /*step*/, const store::ShardRecord& /*record*/) {}
  // Persist thread, every rank, for every checkpoint in order: this rank's shard is durable (ok) or failed.
  virtual Status publish(std::uint64_t step, const Status& outcome) = 0;
  // Persist thread, writer only: waits until every rank published `step`; fails on timeout or a failed rank.
  virtual Status wait_all(std::uint64_t step, std::chrono::milliseconds timeout) = 0;
  // Persist thread, writer only, after wait_all succeeded: every rank's record of `step`, as they came up with the
  // counts (the writer then commits without reading one record file per rank).
  virtual Result<std::vector<store::ShardRecord>> records(std::uint64_t step) = 0;
  // Persist thread, writer only: the steps store::retire renamed away; every rank removes its own files of them.
  virtual void retired(const std::vector<std::uint64_t>& steps) = 0;
  // Any thread: training is gone; a wait_all in progress or to come gives up at once where it can.
  virtual void cancel() {}
  // Training thread, once the heartbeat network is up (every job of more than one rank): the coordinator uses it.
  virtual void attach(LastWords& /*last_words*/) {}
  // Training thread, before the last words go (close): nothing may reach their network after this.
  virtual void detach() {}
  // How a multi-rank restore counts its rounds (restore_agreement.hpp); an error before attach().
  virtual Result<RestoreTally> restore_tally() = 0;
  // Training thread, at close, after the last persist and before this rank leaves: what others wait for from this
  // rank is sent (at most `timeout`).
  virtual void drain(std::chrono::milliseconds /*timeout*/) {}
};

// Single for one process, else the tree.
Result<std::unique_ptr<Coordinator>> make_coordinator(const Config& config);

// Requests and failure reports as files under <root>/.control/<namespace>/: the tree's requests until its network
// is attached, and the reason a rank gives when its shard failed (one file, on failure only). A request is
// "ckpt-<step>" or "stop-<step>", created exclusively (write a temp file, fsync, link): readers never see half a
// file and two ranks asking for the same step cannot clash. The namespace is the run id and the resume step, so a
// restarted run never acts on an older run's files. This is also what keeps a stale rank (an earlier run's, on a
// node that froze and thawed) out of a newer run's coordination: the derived run id carries the restart count
// (config.cpp, derive_run_id), so the stale rank reads and writes only its own run's namespace, which nothing of
// the newer run looks at; these files are not fenced for that reason. The checkpoint dir itself is fenced by the
// store (run_fence below). Thread-safe: the training thread asks and checks, the persist thread reports failures.
class ControlDir {
 public:
  ControlDir(std::string root, std::string run_id, int rank);
  ~ControlDir();
  ControlDir(const ControlDir&) = delete;
  ControlDir& operator=(const ControlDir&) = delete;

  // Sets the namespace: <run_id>-from<resume_step>.
  void begin(std::uint64_t resume_step);
  Status request(std::uint64_t step, store::Kind kind);
  std::optional<store::Kind> requested(std::uint64_t step);
  // Records that `rank` failed to persist `step` (the writer stops waiting for it).
  Status report_failure(std::uint64_t step, const std::string& reason);
  // The failure `rank` reported for `step`, if any.
  std::optional<std::string> failure(std::uint64_t step, int rank);
  // The namespace directory, for tests and log lines.
  std::string path() const;

 private:
  // These three expect mu_ held.
  Status create_exclusive(const std::string& name, const std::string& content);
  int open_dir(bool create);
  std::string dir_path() const;

  const std::string root_;
  const std::string run_id_;
  const int rank_ = 0;
  mutable std::mutex mu_;
  std::string ns_;  // guarded by mu_
  int fd_ = -1;     // guarded by mu_: the namespace dir once it exists
};

}  // namespace ckpt::hooks

namespace ckpt::hooks {
// The coordinator over the heartbeat network (coordinator_tree.cpp): every job of more than one rank.
std::unique_ptr<Coordinator> make_tree_coordinator(const Config& config);
}  // namespace ckpt::hooks
