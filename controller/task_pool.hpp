#pragma once
// A fixed set of threads and a queue: the one pool of the controller. The HTTP endpoint runs its requests on two of
// them (bounded queues: a full one answers 503), the engine its off-thread work on two more (probes of silent
// nodes, checkpoint reads as a job's owner: a flood of failing jobs queues, it does not fork a thread and a reader
// child per job). Threads are made once, at construction: one that cannot be created leaves fewer workers (none:
// work runs on the caller's thread), never a std::terminate later.
// Call order: (any thread) post() or submit(); (workers) run the task; (the caller) the future's wait_for/get, whose
// destructor does not wait, so a record reset while its task runs does not hold the engine's lock; (owner) stop(),
// which runs what is queued, then joins.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace ckpt::controller {

class TaskPool {
 public:
  static constexpr std::size_t kUnbounded = std::numeric_limits<std::size_t>::max();

  explicit TaskPool(std::size_t threads, std::size_t max_queued = kUnbounded) : max_queued_(max_queued) {
    for (std::size_t i = 0; i < threads; ++i) {
      try {
        workers_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        break;  // the host is out of threads: go on with the workers made so far
      }
    }
  }
  ~TaskPool() { stop(); }
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  std::size_t threads() const { return workers_.size(); }

  // Queues `task`; false (and nothing runs) when the pool is stopped or `max_queued` tasks wait already. Without
  // workers it runs on the caller's thread.
  bool post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_ || queue_.size() >= max_queued_) return false;
      if (!workers_.empty()) {
        queue_.push_back(std::move(task));
        task = nullptr;
      }
    }
    if (task) {
      task();
      return true;
    }
    wake_.notify_one();
    return true;
  }

  // Runs f() on a worker; its result or its exception comes through the future (a refused post: an exception).
  template <class F>
  auto submit(F f) -> std::future<decltype(f())> {
    auto promise = std::make_shared<std::promise<decltype(f())>>();
    auto future = promise->get_future();
    const bool queued = post([promise, f = std::move(f)]() mutable {
      try {
        promise->set_value(f());
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    });
    if (!queued) promise->set_exception(std::make_exception_ptr(std::runtime_error("the task pool is full or stopped")));
    return future;
  }

  // Refuses new tasks, runs the queued ones, and joins the workers.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) {
      if (t.joinable()) t.join();
    }
    workers_.clear();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything queued has run
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::size_t max_queued_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace ckpt::controller
