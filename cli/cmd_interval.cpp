// ckpt interval / ckpt simulate: the checkpoint interval model and its Monte-Carlo check.
// Options are taken as strings and parsed with the project's strict parsers, so every bad value gets one
// "ckpt: --option: ..." line naming the option and the value.
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ckpt/interval.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/simulate.hpp"
#include "commands.hpp"

namespace {

namespace iv = ckpt::interval;
namespace sim = ckpt::simulate;

constexpr int kOk = 0;
constexpr int kBadInput = 2;  // the question could not be asked (commands.hpp)

// Default job length for `simulate`: enough failures for about 1% precision, and still fast.
constexpr double kDefaultWorkInMtbf = 10000;

// Thrown inside a callback to print one "ckpt: ..." line and set exit code 2.
struct InputError {
  std::string message;
};

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100 * fraction);
  return buf;
}

std::string seconds_exact(double seconds) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  return buf;
}

// A long duration in one unit, for tables: "151.5d", "3.2h", "12.0m", "40.0s".
std::string coarse(double seconds) {
  if (!std::isfinite(seconds)) return "inf";
  char buf[48];
  if (seconds >= 86400) {
    std::snprintf(buf, sizeof buf, "%.1fd", seconds / 86400);
  } else if (seconds >= 3600) {
    std::snprintf(buf, sizeof buf, "%.1fh", seconds / 3600);
  } else if (seconds >= 60) {
    std::snprintf(buf, sizeof buf, "%.1fm", seconds / 60);
  } else {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  }
  return buf;
}

// Parses a duration option (whole or fractional seconds); `what` is the option name.
double duration_option(const std::string& what, const std::string& text) {
  auto value = ckpt::parse_seconds(text);
  if (!value) {
    throw InputError{what + ": invalid value '" + text + "': " + value.error()};
  }
  return *value;
}

// A fraction in [0, 1] written as plain decimal digits: "0", "0.25", "1".
double fraction_option(const std::string& what, const std::string& text) {
  bool digits = false, ok = !text.empty();
  int dots = 0;
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      digits = true;
    } else if (c == '.') {
      ++dots;
    } else {
      ok = false;
    }
  }
  double value = -1;
  if (ok && digits && dots <= 1) {
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    ok = ec == std::errc() && end == text.data() + text.size();
  } else {
    ok = false;
  }
  if (!ok || value < 0 || value > 1) {
    throw InputError{what + ": invalid value '" + text + "' (expected a fraction between 0 and 1, like 0.3)"};
  }
  return value;
}

std::uint64_t uint_option(const std::string& what, const std::string& text, std::uint64_t min,
                          std::uint64_t max = UINT64_MAX) {
  auto value = ckpt::parse_uint(text);
  if (!value || *value < min || *value > max) {
    std::string range =
        max == UINT64_MAX ? ">= " + std::to_string(min) : "from " + std::to_string(min) + " to " + std::to_string(max);
    throw InputError{what + ": invalid value '" + text + "'" + (value ? "" : ": " + value.error()) +
                     " (expected an integer " + range + ")"};
  }
  return *value;
}

// The options both subcommands share: δ, R and M (given, or derived from a node MTBF and a node count).
struct ModelOptions {
  std::string cost, mtbf, restart = "0s", nodes, node_mtbf;

  void add_to(CLI::App* cmd) {
    cmd->add_option("--cost", cost, "Cost of one checkpoint as training sees it (e.g. 30s)")
        ->required()
        ->type_name("DUR");
    cmd->add_option("--mtbf", mtbf, "Mean time between failures of the job (e.g. 6h)")->type_name("DUR");
    cmd->add_option("--restart", restart, "Cost of one restart, from failure to training again (default 0s)")
        ->type_name("DUR");
    cmd->add_option("--nodes", nodes, "Node count; with --node-mtbf gives MTBF = node MTBF / nodes")->type_name("N");
    cmd->add_option("--node-mtbf", node_mtbf, "Mean time between failures of one node")->type_name("DUR");
  }

  struct Values {
    iv::Params params;
    std::optional<std::uint64_t> nodes;
    double node_mtbf_s = 0;
  };

  Values parse() const {
    Values v;
    v.params.cost_s = duration_option("--cost", cost);
    v.params.restart_s = duration_option("--restart", restart);
    if (!mtbf.empty() && (!nodes.empty() || !node_mtbf.empty())) {
      throw InputError{"--mtbf: give either --mtbf or --nodes with --node-mtbf, not both"};
    }
    if (!mtbf.empty()) {
      v.params.mtbf_s = duration_option("--mtbf", mtbf);
      if (v.params.mtbf_s <= 0) throw InputError{"--mtbf: invalid value '" + mtbf + "': MTBF must be positive"};
    } else if (!nodes.empty() || !node_mtbf.empty()) {
      if (nodes.empty()) throw InputError{"--node-mtbf: needs --nodes"};
      if (node_mtbf.empty()) throw InputError{"--nodes: needs --node-mtbf"};
      v.nodes = uint_option("--nodes", nodes, 1);
      v.node_mtbf_s = duration_option("--node-mtbf", node_mtbf);
      auto m = iv::job_mtbf(v.node_mtbf_s, *v.nodes);
      if (!m) throw InputError{"--node-mtbf: invalid value '" + node_mtbf + "': " + m.error()};
      v.params.mtbf_s = *m;
    } else {
      throw InputError{"--mtbf: required (or --nodes with --node-mtbf)"};
    }
    if (auto st = iv::check(v.params); !st) throw InputError{st.error()};
    return v;
  }
};

std::string mtbf_text(const ModelOptions::Values& v) {
  std::string s = "MTBF " + iv::format_seconds(v.params.mtbf_s);
  if (v.nodes) {
    s += " (node MTBF " + iv::format_seconds(v.node_mtbf_s) + " / " + std::to_string(*v.nodes) + " nodes)";
  }
  return s;
}

// Runs `body`, turning an InputError into one "ckpt: ..." line and exit code 2.
template <class F>
void guarded(int& exit_code, F body) {
  try {
    exit_code = body();
  } catch (const InputError& e) {
    std::fprintf(stderr, "ckpt: %s\n", e.message.c_str());
    exit_code = kBadInput;
  }
}

// ---- interval ---------------------------------------------------------------------------------------------------

struct IntervalCommand {
  ModelOptions model;
  bool json = false;

  int run() const {
    auto v = model.parse();
    auto o = iv::optimize(v.params);
    if (!o) throw InputError{o.error()};
    const iv::Params& p = v.params;
    const double tau = o->daly_s;
    // The three terms of the loss model at Daly's interval.
    const double checkpoint_term = p.cost_s == 0 ? 0 : p.cost_s / tau;
    const double rework_term = tau / 2 / p.mtbf_s;
    const double restart_term = p.restart_s / p.mtbf_s;

    if (json) {
      nlohmann::json j = {
          {"cost_s", p.cost_s},
          {"restart_s", p.restart_s},
          {"mtbf_s", p.mtbf_s},
          {"young_s", o->young_s},
          {"daly_s", o->daly_s},
          {"waste_fraction", o->daly_waste},
          {"goodput", iv::goodput(p, tau)},
          {"young_waste_fraction", o->young_waste},
          {"waste_breakdown", {{"checkpoint", checkpoint_term}, {"rework", rework_term}, {"restart", restart_term}}},
      };
      if (v.nodes) {
        j["nodes"] = *v.nodes;
        j["node_mtbf_s"] = v.node_mtbf_s;
      }
      std::printf("%s\n", j.dump(2).c_str());
      return kOk;
    }

    std::printf("checkpoint cost %s, restart %s, %s\n", iv::format_seconds(p.cost_s).c_str(),
                iv::format_seconds(p.restart_s).c_str(), mtbf_text(v).c_str());
    auto row = [&](const char* name, double interval, double waste) {
      std::printf("  %-6s interval %-8s (%s)  waste %s  goodput %s\n", name, iv::format_seconds(interval).c_str(),
                  seconds_exact(interval).c_str(), percent(waste).c_str(), percent(iv::goodput(p, interval)).c_str());
    };
    row("young", o->young_s, o->young_waste);
    row("daly", o->daly_s, o->daly_waste);
    if (o->daly_waste < 1) {
      std::printf(
          "expected waste at Daly's interval: %s of wall time, %s per day (checkpoints %s, rework %s, "
          "restarts %s)\n",
          percent(o->daly_waste).c_str(), iv::format_seconds(o->daly_waste * 86400).c_str(),
          percent(checkpoint_term).c_str(), percent(rework_term).c_str(), percent(restart_term).c_str());
    } else {
      std::printf("expected waste at Daly's interval: all of it; the model predicts no progress\n");
    }
    if (p.cost_s >= 2 * p.mtbf_s) {
      std::printf("note: the cost is at least twice the MTBF, so Daly's interval is the MTBF itself\n");
    }
    return kOk;
  }
};

// ---- simulate ---------------------------------------------------------------------------------------------------

struct SimulateCommand {
  ModelOptions model;
  std::string catchable = "0", interval, work, seed = "1", svg, points = "25", failure_times, inplace_restart,
              spares = "1", memory_interval, memory_cost = "0", memory_catchable;
  bool json = false;

  struct Row {
    sim::Outcome outcome;
    double model_waste = 0;
    std::optional<double> exact_waste;  // only without last words
  };

  int run() const {
    auto v = model.parse();
    sim::Config c;
    c.cost_s = v.params.cost_s;
    c.restart_s = v.params.restart_s;
    c.mtbf_s = v.params.mtbf_s;
    c.catchable = fraction_option("--catchable", catchable);
    c.seed = uint_option("--seed", seed, 0);
    c.work_s = work.empty() ? kDefaultWorkInMtbf * c.mtbf_s : duration_option("--work", work);
    if (c.work_s <= 0) throw InputError{"--work: invalid value '" + work + "': the job needs some work"};
    if (c.cost_s <= 0) {
      throw InputError{"--cost: invalid value '" + model.cost +
                       "': the simulator needs a cost > 0 (free checkpoints make every optimum 0s)"};
    }
    if (failure_times == "none") {
      c.failure_times.emplace();
    } else if (!failure_times.empty()) {
      c.failure_times.emplace();
      for (const std::string& t : ckpt::split(failure_times, ',')) {
        c.failure_times->push_back(duration_option("--failure-times", t));
      }
    }
    if (!inplace_restart.empty()) {
      c.inplace_restart_s = duration_option("--in-place-restart", inplace_restart);
      c.spares = uint_option("--spares", spares, 1);
    }
    if (!memory_interval.empty()) {
      if (inplace_restart.empty()) {
        throw InputError{"--memory-interval: the memory tier recovers in place: give --in-place-restart too"};
      }
      c.memory_interval_s = duration_option("--memory-interval", memory_interval);
      if (c.memory_interval_s <= 0) {
        throw InputError{"--memory-interval: invalid value '" + memory_interval + "': must be more than 0s"};
      }
      c.memory_cost_s = duration_option("--memory-cost", memory_cost);
      c.memory_catchable =
          memory_catchable.empty() ? c.catchable : fraction_option("--memory-catchable", memory_catchable);
    }
    if (auto st = sim::check(c); !st) throw InputError{st.error()};

    std::vector<std::pair<sim::Policy, double>> policies;
    if (!interval.empty()) {
      double fixed = duration_option("--interval", interval);
      if (fixed <= 0) throw InputError{"--interval: invalid value '" + interval + "': must be at least 1s"};
      policies.emplace_back(sim::Policy::Fixed, fixed);
    }
    for (auto p : {sim::Policy::Young, sim::Policy::Daly, sim::Policy::LastWords}) policies.emplace_back(p, 0);
    if (!inplace_restart.empty()) policies.emplace_back(sim::Policy::InPlace, 0);
    if (!memory_interval.empty()) policies.emplace_back(sim::Policy::MemoryTier, 0);

    std::vector<Row> rows;
    for (auto [policy, fixed] : policies) {
      auto outcome = sim::run(c, policy, fixed);
      if (!outcome) throw InputError{std::string(sim::to_string(policy)) + ": " + outcome.error()};
      Row r{*outcome, sim::model_waste(c, policy, outcome->interval_s), std::nullopt};
      // Daly's exact expression knows neither last words nor in-place restarts.
      if (!sim::restarts_in_place(policy) && (!sim::writes_last_words(policy) || c.catchable == 0))
        r.exact_waste = sim::exact_waste(c, r.outcome.interval_s);
      rows.push_back(r);
    }

    std::optional<std::size_t> svg_points;
    if (!svg.empty()) {
      const int n = static_cast<int>(uint_option("--points", points, 2, 1000));
      const double young_s = iv::young(c.cost_s, c.mtbf_s);
      auto sweep = sim::sweep(c, young_s / 8, young_s * 8, n);
      if (!sweep) throw InputError{"--svg: " + sweep.error()};
      write_file(svg, sim::render_svg(c, *sweep));
      svg_points = sweep->size();
    }

    if (json) {
      print_json(c, rows, svg_points);
    } else {
      print_text(v, c, rows, svg_points);
    }
    return kOk;
  }

  static void write_file(const std::string& path, const std::string& body) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (out) out << body;
    if (out) out.flush();
    if (!out) throw InputError{"--svg: cannot write '" + path + "': " + std::strerror(errno)};
  }

  void print_json(const sim::Config& c, const std::vector<Row>& rows, std::optional<std::size_t> svg_points) const {
    nlohmann::json out = {
        {"cost_s", c.cost_s},
        {"restart_s", c.restart_s},
        {"mtbf_s", c.mtbf_s},
        {"catchable", c.catchable},
        {"work_s", c.work_s},
        {"seed", c.seed},
        {"failure_times", c.failure_times ? nlohmann::json(*c.failure_times) : nlohmann::json(nullptr)},
        {"inplace_restart_s", inplace_restart.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.inplace_restart_s)},
        {"spares", c.spares},
        {"memory_interval_s", memory_interval.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.memory_interval_s)},
        {"memory_cost_s", c.memory_cost_s},
        {"memory_catchable", c.memory_catchable},
        {"young_s", iv::young(c.cost_s, c.mtbf_s)},
        {"daly_s", iv::daly(c.cost_s, c.mtbf_s)},
    };
    nlohmann::json list = nlohmann::json::array();
    for (const Row& r : rows) {
      const sim::Outcome& o = r.outcome;
      nlohmann::json e = {
          {"policy", sim::to_string(o.policy)},
          {"interval_s", o.interval_s},
          {"goodput", o.goodput()},
          {"waste_fraction", o.waste_fraction()},
          {"model_goodput", std::max(0.0, 1 - r.model_waste)},
          {"model_waste_fraction", r.model_waste},
          {"lost_s", o.lost_s()},
          {"model_lost_s", sim::model_lost_s(c, o.policy, o.interval_s)},
          {"wall_s", o.wall_s},
          {"checkpoint_s", o.checkpoint_s},
          {"rework_s", o.rework_s},
          {"restart_s", o.restart_s},
          {"last_words_s", o.last_words_s},
          {"checkpoints", o.checkpoints},
          {"failures", o.failures},
          {"last_words", o.last_words},
          {"in_place", o.in_place},
          {"memory_s", o.memory_s},
          {"from_memory", o.from_memory},
      };
      e["exact_goodput"] = r.exact_waste ? nlohmann::json(1 - *r.exact_waste) : nlohmann::json(nullptr);
      list.push_back(e);
    }
    out["policies"] = list;
    if (svg_points) {
      out["svg"] = svg;
      out["svg_points"] = *svg_points;
    }
    std::printf("%s\n", out.dump(2).c_str());
  }

  void print_text(const ModelOptions::Values& v, const sim::Config& c, const std::vector<Row>& rows,
                  std::optional<std::size_t> svg_points) const {
    std::string work_text = iv::format_seconds(c.work_s);
    if (work.empty()) work_text += " (10000 x MTBF)";
    std::printf("checkpoint cost %s, restart %s, %s, %s of failures catchable, work %s, seed %llu\n",
                iv::format_seconds(c.cost_s).c_str(), iv::format_seconds(c.restart_s).c_str(), mtbf_text(v).c_str(),
                percent(c.catchable).c_str(), work_text.c_str(), static_cast<unsigned long long>(c.seed));
    if (!inplace_restart.empty()) {
      std::printf("in place: restart %s while the allocation holds one of its %llu spares, else a requeue\n",
                  iv::format_seconds(c.inplace_restart_s).c_str(), static_cast<unsigned long long>(c.spares));
    }
    if (!memory_interval.empty()) {
      std::printf("memory tier: a memory checkpoint every %s of compute, stalling %s; %s of failures caught with it\n",
                  iv::format_seconds(c.memory_interval_s).c_str(), iv::format_seconds(c.memory_cost_s).c_str(),
                  percent(c.memory_catchable).c_str());
    }
    if (c.failure_times) {
      std::printf("failures replayed at %zu given times, not drawn (model and exact are expectations)\n",
                  c.failure_times->size());
    }
    std::printf("%-11s %-9s %8s %8s %8s  %10s %10s  %8s %10s\n", "policy", "interval", "goodput", "model", "exact",
                "lost work", "model", "failures", "last words");
    for (const Row& r : rows) {
      const sim::Outcome& o = r.outcome;
      std::string exact = r.exact_waste ? percent(1 - *r.exact_waste) : "-";
      std::string words = sim::writes_last_words(o.policy) ? std::to_string(o.last_words) : "-";
      std::printf("%-11s %-9s %8s %8s %8s  %10s %10s  %8llu %10s\n", sim::to_string(o.policy),
                  iv::format_seconds(o.interval_s).c_str(), percent(o.goodput()).c_str(),
                  percent(std::max(0.0, 1 - r.model_waste)).c_str(), exact.c_str(), coarse(o.lost_s()).c_str(),
                  coarse(sim::model_lost_s(c, o.policy, o.interval_s)).c_str(),
                  static_cast<unsigned long long>(o.failures), words.c_str());
    }
    std::printf(
        "model: first-order loss model (last words: catchable failures cost min(work at risk, cost); memory tier: "
        "min(half an interval, half a memory interval + cost)); exact: exponential failures, no last words\n");
    if (svg_points) std::printf("wrote %s (%zu simulated intervals)\n", svg.c_str(), *svg_points);
  }
};

}  // namespace

void add_interval_commands(CLI::App& app, int& exit_code) {
  // The command objects outlive parse(): CLI11 binds the options to their members.
  auto interval_cmd = std::make_shared<IntervalCommand>();
  CLI::App* interval =
      app.add_subcommand("interval", "Optimal checkpoint interval (Young and Daly) and the expected waste");
  interval_cmd->model.add_to(interval);
  interval->add_flag("--json", interval_cmd->json, "Print JSON (young_s, daly_s, waste_fraction, ...)");
  interval->callback([interval_cmd, &exit_code] { guarded(exit_code, [&] { return interval_cmd->run(); }); });

  auto simulate_cmd = std::make_shared<SimulateCommand>();
  CLI::App* simulate =
      app.add_subcommand("simulate", "Monte-Carlo run of a job under exponential failures, checked against the model");
  simulate_cmd->model.add_to(simulate);
  simulate
      ->add_option("--catchable", simulate_cmd->catchable,
                   "Fraction of failures that leave time for a last-words checkpoint (default 0)")
      ->type_name("P");
  simulate->add_option("--interval", simulate_cmd->interval, "Also simulate this fixed interval")->type_name("DUR");
  simulate->add_option("--work", simulate_cmd->work, "Compute the job needs (default 10000 x MTBF)")->type_name("DUR");
  simulate->add_option("--seed", simulate_cmd->seed, "Random seed (default 1)")->type_name("N");
  simulate
      ->add_option("--failure-times", simulate_cmd->failure_times,
                   "Replay failures at these wall times (comma-separated, ascending; none: no failure) instead of "
                   "drawing them")
      ->type_name("LIST");
  simulate
      ->add_option("--in-place-restart", simulate_cmd->inplace_restart,
                   "Also simulate restart in place: last words, and this restart cost while a spare is left")
      ->type_name("DUR");
  simulate
      ->add_option("--spares", simulate_cmd->spares,
                   "Spares per allocation for --in-place-restart (default 1); a requeue brings new ones")
      ->type_name("N");
  simulate
      ->add_option("--memory-interval", simulate_cmd->memory_interval,
                   "Also simulate the memory tier (needs --in-place-restart): a memory checkpoint every DUR of compute")
      ->type_name("DUR");
  simulate
      ->add_option("--memory-cost", simulate_cmd->memory_cost,
                   "How long each memory checkpoint stalls training (default 0s)")
      ->type_name("DUR");
  simulate
      ->add_option("--memory-catchable", simulate_cmd->memory_catchable,
                   "Fraction of failures the last words catch with the memory tier, >= --catchable (default: "
                   "--catchable); the ones beyond --catchable keep the last memory checkpoint's work")
      ->type_name("P");
  simulate->add_option("--svg", simulate_cmd->svg, "Write a plot of waste against interval to this file")
      ->type_name("FILE");
  simulate->add_option("--points", simulate_cmd->points, "Intervals in the --svg sweep (default 25)")->type_name("N");
  simulate->add_flag("--json", simulate_cmd->json, "Print JSON");
  simulate->callback([simulate_cmd, &exit_code] { guarded(exit_code, [&] { return simulate_cmd->run(); }); });
}
