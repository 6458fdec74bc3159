// Straggler detection at run time (pace.hpp).
#include "pace.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <xxhash.h>

#include "ckpt/clock.hpp"
#include "ckpt/inplace.hpp"
#include "ckpt/format.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/recovery.hpp"
#include "events.hpp"
#include "log.hpp"

namespace ckpt::hooks {

namespace heartbeat {

namespace {

std::uint64_t micros(double seconds) {
  if (!(seconds > 0)) return 0;
  return static_cast<std::uint64_t>(std::min(seconds * 1e6, 4294967295.0));
}

}  // namespace

Frame PaceFrame::to_frame() const {
  Frame f;
  f.type = kPace;
  f.a = pace.window;
  f.b = micros(pace.best_s) | (micros(pace.worst_s) << 32);
  f.flags = static_cast<std::uint32_t>(pace.best_rank);
  f.subject = pace.worst_rank;
  f.spare = static_cast<std::uint32_t>(pace.ranks);
  return f;
}

PaceFrame PaceFrame::from_frame(const Frame& f) {
  PaceFrame p;
  p.pace.window = f.a;
  p.pace.best_s = static_cast<double>(f.b & 0xffffffffu) / 1e6;
  p.pace.worst_s = static_cast<double>(f.b >> 32) / 1e6;
  p.pace.best_rank = static_cast<int>(f.flags);
  p.pace.worst_rank = f.subject;
  p.pace.ranks = static_cast<int>(f.spare);
  return p;
}

Frame SwapFrame::to_frame() const {
  Frame f;
  f.type = kSwap;
  f.a = node_hash;
  f.subject = rank;
  return f;
}

SwapFrame SwapFrame::from_frame(const Frame& f) { return {f.a, f.subject}; }

std::uint64_t node_hash(const std::string& node) { return XXH64(node.data(), node.size(), 0); }

}  // namespace heartbeat

namespace {

// A window still open this many windows after this rank's own is closed goes up with what it has.
constexpr std::uint64_t kWindowsLate = 2;
constexpr std::size_t kMaxQueuedReports = 16;

}  // namespace

PaceTree::PaceTree(const Config& config, heartbeat::Mesh& mesh, OnFlag on_flag)
    : config_(config),
      mesh_(mesh),
      on_flag_(std::move(on_flag)),
      meter_(config.straggler.window_steps),
      own_node_(mesh.node_of(config.rank)),
      detector_(config.straggler) {
  if (!on_flag_) on_flag_ = [this](const straggler::Flag& f, const std::string& node) { report(f, node); };
  reporter_ = std::thread([this] { reporter_loop(); });
}

PaceTree::~PaceTree() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  reports_cv_.notify_all();
  if (reporter_.joinable()) reporter_.join();
}

void PaceTree::on_work(double seconds) { meter_.on_work(seconds); }

void PaceTree::on_step(std::uint64_t step) {
  auto own = meter_.on_step(step, config_.rank);
  if (!own) return;
  std::lock_guard<std::mutex> lock(mu_);
  add_locked(*own, config_.rank);
  const std::uint64_t w = own->window;
  settle_locked(w >= kWindowsLate ? std::optional<std::uint64_t>(w - kWindowsLate + 1) : std::nullopt);
}

void PaceTree::on_frame(const heartbeat::Frame& frame, int from) {
  if (frame.type == heartbeat::kSwap) {
    on_swap(heartbeat::SwapFrame::from_frame(frame), from);
    return;
  }
  const straggler::Pace p = heartbeat::PaceFrame::from_frame(frame).pace;
  const auto in_world = [&](int r) { return r >= 0 && r < config_.world_size; };
  if (!in_world(p.best_rank) || !in_world(p.worst_rank) || p.ranks < 1 || p.ranks > config_.world_size) return;
  std::lock_guard<std::mutex> lock(mu_);
  add_locked(p, from);
  settle_locked(std::nullopt);
}

void PaceTree::on_swap(const heartbeat::SwapFrame& swap, int from) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (swap_seen_) return;
    swap_seen_ = true;
    leave_if_named_locked(swap);
  }
  mesh_.flood(swap.to_frame(), from);
}

// Under mu_: the rank on the node a swap names (the root's own included) is to end at its next step boundary.
void PaceTree::leave_if_named_locked(const heartbeat::SwapFrame& swap) {
  if (own_node_.empty() || heartbeat::node_hash(own_node_) != swap.node_hash) return;
  leaving_why_ = "node " + ckpt::printable(own_node_) + " is slow (named by rank " + std::to_string(swap.rank) +
                 "): ending this rank at the step boundary so that a warm spare takes it over";
  leaving_ = true;
}

std::string PaceTree::leaving_why() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leaving_why_;
}

bool PaceTree::spare_free() const {
  if (config_.inplace_id.empty() || config_.dir.empty()) return false;
  auto records = inplace::Records::open(inplace::records_dir(config_.dir, config_.inplace_id), false);
  return records && !records->free_spares().empty();
}

int PaceTree::flags() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flags_;
}

void PaceTree::add_locked(const straggler::Pace& pace, int from) {
  if (settled_ && pace.window <= *settled_) return;  // late: its window went up without it
  Tally& t = tallies_[pace.window];
  if (from == config_.rank) {
    if (t.own) return;
    t.own = true;
  } else {
    if (std::find(t.from.begin(), t.from.end(), from) != t.from.end()) return;
    t.from.push_back(from);
  }
  t.pace = straggler::merge(t.pace, pace);
  t.pace.window = pace.window;
}

void PaceTree::settle_locked(std::optional<std::uint64_t> stale_before) {
  const overlay::Links links = mesh_.links();
  while (!tallies_.empty()) {
    auto it = tallies_.begin();
    const Tally& t = it->second;
    const bool complete = t.own && std::all_of(links.down.begin(), links.down.end(), [&](int d) {
      return std::find(t.from.begin(), t.from.end(), d) != t.from.end();
    });
    const bool stale = stale_before && it->first < *stale_before;
    if (!complete && !stale) return;
    const straggler::Pace pace = t.pace;
    settled_ = it->first;
    tallies_.erase(it);
    if (links.is_root) {
      judge(pace);
    } else {
      (void)mesh_.send_up(heartbeat::PaceFrame{pace}.to_frame());
    }
  }
}

void PaceTree::judge(const straggler::Pace& job) {
  if (log::enabled(LogLevel::Debug)) {
    // One line per window at the root only: what bench/straggler reads to compare rules on the same windows.
    char line[200];
    std::snprintf(line, sizeof line,
                  "pace: window %llu: best %.6f s (rank %d), slowest %.6f s (rank %d), score %.3f, %d ranks",
                  static_cast<unsigned long long>(job.window), job.best_s, job.best_rank, job.worst_s,
                  job.worst_rank, straggler::score(job), job.ranks);
    log::debug(config_.rank, line);
  }
  auto flag = detector_.on_window(job);
  if (!flag) return;
  ++flags_;
  // node_of reads one address file: once per flag, never per window.
  std::string node = mesh_.node_of(flag->rank);
  if (node.empty()) node = "rank " + std::to_string(flag->rank) + "'s node";
  on_flag_(*flag, node);
}

// The root, under mu_: the line now (and the swap), the controller's report on the reporter thread.
void PaceTree::report(const straggler::Flag& flag, const std::string& node) {
  const std::string what = flag.describe(config_.straggler.window_steps);
  const straggler::Action action = config_.straggler.action;
  const bool exclude = action != straggler::Action::Report;
  const bool told = !config_.controller_url.empty() && !config_.job_id.empty();
  std::string then = told ? (exclude ? "; asking the controller to leave it out of the job's next runs"
                                     : "; reported to the controller")
                          : "";
  bool swap = false;
  if (action == straggler::Action::Swap) {
    swap = spare_free();
    then += swap ? "; its ranks hand over to a warm spare in place at their next step boundary"
                 : "; no warm spare is free to take its ranks over, so it trains on";
  }
  log::warn(config_.rank, "straggler: node " + ckpt::printable(node) + " runs at " + what + then);
  if (swap) {
    const heartbeat::SwapFrame frame{heartbeat::node_hash(node), flag.rank};
    swap_seen_ = true;  // the flood below is the only one
    leave_if_named_locked(frame);
    mesh_.flood(frame.to_frame());
  }
  if (!told || reports_.size() >= kMaxQueuedReports) return;
  auto job = parse_uint(config_.job_id);
  if (!job) return;
  ckpt::recovery::Event e = toolkit::event_from_here(ckpt::recovery::EventType::SlowNode,
                                                     static_cast<std::uint32_t>(*job),
                                                     static_cast<std::uint32_t>(config_.restart_count));
  e.slow_node = node;
  e.score = flag.score;
  // The controller's vocabulary: a swapped node leaves the job too.
  e.action = exclude ? ckpt::recovery::kSlowNodeExclude : ckpt::recovery::kSlowNodeReport;
  e.detail = what;
  reports_.push_back(std::move(e));
  reports_cv_.notify_all();
}

void PaceTree::reporter_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    reports_cv_.wait(lock, [&] { return stopping_ || !reports_.empty(); });
    if (reports_.empty()) return;
    const ckpt::recovery::Event event = std::move(reports_.front());
    reports_.pop_front();
    lock.unlock();
    if (Status s = toolkit::post_event(config_.controller_url, event, config_.munge_socket); !s) {
      log::warn(config_.rank, "straggler: the report to the controller failed: " + ckpt::printable(s.error()));
    }
    lock.lock();
  }
}

}  // namespace ckpt::hooks
