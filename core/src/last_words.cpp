#include "ckpt/last_words.hpp"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <iterator>
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

// Who holds a copy of whose shard: ward rank -> step -> the lowest live rank that holds it.
using Copies = std::map<int, std::map<std::uint64_t, int>>;

// Where a coordinate's shard of one step comes from: its own rank (own), else a holder's copy (holder >= 0).
struct Source {
  WriteSource own = WriteSource::None;
  int holder = -1;
  bool usable() const { return own != WriteSource::None || holder >= 0; }
};

std::string copy_text(int holder, std::uint64_t step) {
  return "a partner copy of " + step_text(step) + " on rank " + std::to_string(holder);
}

// The reports indexed by coordinate, with every question asked of one rank.
class Ranks {
 public:
  Ranks(const Layout& layout, std::vector<const RankReport*> at, Copies copies, bool memory_in_use)
      : layout_(layout), at_(std::move(at)), copies_(std::move(copies)), memory_in_use_(memory_in_use) {
    for (const RankReport* r : at_) {
      if (r) by_rank_[r->coord.rank] = r;
    }
  }

  const RankReport* report(int dp, int tp, int pp) const { return at_[coord_index(layout_, dp, tp, pp)]; }
  const RankReport& report_of(int rank) const { return *by_rank_.at(rank); }

  // Whether any report holds a snapshot or a copy: without, every answer is today's live-state rule and its text.
  bool memory_in_use() const { return memory_in_use_; }

  // Where the coordinate's shard of `step` comes from: the rank itself first, then the lowest live holder. A
  // coordinate without a report has no rank to match a copy to.
  Source source_at(int dp, int tp, int pp, std::uint64_t step) const {
    const RankReport* r = report(dp, tp, pp);
    Source s;
    if (!r) return s;
    s.own = source_for(*r, step);
    if (s.own != WriteSource::None) return s;
    if (auto w = copies_.find(r->coord.rank); w != copies_.end()) {
      if (auto c = w->second.find(step); c != w->second.end()) s.holder = c->second;
    }
    return s;
  }
  bool usable_at(int dp, int tp, int pp, std::uint64_t step) const { return source_at(dp, tp, pp, step).usable(); }

  // Every step the coordinate's shard can be written at: by its own rank (live or staging), and with
  // `with_copies` from a holder's copy too.
  std::set<std::uint64_t> steps_of(int dp, int tp, int pp, bool with_copies) const {
    std::set<std::uint64_t> out;
    const RankReport* r = report(dp, tp, pp);
    if (!r) return out;
    if (r->alive && !r->mid_update) out.insert(r->step);
    if (r->alive) out.insert(r->memory_steps.begin(), r->memory_steps.end());
    if (auto w = copies_.find(r->coord.rank); with_copies && w != copies_.end()) {
      for (const auto& [step, holder] : w->second) out.insert(step);
    }
    return out;
  }

  // Why a rank's live state cannot contribute at `step`, e.g. "rank 5 (dp1/tp0/pp0) is dead"; empty when it can.
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

  // What the memory tier holds of the coordinate's shard, for a line about it: "; its snapshots are of step 11, step 10; a
  // partner copy of step 12 on rank 6", or "; no live rank holds a copy of its shard". Empty without the tier.
  std::string memory_note(int dp, int tp, int pp) const {
    const RankReport* r = report(dp, tp, pp);
    if (!memory_in_use_ || !r) return "";
    std::string note;
    for (std::size_t i = 0; r->alive && i < r->memory_steps.size(); ++i) {
      note += (i == 0 ? "; its snapshots are of " : ", ") + step_text(r->memory_steps[i]);
    }
    auto w = copies_.find(r->coord.rank);
    if (w == copies_.end()) return note + "; no live rank holds a copy of its shard";
    for (const auto& [held_step, holder] : w->second) note += "; " + copy_text(holder, held_step);
    return note;
  }

  // Why the coordinate's shard cannot be written at `step` from any source; empty when it can.
  std::string why_unusable(int dp, int tp, int pp, std::uint64_t step) const {
    if (usable_at(dp, tp, pp, step)) return "";
    return why_not(dp, tp, pp, step) + memory_note(dp, tp, pp);
  }

 private:
  Layout layout_;
  std::vector<const RankReport*> at_;
  std::map<int, const RankReport*> by_rank_;
  Copies copies_;
  bool memory_in_use_ = false;
};

// One TP group: replica `dp` of stage `pp`. Its live state qualifies when every rank is alive, none is mid-update
// and all agree on the step; with the memory tier it may also qualify at the steps every rank's shard can be
// written at from a snapshot or a copy.
struct Group {
  bool consistent = false;  // its live state: alive, idle, one step
  std::uint64_t step = 0;   // when consistent
  std::string why;          // when not
  int why_tp = -1;          // the rank `why` is about, when it is about one
  std::set<std::uint64_t> steps;      // every step at which each of its ranks' shards can be written
  std::set<std::uint64_t> own_steps;  // the same without partner copies: each rank writes its own
};

// The steps every rank of group (dp, pp) can be written at.
std::set<std::uint64_t> common_steps(const Ranks& ranks, const Layout& layout, int dp, int pp, bool with_copies) {
  std::set<std::uint64_t> common = ranks.steps_of(dp, 0, pp, with_copies);
  for (int t = 1; t < layout.tp && !common.empty(); ++t) {
    const std::set<std::uint64_t> mine = ranks.steps_of(dp, t, pp, with_copies);
    std::set<std::uint64_t> both;
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(), std::inserter(both, both.end()));
    common = std::move(both);
  }
  return common;
}

Group assess_group(const Ranks& ranks, const Layout& layout, int dp, int pp) {
  Group g;
  g.steps = common_steps(ranks, layout, dp, pp, true);
  g.own_steps = common_steps(ranks, layout, dp, pp, false);
  std::map<std::uint64_t, std::vector<std::string>> by_step;
  for (int t = 0; t < layout.tp; ++t) {
    std::string why = ranks.why_not(dp, t, pp, std::nullopt);
    if (!why.empty()) {
      g.why = why;
      g.why_tp = t;
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

// Why group (dp, pp) cannot write at `step`; empty when it can. Without the memory tier, today's text about the
// group's live state; with it, the first rank whose shard no source gives, and what the tier holds of it.
std::string why_group_not_at(const Ranks& ranks, const Layout& layout, const Group& g, int dp, int pp,
                             std::uint64_t step) {
  if (g.steps.count(step) > 0) return "";
  if (!ranks.memory_in_use()) {
    return g.consistent ? "at " + step_text(g.step) + ", not the agreed " + step_text(step) : g.why;
  }
  for (int t = 0; t < layout.tp; ++t) {
    if (std::string why = ranks.why_unusable(dp, t, pp, step); !why.empty()) return why;
  }
  return "";
}

// The outcome of trying one step.
struct Attempt {
  std::uint64_t step = 0;
  std::vector<int> replica_of_stage;
  std::map<int, std::vector<std::string>> writers;
  std::map<int, int> stand_ins;  // ward -> holder, for the writers whose shard comes from a copy
  std::set<int> from_memory;     // writers whose shard comes from their own staging
  std::size_t covered = 0;
  std::vector<std::string> missing;  // one line per uncovered key or stage
};

std::string replica_name(int dp, int pp) {
  return "replica dp" + std::to_string(dp) + " of stage pp" + std::to_string(pp);
}

Plan no_write(Plan plan, std::string why) {
  plan.write = false;
  plan.writers.clear();
  plan.stand_ins.clear();
  plan.from_memory.clear();
  plan.summary = "last words: not writing a terminal checkpoint: " + why;
  plan.reasons.push_back(std::move(why));
  return plan;
}

}  // namespace

WriteSource source_for(const RankReport& mine, std::uint64_t step) {
  if (!mine.alive) return WriteSource::None;
  if (!mine.mid_update && mine.step == step) return WriteSource::Live;
  if (std::find(mine.memory_steps.begin(), mine.memory_steps.end(), step) != mine.memory_steps.end()) {
    return WriteSource::Staging;
  }
  return WriteSource::None;
}

std::vector<int> behind(const Plan& plan, const std::vector<RankReport>& reports) {
  std::vector<int> out;
  if (!plan.write) return out;
  for (const RankReport& r : reports) {
    if (r.alive && source_for(r, plan.step) == WriteSource::None) out.push_back(r.coord.rank);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<int> late_stand_in(const std::vector<RankReport>& reports, const std::set<int>& gone, int ward,
                                 std::uint64_t step) {
  std::optional<int> holder;
  for (const RankReport& r : reports) {
    const int h = r.coord.rank;
    if (!r.alive || h == ward || gone.count(h) != 0 || (holder && *holder <= h)) continue;
    const std::pair<int, std::uint64_t> copy{ward, step};
    if (std::find(r.held.begin(), r.held.end(), copy) != r.held.end()) holder = h;
  }
  return holder;
}

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

// Indexes the partner copies live ranks hold into `copies`: for each ward and step, the lowest holder. Returns why
// when a report names a copy no rank can hold (of a rank outside the world, or of its own shard, which a partner
// on another node never sends), empty when all are good. A dead rank's copies died with it.
std::string index_copies(const Layout& layout, const std::vector<RankReport>& reports, Copies& copies) {
  const int world = layout.world_size();
  for (const RankReport& r : reports) {
    const std::string where = "invalid report from rank " + std::to_string(r.coord.rank);
    for (const auto& [ward, step] : r.held) {
      if (ward < 0 || ward >= world) {
        return where + ": holds a copy of rank " + std::to_string(ward) + ", outside a world of " +
               std::to_string(world);
      }
      if (ward == r.coord.rank) return where + ": holds a copy of its own shard";
      if (!r.alive) continue;
      auto [it, fresh] = copies[ward].emplace(step, r.coord.rank);
      if (!fresh) it->second = std::min(it->second, r.coord.rank);
    }
  }
  return "";
}

bool any_memory(const std::vector<RankReport>& reports) {
  return std::any_of(reports.begin(), reports.end(),
                     [](const RankReport& r) { return !r.memory_steps.empty() || !r.held.empty(); });
}

// Every group's state and every key's possible owners, assessed once; then what one step would cover.
class Planner {
 public:
  Planner(const Layout& layout, const Ranks& ranks)
      : layout_(layout), ranks_(ranks), required_(store::required_state_keys(layout)) {
    // The candidate steps: every step some group can be written at. Any other step a report names leaves a stage
    // without a replica, so it could never give full coverage.
    for (int p = 0; p < layout.pp; ++p) {
      for (int d = 0; d < layout.dp; ++d) {
        groups_.push_back(assess_group(ranks, layout, d, p));
        steps_.insert(groups_.back().steps.begin(), groups_.back().steps.end());
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
          for (const std::string& key : store::state_keys_of_rank(layout, c)) owners_[key].push_back(c);
        }
      }
    }
  }

  const Group& group(int d, int p) const {
    return groups_[static_cast<std::size_t>(p) * static_cast<std::size_t>(layout_.dp) + static_cast<std::size_t>(d)];
  }
  std::size_t group_count() const { return groups_.size(); }
  // Why group (d, p) cannot write at `step`; empty when it can.
  std::string why_not_at(int d, int p, std::uint64_t step) const {
    return why_group_not_at(ranks_, layout_, group(d, p), d, p, step);
  }
  bool memory_in_use() const { return ranks_.memory_in_use(); }
  std::string memory_note(int d, int t, int p) const { return ranks_.memory_note(d, t, p); }
  // The steps some group can be written at.
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
        note_source(a, *writer, r->coord.rank);
        ++a.covered;
      }
    }
    return a;
  }

 private:
  // Where the shard of `rank` (at coordinate c) comes from when it is not the rank's live state.
  void note_source(Attempt& a, const RankCoord& c, int rank) const {
    const Source s = ranks_.source_at(c.dp, c.tp, c.pp, a.step);
    if (s.own == WriteSource::Staging) a.from_memory.insert(rank);
    if (s.own == WriteSource::None && s.holder >= 0) a.stand_ins[rank] = s.holder;
  }

  // For each stage the lowest dp index whose group can be written at the attempt's step, by its own ranks where
  // one can: a stand-in writes a second shard on its holder, so a copy is used only where no replica is whole
  // without one.
  void elect_replicas(Attempt& a) const {
    a.replica_of_stage.assign(static_cast<std::size_t>(layout_.pp), -1);
    for (int p = 0; p < layout_.pp; ++p) {
      int& elected = a.replica_of_stage[static_cast<std::size_t>(p)];
      for (int d = 0; d < layout_.dp && elected < 0; ++d) {
        if (group(d, p).own_steps.count(a.step) > 0) elected = d;
      }
      for (int d = 0; d < layout_.dp && elected < 0; ++d) {
        if (group(d, p).steps.count(a.step) > 0) elected = d;
      }
      if (a.replica_of_stage[static_cast<std::size_t>(p)] < 0) {
        a.missing.push_back("stage pp" + std::to_string(p) + " has no replica whose whole tensor-parallel group " +
                            (ranks_.memory_in_use() ? "can be written at " + step_text(a.step) +
                                                          " (live, from snapshots or from partner copies)"
                                                    : "is alive and consistent at " + step_text(a.step)));
      }
    }
  }

  // The rank that writes `key` at the attempt's step; none (with a line in a.missing where the stage line does not
  // already explain it) when no rank can.
  std::optional<RankCoord> writer_of(Attempt& a, const std::string& key) const {
    auto it = owners_.find(key);
    if (it == owners_.end() || it->second.empty()) {
      a.missing.push_back(key + ": no rank holds it");
      return std::nullopt;
    }
    const std::vector<RankCoord>& hs = it->second;
    // A key a whole replica holds comes from the stage's elected group, so one stage's slices match.
    for (const RankCoord& c : hs) {
      if (a.replica_of_stage[static_cast<std::size_t>(c.pp)] == c.dp) return c;
    }
    // A key only one rank holds (a ZeRO-1 optimizer shard) needs just that rank's shard at the step: from the
    // rank itself, or from a copy of it.
    if (hs.size() == 1) {
      const RankCoord& c = hs.front();
      if (ranks_.usable_at(c.dp, c.tp, c.pp, a.step)) return c;
      a.missing.push_back(key + ": its only holder " + ranks_.why_unusable(c.dp, c.tp, c.pp, a.step));
    }
    // Otherwise already explained by the stage line, unless the store's holders span stages.
    return std::nullopt;
  }

  const Layout& layout_;
  const Ranks& ranks_;
  const std::vector<std::string> required_;
  std::vector<Group> groups_;  // index pp * dp + d
  std::set<std::uint64_t> steps_;
  std::map<std::string, std::vector<RankCoord>> owners_;  // key -> the coordinates whose shard has it
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
        const Group& g = planner.group(d, p);
        std::string note;
        if (planner.memory_in_use()) {
          note = g.why_tp >= 0 ? planner.memory_note(d, g.why_tp, p)
                               : "; no step has each of its ranks live, in a snapshot or in a partner copy";
        }
        out.reasons.push_back(replica_name(d, p) + " disqualified: " + g.why + note);
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
      const std::string why = planner.why_not_at(d, p, used.step);
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
                            " writes the model (lowest qualifying dp index" +
                            (planner.memory_in_use() ? ", replicas that need no partner copy first)" : ")"));
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

// "its live state is at step 13" or "it was caught mid-update at step 13": why a rank writes from its snapshot.
std::string live_state_text(const RankReport& r) {
  if (r.mid_update) return "it was caught mid-update at " + step_text(r.step);
  return "its live state is at " + step_text(r.step);
}

// One line per shard the plan takes from memory rather than from its rank's live state, up to kMaxListed of each.
void list_memory_sources(const Ranks& ranks, const Attempt& used, Plan& out) {
  std::size_t listed = 0;
  for (const auto& [ward, holder] : used.stand_ins) {
    if (listed++ == kMaxListed) {
      out.reasons.push_back("and " + std::to_string(used.stand_ins.size() - kMaxListed) +
                            " more shards from partner copies");
      break;
    }
    const RankCoord& c = ranks.report_of(ward).coord;
    out.reasons.push_back(ranks.why_not(c.dp, c.tp, c.pp, used.step) + ": its shard of " + step_text(used.step) +
                          " comes from its partner copy on rank " + std::to_string(holder));
  }
  listed = 0;
  for (int rank : used.from_memory) {
    if (listed++ == kMaxListed) {
      out.reasons.push_back("and " + std::to_string(used.from_memory.size() - kMaxListed) +
                            " more ranks write from their snapshots");
      break;
    }
    const RankReport& r = ranks.report_of(rank);
    out.reasons.push_back("rank " + std::to_string(rank) + " (" + format_coord(r.coord.dp, r.coord.tp, r.coord.pp) +
                          ") writes " + step_text(used.step) + " from its snapshot (" + live_state_text(r) + ")");
  }
}

// "; 1 shard from a partner copy, 2 shards from snapshots" for the summary; empty when every shard is live state.
std::string memory_summary(const Attempt& used) {
  std::string out;
  auto add = [&out](std::size_t n, const char* one, const char* many) {
    if (n == 0) return;
    out += (out.empty() ? "; " : ", ") + std::to_string(n) + (n == 1 ? one : many);
  };
  add(used.stand_ins.size(), " shard from a partner copy", " shards from partner copies");
  add(used.from_memory.size(), " shard from a snapshot", " shards from snapshots");
  return out;
}

// A complete attempt becomes the plan, unless the store, which has the last word on completeness, would not
// commit it: then nothing is written at all.
Plan commit_or_refuse(Plan out, const Layout& layout, const Ranks& ranks, const Attempt& used, std::size_t required) {
  out.writers = used.writers;
  out.stand_ins = used.stand_ins;
  out.from_memory = used.from_memory;
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
                " state keys (" + stages + ")" + memory_summary(used);
  list_memory_sources(ranks, used, out);
  out.reasons.push_back("store: " + decision.reason);
  return out;
}

}  // namespace

bool update_finishes_alone(const Layout& layout) {
  return layout.dp >= 1 && layout.tp == 1 && layout.pp == 1 && !layout.zero1;
}

Plan plan(const Layout& layout, const std::vector<RankReport>& given, std::uint64_t oldest) {
  Plan out;
  std::vector<RankReport> reports = given;
  for (RankReport& r : reports) {  // memory older than the dir's newest checkpoint is worth nothing
    std::erase_if(r.memory_steps, [oldest](std::uint64_t s) { return s < oldest; });
    std::erase_if(r.held, [oldest](const std::pair<int, std::uint64_t>& h) { return h.second < oldest; });
  }
  if (layout.dp < 1 || layout.tp < 1 || layout.pp < 1) {
    return no_write(out, "layout sizes must be at least 1 (dp " + std::to_string(layout.dp) + ", tp " +
                             std::to_string(layout.tp) + ", pp " + std::to_string(layout.pp) + ")");
  }
  if (static_cast<long long>(layout.dp) * layout.tp * layout.pp > INT_MAX) return no_write(out, "layout too large");
  out.replica_of_stage.assign(static_cast<std::size_t>(layout.pp), -1);

  std::vector<const RankReport*> at;
  if (std::string why = index_reports(layout, reports, at); !why.empty()) return no_write(out, std::move(why));
  Copies copies;
  if (std::string why = index_copies(layout, reports, copies); !why.empty()) return no_write(out, std::move(why));
  const Ranks ranks(layout, std::move(at), std::move(copies), any_memory(reports));
  const Planner planner(layout, ranks);
  if (planner.steps().empty()) {
    list_inconsistent_groups(layout, planner, out);
    return no_write(out, ranks.memory_in_use()
                             ? "no replica of any stage has its whole tensor-parallel group at one step, live or "
                               "from snapshots and partner copies"
                             : "no replica of any stage has its whole tensor-parallel group alive and consistent");
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
  return commit_or_refuse(std::move(out), layout, ranks, used, required);
}

}  // namespace ckpt::last_words
