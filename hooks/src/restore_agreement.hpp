#pragma once
// How the ranks of a job restore the same checkpoint, and pass over one that any rank cannot load together.
//
// Rounds, one candidate each. The leader (rank 0) proposes the candidate in the control dir (<root>/.control/
// <run_id>-restore/plan-<round>) and announces it over the coordinator's network (the tally); every rank loads its
// shard of it, checked while read, and reports: a rank whose load failed first creates bad-<round> (the checkpoint
// is at fault) or stop-<round> (only its access to it is: permissions, a stale handle, after retries),
// exclusively, so that any number of failures costs one file; every rank's report is counted up the tree. The
// leader, once every rank counted in, decides for all (verdict-<round>, announced the same way): ok, walk back (it
// marks the candidate FAILED, once, and proposes an older one) or stop (every rank fails its restore with the
// reason). A rank reads two files per round, once each, without polling; only a failed load creates one.
//
// Threads: one RestoreAgreement per restore, used by the thread that calls Checkpointer::restore (the training
// thread); the tally's callbacks run on it too and block on the coordinator's own lock, never the network's.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ckpt/hooks.hpp"
#include "ckpt/posix.hpp"

namespace ckpt::hooks {

// A candidate: the step and where it lives, and what the leader read in its manifest, so that a rank loading its
// own shard of a periodic checkpoint of the same world size reads its record alone.
struct RestorePlan {
  std::optional<std::uint64_t> step;  // absent: nothing to restore
  std::string root;
  store::Kind kind = store::Kind::Periodic;
  int world_size = 0;
  // Not empty: the memory snapshot of `step` that the launch with this run id left in every rank's node tier
  // (node_tier.hpp), newer than any checkpoint in the dir; a rank that does not hold it whole fails the round, and
  // every rank walks back to the dir's, which nothing marks.
  std::string node_launch;
  // With node_launch: this round only asks whether every rank holds that snapshot (no byte is hashed); the round
  // after it, which the leader proposes only when every rank does, checks and loads it. A rank that lacks it thus
  // costs no rank a pass over its state.
  bool probe = false;
};
std::string to_json(const RestorePlan& plan);
Result<RestorePlan> parse_restore_plan(std::string_view text);

// Counts the ranks' reports of a round over the tree coordinator's network, so that no rank writes or reads a file
// per rank. report: every rank, once per round; wait_all: the leader, true once every rank of the job reported.
// The leader's files of a round that the other ranks wait for.
enum class RestoreFile { Plan, Verdict };
struct RestoreTally {
  std::function<void(int round)> report;
  std::function<bool(int round, std::chrono::milliseconds timeout)> wait_all;
  // Leader: every rank learns that `file` of `round` is written (flooded), so that none polls the control dir.
  std::function<void(int round, RestoreFile file)> announce;
  // Others: waits until `file` of `round` was announced; false at `deadline` or once the network is gone (the
  // caller then polls for the file until its deadline, as without a tally).
  std::function<bool(int round, RestoreFile file, std::chrono::steady_clock::time_point deadline)> await;
  // Why this restore can no longer complete (a rank of the job died), or nothing: a rank that waits for the
  // leader stops waiting then, rather than poll for files until its deadline (the leader may be gone, or be
  // recovering already).
  std::function<std::optional<std::string>()> broken;
};

enum class RestoreVerdict { Ok, WalkBack, Stop };
struct RoundOutcome {
  RestoreVerdict verdict = RestoreVerdict::Ok;
  std::string reason;  // the failure that decided it: "rank 3: step 300: ... checksum mismatch ..."
};

// The verdict of one rank alone (a job of one rank): ok, walk back past a bad checkpoint, or stop.
RoundOutcome solo_outcome(const Status& loaded, bool definite, int rank);

class RestoreAgreement {
 public:
  // Waits for other ranks give up after `timeout` (the leader's; the others allow it 30 s more to answer).
  RestoreAgreement(std::string root, std::string run_id, int rank, int world_size, std::chrono::milliseconds timeout,
                   RestoreTally tally);
  ~RestoreAgreement();
  RestoreAgreement(const RestoreAgreement&) = delete;
  RestoreAgreement& operator=(const RestoreAgreement&) = delete;

  // Leader: publishes the candidate of `round`. Fails when the round was proposed before: another launch with
  // the same run id restored here.
  Status propose(int round, const RestorePlan& plan);
  // Other ranks: the leader's candidate of `round`, once it is there.
  Result<RestorePlan> proposal(int round);
  // Every rank, after loading: reports its outcome and returns the verdict for all ranks.
  Result<RoundOutcome> agree(int round, const Status& loaded, bool definite);
  std::string path() const { return dir_; }

 private:
  Status open_dir(bool create);
  // Creates `name` exclusively and complete (temp file, link); `existed` says the name was there already.
  Status create_exclusive(const std::string& name, const std::string& content, bool* existed);
  std::optional<std::string> read(const std::string& name);
  // agree() on a rank other than 0: waits for rank 0's verdict.
  Result<RoundOutcome> await_verdict(int round);
  // agree() on rank 0: waits for every report, publishes the verdict.
  Result<RoundOutcome> decide_round(int round);
  // The verdict of a round: a bad checkpoint walks back, a rank's own failure or a missing report stops.
  RoundOutcome round_outcome(int round, bool all);
  // Polls `ready` with growing pauses until it holds, `deadline` passes or the job broke (broken_ says why).
  template <class Ready>
  bool wait(Ready ready, std::chrono::steady_clock::time_point deadline);
  // `ready` once the leader announced `file` of `round` over the tally's network (or, once the network is gone, by
  // polling for the file until `deadline`).
  template <class Ready>
  bool wait_announced(int round, RestoreFile file, Ready ready, std::chrono::steady_clock::time_point deadline);

  const std::string root_;
  const std::string dir_;
  const int rank_;
  const int world_;
  const std::chrono::milliseconds timeout_;
  int fd_ = -1;
  RestoreTally tally_;
  std::string broken_;  // why a wait ended early: the tally's word that a rank of the job died
  bool job_broke();
  std::string waited_for(const std::string& what, std::chrono::milliseconds limit) const;
};

}  // namespace ckpt::hooks
