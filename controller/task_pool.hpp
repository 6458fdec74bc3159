#pragma once
// A fixed set of threads for work the engine does off its own thread (probes of silent nodes, checkpoint reads as
// a job's owner). It bounds what runs at once across all jobs (a flood of failing jobs queues, it does not fork a
// thread and a reader child per job), and it makes its threads once, at start: a thread that cannot be created then
// leaves fewer workers (none: work runs on the caller's thread), never a std::terminate later.
// Call order: (engine thread) submit(); (workers) run the task; (engine thread) the future's wait_for/get. The
// future's destructor does not wait, so a record reset while its task runs does not hold the engine's lock.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace ckpt::controller {

class TaskPool {
 public:
  explicit TaskPool(std::size_t threads) {
    for (std::size_t i = 0; i < threads; ++i) {
      try {
        workers_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        break;  // the host is out of threads: go on with the workers made so far
      }
    }
  }
  ~TaskPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  std::size_t threads() const { return workers_.size(); }

  // Runs f() on a worker; its result or its exception comes through the future.
  template <class F>
  auto submit(F f) -> std::future<decltype(f())> {
    auto promise = std::make_shared<std::promise<decltype(f())>>();
    auto future = promise->get_future();
    std::function<void()> task = [promise, f = std::move(f)]() mutable {
      try {
        promise->set_value(f());
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    };
    if (workers_.empty()) {
      task();
      return future;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    return future;
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;  // what is still queued is dropped: its futures report a broken promise
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace ckpt::controller
