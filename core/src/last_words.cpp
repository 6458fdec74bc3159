#include "ckpt/last_words.hpp"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <optional>
#include <set>
#include <utility>

namespace ckpt::last_words {

namespace {

using store::Layout;
using store::RankCoord;

// Disqualified replicas listed one per line up to this many; a mass failure must not flood the log.
constexpr std::size_t kMaxListed = 32;

std::string step_text(std::uint64_t step) { return "step " + std::to_string(step); }

// Position of a coordinate in a world-sized array; the coordinate must lie inside the layout.
std::size_t coord_index(const Layout& layout, int dp, int tp, int pp) {
  return (static_cast<std::size_t>(pp) * static_cast<std::size_t>(layout.tp) + static_cast<std::size_t>(tp)) *
             static_cast<std::size_t>(layout.dp) +
         static_cast<std::size_t>(dp);
}

// The reports indexed by coordinate, with every question asked of one rank.
class Ranks {
 public:
  Ranks(const Layout& layout, std::vector<const RankReport*> at) : layout_(layout), at_(std::move(at)) {}

  const RankReport* report(int dp, int tp, int pp) const { return at_[coord_index(layout_, dp, tp, pp)]; }

  // Alive, not mid-update, and at `step`.
  bool ready_at(int dp, int tp, int pp, std::uint64_t step) const {
    const RankReport* r = report(dp, tp, pp);
    return r && r->alive && !r->mid_update && r->step == step;
  }

  // Why a rank cannot contribute at `step`, e.g. "rank 5 (dp1/tp0/pp0) is dead"; empty when it can.
  std::string why_not(int dp, int tp, int pp, std::optional<std::uint64_t> step) const {
    const RankReport* r = report(dp, tp, pp);
    std::string who = format_coord(dp, tp, pp);
    if (!r) return who + " did not report";
    who = "rank " + std::to_string(r->coord.rank) + " (" + who + ")";
    if (!r->alive) return who + " is dead";
    if (r->mid_update) return who + " was caught mid-update at " + step_text(r->step);
    if (step && r->step != *step) return who + " is at " + step_text(r->step) + ", not " + step_text(*step);
    return "";
  }

 private:
  Layout layout_;
  std::vector<const RankReport*> at_;
};

// One TP group: replica `dp` of stage `pp`. Qualifies when every rank is alive, none is mid-update and all agree
// on the step.
struct Group {
  bool consistent = false;
  std::uint64_t step = 0;  // when consistent
  std::string why;         // when not
};

Group assess_group(const Ranks& ranks, const Layout& layout, int dp, int pp) {
  Group g;
  std::map<std::uint64_t, std::vector<std::string>> by_step;
  for (int t = 0; t < layout.tp; ++t) {
    std::string why = ranks.why_not(dp, t, pp, std::nullopt);
    if (!why.empty()) {
      g.why = why;
      return g;
    }
    by_step[ranks.report(dp, t, pp)->step].push_back(format_coord(dp, t, pp));
  }
  if (by_step.size() > 1) {
    g.why = "its ranks disagree on the step (";
    bool first = true;
    for (const auto& [step, who] : by_step) {
      if (!first) g.why += "; ";
      first = false;
      g.why += std::to_string(who.size()) + " at " + step_text(step);
    }
    g.why += ")";
    return g;
  }
  g.consistent = true;
  g.step = by_step.begin()->first;
  return g;
}

// The outcome of trying one step.
struct Attempt {
  std::uint64_t step = 0;
  std::vector<int> replica_of_stage;
  std::map<int, std::vector<std::string>> writers;
  std::size_t covered = 0;
  std::vector<std::string> missing;  // one line per uncovered key or stage
};

std::string replica_name(int dp, int pp) {
  return "replica dp" + std::to_string(dp) + " of stage pp" + std::to_string(pp);
}

Plan no_write(Plan plan, std::string why) {
  plan.write = false;
  plan.writers.clear();
  plan.summary = "last words: not writing a terminal checkpoint: " + why;
  plan.reasons.push_back(std::move(why));
  return plan;
}

}  // namespace

std::string format_coord(int dp, int tp, int pp) {
  return "dp" + std::to_string(dp) + "/tp" + std::to_string(tp) + "/pp" + std::to_string(pp);
}

std::vector<std::string> writer_keys(const Layout& layout, const std::vector<int>& replica_of_stage,
                                     const RankCoord& coord) {
  std::vector<std::string> keys;
  if (coord.pp < 0 || static_cast<std::size_t>(coord.pp) >= replica_of_stage.size()) return keys;
  const bool elected = replica_of_stage[static_cast<std::size_t>(coord.pp)] == coord.dp;
  for (const std::string& key : store::state_keys_of_rank(layout, coord)) {
    if (elected) {
      keys.push_back(key);
      continue;
    }
    // Not the elected replica: a key no other rank holds (a ZeRO-1 optimizer shard) is still this rank's to write.
    int holders = 0;
    for (int p = 0; p < layout.pp && holders < 2; ++p) {
      for (int t = 0; t < layout.tp && holders < 2; ++t) {
        for (int d = 0; d < layout.dp && holders < 2; ++d) {
          RankCoord c;
          c.dp = d;
          c.tp = t;
          c.pp = p;
          for (const std::string& k : store::state_keys_of_rank(layout, c)) holders += k == key ? 1 : 0;
        }
      }
    }
    if (holders == 1) keys.push_back(key);
  }
  return keys;
}

std::vector<store::ShardRecord> planned_records(const Plan& plan) {
  std::vector<store::ShardRecord> records;
  for (const auto& [rank, keys] : plan.writers) {
    store::ShardRecord r;
    r.rank = rank;
    r.file = store::shard_file_name(rank);
    r.covers = keys;
    records.push_back(std::move(r));
  }
  return records;
}

namespace {

// Indexes the reports by coordinate into `at` (world-sized); returns why when a report is bad, empty when all are
// good. A bad report means the coordinator's view is wrong, so the plan fails closed.
std::string index_reports(const Layout& layout, const std::vector<RankReport>& reports,
                          std::vector<const RankReport*>& at) {
  const int world = layout.world_size();
  at.assign(static_cast<std::size_t>(world), nullptr);
  std::set<int> seen_ranks;
  for (const RankReport& r : reports) {
    const RankCoord& c = r.coord;
    const std::string where = "report from rank " + std::to_string(c.rank);
    if (c.rank < 0 || c.rank >= world) {
      return "invalid " + where + ": rank outside a world of " + std::to_string(world);
    }
    if (c.dp < 0 || c.dp >= layout.dp || c.tp < 0 || c.tp >= layout.tp || c.pp < 0 || c.pp >= layout.pp) {
      return "invalid " + where + ": coordinate " + format_coord(c.dp, c.tp, c.pp) + " outside the layout";
    }
    if (!seen_ranks.insert(c.rank).second) return "invalid " + where + ": rank reported twice";
    const RankReport*& slot = at[coord_index(layout, c.dp, c.tp, c.pp)];
    if (slot) {
      return "invalid " + where + ": coordinate " + format_coord(c.dp, c.tp, c.pp) + " already reported by rank " +
             std::to_string(slot->coord.rank);
    }
    slot = &r;
  }
  return "";
}

// Every group's state and every key's possible holders, assessed once; then what one step would cover.
class Planner {
 public:
  Planner(const Layout& layout, const Ranks& ranks)
      : layout_(layout), ranks_(ranks), required_(store::required_state_keys(layout)) {
    for (int p = 0; p < layout.pp; ++p) {
      for (int d = 0; d < layout.dp; ++d) {
        groups_.push_back(assess_group(ranks, layout, d, p));
        if (groups_.back().consistent) steps_.insert(groups_.back().step);
      }
    }
    // Who could hold each key, from the store's own definition, in (pp, tp, dp) order.
    for (int p = 0; p < layout.pp; ++p) {
      for (int t = 0; t < layout.tp; ++t) {
        for (int d = 0; d < layout.dp; ++d) {
          RankCoord c;
          c.dp = d;
          c.tp = t;
          c.pp = p;
          for (const std::string& key : store::state_keys_of_rank(layout, c)) holders_[key].push_back(c);
        }
      }
    }
  }

  const Group& group(int d, int p) const {
    return groups_[static_cast<std::size_t>(p) * static_cast<std::size_t>(layout_.dp) + static_cast<std::size_t>(d)];
  }
  std::size_t group_count() const { return groups_.size(); }
  // The steps consistent groups are at.
  const std::set<std::uint64_t>& steps() const { return steps_; }
  std::size_t required_count() const { return required_.size(); }

  // Elects each stage's replica at `step` and finds a writer for every required key.
  Attempt attempt_at(std::uint64_t step) const {
    Attempt a;
    a.step = step;
    elect_replicas(a);
    for (const std::string& key : required_) {
      if (std::optional<RankCoord> writer = writer_of(a, key)) {
        const RankReport* r = ranks_.report(writer->dp, writer->tp, writer->pp);
        a.writers[r->coord.rank].push_back(key);
        ++a.covered;
      }
    }
    return a;
  }

 private:
  // For each stage the lowest dp index whose group is consistent at the attempt's step.
  void elect_replicas(Attempt& a) const {
    a.replica_of_stage.assign(static_cast<std::size_t>(layout_.pp), -1);
    for (int p = 0; p < layout_.pp; ++p) {
      for (int d = 0; d < layout_.dp; ++d) {
        const Group& g = group(d, p);
        if (g.consistent && g.step == a.step) {
          a.replica_of_stage[static_cast<std::size_t>(p)] = d;
          break;
        }
      }
      if (a.replica_of_stage[static_cast<std::size_t>(p)] < 0) {
        a.missing.push_back("stage pp" + std::to_string(p) + " has no replica whose whole tensor-parallel group " +
                            "is alive and consistent at " + step_text(a.step));
      }
    }
  }

  // The rank that writes `key` at the attempt's step; none (with a line in a.missing where the stage line does not
  // already explain it) when no rank can.
  std::optional<RankCoord> writer_of(Attempt& a, const std::string& key) const {
    auto it = holders_.find(key);
    if (it == holders_.end() || it->second.empty()) {
      a.missing.push_back(key + ": no rank holds it");
      return std::nullopt;
    }
    const std::vector<RankCoord>& hs = it->second;
    // A key a whole replica holds comes from the stage's elected group, so one stage's slices match.
    for (const RankCoord& c : hs) {
      if (a.replica_of_stage[static_cast<std::size_t>(c.pp)] == c.dp) return c;
    }
    // A key only one rank holds (a ZeRO-1 optimizer shard) needs just that rank, ready at the step.
    if (hs.size() == 1) {
      const RankCoord& c = hs.front();
      if (ranks_.ready_at(c.dp, c.tp, c.pp, a.step)) return c;
      a.missing.push_back(key + ": its only holder " + ranks_.why_not(c.dp, c.tp, c.pp, a.step));
    }
    // Otherwise already explained by the stage line, unless the store's holders span stages.
    return std::nullopt;
  }

  const Layout& layout_;
  const Ranks& ranks_;
  const std::vector<std::string> required_;
  std::vector<Group> groups_;  // index pp * dp + d
  std::set<std::uint64_t> steps_;
  std::map<std::string, std::vector<RankCoord>> holders_;
};

// The step tried: the newest that gives full coverage (complete); failing that, the one that comes closest, to
// explain why not.
struct Choice {
  Attempt used;
  bool complete = false;
};

Choice choose_step(const Planner& planner) {
  std::optional<Attempt> best;
  const std::set<std::uint64_t>& steps = planner.steps();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    Attempt a = planner.attempt_at(*it);
    if (a.missing.empty() && a.covered == planner.required_count()) return Choice{std::move(a), true};
    if (!best || a.covered > best->covered) best = std::move(a);
  }
  return Choice{std::move(*best), false};
}

// When no group is consistent at all: why each one (up to kMaxListed) is disqualified.
void list_inconsistent_groups(const Layout& layout, const Planner& planner, Plan& out) {
  const std::size_t total = planner.group_count();
  for (int p = 0; p < layout.pp; ++p) {
    for (int d = 0; d < layout.dp; ++d) {
      if (out.reasons.size() < kMaxListed) {
        out.reasons.push_back(replica_name(d, p) + " disqualified: " + planner.group(d, p).why);
      }
    }
  }
  if (total > kMaxListed)
    out.reasons.push_back("and " + std::to_string(total - kMaxListed) + " more disqualified replicas");
}

// Reasons: every group disqualified at the used step, then the election, then what is missing.
void list_reasons(const Layout& layout, const Planner& planner, const Attempt& used, Plan& out) {
  std::size_t listed = 0, unlisted = 0;
  for (int p = 0; p < layout.pp; ++p) {
    for (int d = 0; d < layout.dp; ++d) {
      const Group& g = planner.group(d, p);
      std::string why;
      if (!g.consistent) {
        why = g.why;
      } else if (g.step != used.step) {
        why = "at " + step_text(g.step) + ", not the agreed " + step_text(used.step);
      }
      if (why.empty()) continue;
      if (listed++ < kMaxListed) {
        out.reasons.push_back(replica_name(d, p) + " disqualified: " + why);
      } else {
        ++unlisted;
      }
    }
  }
  if (unlisted > 0) out.reasons.push_back("and " + std::to_string(unlisted) + " more disqualified replicas");
  for (int p = 0; p < layout.pp; ++p) {
    int d = used.replica_of_stage[static_cast<std::size_t>(p)];
    if (d >= 0) {
      out.reasons.push_back("stage pp" + std::to_string(p) + ": " + replica_name(d, p) +
                            " writes the model (lowest qualifying dp index)");
    }
  }
  for (std::size_t i = 0; i < used.missing.size(); ++i) {
    if (i == kMaxListed) {
      out.reasons.push_back("and " + std::to_string(used.missing.size() - kMaxListed) + " more missing");
      break;
    }
    out.reasons.push_back(used.missing[i]);
  }
}

// A complete attempt becomes the plan, unless the store, which has the last word on completeness, would not
// commit it: then nothing is written at all.
Plan commit_or_refuse(Plan out, const Layout& layout, const Attempt& used, std::size_t required) {
  out.writers = used.writers;
  const store::CommitDecision decision =
      store::decide_commit(store::Kind::Terminal, layout, layout.world_size(), planned_records(out));
  if (!decision.complete) return no_write(out, "the store would not commit it: " + decision.reason);

  out.write = true;
  std::string stages;
  for (int p = 0; p < layout.pp; ++p) {
    if (p > 0) stages += ", ";
    stages +=
        "pp" + std::to_string(p) + " from dp" + std::to_string(used.replica_of_stage[static_cast<std::size_t>(p)]);
  }
  out.summary = "last words: writing a terminal checkpoint at " + step_text(out.step) + ": " +
                std::to_string(out.writers.size()) + " writers cover " + std::to_string(required) +
                " state keys (" + stages + ")";
  out.reasons.push_back("store: " + decision.reason);
  return out;
}

}  // namespace

bool update_finishes_alone(const Layout& layout) {
  return layout.dp >= 1 && layout.tp == 1 && layout.pp == 1 && !layout.zero1;
}

Plan plan(const Layout& layout, const std::vector<RankReport>& reports) {
  Plan out;
  if (layout.dp < 1 || layout.tp < 1 || layout.pp < 1) {
    return no_write(out, "layout sizes must be at least 1 (dp " + std::to_string(layout.dp) + ", tp " +
                             std::to_string(layout.tp) + ", pp " + std::to_string(layout.pp) + ")");
  }
  if (static_cast<long long>(layout.dp) * layout.tp * layout.pp > INT_MAX) return no_write(out, "layout too large");
  out.replica_of_stage.assign(static_cast<std::size_t>(layout.pp), -1);

  std::vector<const RankReport*> at;
  if (std::string why = index_reports(layout, reports, at); !why.empty()) return no_write(out, std::move(why));
  const Ranks ranks(layout, std::move(at));
  const Planner planner(layout, ranks);
  if (planner.steps().empty()) {
    list_inconsistent_groups(layout, planner, out);
    return no_write(out, "no replica of any stage has its whole tensor-parallel group alive and consistent");
  }

  const Choice choice = choose_step(planner);
  const Attempt& used = choice.used;
  out.step = used.step;
  out.replica_of_stage = used.replica_of_stage;
  list_reasons(layout, planner, used, out);
  const std::size_t required = planner.required_count();
  if (!choice.complete) {
    std::string why = std::to_string(required - used.covered) + " of " + std::to_string(required) +
                      " state keys cannot be covered at " + step_text(used.step);
    if (!used.missing.empty()) why += " (" + used.missing.front() + ")";
    return no_write(out, why);
  }
  return commit_or_refuse(std::move(out), layout, used, required);
}

}  // namespace ckpt::last_words
