#pragma once
// Where the ranks of a job find each other's heartbeat address ("<address> <port> [<node>]", heartbeat.hpp).
//
//   Files  one file per rank (rank-<r>.addr) in the rendezvous dir on the shared checkpoint dir: written once at
//          start, read for the few ranks this rank dials, removed at an orderly leave (a peer that finds it gone
//          knows the rank left rather than died).
//   Pmix   under srun --mpi=pmix: every rank Puts its line, Commits, and one collecting Fence at start makes them
//          all known to each node's PMIx server; a lookup is a PMIx_Get that the local server answers. No file per
//          rank on the shared file system. PMIx is used for this alone and never after the fence: no collective
//          runs while training, so a rank's death never meets a PMIx call in progress (Slurm's PMIx server kills
//          the step on error events of a collective). It keeps no trace of an orderly leave.
//
// Auto takes Pmix where PMIx describes this very job: the library was built with it, the process is a task of an
// srun step under PMIx whose task count is the world size (not one of several ranks a launcher such as torchrun
// starts inside a task), PMIx's job size is the world size, and the ranks are the first generation of a job that
// does not restart in place (a later generation or a spare has a world PMIx does not know). Every rank decides
// alike from the same facts. Threads: publish() once, from the thread that starts the network; lookup() from any thread.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/hooks.hpp"

namespace ckpt::hooks {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // "files" or "pmix", for log lines.
  virtual const char* name() const = 0;
  // Makes `line` this rank's. With PMIx this is collective: it returns once every rank of the job published, or
  // fails after `timeout`.
  virtual Status publish(const std::string& line, std::chrono::milliseconds timeout) = 0;
  // A peer's fields (at least the address and the port), or nothing while it has not published (files: or once it
  // left in order).
  virtual std::optional<std::vector<std::string>> lookup(int peer) const = 0;
  // An orderly leave (files: the file goes; PMIx cannot withdraw, the network's kGone tells the peers instead).
  virtual void withdraw() = 0;
  // True when lookup() finding nothing after the start means the peer left in order.
  virtual bool tells_leaves() const = 0;
};

// What `config` asks for, with the generation and restart-in-place part of Auto's rule applied: Files for a world
// PMIx does not know, else as set (Auto stays Auto, decided by make_rendezvous).
RendezvousKind rendezvous_for(const Config& config);

// The rendezvous for `rank` of `world`: files in `dirfd` (the private rendezvous dir, `dir_path` for error lines;
// not owned), or PMIx. Auto takes PMIx when the library has it, the process is one task of a PMIx step of `world`
// tasks and PMIx's job size is `world`; Pmix fails where PMIx cannot start, its size is not `world`, or it numbers
// this rank otherwise.
Result<std::unique_ptr<Rendezvous>> make_rendezvous(RendezvousKind kind, int dirfd, const std::string& dir_path,
                                                    int rank, int world);

}  // namespace ckpt::hooks
