#include "persist_queue.hpp"

#include <sys/resource.h>
#include <unistd.h>

namespace ckpt::hooks {

namespace {

// The persist thread runs at the lowest priority. Buffered writes cost a lot of system CPU (page-cache
// allocation runs at first-touch speed on some VMs: ~2.6 s per GiB here); training must win a contended core.
constexpr int kPersistNice = 19;

}  // namespace

void PersistQueue::start() { worker_ = std::thread([this] { run_tasks(); }); }

void PersistQueue::run_tasks() {
  // Linux nice values are per thread; a failure only costs some interference.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kPersistNice);
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    task.run();
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      if (task.persist) --persists_pending_;
    }
    cv_.notify_all();
  }
}

void PersistQueue::enqueue(bool persist, std::function<void()> run) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back({persist, std::move(run)});
    if (persist) ++persists_pending_;
  }
  cv_.notify_all();
}

bool PersistQueue::wait_idle() {
  std::unique_lock<std::mutex> lock(mu_);
  bool persist = persists_pending_ > 0;
  cv_.wait(lock, [&] { return tasks_.empty() && !busy_; });
  return persist;
}

int PersistQueue::persists_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return persists_pending_;
}

bool PersistQueue::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.empty() && !busy_;
}

void PersistQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

}  // namespace ckpt::hooks
