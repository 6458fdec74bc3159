#include "ckpt/placement.hpp"

#include <algorithm>
#include <map>

namespace ckpt::placement {

std::optional<std::vector<std::string>> keep_nodes(const std::vector<std::string>& node_of_rank,
                                                   const std::set<std::string>& excluded,
                                                   const std::vector<std::string>& alloc) {
  if (node_of_rank.empty()) return std::nullopt;
  const std::set<std::string> used(node_of_rank.begin(), node_of_rank.end());
  if (used.count("") != 0) return std::nullopt;
  auto next_free = alloc.begin();
  std::map<std::string, std::string> moved;  // excluded node -> the node its ranks go to
  std::vector<std::string> out = node_of_rank;
  for (std::string& node : out) {
    if (excluded.count(node) == 0) continue;
    auto it = moved.find(node);
    if (it == moved.end()) {
      next_free = std::find_if(next_free, alloc.end(), [&](const std::string& n) {
        return excluded.count(n) == 0 && used.count(n) == 0;
      });
      if (next_free == alloc.end()) return std::nullopt;
      it = moved.emplace(node, *next_free++).first;
    }
    node = it->second;
  }
  return out;
}

std::optional<NodeSteps> node_steps(const std::vector<std::string>& training, const std::set<std::string>& excluded,
                                    const std::vector<std::string>& alloc, std::size_t spares) {
  auto kept = keep_nodes(training, excluded, alloc);
  if (!kept) return std::nullopt;
  NodeSteps steps;
  steps.training = std::move(*kept);
  const std::set<std::string> used(steps.training.begin(), steps.training.end());
  for (const std::string& node : alloc) {
    if (steps.spares.size() == spares) break;
    if (excluded.count(node) == 0 && used.count(node) == 0) steps.spares.push_back(node);
  }
  return steps;
}

std::set<std::string> failed_nodes(const std::map<int, std::string>& node_of_rank, const std::vector<int>& lost,
                                   const std::set<std::string>& failed_before, const std::vector<StepEnd>& steps,
                                   int gave_up) {
  std::set<std::string> failed = failed_before;
  for (int rank : lost) {
    if (auto it = node_of_rank.find(rank); it != node_of_rank.end()) failed.insert(it->second);
  }
  if (!lost.empty()) return failed;
  for (const StepEnd& step : steps) {
    if (step.status && *step.status != 0 && *step.status != gave_up) failed.insert(step.node);
  }
  return failed;
}

std::string hostfile(const std::vector<std::string>& node_of_rank) {
  std::string text;
  for (const std::string& node : node_of_rank) text += node + "\n";
  return text;
}

}  // namespace ckpt::placement
