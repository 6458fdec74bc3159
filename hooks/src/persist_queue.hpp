#pragma once
// The persist thread: one worker at the lowest priority that runs tasks in the order they were queued, the persists
// of checkpoints and the background work beside them (staging grown ahead of a snapshot, the auto interval's
// measurements kept). One per Checkpointer.
//
// Call order: start() once; then the training thread enqueue()s and wait_idle()s (back-pressure: the staging a
// queued or running task reads is the worker's until then); persists_pending() and idle() from any thread; stop()
// (or the destructor) runs what is queued and joins.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ckpt::hooks {

class PersistQueue {
 public:
  PersistQueue() = default;
  PersistQueue(const PersistQueue&) = delete;
  PersistQueue& operator=(const PersistQueue&) = delete;
  ~PersistQueue() { stop(); }

  void start();
  // `persist`: the task writes a checkpoint (counted by persists_pending until it has run).
  void enqueue(bool persist, std::function<void()> run);
  // Blocks until the worker has nothing queued or running; returns whether a persist was what it waited for.
  bool wait_idle();
  int persists_pending() const;
  bool idle() const;
  void stop();

 private:
  struct Task {
    bool persist = false;
    std::function<void()> run;
  };
  void run_tasks();

  std::thread worker_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;    // guarded by mu_
  bool busy_ = false;         // guarded by mu_: a task is running
  int persists_pending_ = 0;  // guarded by mu_: persist tasks queued or running
  bool stopping_ = false;     // guarded by mu_
};

}  // namespace ckpt::hooks
