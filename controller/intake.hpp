#pragma once
// The engine's intake: events and admin requests from the HTTP server's threads, in arrival order, until the
// engine's thread takes them. Each decision cycle takes a fair batch (recovery::fair_batch: each user's share of
// kBatchPerCycle), and each user may have at most kPerUserQueued waiting, so one user's flood neither fills the
// queue nor delays another user's report by more than one cycle, and is committed once per cycle, not per event.
//
// Call order: any thread push()es; the engine's thread take_batch()es each cycle and wait()s between cycles.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ckpt/controller_limits.hpp"
#include "ckpt/recovery.hpp"

namespace ckpt::controller {

struct Verdict {
  int http_status = 202;   // 202 accepted, 200 done, 400 bad request, 403 refused, 404 unknown, 503 try later
  std::string message;
  bool ok() const { return http_status >= 200 && http_status < 300; }
};

// One queued event or admin request, and the promise of its verdict.
struct Request {
  enum class Kind { Event, Admin } kind = Kind::Event;
  ckpt::recovery::Event event;
  std::string op, arg;
  std::uint32_t uid = 0;    // the credential's
  std::uint32_t share = 0;  // the user whose share of the intake it takes (Engine::submit)
  std::promise<Verdict> promise;
};

class Intake {
 public:
  static constexpr std::size_t kQueuedMax = 100000;
  static constexpr std::size_t kPerUserQueued = 20000;  // a 16,384-rank job's task exits fit
  static constexpr std::size_t kMinSharePerCycle = 16;
  static constexpr std::size_t kBatchPerCycle = 256;

  // Queues `request` and waits up to `wait_s` for its verdict; "queued" (202) when it did not come in time, or
  // at once when the request's user has a cycle's share waiting already (the caller goes on to the others), 503
  // when the queue or the user's part of it is full.
  Verdict submit(std::shared_ptr<Request> request, double wait_s);
  // This cycle's fair share of the queue, taken out of it in arrival order.
  std::vector<std::shared_ptr<Request>> take_batch();
  // Until a request comes, `stop` is set (and wake() called), or `wait_s` passed.
  void wait(double wait_s, const std::atomic<bool>& stop);
  void wake() { cv_.notify_one(); }
  std::size_t size() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;      // guarded by mu_
  std::map<std::uint32_t, std::size_t> by_user_;    // guarded by mu_: requests waiting per share
};

}  // namespace ckpt::controller
