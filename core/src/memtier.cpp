#include "ckpt/memtier.hpp"

#include "ckpt/format.hpp"
#include "ckpt/interval.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <set>

namespace ckpt::memtier {

namespace {

// Each node's ranks in rank order, the nodes in the sorted order of their names.
std::vector<std::vector<int>> ranks_by_node(const std::vector<std::string>& node_of_rank) {
  std::map<std::string, std::vector<int>> by_name;
  for (std::size_t r = 0; r < node_of_rank.size(); ++r) by_name[node_of_rank[r]].push_back(static_cast<int>(r));
  std::vector<std::vector<int>> out;
  out.reserve(by_name.size());
  for (auto& [name, ranks] : by_name) out.push_back(std::move(ranks));
  return out;
}

// a * b, or the largest value when it does not fit: a budget that overflows must refuse, not wrap to a small one.
std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::numeric_limits<std::uint64_t>::max();
  return a * b;
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return b > std::numeric_limits<std::uint64_t>::max() - a ? std::numeric_limits<std::uint64_t>::max() : a + b;
}

}  // namespace

Pairing pair_ranks(const std::vector<std::string>& node_of_rank, int distance) {
  Pairing out;
  out.partner.assign(node_of_rank.size(), -1);
  out.wards.assign(node_of_rank.size(), {});
  const std::vector<std::vector<int>> nodes = ranks_by_node(node_of_rank);
  const std::size_t n = nodes.size();
  const std::size_t shift = static_cast<std::size_t>(std::max(distance, 1)) % std::max<std::size_t>(n, 1);
  // One node, or a shift that lands on the rank's own node: a copy there dies with the original.
  if (n < 2 || shift == 0) return out;
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<int>& to = nodes[(i + shift) % n];
    for (std::size_t j = 0; j < nodes[i].size(); ++j) {
      out.partner[static_cast<std::size_t>(nodes[i][j])] = to[j % to.size()];
    }
  }
  // In rank order, so each ward list comes out ascending.
  for (std::size_t r = 0; r < out.partner.size(); ++r) {
    if (out.partner[r] >= 0) out.wards[static_cast<std::size_t>(out.partner[r])].push_back(static_cast<int>(r));
  }
  return out;
}

std::vector<int> lost_after(const Pairing& pairing, const std::vector<std::string>& node_of_rank,
                            const std::vector<std::string>& lost_nodes) {
  const std::set<std::string> lost(lost_nodes.begin(), lost_nodes.end());
  auto died = [&](int rank) {
    return rank >= 0 && static_cast<std::size_t>(rank) < node_of_rank.size() &&
           lost.count(node_of_rank[static_cast<std::size_t>(rank)]) > 0;
  };
  std::vector<int> out;
  for (std::size_t r = 0; r < node_of_rank.size(); ++r) {
    const int rank = static_cast<int>(r);
    if (!died(rank)) continue;
    const int partner = r < pairing.partner.size() ? pairing.partner[r] : -1;
    if (partner < 0 || died(partner)) out.push_back(rank);
  }
  return out;
}

std::uint64_t tier_bytes(std::uint64_t staging_bytes, std::uint64_t largest_ward_bytes, std::size_t wards) {
  const std::uint64_t copies = saturating_mul(2, static_cast<std::uint64_t>(wards));
  return saturating_add(staging_bytes, saturating_mul(copies, largest_ward_bytes));
}

namespace {

// A step count from a real number: at least 1, at most max_steps (NaN and infinity included).
std::uint64_t clamp_steps(double steps, std::uint64_t max_steps) {
  const std::uint64_t most = std::max<std::uint64_t>(max_steps, 1);
  if (!(steps >= 1)) return 1;
  if (!(steps < static_cast<double>(most))) return most;
  return static_cast<std::uint64_t>(steps);
}

}  // namespace

std::uint64_t keep_up_interval(double busy_s, double step_s, std::uint64_t max_steps) {
  if (!(step_s > 0) || !(busy_s > 0)) return 1;
  return clamp_steps(std::ceil(1.25 * busy_s / step_s), max_steps);
}

std::uint64_t auto_interval(const AutoIntervalInputs& in, std::uint64_t max_steps) {
  const std::uint64_t keep_up = keep_up_interval(in.busy_s, in.step_s, max_steps);
  if (!(in.step_s > 0) || !(in.cost_s > 0) || !(in.mtbf_s > 0)) return keep_up;
  // Rounded down: between two step counts, the shorter interval loses less at a failure.
  const double young = std::floor(interval::young(in.cost_s, in.mtbf_s) / in.step_s);
  return std::max(keep_up, clamp_steps(young, max_steps));
}

std::optional<std::string> refuse(std::uint64_t need, std::uint64_t max_bytes, int rank) {
  if (need <= max_bytes) return std::nullopt;
  return "the memory tier is off for the whole job: rank " + std::to_string(rank) + " needs " + format_bytes(need) +
         " (its own staging, and two copies of each shard it keeps for another rank) but CKPT_MEMORY allows " +
         format_bytes(max_bytes) + " per rank: checkpoints go to the file system alone";
}

namespace {

// The node count and the distance in nodes stride_partner uses; nullopt where no rank has a partner.
std::optional<std::pair<int, int>> stride_shape(int world, int per_node, int distance) {
  if (world <= 0 || per_node <= 0 || world % per_node != 0) return std::nullopt;
  const int nodes = world / per_node;
  const int d = std::max(distance, 1) % nodes;
  if (nodes <= 1 || d == 0) return std::nullopt;
  return std::make_pair(nodes, d);
}

}  // namespace

int stride_partner(int rank, int world, int per_node, int distance) {
  auto shape = stride_shape(world, per_node, distance);
  if (!shape || rank < 0 || rank >= world) return -1;
  return static_cast<int>((static_cast<long long>(rank) + static_cast<long long>(shape->second) * per_node) % world);
}

std::vector<int> stride_wards(int rank, int world, int per_node, int distance) {
  auto shape = stride_shape(world, per_node, distance);
  if (!shape || rank < 0 || rank >= world) return {};
  const long long back = static_cast<long long>(shape->second) * per_node;
  return {static_cast<int>(((static_cast<long long>(rank) - back) % world + world) % world)};
}

std::optional<int> uniform_tasks_per_node(std::string_view text) {
  std::optional<int> count;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (comma != std::string_view::npos && text.empty()) return std::nullopt;  // a trailing comma
    std::string_view number = item;
    if (const std::size_t paren = item.find('('); paren != std::string_view::npos) {
      // "4(x3)": the repeat must be a whole number too
      std::string_view repeat = item.substr(paren);
      if (repeat.size() < 4 || repeat.substr(0, 2) != "(x" || repeat.back() != ')') return std::nullopt;
      repeat = repeat.substr(2, repeat.size() - 3);
      if (repeat.empty() || !std::all_of(repeat.begin(), repeat.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return std::nullopt;
      }
      number = item.substr(0, paren);
    }
    if (number.empty() || number.size() > 6 ||
        !std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return std::nullopt;
    }
    int n = 0;
    for (char c : number) n = n * 10 + (c - '0');
    if (n <= 0 || (count && *count != n)) return std::nullopt;
    count = n;
  }
  return count;
}

std::string node_dir_name(unsigned uid, std::string_view job) {
  return kNodeDirPrefix + std::to_string(uid) + "." + std::string(job);
}

}  // namespace ckpt::memtier
