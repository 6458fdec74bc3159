#pragma once
// ckpt-run's settings, from its own options (run_options.hpp) and the controller's config.
#include <cstdint>
#include <optional>
#include <string>

namespace ckpt::run {

struct Settings {
  std::string url;
  std::optional<std::uint64_t> min_nodes;
  std::uint64_t max_relaunches = 100;
  double decision_wait_s = 5;
  double poll_s = 0.1;
  std::optional<std::uint64_t> spares;  // --spares: one step per node, spares kept warm, restart in place
  std::string spares_source = "--spares";  // what asked for spares, for messages: or --ckpt-spares (CKPT_SPARES)
};

}  // namespace ckpt::run
