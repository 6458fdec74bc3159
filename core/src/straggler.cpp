#include "ckpt/straggler.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace ckpt::straggler {

const char* to_string(Action action) {
  switch (action) {
    case Action::Report: return "report";
    case Action::Exclude: return "exclude";
    case Action::Swap: return "swap";
  }
  return "report";
}

namespace {

constexpr const char* kExpected =
    "expected off, or a fraction of the job's best speed between 0 and 1 with an optional action: 0.7, "
    "0.7,report, 0.6,exclude or 0.6,swap";

Result<double> parse_threshold(std::string_view text) {
  // Digits and one dot only: no sign, exponent, spaces or "nan" for from_chars to take.
  const bool plain = !text.empty() && text.size() <= 8 &&
                     std::all_of(text.begin(), text.end(), [](char c) { return (c >= '0' && c <= '9') || c == '.'; }) &&
                     std::count(text.begin(), text.end(), '.') <= 1 && text.front() != '.' && text.back() != '.';
  double value = 0;
  if (plain) {
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) value = 0;
  }
  if (!plain || !(value >= 0.01 && value <= 0.99)) return Error{"bad threshold"};
  return value;
}

}  // namespace

Result<Policy> parse_policy(std::string_view text, Policy base) {
  const auto bad = [&] { return Error{"'" + std::string(text) + "': " + kExpected}; };
  if (text == "off") {
    base.enabled = false;
    return base;
  }
  const auto comma = text.find(',');
  auto threshold = parse_threshold(text.substr(0, comma));
  if (!threshold) return bad();
  base.enabled = true;
  base.threshold = *threshold;
  base.action = Action::Report;
  if (comma != std::string_view::npos) {
    const std::string_view action = text.substr(comma + 1);
    if (action == "exclude") {
      base.action = Action::Exclude;
    } else if (action == "swap") {
      base.action = Action::Swap;
    } else if (action != "report") {
      return bad();
    }
  }
  return base;
}

std::string format_policy(const Policy& policy) {
  if (!policy.enabled) return "off";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f,%s", policy.threshold, to_string(policy.action));
  return text;
}

Pace merge(const Pace& a, const Pace& b) {
  if (a.ranks == 0) return b;
  if (b.ranks == 0) return a;
  Pace out = a;
  out.window = std::max(a.window, b.window);
  // Ties go to the lower rank, so that every leader merging the same paces agrees on who is named.
  if (b.best_s < a.best_s || (b.best_s == a.best_s && b.best_rank < a.best_rank)) {
    out.best_s = b.best_s;
    out.best_rank = b.best_rank;
  }
  if (b.worst_s > a.worst_s || (b.worst_s == a.worst_s && b.worst_rank < a.worst_rank)) {
    out.worst_s = b.worst_s;
    out.worst_rank = b.worst_rank;
  }
  out.ranks = a.ranks + b.ranks;
  return out;
}

double score(const Pace& pace) {
  if (pace.ranks < 2 || !(pace.worst_s > 0) || !(pace.best_s >= 0)) return 1;
  return std::clamp(pace.best_s / pace.worst_s, 0.0, 1.0);
}

void PaceMeter::on_work(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return;
  current_s_ += seconds;
  current_timed_ = true;
}

std::optional<Pace> PaceMeter::on_step(std::uint64_t step, int rank) {
  if (current_timed_) steps_s_.push_back(current_s_);
  current_s_ = 0;
  current_timed_ = false;
  const auto w = static_cast<std::uint64_t>(window_steps_);
  if (step % w != w - 1) {
    // A window never holds more steps than its length, even when steps are skipped.
    if (steps_s_.size() > w) steps_s_.erase(steps_s_.begin());
    return std::nullopt;
  }
  std::vector<double> steps;
  steps.swap(steps_s_);
  if (steps.empty() || steps.size() * 2 < w) return std::nullopt;
  std::sort(steps.begin(), steps.end());
  const std::size_t n = steps.size();
  const double median = n % 2 == 1 ? steps[n / 2] : (steps[n / 2 - 1] + steps[n / 2]) / 2;
  Pace p;
  p.window = step / w;
  p.best_s = p.worst_s = median;
  p.best_rank = p.worst_rank = rank;
  p.ranks = 1;
  return p;
}

std::string Flag::describe(int window_steps) const {
  char line[200];
  const auto w = static_cast<std::uint64_t>(std::max(window_steps, 1));
  std::snprintf(line, sizeof line, "%.2f of the job's best for %d windows, steps %llu-%llu (rank %d)", score, windows,
                static_cast<unsigned long long>(first_window * w),
                static_cast<unsigned long long>(last_window * w + w - 1), rank);
  return line;
}

std::optional<Flag> Detector::on_window(const Pace& job) {
  if (!policy_.enabled) return std::nullopt;
  if (last_window_ && job.window <= *last_window_) return std::nullopt;
  // A gap (a window nobody reported whole) breaks a spell: "in a row" means consecutive windows.
  const bool consecutive = last_window_ && job.window == *last_window_ + 1;
  last_window_ = job.window;
  const double s = score(job);
  if (s >= policy_.threshold) {
    spell_ = Flag{};
    flagged_ = false;
    return std::nullopt;
  }
  if (spell_.rank != job.worst_rank || !consecutive) {
    spell_ = Flag{};
    spell_.rank = job.worst_rank;
    spell_.first_window = job.window;
    flagged_ = false;
  }
  spell_.windows += 1;
  spell_.score = s;
  spell_.worst_score = std::min(spell_.worst_score, s);
  spell_.last_window = job.window;
  if (flagged_ || spell_.windows < policy_.windows) return std::nullopt;
  flagged_ = true;
  return spell_;
}

bool single_window_rule(const Pace& job, double threshold) { return score(job) < threshold; }

}  // namespace ckpt::straggler
