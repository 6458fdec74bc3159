#include "intake.hpp"

#include <chrono>

namespace ckpt::controller {

Verdict Intake::submit(std::shared_ptr<Request> request, double wait_s) {
  auto future = request->promise.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= kQueuedMax) return Verdict{503, "the controller's queue is full"};
    std::size_t& mine = by_user_[request->share];
    if (mine >= kPerUserQueued) {
      return Verdict{503, "uid " + std::to_string(request->share) + " has " + std::to_string(mine) +
                              " requests waiting already; try again"};
    }
    // A user whose requests queue up gets no verdict to wait for: the intake's workers go on to the others.
    if (mine >= kMinSharePerCycle) wait_s = 0;
    ++mine;
    queue_.push_back(std::move(request));
  }
  cv_.notify_one();
  if (wait_s <= 0) return Verdict{202, "queued"};
  if (future.wait_for(std::chrono::duration<double>(wait_s)) != std::future_status::ready) {
    return Verdict{202, "queued"};
  }
  return future.get();
}

std::vector<std::shared_ptr<Request>> Intake::take_batch() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::uint32_t> users;
  users.reserve(queue_.size());
  for (const auto& r : queue_) users.push_back(r->share);
  const auto take = ckpt::recovery::fair_batch(users, kBatchPerCycle, kMinSharePerCycle);
  std::vector<std::shared_ptr<Request>> batch;
  std::deque<std::shared_ptr<Request>> rest;
  std::size_t next = 0;
  for (std::size_t i = 0; i < queue_.size(); ++i) {
    if (next < take.size() && take[next] == i) {
      ++next;
      if (--by_user_[queue_[i]->share] == 0) by_user_.erase(queue_[i]->share);
      batch.push_back(std::move(queue_[i]));
    } else {
      rest.push_back(std::move(queue_[i]));
    }
  }
  queue_.swap(rest);
  return batch;
}

void Intake::wait(double wait_s, const std::atomic<bool>& stop) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(wait_s), [&] { return !queue_.empty() || stop.load(); });
}

std::size_t Intake::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace ckpt::controller
