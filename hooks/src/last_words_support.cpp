// What last words need besides their run (last_words_runtime.cpp): whether they are armed, the manifest of a
// terminal checkpoint, coordinates packed into a frame, and the tracker that freezes training between updates.
#include "last_words_runtime.hpp"

namespace ckpt::hooks {

namespace {

constexpr std::uint64_t kCoordBits = 21;
constexpr std::uint64_t kCoordMask = (std::uint64_t{1} << kCoordBits) - 1;

}  // namespace

bool last_words_armed(const Config& config) {
  return config.last_words && config.layout_declared && config.world_size > 1 && !config.dir.empty();
}

store::Manifest last_words_manifest(const Config& config, std::uint64_t step, store::Kind kind) {
  store::Manifest m;
  m.step = step;
  m.kind = kind;
  m.world_size = config.world_size;
  m.layout = config.layout;
  for (int r = 0; r < config.world_size; ++r) m.ranks.push_back(config.layout.coord_of(r));
  if (config.rank >= 0 && config.rank < config.world_size) m.ranks[static_cast<std::size_t>(config.rank)] = config.coord;
  return m;
}

std::uint64_t pack_coord(const store::RankCoord& c) {
  return (static_cast<std::uint64_t>(c.dp) & kCoordMask) | ((static_cast<std::uint64_t>(c.tp) & kCoordMask) << kCoordBits) |
         ((static_cast<std::uint64_t>(c.pp) & kCoordMask) << (2 * kCoordBits));
}

store::RankCoord unpack_coord(int rank, std::uint64_t packed) {
  return {rank, static_cast<int>(packed & kCoordMask), static_cast<int>((packed >> kCoordBits) & kCoordMask),
          static_cast<int>((packed >> (2 * kCoordBits)) & kCoordMask)};
}

// ---- UpdateTracker ----------------------------------------------------------------------------------------------

bool UpdateTracker::enter_update() {
  std::lock_guard<std::mutex> lock(mu_);
  if (frozen_) return false;
  progress_.mid_update = true;
  return true;
}

void UpdateTracker::finish_step(std::uint64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_ = {step, false};
  }
  finished_.notify_all();
}

UpdateTracker::Progress UpdateTracker::freeze(std::optional<std::chrono::steady_clock::time_point> finish_by) {
  std::unique_lock<std::mutex> lock(mu_);
  frozen_ = true;
  if (finish_by) finished_.wait_until(lock, *finish_by, [&] { return !progress_.mid_update; });
  return progress_;
}

UpdateTracker::Progress UpdateTracker::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

bool UpdateTracker::frozen() const {
  std::lock_guard<std::mutex> lock(mu_);
  return frozen_;
}

}  // namespace ckpt::hooks
