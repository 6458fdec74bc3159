#include "ckpt/overlay.hpp"

#include <algorithm>

namespace ckpt::overlay {

namespace {

bool is_gone(const Gone& gone, int rank) {
  return rank >= 0 && static_cast<std::size_t>(rank) < gone.size() && gone[static_cast<std::size_t>(rank)] != 0;
}

// The leaders of the groups below `g` in the heap whose path up to `g` crosses only groups without a leader.
void live_below(const Shape& shape, int g, const Gone& gone, int skip, std::vector<int>& out) {
  const int count = shape.group_count();
  for (int c = 2 * g + 1; c <= 2 * g + 2 && c < count; ++c) {
    if (auto l = leader(shape, c, gone)) {
      if (*l != skip) out.push_back(*l);
    } else {
      live_below(shape, c, gone, skip, out);
    }
  }
}

// The lowest group with a live rank, or -1.
int root_group(const Shape& shape, const Gone& gone) {
  for (int g = 0; g < shape.group_count(); ++g) {
    if (leader(shape, g, gone)) return g;
  }
  return -1;
}

}  // namespace

std::optional<int> leader(const Shape& shape, int g, const Gone& gone) {
  const int first = g * shape.group_size;
  const int last = std::min(shape.world_size, first + shape.group_size);
  for (int r = first; r < last; ++r) {
    if (!is_gone(gone, r)) return r;
  }
  return std::nullopt;
}

std::optional<int> root(const Shape& shape, const Gone& gone) {
  int g = root_group(shape, gone);
  if (g < 0) return std::nullopt;
  return leader(shape, g, gone);
}

Links links_of(const Shape& shape, int rank, const Gone& gone) {
  Links out;
  if (rank < 0 || rank >= shape.world_size) return out;
  // The view of a live `rank`: its own entry does not count.
  Gone view = gone;
  if (static_cast<std::size_t>(rank) < view.size()) view[static_cast<std::size_t>(rank)] = 0;
  const int g = shape.group_of(rank);
  const int l = *leader(shape, g, view);
  if (l != rank) {
    out.up = l;
    return out;
  }
  // A leader: its live members first.
  const int last = std::min(shape.world_size, (g + 1) * shape.group_size);
  for (int r = rank + 1; r < last; ++r) {
    if (!is_gone(view, r)) out.down.push_back(r);
  }
  live_below(shape, g, view, rank, out.down);
  // Up: the nearest ancestor group with a leader.
  for (int a = g; a > 0;) {
    a = (a - 1) / 2;
    if (auto up = leader(shape, a, view)) {
      out.up = *up;
      break;
    }
  }
  const int top = root_group(shape, view);
  if (top == g) {
    out.is_root = true;
    out.up.reset();
    // The groups whose ancestors are all gone hang below the root: those below group 0's dead chain.
    if (g != 0) live_below(shape, 0, view, rank, out.down);
  } else if (!out.up) {
    out.up = *leader(shape, top, view);
  }
  std::sort(out.down.begin(), out.down.end());
  out.down.erase(std::unique(out.down.begin(), out.down.end()), out.down.end());
  return out;
}

std::optional<int> up_when_whole(const Shape& shape, int rank) {
  if (rank <= 0 || rank >= shape.world_size) return std::nullopt;
  const int g = shape.group_of(rank);
  if (rank != g * shape.group_size) return g * shape.group_size;
  return (g - 1) / 2 * shape.group_size;
}

}  // namespace ckpt::overlay
