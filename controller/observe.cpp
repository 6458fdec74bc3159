#include "observe.hpp"

#include <algorithm>

#include <cstdio>

#include "ckpt/store.hpp"
#include "http.hpp"
#include "log.hpp"

namespace ckpt::controller {

namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

const std::map<std::string, std::string>& help() {
  static const std::map<std::string, std::string> h = {
      {"ckpt_controller_restarts_total", "Restarts made or seen, by ending and path"},
      {"ckpt_controller_gave_up_total", "Jobs the controller stopped restarting, by ending"},
      {"ckpt_controller_lost_work_seconds_total", "Training time lost to failures (since the newest checkpoint)"},
      {"ckpt_controller_events_total", "Events received, by type and result"},
      {"ckpt_controller_excluded_nodes_total", "Nodes excluded from a job after a failure"},
      {"ckpt_controller_slurm_errors_total", "Slurm calls that failed, by operation"},
  };
  return h;
}

}  // namespace

void Metrics::add(const std::string& name, const std::string& labels, double value) {
  std::lock_guard<std::mutex> lock(mutex_);
  counters_[name][labels] += value;
}

void Metrics::observe_recovery(const std::string& path, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  Histogram& h = recovery_[path];
  const auto& bounds = recovery_buckets();
  if (h.buckets.empty()) h.buckets.assign(bounds.size(), 0);
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (seconds <= bounds[i]) ++h.buckets[i];
  }
  ++h.count;
  h.sum += seconds;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  for (const auto& [name, h] : help()) {
    out += "# HELP " + name + " " + h + "\n# TYPE " + name + " counter\n";
    auto it = counters_.find(name);
    if (it == counters_.end()) {
      out += name + " 0\n";
      continue;
    }
    for (const auto& [labels, value] : it->second) {
      out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number(value) + "\n";
    }
  }
  const std::string hist = "ckpt_controller_recovery_seconds";
  out += "# HELP " + hist + " Time from the first failure report to the job's next run starting\n";
  out += "# TYPE " + hist + " histogram\n";
  for (const auto& [path, h] : recovery_) {
    const auto& bounds = recovery_buckets();
    for (std::size_t i = 0; i < bounds.size(); ++i) {
      out += hist + "_bucket{path=\"" + path + "\",le=\"" + number(bounds[i]) + "\"} " +
             std::to_string(h.buckets[i]) + "\n";
    }
    out += hist + "_bucket{path=\"" + path + "\",le=\"+Inf\"} " + std::to_string(h.count) + "\n";
    out += hist + "_sum{path=\"" + path + "\"} " + number(h.sum) + "\n";
    out += hist + "_count{path=\"" + path + "\"} " + std::to_string(h.count) + "\n";
  }
  return out;
}

Alerts::Alerts(std::string url, double timeout_s, int attempts, std::chrono::milliseconds first_retry)
    : url_(std::move(url)), timeout_s_(timeout_s), attempts_(std::max(1, attempts)), first_retry_(first_retry) {
  if (!url_.empty()) thread_ = std::thread([this] { worker(); });
}

Alerts::~Alerts() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Alerts::send(const std::string& json) {
  if (url_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.size() >= 1000) {
      log_warning("alert queue is full; dropping an alert");
      return;
    }
    queue_.push_back(json);
  }
  cv_.notify_one();
}

void Alerts::worker() {
  for (;;) {
    std::string body;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      body = std::move(queue_.front());
      queue_.pop_front();
    }
    deliver(body);
  }
}

void Alerts::deliver(const std::string& body) {
  HttpRequest request;
  request.method = "POST";
  request.url = url_;
  request.body = body;
  request.timeout_s = timeout_s_;
  auto wait = first_retry_;
  for (int attempt = 1;; ++attempt) {
    HttpResponse response = http_request(request);
    if (response.ok()) return;
    const std::string why = response.error.empty() ? "HTTP " + std::to_string(response.status) : response.error;
    const bool may_pass = !response.error.empty() || response.status == 429 || response.status >= 500;
    if (!may_pass || attempt >= attempts_) {
      log_warning("webhook " + url_ + " failed: " + why + (may_pass ? "; given up after " + std::to_string(attempt) +
                                                                          " attempts" : "; not retried"));
      return;
    }
    log_warning("webhook " + url_ + " failed: " + why + "; retrying in " + std::to_string(wait.count()) + " ms");
    std::unique_lock<std::mutex> lock(mutex_);
    if (cv_.wait_for(lock, wait, [&] { return stop_; })) {
      log_warning("webhook " + url_ + ": stopping; an alert was not delivered");
      return;
    }
    wait = std::min<std::chrono::milliseconds>(wait * 2, std::chrono::seconds(60));
  }
}

CheckpointView read_checkpoints(const std::string& dir) {
  CheckpointView view;
  if (dir.empty()) return view;
  try {
    auto entries = ckpt::store::scan(dir);
    if (!entries) {
      view.error = entries.error();
      return view;
    }
    auto candidates = ckpt::store::resume_candidates(*entries);
    if (candidates.empty()) return view;
    view.newest_complete = candidates.front();
    for (const auto& e : *entries) {
      if (e.step != candidates.front()) continue;
      view.newest_wall_time = e.manifest ? e.manifest->wall_time : e.mtime;
    }
  } catch (const std::exception& ex) {
    view.error = ex.what();
  }
  return view;
}

}  // namespace ckpt::controller
