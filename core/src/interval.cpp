#include "ckpt/interval.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/format.hpp"
#include "ckpt/parse.hpp"

namespace ckpt::interval {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A finite, non-negative measurement or an error naming it.
Status check_measurement(const char* name, double value) {
  if (!std::isfinite(value) || value < 0) {
    return Status::failure(std::string(name) + " must be a finite number of seconds >= 0 (got " + format_number(value) +
                           ")");
  }
  return Status::success();
}

}  // namespace

double median(const std::deque<double>& samples) {
  if (samples.empty()) return 0;
  std::vector<double> v(samples.begin(), samples.end());
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  double upper = *mid;
  if (v.size() % 2 == 1) return upper;
  double lower = *std::max_element(v.begin(), mid);
  return (lower + upper) / 2;
}

void push_bounded(std::deque<double>& samples, double value, std::size_t window) {
  samples.push_back(value);
  while (samples.size() > window) samples.pop_front();
}

Status check(const Params& params) {
  if (std::isnan(params.cost_s) || params.cost_s < 0 || std::isinf(params.cost_s)) {
    return Status::failure("checkpoint cost must be a finite duration >= 0 (got " + format_number(params.cost_s) +
                           "s)");
  }
  if (std::isnan(params.restart_s) || params.restart_s < 0 || std::isinf(params.restart_s)) {
    return Status::failure("restart cost must be a finite duration >= 0 (got " + format_number(params.restart_s) +
                           "s)");
  }
  if (std::isnan(params.mtbf_s) || params.mtbf_s <= 0) {
    return Status::failure("MTBF must be a positive duration (got " + format_number(params.mtbf_s) + "s)");
  }
  return Status::success();
}

double young(double cost_s, double mtbf_s) {
  if (cost_s == 0) return 0;  // checked before M: 0·inf would be NaN
  return std::sqrt(2 * cost_s * mtbf_s);
}

double daly(double cost_s, double mtbf_s) {
  if (cost_s == 0) return 0;
  if (cost_s >= 2 * mtbf_s) return mtbf_s;
  if (std::isinf(mtbf_s)) return kInf;
  double ratio = cost_s / (2 * mtbf_s);
  return std::sqrt(2 * cost_s * mtbf_s) * (1 + std::sqrt(ratio) / 3 + ratio / 9) - cost_s;
}

double waste_fraction(const Params& params, double interval_s) {
  double checkpoint_term = 0;
  if (params.cost_s > 0) {
    if (!(interval_s > 0)) return kInf;
    checkpoint_term = std::isinf(interval_s) ? 0 : params.cost_s / interval_s;
  }
  double failure_term = 0;
  if (!std::isinf(params.mtbf_s)) {
    double tau = std::max(interval_s, 0.0);
    failure_term = (tau / 2 + params.restart_s) / params.mtbf_s;
  }
  return checkpoint_term + failure_term;
}

double goodput(const Params& params, double interval_s) {
  double waste = waste_fraction(params, interval_s);
  return std::clamp(1 - waste, 0.0, 1.0);
}

Result<Optimum> optimize(const Params& params) {
  if (auto st = check(params); !st) return Error{st.error()};
  Optimum o;
  o.params = params;
  o.young_s = young(params.cost_s, params.mtbf_s);
  o.daly_s = daly(params.cost_s, params.mtbf_s);
  o.young_waste = waste_fraction(params, o.young_s);
  o.daly_waste = waste_fraction(params, o.daly_s);
  return o;
}

Result<double> job_mtbf(double node_mtbf_s, unsigned long long nodes) {
  if (nodes == 0) return Error{"node count must be at least 1"};
  if (std::isnan(node_mtbf_s) || node_mtbf_s <= 0) {
    return Error{"node MTBF must be a positive duration (got " + format_number(node_mtbf_s) + "s)"};
  }
  return node_mtbf_s / static_cast<double>(nodes);
}

// ---- AutoInterval ------------------------------------------------------------------------------------------

AutoInterval::AutoInterval() : AutoInterval(Config{}) {}

AutoInterval::AutoInterval(const Config& config) : config_(config), mtbf_s_(config.mtbf_s) { recompute(); }

Result<AutoInterval> AutoInterval::create(const Config& config) {
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (!positive(config.min_interval_s)) {
    return Error{"min_interval_s must be a positive finite duration (got " + format_number(config.min_interval_s) +
                 ")"};
  }
  if (!positive(config.initial_interval_s)) {
    return Error{"initial_interval_s must be a positive finite duration (got " +
                 format_number(config.initial_interval_s) + ")"};
  }
  if (!(config.max_interval_s == 0 ||
        (std::isfinite(config.max_interval_s) && config.max_interval_s >= config.min_interval_s))) {
    return Error{"max_interval_s must be 0 (none) or at least min_interval_s (got " +
                 format_number(config.max_interval_s) + ")"};
  }
  if (std::isnan(config.mtbf_s) || config.mtbf_s <= 0) {
    return Error{"mtbf_s must be positive (got " + format_number(config.mtbf_s) + ")"};
  }
  if (config.window == 0) return Error{"window must be at least 1"};
  return AutoInterval(config);
}

Status AutoInterval::observe_checkpoint(double stall_s, double interference_s, double persist_s) {
  for (auto [name, value] : {std::pair{"stall", stall_s}, {"interference", interference_s}, {"persist", persist_s}}) {
    if (auto st = check_measurement(name, value); !st) return st;
  }
  push_bounded(stall_, stall_s, config_.window);
  push_bounded(interference_, interference_s, config_.window);
  push_bounded(cost_, stall_s + interference_s, config_.window);
  push_bounded(persist_, persist_s, config_.window);
  ++checkpoints_;
  recompute();
  return Status::success();
}

std::string AutoInterval::measurements_json() const {
  nlohmann::json checkpoints = nlohmann::json::array();
  for (std::size_t i = 0; i < stall_.size(); ++i) checkpoints.push_back({stall_[i], interference_[i], persist_[i]});
  nlohmann::json j = {{"version", 1}, {"checkpoints", checkpoints}, {"restarts", restart_}};
  return j.dump();
}

Result<std::size_t> AutoInterval::replay_measurements(std::string_view json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error{"not a JSON object"};
  if (j.value("version", 0) != 1) return Error{"unknown version " + j.value("version", nlohmann::json()).dump()};
  auto number_at = [](const nlohmann::json& a, std::size_t i) -> std::optional<double> {
    if (!a.is_array() || i >= a.size() || !a[i].is_number()) return std::nullopt;
    return a[i].get<double>();
  };
  const nlohmann::json checkpoints = j.value("checkpoints", nlohmann::json::array());
  const nlohmann::json restarts = j.value("restarts", nlohmann::json::array());
  if (!checkpoints.is_array() || !restarts.is_array()) return Error{"checkpoints and restarts must be arrays"};
  // Everything is checked before anything is recorded.
  AutoInterval trial = *this;
  for (std::size_t i = 0; i < checkpoints.size(); ++i) {
    auto stall = number_at(checkpoints[i], 0), interference = number_at(checkpoints[i], 1),
         persist = number_at(checkpoints[i], 2);
    if (!stall || !interference || !persist || checkpoints[i].size() != 3) {
      return Error{"checkpoint " + std::to_string(i) + " is not [stall, interference, persist]"};
    }
    if (Status s = trial.observe_checkpoint(*stall, *interference, *persist); !s) {
      return Error{"checkpoint " + std::to_string(i) + ": " + s.error()};
    }
  }
  for (std::size_t i = 0; i < restarts.size(); ++i) {
    auto r = number_at(restarts, i);
    if (!r) return Error{"restart " + std::to_string(i) + " is not a number"};
    if (Status s = trial.observe_restart(*r); !s) return Error{"restart " + std::to_string(i) + ": " + s.error()};
  }
  *this = std::move(trial);
  return checkpoints.size();
}

Status AutoInterval::observe_restart(double restart_s) {
  if (auto st = check_measurement("restart", restart_s); !st) return st;
  push_bounded(restart_, restart_s, config_.window);
  recompute();
  return Status::success();
}

Status AutoInterval::set_mtbf(double mtbf_s) {
  if (std::isnan(mtbf_s) || mtbf_s <= 0) {
    return Status::failure("MTBF must be positive (got " + format_number(mtbf_s) + "s)");
  }
  mtbf_s_ = mtbf_s;
  recompute();
  return Status::success();
}

void AutoInterval::recompute() {
  Inputs in;
  in.checkpoints = checkpoints_;
  in.mtbf_s = mtbf_s_;
  in.stall_s = median(stall_);
  in.interference_s = median(interference_);
  // The median of the sums, not the sum of the medians: stall and interference of one checkpoint trade off.
  in.cost_s = median(cost_);
  in.persist_floor_s = persist_.empty() ? 0 : *std::max_element(persist_.begin(), persist_.end());
  in.restart_s = median(restart_);

  double chosen = config_.initial_interval_s;
  in.source = Source::Initial;
  if (!cost_.empty()) {
    in.young_s = young(in.cost_s, in.mtbf_s);
    in.daly_s = daly(in.cost_s, in.mtbf_s);
    chosen = in.daly_s;
    in.source = Source::Daly;
  }
  if (chosen < config_.min_interval_s) {
    chosen = config_.min_interval_s;
    in.source = Source::Minimum;
  }
  if (config_.max_interval_s > 0 && chosen > config_.max_interval_s) {
    chosen = config_.max_interval_s;
    in.source = Source::Maximum;
  }
  // The floor wins over the maximum: overlapping persists would only queue up and stall training anyway.
  if (chosen < in.persist_floor_s) {
    chosen = in.persist_floor_s;
    in.source = Source::PersistFloor;
  }
  in.interval_s = chosen;
  in.waste_fraction = waste_fraction(Params{in.cost_s, in.restart_s, in.mtbf_s}, chosen);
  inputs_ = in;
}

std::string AutoInterval::describe() const {
  const Inputs& in = inputs_;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.2f%%", 100 * in.waste_fraction);
  std::string line = "interval " + format_seconds(in.interval_s) + " (" + to_string(in.source) + ")";
  if (in.checkpoints == 0) {
    line += "; no checkpoint measured yet";
  } else {
    line += "; daly " + format_seconds(in.daly_s) + ", young " + format_seconds(in.young_s) + "; cost " +
            format_seconds(in.cost_s) + " (median of " + std::to_string(std::min(in.checkpoints, config_.window)) +
            ": stall " + format_seconds(in.stall_s) + ", interference " + format_seconds(in.interference_s) +
            "); persist floor " + format_seconds(in.persist_floor_s);
  }
  line +=
      "; restart " + format_seconds(in.restart_s) + "; mtbf " + format_seconds(in.mtbf_s) + "; expected waste " + pct;
  return line;
}

const char* to_string(AutoInterval::Source source) {
  switch (source) {
    case AutoInterval::Source::Initial: return "initial";
    case AutoInterval::Source::Daly: return "daly";
    case AutoInterval::Source::Minimum: return "minimum";
    case AutoInterval::Source::Maximum: return "maximum";
    case AutoInterval::Source::PersistFloor: return "persist floor";
  }
  return "?";
}

std::string format_seconds(double seconds) {
  if (std::isnan(seconds)) return "nan";
  if (std::isinf(seconds)) return seconds > 0 ? "inf" : "-inf";
  char buf[64];
  if (seconds < 0) {
    std::snprintf(buf, sizeof buf, "%gs", seconds);
    return buf;
  }
  if (seconds < 10 && seconds != std::floor(seconds)) {
    // Sub-second precision only where it matters; "18m31s" reads better than "1111.42s".
    std::snprintf(buf, sizeof buf, "%.2gs", seconds);
    return buf;
  }
  double rounded = std::round(seconds);
  if (rounded >= 1e18) {
    std::snprintf(buf, sizeof buf, "%.3gs", seconds);
    return buf;
  }
  return format_duration(static_cast<std::uint64_t>(rounded));
}

void StepMeter::on_snapshot(double now_s, std::uint64_t persisted, std::uint64_t failed) {
  measuring_ = true;
  interference_s_ = 0;
  step_end_s_ = now_s;  // the snapshot's stall is δ's stall part, not step time
  persists_seen_ = persisted + failed;
  persisted_seen_ = persisted;
}

std::optional<StepMeter::Measurement> StepMeter::on_step(double now_s, const Worker& worker) {
  const double dt = std::max(0.0, now_s - step_end_s_ - guard_s_);
  guard_s_ = 0;
  step_end_s_ = now_s;
  const bool finished = measuring_ && worker.pending == 0 && worker.persisted + worker.failed > persists_seen_;
  // The step in which the persist ended ran beside it too: a persist shorter than a step ends inside the first
  // step after the snapshot, and that step's excess is all of its interference.
  if (measuring_) {
    if (!quiet_.empty()) {
      std::vector<double> sorted(quiet_.begin(), quiet_.end());
      std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
      interference_s_ += std::max(0.0, dt - sorted[sorted.size() / 2]);
    }
  } else if (worker.pending == 0) {
    quiet_.push_back(dt);
    if (quiet_.size() > kQuietWindow) quiet_.pop_front();
  }
  if (!finished) return std::nullopt;
  measuring_ = false;
  if (worker.persisted <= persisted_seen_) return std::nullopt;
  return Measurement{worker.last_stall_s, interference_s_, worker.last_persist_s};
}

}  // namespace ckpt::interval
