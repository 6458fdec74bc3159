// The store's decisions: state keys, is a checkpoint complete, which one to resume from, what retention deletes.
// Pure functions over in-memory data.
#include <algorithm>
#include <map>
#include <type_traits>
#include <set>
#include <string>

#include "ckpt/store.hpp"

namespace ckpt::store {

namespace {

std::string model_key(int pp, int tp) { return "model/pp" + std::to_string(pp) + "/tp" + std::to_string(tp); }

std::string optim_key(int pp, int tp) { return "optim/pp" + std::to_string(pp) + "/tp" + std::to_string(tp); }

std::string optim_key(int pp, int tp, int dp) { return optim_key(pp, tp) + "/dp" + std::to_string(dp); }

// "2, 3, 7 and 5 more": enough to act on without flooding a log line.
template <class T>
std::string list_some(const std::vector<T>& items) {
  std::string out;
  constexpr std::size_t kShown = 6;
  for (std::size_t i = 0; i < items.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    if constexpr (std::is_same_v<T, std::string>) {
      out += items[i];
    } else {
      out += std::to_string(items[i]);
    }
  }
  if (items.size() > kShown) out += " and " + std::to_string(items.size() - kShown) + " more";
  return out;
}

CommitDecision incomplete(std::string reason) { return {false, std::move(reason)}; }

CommitDecision decide_periodic(int world_size, const std::vector<ShardRecord>& present) {
  std::vector<bool> seen(static_cast<std::size_t>(world_size), false);
  for (const ShardRecord& r : present) {
    if (r.rank < 0 || r.rank >= world_size) {
      return incomplete("record for rank " + std::to_string(r.rank) + " outside a world of " +
                        std::to_string(world_size));
    }
    if (seen[static_cast<std::size_t>(r.rank)]) return incomplete("two records for rank " + std::to_string(r.rank));
    seen[static_cast<std::size_t>(r.rank)] = true;
  }
  std::vector<int> missing;
  for (int rank = 0; rank < world_size; ++rank) {
    if (!seen[static_cast<std::size_t>(rank)]) missing.push_back(rank);
  }
  if (!missing.empty()) {
    return incomplete("missing " + std::to_string(missing.size()) + " of " + std::to_string(world_size) +
                      " ranks: " + list_some(missing));
  }
  return {true, "all " + std::to_string(world_size) + " ranks written"};
}

CommitDecision decide_terminal(const Layout& layout, int world_size, const std::vector<ShardRecord>& present) {
  if (layout.dp < 1 || layout.tp < 1 || layout.pp < 1) return incomplete("layout sizes must be at least 1");
  std::map<std::string, int> owner;  // key -> the rank whose shard covers it; -1 while uncovered
  for (const std::string& key : required_state_keys(layout)) owner.emplace(key, -1);
  std::set<int> ranks;
  for (const ShardRecord& r : present) {
    if (r.rank < 0 || r.rank >= world_size) {
      return incomplete("record for rank " + std::to_string(r.rank) + " outside a world of " +
                        std::to_string(world_size));
    }
    if (!ranks.insert(r.rank).second) return incomplete("two records for rank " + std::to_string(r.rank));
    std::set<std::string> keys(r.covers.begin(), r.covers.end());
    for (const std::string& key : keys) {
      auto it = owner.find(key);
      if (it == owner.end()) {
        return incomplete("rank " + std::to_string(r.rank) + " covers unknown state key '" + key + "'");
      }
      if (it->second >= 0) {
        return incomplete("state key " + key + " covered by ranks " + std::to_string(it->second) + " and " +
                          std::to_string(r.rank));
      }
      it->second = r.rank;
    }
  }
  std::vector<std::string> uncovered;
  for (const auto& [key, rank] : owner) {
    if (rank < 0) uncovered.push_back(key);
  }
  if (!uncovered.empty()) {
    return incomplete(std::to_string(uncovered.size()) + " of " + std::to_string(owner.size()) +
                      " state keys uncovered: " + list_some(uncovered));
  }
  return {true, "all " + std::to_string(owner.size()) + " state keys covered by " + std::to_string(present.size()) +
                    " shards"};
}

}  // namespace

std::vector<std::string> required_state_keys(const Layout& layout) {
  std::vector<std::string> keys;
  for (int p = 0; p < layout.pp; ++p) {
    for (int t = 0; t < layout.tp; ++t) keys.push_back(model_key(p, t));
  }
  for (int p = 0; p < layout.pp; ++p) {
    for (int t = 0; t < layout.tp; ++t) {
      if (!layout.zero1) {
        keys.push_back(optim_key(p, t));
        continue;
      }
      for (int d = 0; d < layout.dp; ++d) keys.push_back(optim_key(p, t, d));
    }
  }
  return keys;
}

std::vector<std::string> state_keys_of_rank(const Layout& layout, const RankCoord& coord) {
  return {model_key(coord.pp, coord.tp),
          layout.zero1 ? optim_key(coord.pp, coord.tp, coord.dp) : optim_key(coord.pp, coord.tp)};
}

CommitDecision decide_commit(Kind kind, const Layout& layout, int world_size,
                             const std::vector<ShardRecord>& present) {
  if (world_size < 1) return incomplete("world size must be at least 1");
  return kind == Kind::Periodic ? decide_periodic(world_size, present)
                                : decide_terminal(layout, world_size, present);
}

std::vector<std::uint64_t> resume_candidates(const std::vector<Entry>& entries) {
  std::vector<std::uint64_t> steps;
  for (const Entry& e : entries) {
    if (e.state == State::Complete) steps.push_back(e.step);
  }
  std::sort(steps.rbegin(), steps.rend());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

std::vector<std::uint64_t> plan_gc(const std::vector<Entry>& entries, std::uint64_t keep,
                                   std::optional<std::uint64_t> newest_verified) {
  std::vector<std::uint64_t> complete = resume_candidates(entries);  // newest first
  if (complete.empty()) return {};                                   // nothing safe to anchor on yet
  const std::uint64_t newest_complete = complete.front();
  for (const Entry& e : entries) {
    if (e.state == State::Incomplete && e.step > newest_complete) return {};  // a save may be in flight
  }
  keep = std::max<std::uint64_t>(keep, 1);  // the newest complete checkpoint is never deleted
  std::vector<std::uint64_t> doomed;
  for (std::size_t i = 0; i < complete.size(); ++i) {
    if (i < keep || complete[i] == newest_verified) continue;
    doomed.push_back(complete[i]);
  }
  for (const Entry& e : entries) {
    // FAILED and corrupt checkpoints are evidence: kept for a person to look at.
    if (e.state == State::Incomplete && e.step < newest_complete) doomed.push_back(e.step);
  }
  std::sort(doomed.begin(), doomed.end());
  doomed.erase(std::unique(doomed.begin(), doomed.end()), doomed.end());
  return doomed;
}

}  // namespace ckpt::store

namespace ckpt::store {

namespace {

// A range name under one of the partition prefixes ("optim/<index>/"); an empty prefix names nothing.
bool named_by_any(const std::string& name, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(),
                     [&](const std::string& p) { return !p.empty() && name.compare(0, p.size(), p) == 0; });
}

// Last words: only survivors wrote, each state key once; a rank loads the shard that covers its keys. Onto another
// world size (pure data parallelism: a job that shrank in place), the keys of the replica `source` it takes.
Result<int> covering_shard(const Manifest& m, bool same_world, int source, const Layout& layout,
                           const RankCoord& coord) {
  const Layout& l = m.layout;
  if (same_world && (l.dp != layout.dp || l.tp != layout.tp || l.pp != layout.pp || l.zero1 != layout.zero1)) {
    return Error{"a terminal checkpoint of another layout (dp " + std::to_string(l.dp) + ", tp " +
                 std::to_string(l.tp) + ", pp " + std::to_string(l.pp) + ")"};
  }
  std::vector<std::string> keys =
      same_world ? state_keys_of_rank(layout, coord) : state_keys_of_rank(l, l.coord_of(source));
  const ShardRecord* record = nullptr;
  for (const ShardRecord& r : m.shards) {
    if (std::find(r.covers.begin(), r.covers.end(), keys.front()) != r.covers.end()) record = &r;
  }
  if (record == nullptr) return Error{"no shard covers " + keys.front()};
  for (const std::string& key : keys) {
    if (std::find(record->covers.begin(), record->covers.end(), key) == record->covers.end()) {
      // A plan never splits a rank's keys among ranks other than itself (ZeRO-1 shards have no other copy).
      return Error{key + " lies in another shard than " + keys.front() + ": not a last-words plan"};
    }
  }
  return record->rank;
}

}  // namespace

RestoreSource restore_source(const Manifest& m, int world_size, int rank, const Layout& layout,
                             const RankCoord& coord) {
  RestoreSource out;
  auto refuse = [&](std::string why, bool definite) {
    out.error = std::move(why);
    out.definite = definite;
    return out;
  };
  int source = rank;
  const Layout& saved = m.layout;
  const bool dp_saved = saved.tp == 1 && saved.pp == 1, dp_here = layout.tp == 1 && layout.pp == 1;
  const bool other_split = m.world_size != world_size ? !(dp_saved && dp_here) : saved.tp != layout.tp;
  if (other_split) {
    // Tensors split another way: each is assembled from the saved blocks (plan_relayout), as long as the names
    // mean the same on every rank: not across pipeline stages, nor with ZeRO-1's partitions besides.
    if (saved.pp != 1 || layout.pp != 1 || saved.zero1 || layout.zero1 || m.world_size < 1) {
      return refuse("written by " + std::to_string(m.world_size) + " ranks (tp " + std::to_string(saved.tp) +
                        ", pp " + std::to_string(saved.pp) + (saved.zero1 ? ", ZeRO-1" : "") + "); this run has " +
                        std::to_string(world_size) + " (tp " + std::to_string(layout.tp) + ", pp " +
                        std::to_string(layout.pp) + (layout.zero1 ? ", ZeRO-1" : "") +
                        "): pipeline stages and ZeRO-1 with tensor parallelism restore onto their own layout only",
                    false);
    }
    out.relayout = true;
    return out;
  }
  if (m.world_size != world_size) {
    // Pure data parallelism: every shard holds a full replica, so a job relaunched on fewer or more nodes can go
    // on from any of them.
    if (m.world_size < 1) return refuse("written by " + std::to_string(m.world_size) + " ranks", true);
    source = rank % m.world_size;
    out.replica = true;
    out.reshard = saved.zero1;
  }
  for (const ShardRecord& r : m.shards) {
    if (r.rank == source) out.rank = source;
  }
  if (out.rank >= 0) return out;
  const bool same_world = m.world_size == world_size;
  if (m.kind != Kind::Terminal || (!same_world && m.layout.zero1)) {
    return refuse("no shard for rank " + std::to_string(source), true);
  }
  auto covering = covering_shard(m, same_world, source, layout, coord);
  if (!covering) return refuse(covering.error(), true);
  out.rank = *covering;
  return out;
}

std::vector<std::size_t> replica_ranges(const ShardRecord& record, const std::vector<std::string>& prefixes) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < record.states.size(); ++i) {
    const StateRange& range = record.states[i];
    const bool partition = range.meta.is_object() && range.meta.value("replica_group", nlohmann::json()) == "rank";
    const bool wanted = named_by_any(range.name, prefixes);
    if (!partition || wanted) out.push_back(i);
  }
  return out;
}

Result<std::vector<std::pair<std::size_t, StateRange>>> locate_ranges(const Manifest& manifest,
                                                                      const std::vector<std::string>& prefixes,
                                                                      std::optional<std::size_t> skip) {
  std::vector<std::pair<std::size_t, StateRange>> out;
  std::map<std::string, std::size_t> seen;
  for (std::size_t i = 0; i < manifest.shards.size(); ++i) {
    if (skip && *skip == i) continue;
    for (const StateRange& range : manifest.shards[i].states) {
      const bool wanted = named_by_any(range.name, prefixes);
      if (!wanted) continue;
      if (auto [it, fresh] = seen.emplace(range.name, i); !fresh) {
        return Error{"range '" + range.name + "' is in " + manifest.shards[it->second].file + " and " +
                     manifest.shards[i].file};
      }
      out.emplace_back(i, range);
    }
  }
  return out;
}

}  // namespace ckpt::store
