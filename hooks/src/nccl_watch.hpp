#pragma once
// Watches the NCCL communicators a training program hands to the checkpointer (Checkpointer::watch_nccl).
//
// A thread polls ncclCommGetAsyncError on each one. An error (a peer died, a link failed) aborts that
// communicator with ncclCommAbort, which makes collectives blocked on it return, and is reported (it triggers last
// words). When the last words start for another reason, every communicator is aborted before anything is saved:
// a hung collective must never hold the last words (or a device copy queued behind it) back.
//
// NCCL is found in the process itself (the library the program linked, or one already loaded), never loaded
// anew: a communicator must only be handled by the NCCL that created it. The library therefore builds without
// NCCL and refuses watch_nccl with a clear line where no NCCL is loaded.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt::hooks {

class NcclWatch {
 public:
  struct Hooks {
    // A communicator reported an error (already aborted); called once per communicator, on the watch thread.
    std::function<void(const std::string& why)> on_error;
    // Polled with the communicators: true once the last words started (every communicator is then aborted).
    std::function<bool()> abort_requested;
  };

  // Resolves ncclCommGetAsyncError, ncclCommAbort and ncclGetErrorString in this process and starts the thread.
  static Result<std::unique_ptr<NcclWatch>> start(Hooks hooks, std::chrono::milliseconds period);
  ~NcclWatch();
  NcclWatch(const NcclWatch&) = delete;
  NcclWatch& operator=(const NcclWatch&) = delete;

  // Watches one more communicator (an ncclComm_t). The watch owns its abort, not its destruction: a program
  // that destroys a communicator must not hand it in, or must close the checkpointer first.
  Status add(void* comm);
  // Aborts every communicator not aborted yet; idempotent. Any thread.
  void abort_all(const std::string& why);
  // Communicators aborted so far (by an error or by abort_all).
  std::size_t aborted() const;

 private:
  struct Api;
  struct Watched {
    void* comm = nullptr;
    bool aborted = false;
  };
  NcclWatch(std::unique_ptr<Api> api, Hooks hooks, std::chrono::milliseconds period);
  void loop();
  // Aborts `w` outside the lock's critical path; returns false when it was already aborted.
  bool abort_one(Watched& w);

  std::unique_ptr<Api> api_;
  Hooks hooks_;
  std::chrono::milliseconds period_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Watched> comms_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ckpt::hooks
