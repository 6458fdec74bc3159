#include "ckpt/simulate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <string_view>

#include "ckpt/format.hpp"
#include "ckpt/interval.hpp"

namespace ckpt::simulate {

namespace {

// The failure process. std::mt19937_64 is fully specified by the standard; the distributions are not, so the
// conversions are written out to make a seed mean the same run on every platform.
class Failures {
 public:
  // `trace`: replay these failure times instead of drawing gaps (see Config::failure_times).
  Failures(std::uint64_t seed, const std::vector<double>* trace) : rng_(seed), trace_(trace) {}

  // Draws the next failure: its gap from now and a uniform number that says whether it is catchable (see
  // Simulation::caught). A replayed failure that is already due strikes now.
  void draw(double now, double mtbf_s) {
    const double gap = -mtbf_s * std::log1p(-uniform());
    if (trace_ == nullptr) {
      next_at_ = now + gap;
    } else {
      next_at_ = next_ < trace_->size() ? std::max(now, (*trace_)[next_++]) : kNever;
    }
    next_catch_draw_ = uniform();
  }
  double next_at() const { return next_at_; }
  double next_catch_draw() const { return next_catch_draw_; }
  // A replay defers failures during a restart to its end instead of starting the restart over.
  bool replaying() const { return trace_ != nullptr; }

 private:
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  static constexpr double kNever = std::numeric_limits<double>::infinity();
  std::mt19937_64 rng_;
  const std::vector<double>* trace_;
  std::size_t next_ = 0;
  double next_at_ = 0;
  double next_catch_draw_ = 1;
};

// Expected wall time to get `a` seconds done without a failure, restarting (R) after each one.
double expected_segment_s(double a, double restart_s, double mtbf_s) {
  return mtbf_s * std::exp(restart_s / mtbf_s) * std::expm1(a / mtbf_s);
}

}  // namespace

const char* to_string(Policy policy) {
  switch (policy) {
    case Policy::Fixed: return "fixed";
    case Policy::Young: return "young";
    case Policy::Daly: return "daly";
    case Policy::LastWords: return "last-words";
    case Policy::InPlace: return "in-place";
    case Policy::MemoryTier: return "memory-tier";
  }
  return "?";
}

bool writes_last_words(Policy policy) {
  return policy == Policy::LastWords || policy == Policy::InPlace || policy == Policy::MemoryTier;
}

bool restarts_in_place(Policy policy) { return policy == Policy::InPlace || policy == Policy::MemoryTier; }

Status check(const Config& config) {
  auto finite_non_negative = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!finite_non_negative(config.cost_s)) {
    return Status::failure("checkpoint cost must be a finite duration >= 0 (got " + format_number(config.cost_s) +
                           "s)");
  }
  if (!finite_non_negative(config.restart_s)) {
    return Status::failure("restart cost must be a finite duration >= 0 (got " + format_number(config.restart_s) +
                           "s)");
  }
  if (!finite_non_negative(config.inplace_restart_s)) {
    return Status::failure("in-place restart cost must be a finite duration >= 0 (got " +
                           format_number(config.inplace_restart_s) + "s)");
  }
  if (!std::isfinite(config.mtbf_s) || config.mtbf_s <= 0) {
    return Status::failure("MTBF must be a positive finite duration (got " + format_number(config.mtbf_s) + "s)");
  }
  if (!std::isfinite(config.work_s) || config.work_s <= 0) {
    return Status::failure("work must be a positive finite duration (got " + format_number(config.work_s) + "s)");
  }
  if (!(config.catchable >= 0 && config.catchable <= 1)) {
    return Status::failure("catchable fraction must be between 0 and 1 (got " + format_number(config.catchable) + ")");
  }
  static const std::vector<double> kNone;
  const std::vector<double>& times = config.failure_times ? *config.failure_times : kNone;
  for (std::size_t i = 0; i < times.size(); ++i) {
    const double t = times[i];
    if (!std::isfinite(t) || t < 0 || (i > 0 && t < times[i - 1])) {
      return Status::failure("failure time " + std::to_string(i + 1) + " must be finite, >= 0 and not before the one"
                             " before it (got " + format_number(t) + "s)");
    }
  }
  if (!finite_non_negative(config.memory_interval_s)) {
    return Status::failure("memory interval must be a finite duration >= 0 (got " +
                           format_number(config.memory_interval_s) + "s)");
  }
  if (!finite_non_negative(config.memory_cost_s)) {
    return Status::failure("memory checkpoint cost must be a finite duration >= 0 (got " +
                           format_number(config.memory_cost_s) + "s)");
  }
  if (config.memory_interval_s > 0 &&
      !(config.memory_catchable >= config.catchable && config.memory_catchable <= 1)) {
    return Status::failure("the fraction caught with the memory tier must be between the catchable fraction (" +
                           format_number(config.catchable) + ") and 1 (got " + format_number(config.memory_catchable) +
                           ")");
  }
  if (config.max_events == 0) return Status::failure("max_events must be at least 1");
  return Status::success();
}

double policy_interval(const Config& config, Policy policy, double fixed_s) {
  switch (policy) {
    case Policy::Fixed: return fixed_s;
    case Policy::Young: return interval::young(config.cost_s, config.mtbf_s);
    case Policy::Daly:
    case Policy::LastWords:
    case Policy::InPlace:
    case Policy::MemoryTier: return interval::daly(config.cost_s, config.mtbf_s);
  }
  return 0;
}

namespace {

Error too_many_events(const Config& config, const std::string& what) {
  return Error{"the job cannot finish within " + std::to_string(config.max_events) + " events (" + what +
               " is far too long for MTBF " + interval::format_seconds(config.mtbf_s) + ")"};
}

// One simulated run under one policy: the clock, the work in a checkpoint and the tallies, advanced a segment (or
// a failure and its restart) at a time. Under the memory tier the stall of its checkpoints is spread over the
// compute (`stretch_` wall seconds per second of work), and memory checkpoints fall at multiples of τ_m of work.
class Simulation {
 public:
  Simulation(const Config& config, Policy policy, double tau)
      : config_(config),
        tau_(tau),
        delta_(config.cost_s),
        in_place_(restarts_in_place(policy)),
        last_words_(writes_last_words(policy)),
        memory_tier_(policy == Policy::MemoryTier),
        stretch_(memory_tier_ ? 1 + config.memory_cost_s / config.memory_interval_s : 1),
        spares_left_(config.spares),
        failures_(config.seed, config.failure_times ? &*config.failure_times : nullptr) {
    out_.policy = policy;
    out_.interval_s = tau;
    failures_.draw(now_, config.mtbf_s);
  }

  Result<Outcome> run() {
    const std::string interval_text = "interval " + interval::format_seconds(tau_);
    while (done_ < config_.work_s) {
      if (++events_ > config_.max_events) return too_many_events(config_, interval_text);
      const double segment = std::min(tau_, config_.work_s - done_);
      const double attempt = segment * stretch_ + delta_;
      if (now_ + attempt <= failures_.next_at()) {
        now_ += attempt;
        done_ += segment;
        out_.memory_s += segment * (stretch_ - 1);
        out_.checkpoint_s += delta_;
        ++out_.checkpoints;
        continue;
      }
      fail_during(segment);
      if (auto error = restart()) return *error;
    }
    out_.work_s = config_.work_s;
    out_.wall_s = now_;
    return out_;
  }

 private:
  enum class Catch { None, Live, Memory };

  // How the last words catch the next failure: from live state with probability `catchable`, from the memory tier
  // with probability memory_catchable − catchable, else not at all.
  Catch caught() const {
    if (!last_words_) return Catch::None;
    const double draw = failures_.next_catch_draw();
    if (draw < config_.catchable) return Catch::Live;
    if (memory_tier_ && draw < config_.memory_catchable) return Catch::Memory;
    return Catch::None;
  }

  // A failure during the segment or its checkpoint.
  void fail_during(double segment) {
    const double elapsed = failures_.next_at() - now_;
    now_ = failures_.next_at();
    ++out_.failures;
    const double compute_wall = std::min(elapsed, segment * stretch_);
    const double at_risk = compute_wall / stretch_;  // work not yet in a checkpoint
    const Catch how = caught();
    double kept = 0;
    if (how == Catch::Live) kept = at_risk;
    if (how == Catch::Memory) {
      const double tau_m = config_.memory_interval_s;
      kept = std::max(0.0, std::floor((done_ + at_risk) / tau_m) * tau_m - done_);
    }
    if (kept > delta_) {
      // Writing the terminal checkpoint is worth it only when it costs less than redoing the work.
      done_ += kept;
      out_.memory_s += kept * (stretch_ - 1);
      out_.rework_s += compute_wall - kept * stretch_;  // the compute since the last memory checkpoint
      out_.checkpoint_s += elapsed - compute_wall;       // a periodic write cut short, if the failure hit one
      now_ += delta_;
      out_.last_words_s += delta_;
      ++out_.last_words;
      if (how == Catch::Memory) ++out_.from_memory;
    } else {
      out_.rework_s += elapsed;
    }
  }

  // In place while a spare is left; else the requeue, into an allocation with its spares again. The error when the
  // restarts run into the event guard.
  std::optional<Error> restart() {
    double restart_s = config_.restart_s;
    if (in_place_ && spares_left_ > 0) {
      restart_s = config_.inplace_restart_s;
      --spares_left_;
      ++out_.in_place;
    } else {
      spares_left_ = config_.spares;
    }
    // A failure during the restart starts it over. Its catchable flag is drawn but unused, which keeps the random
    // stream aligned across policies (two draws per failure).
    failures_.draw(now_ + (failures_.replaying() ? restart_s : 0), config_.mtbf_s);
    while (now_ + restart_s > failures_.next_at()) {
      if (++events_ > config_.max_events) {
        return too_many_events(config_, "restart cost " + interval::format_seconds(restart_s));
      }
      out_.restart_s += failures_.next_at() - now_;
      now_ = failures_.next_at();
      ++out_.failures;
      failures_.draw(now_, config_.mtbf_s);
    }
    now_ += restart_s;
    out_.restart_s += restart_s;
    return std::nullopt;
  }

  const Config& config_;
  const double tau_;
  const double delta_;  // the checkpoint's cost
  const bool in_place_;
  const bool last_words_;
  const bool memory_tier_;
  const double stretch_;
  std::uint64_t spares_left_;  // of the current allocation
  Failures failures_;
  Outcome out_;
  double now_ = 0;
  double done_ = 0;  // work in a checkpoint
  std::uint64_t events_ = 0;
};

}  // namespace

Result<Outcome> run(const Config& config, Policy policy, double fixed_s) {
  if (auto st = check(config); !st) return Error{st.error()};
  const double tau = policy_interval(config, policy, fixed_s);
  if (!std::isfinite(tau) || tau <= 0) {
    return Error{std::string("the ") + to_string(policy) + " interval must be a positive finite duration (got " +
                 format_number(tau) + "s)"};
  }
  if (policy == Policy::MemoryTier && !(config.memory_interval_s > 0)) {
    return Error{"the memory-tier policy needs a memory interval > 0"};
  }
  // Refuse up front what would run into the guard anyway: each segment takes e^{(τ+δ)/M}·e^{R/M} attempts on
  // average. Last words can only shorten that, so it keeps just the guard in Simulation::run.
  const double expected_events =
      std::ceil(config.work_s / tau) * std::exp((tau + config.cost_s + config.restart_s) / config.mtbf_s);
  if (!writes_last_words(policy) && !config.failure_times &&
      expected_events > static_cast<double>(config.max_events)) {
    return too_many_events(config, "interval " + interval::format_seconds(tau));
  }
  return Simulation(config, policy, tau).run();
}

double model_waste(const Config& config, Policy policy, double interval_s) {
  const double spares = static_cast<double>(config.spares);
  const double restart = restarts_in_place(policy)
                             ? (spares * config.inplace_restart_s + config.restart_s) / (spares + 1)
                             : config.restart_s;
  const bool memory_tier = policy == Policy::MemoryTier && config.memory_interval_s > 0;
  // The stall of memory checkpoints stretches compute: intervals below are counted in wall time.
  const double stretch = memory_tier ? 1 + config.memory_cost_s / config.memory_interval_s : 1;
  const double tau = interval_s * stretch;
  interval::Params params{config.cost_s, restart, config.mtbf_s};
  double waste = interval::waste_fraction(params, tau);
  if (!writes_last_words(policy) || !std::isfinite(waste)) return waste;
  // E[min(u, δ)] for u ~ U[0, τ]: a caught failure costs the terminal write, or the rework when that is cheaper.
  const double delta = config.cost_s;
  const double caught_cost = delta >= tau ? tau / 2 : delta - delta * delta / (2 * tau);
  waste += config.catchable * (caught_cost - tau / 2) / config.mtbf_s;
  if (!memory_tier) return waste;
  // Caught from the memory tier: the compute since its last checkpoint (half an interval on average) and the write.
  const double memory_caught_cost = std::min(tau / 2, config.memory_interval_s * stretch / 2 + delta);
  waste += (config.memory_catchable - config.catchable) * (memory_caught_cost - tau / 2) / config.mtbf_s;
  return 1 - (1 - waste) / stretch;
}

double model_lost_s(const Config& config, Policy policy, double interval_s) {
  const double waste = model_waste(config, policy, interval_s);
  if (!(waste < 1)) return std::numeric_limits<double>::infinity();
  return config.work_s * waste / (1 - waste);
}

double exact_waste(const Config& config, double interval_s) {
  if (!(interval_s > 0) || !std::isfinite(interval_s)) return 1;
  const double segments = std::floor(config.work_s / interval_s);
  const double remainder = config.work_s - segments * interval_s;
  double wall = segments * expected_segment_s(interval_s + config.cost_s, config.restart_s, config.mtbf_s);
  if (remainder > 0) wall += expected_segment_s(remainder + config.cost_s, config.restart_s, config.mtbf_s);
  if (!std::isfinite(wall) || wall <= 0) return 1;
  return 1 - config.work_s / wall;
}

Result<std::vector<SweepPoint>> sweep(const Config& config, double lo_s, double hi_s, int points) {
  if (auto st = check(config); !st) return Error{st.error()};
  if (!(lo_s > 0) || !std::isfinite(hi_s) || !(hi_s > lo_s)) {
    return Error{"sweep range must satisfy 0 < low < high (got " + format_number(lo_s) + "s to " + format_number(hi_s) +
                 "s)"};
  }
  if (points < 2) return Error{"a sweep needs at least 2 points"};
  std::vector<SweepPoint> out;
  out.reserve(static_cast<std::size_t>(points));
  const double step = std::log(hi_s / lo_s) / (points - 1);
  for (int i = 0; i < points; ++i) {
    SweepPoint p;
    p.interval_s = i == points - 1 ? hi_s : lo_s * std::exp(step * i);
    auto outcome = run(config, Policy::Fixed, p.interval_s);
    if (!outcome) return Error{outcome.error()};
    p.simulated = outcome->waste_fraction();
    p.model = model_waste(config, Policy::Fixed, p.interval_s);
    p.exact = exact_waste(config, p.interval_s);
    out.push_back(p);
  }
  return out;
}

// ---- SVG --------------------------------------------------------------------------------------------------------

namespace {

struct Plot {
  double left = 80, right = 200, top = 50, bottom = 60;  // margins; the legend sits in the right one
  double width = 860, height = 480;
  double x_lo = 1, x_hi = 10, y_hi = 1;

  double x(double seconds) const {
    double f = std::log(seconds / x_lo) / std::log(x_hi / x_lo);
    return left + f * (width - left - right);
  }
  double y(double fraction) const {
    double f = std::clamp(fraction, 0.0, y_hi) / y_hi;
    return height - bottom - f * (height - top - bottom);
  }
};

std::string fmt_num(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string text(double x, double y, std::string_view body, std::string_view attrs = "") {
  std::string out = "<text x=\"" + fmt_num("%.1f", x) + "\" y=\"" + fmt_num("%.1f", y) + "\"";
  if (!attrs.empty()) {
    out += ' ';
    out += attrs;
  }
  return out + ">" + escape(body) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, std::string_view attrs) {
  return "<line x1=\"" + fmt_num("%.1f", x1) + "\" y1=\"" + fmt_num("%.1f", y1) + "\" x2=\"" + fmt_num("%.1f", x2) +
         "\" y2=\"" + fmt_num("%.1f", y2) + "\" " + std::string(attrs) + "/>\n";
}

// A polyline of f(τ) over the plot's x range, 200 log-spaced samples.
template <class F>
std::string curve(const Plot& plot, F f, std::string_view attrs) {
  std::string pts;
  constexpr int n = 200;
  for (int i = 0; i <= n; ++i) {
    double tau = plot.x_lo * std::pow(plot.x_hi / plot.x_lo, static_cast<double>(i) / n);
    double w = f(tau);
    if (!std::isfinite(w)) continue;
    pts += fmt_num("%.1f", plot.x(tau)) + "," + fmt_num("%.1f", plot.y(w)) + " ";
  }
  return "<polyline fill=\"none\" " + std::string(attrs) + " points=\"" + pts + "\"/>\n";
}

// Round tick steps for a waste axis ending at y_hi (a fraction).
double y_tick_step(double y_hi) {
  for (double step : {0.001, 0.002, 0.005, 0.01, 0.02, 0.025, 0.05, 0.1, 0.2, 0.25}) {
    if (y_hi / step <= 8) return step;
  }
  return 0.25;
}

// The plot's ranges: the sweep's intervals (else a range around Young's interval), and waste up to a little above
// the highest point.
Plot fit_plot(const std::vector<SweepPoint>& points, double young_s) {
  Plot plot;
  if (!points.empty()) {
    plot.x_lo = points.front().interval_s;
    plot.x_hi = points.back().interval_s;
  }
  if (!(plot.x_hi > plot.x_lo) || !(plot.x_lo > 0)) {
    plot.x_lo = std::max(1.0, young_s / 8);
    plot.x_hi = plot.x_lo * 64;
  }
  double y_max = 0;
  for (const auto& p : points) y_max = std::max({y_max, p.simulated, std::min(p.model, 1.0), p.exact});
  plot.y_hi = std::clamp(y_max * 1.1, 0.01, 1.0);
  return plot;
}

// The document's start: the <svg> element, a white background and the title with the run's parameters.
std::string svg_header(const Plot& plot, const Config& config) {
  std::string svg;
  svg += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt_num("%.0f", plot.width) + "\" height=\"" +
         fmt_num("%.0f", plot.height) + "\" viewBox=\"0 0 " + fmt_num("%.0f", plot.width) + " " +
         fmt_num("%.0f", plot.height) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::string title = "Waste vs checkpoint interval: cost " + interval::format_seconds(config.cost_s) + ", restart " +
                      interval::format_seconds(config.restart_s) + ", MTBF " + interval::format_seconds(config.mtbf_s) +
                      ", seed " + std::to_string(config.seed);
  svg += text(plot.width / 2, 24, title, "text-anchor=\"middle\" font-size=\"15\"");
  return svg;
}

// Horizontal grid lines at round waste fractions, labelled in percent.
std::string y_grid(const Plot& plot) {
  const double x0 = plot.left, x1 = plot.width - plot.right;
  std::string svg;
  const double y_step = y_tick_step(plot.y_hi);
  const int y_ticks = static_cast<int>(std::floor(plot.y_hi / y_step + 1e-9));
  for (int i = 0; i <= y_ticks; ++i) {
    const double v = i * y_step;
    const double y = plot.y(v);
    svg += line(x0, y, x1, y, "stroke=\"#e5e5e5\"");
    svg += text(x0 - 6, y + 4, fmt_num(y_step < 0.01 ? "%.1f%%" : "%.0f%%", 100 * v), "text-anchor=\"end\"");
  }
  return svg;
}

// Vertical grid lines at round durations within the range, at most about ten of them labelled.
std::string x_grid(const Plot& plot) {
  const double y0 = plot.height - plot.bottom, y1 = plot.top;
  static constexpr double kTicks[] = {1,     2,     5,      10,     15,     30,      60,     120,
                                      300,   600,   900,    1800,   3600,   7200,    10800,  21600,
                                      43200, 86400, 172800, 345600, 604800, 1209600, 2592000};
  int shown = 0;
  for (double t : kTicks) {
    if (t >= plot.x_lo && t <= plot.x_hi) ++shown;
  }
  int every = std::max(1, (shown + 9) / 10);  // at most about ten labels
  int index = 0;
  std::string svg;
  for (double t : kTicks) {
    if (t < plot.x_lo || t > plot.x_hi) continue;
    double x = plot.x(t);
    svg += line(x, y0, x, y1, "stroke=\"#e5e5e5\"");
    if (index++ % every == 0) svg += text(x, y0 + 16, interval::format_seconds(t), "text-anchor=\"middle\"");
  }
  return svg;
}

// The two axes and their titles.
std::string axes(const Plot& plot) {
  const double x0 = plot.left, x1 = plot.width - plot.right;
  const double y0 = plot.height - plot.bottom, y1 = plot.top;
  std::string svg;
  svg += line(x0, y0, x1, y0, "stroke=\"black\"");
  svg += line(x0, y0, x0, y1, "stroke=\"black\"");
  svg += text((x0 + x1) / 2, plot.height - 18, "checkpoint interval (log scale)", "text-anchor=\"middle\"");
  svg += text(18, (y0 + y1) / 2, "waste (share of wall time)",
              "text-anchor=\"middle\" transform=\"rotate(-90 18 " + fmt_num("%.1f", (y0 + y1) / 2) + ")\"");
  return svg;
}

// The model's and the exact waste as curves, then the simulated points on top.
std::string curves_and_points(const Plot& plot, const Config& config, const std::vector<SweepPoint>& points) {
  std::string svg;
  svg += curve(
      plot, [&](double tau) { return model_waste(config, Policy::Fixed, tau); },
      "stroke=\"#1f77b4\" stroke-width=\"2\"");
  svg += curve(
      plot, [&](double tau) { return exact_waste(config, tau); },
      "stroke=\"#2ca02c\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"");
  for (const auto& p : points) {
    svg += "<circle cx=\"" + fmt_num("%.1f", plot.x(p.interval_s)) + "\" cy=\"" + fmt_num("%.1f", plot.y(p.simulated)) +
           "\" r=\"3.5\" fill=\"#d62728\"><title>" +
           escape(interval::format_seconds(p.interval_s) + ": simulated " + fmt_num("%.2f%%", 100 * p.simulated) +
                  ", model " + fmt_num("%.2f%%", 100 * p.model)) +
           "</title></circle>\n";
  }
  return svg;
}

// A dashed vertical line at an optimum `tau`, labelled at `label_y`; nothing when `tau` is outside the range.
std::string optimum_marker(const Plot& plot, double tau, const char* name, const char* color, double label_y) {
  if (!(tau >= plot.x_lo && tau <= plot.x_hi)) return "";
  const double y0 = plot.height - plot.bottom, y1 = plot.top;
  double x = plot.x(tau);
  return line(x, y0, x, y1, std::string("stroke=\"") + color + "\" stroke-dasharray=\"3,3\"") +
         text(x + 4, label_y, std::string(name) + " " + interval::format_seconds(tau),
              std::string("fill=\"") + color + "\"");
}

// The legend, in the right margin.
std::string legend(const Plot& plot) {
  const double y1 = plot.top;
  const double lx = plot.width - plot.right + 16;
  std::string svg;
  svg += line(lx, y1 + 10, lx + 24, y1 + 10, "stroke=\"#1f77b4\" stroke-width=\"2\"");
  svg += text(lx + 30, y1 + 14, "first-order model");
  svg += line(lx, y1 + 30, lx + 24, y1 + 30, "stroke=\"#2ca02c\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"");
  svg += text(lx + 30, y1 + 34, "exact (exponential)");
  svg += "<circle cx=\"" + fmt_num("%.1f", lx + 12) + "\" cy=\"" + fmt_num("%.1f", y1 + 50) +
         "\" r=\"3.5\" fill=\"#d62728\"/>\n";
  svg += text(lx + 30, y1 + 54, "simulated");
  svg += line(lx, y1 + 70, lx + 24, y1 + 70, "stroke=\"#9467bd\" stroke-dasharray=\"3,3\"");
  svg += text(lx + 30, y1 + 74, "Young");
  svg += line(lx, y1 + 90, lx + 24, y1 + 90, "stroke=\"#ff7f0e\" stroke-dasharray=\"3,3\"");
  svg += text(lx + 30, y1 + 94, "Daly");
  return svg;
}

}  // namespace

std::string render_svg(const Config& config, const std::vector<SweepPoint>& points) {
  const double young_s = interval::young(config.cost_s, config.mtbf_s);
  const double daly_s = interval::daly(config.cost_s, config.mtbf_s);
  const Plot plot = fit_plot(points, young_s);
  std::string svg = svg_header(plot, config);
  svg += y_grid(plot);
  svg += x_grid(plot);
  svg += axes(plot);
  svg += curves_and_points(plot, config, points);
  svg += optimum_marker(plot, young_s, "Young", "#9467bd", plot.top + 14);
  svg += optimum_marker(plot, daly_s, "Daly", "#ff7f0e", plot.top + 30);
  svg += legend(plot);
  svg += "</svg>\n";
  return svg;
}

}  // namespace ckpt::simulate
