// The shape of the heartbeat network (ckpt/overlay.hpp): constant links per rank, one tree over the live ranks
// whatever is gone, and links both ends agree on.
#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "ckpt/overlay.hpp"

using namespace ckpt::overlay;

namespace {

// Checks the views of every live rank under `gone`: each has at most group-1 members + 3 tree links, up and down
// agree, and following `up` from any live rank reaches the root without a cycle.
void check_shape(const Shape& shape, const Gone& gone) {
  const auto top = root(shape, gone);
  std::vector<Links> views(static_cast<std::size_t>(shape.world_size));
  int live = 0;
  for (int r = 0; r < shape.world_size; ++r) {
    if (gone[static_cast<std::size_t>(r)]) continue;
    ++live;
    views[static_cast<std::size_t>(r)] = links_of(shape, r, gone);
  }
  if (live == 0) {
    CHECK_FALSE(top);
    return;
  }
  REQUIRE(top);
  std::size_t max_links = 0;
  for (int r = 0; r < shape.world_size; ++r) {
    if (gone[static_cast<std::size_t>(r)]) continue;
    const Links& l = views[static_cast<std::size_t>(r)];
    CAPTURE(shape.world_size, r);
    CHECK(l.is_root == (r == *top));
    CHECK(l.up.has_value() == !l.is_root);
    max_links = std::max(max_links, l.down.size() + (l.up ? 1 : 0));
    if (l.up) {
      REQUIRE_FALSE(gone[static_cast<std::size_t>(*l.up)]);
      const auto& theirs = views[static_cast<std::size_t>(*l.up)].down;
      CHECK(std::find(theirs.begin(), theirs.end(), r) != theirs.end());
    }
    for (int d : l.down) {
      REQUIRE_FALSE(gone[static_cast<std::size_t>(d)]);
      CHECK(views[static_cast<std::size_t>(d)].up == r);
    }
    std::set<int> path{r};
    int at = r;
    while (views[static_cast<std::size_t>(at)].up) {
      at = *views[static_cast<std::size_t>(at)].up;
      REQUIRE(path.insert(at).second);  // no cycle
    }
    CHECK(at == *top);
  }
  // Members: 1 link; a leader: its members, a parent and two child groups. More only when whole groups are gone
  // below a leader (their live descendants hang on it), which a test of constant fan-out must bound too.
  CHECK(max_links <= static_cast<std::size_t>(shape.group_size - 1 + 3 + 4));
}

}  // namespace

TEST_CASE("overlay: groups of 8 with a leader each, a binary tree of leaders", "[overlay]") {
  Shape shape{20};
  Gone none(20, 0);
  CHECK(shape.group_count() == 3);
  CHECK(links_of(shape, 0, none).is_root);
  CHECK(links_of(shape, 0, none).down == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 16});
  CHECK(links_of(shape, 5, none).up == 0);
  CHECK(links_of(shape, 8, none).up == 0);
  CHECK(links_of(shape, 8, none).down == std::vector<int>{9, 10, 11, 12, 13, 14, 15});
  CHECK(links_of(shape, 19, none).up == 16);
  check_shape(shape, none);
}

TEST_CASE("overlay: up_when_whole is links_of's up with nothing gone", "[overlay]") {
  for (int world : {1, 7, 8, 9, 20, 64, 100, 1000}) {
    Shape shape{world};
    Gone none(static_cast<std::size_t>(world), 0);
    for (int r = 0; r < world; ++r) {
      CAPTURE(world, r);
      CHECK(up_when_whole(shape, r) == links_of(shape, r, none).up);
    }
  }
}

TEST_CASE("overlay: a dead leader is replaced by the next rank of its group, a dead group by its ancestor",
          "[overlay]") {
  Shape shape{64};  // groups 0..7: 1, 2 below 0; 3, 4 below 1; 5, 6 below 2; 7 below 3
  Gone gone(64, 0);
  gone[8] = 1;  // group 1's leader
  CHECK(links_of(shape, 9, gone).up == 0);
  CHECK(links_of(shape, 10, gone).up == 9);
  CHECK(links_of(shape, 24, gone).up == 9);  // group 3 hangs below group 1, now led by rank 9
  for (int r = 8; r < 16; ++r) gone[static_cast<std::size_t>(r)] = 1;  // all of group 1: a node
  CHECK(links_of(shape, 24, gone).up == 0);  // group 3 hangs below group 0
  CHECK(links_of(shape, 32, gone).up == 0);
  CHECK(links_of(shape, 0, gone).down == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 16, 24, 32});
  check_shape(shape, gone);
  for (int r = 0; r < 8; ++r) gone[static_cast<std::size_t>(r)] = 1;  // and group 0: the root moves to group 2
  CHECK(root(shape, gone) == 16);
  CHECK(links_of(shape, 24, gone).up == 16);
  check_shape(shape, gone);
}

TEST_CASE("overlay: every gone set of random jobs still gives one tree with constant links", "[overlay]") {
  std::mt19937 rng(11);
  for (int world : {1, 2, 7, 8, 9, 16, 63, 100, 256, 1000}) {
    Shape shape{world};
    for (int trial = 0; trial < 20; ++trial) {
      Gone gone(static_cast<std::size_t>(world), 0);
      std::uniform_int_distribution<int> pick(0, world - 1);
      // A few ranks and, half the time, one whole group (a node).
      const int deaths = std::uniform_int_distribution<int>(0, std::max(1, world / 10))(rng);
      for (int i = 0; i < deaths; ++i) gone[static_cast<std::size_t>(pick(rng))] = 1;
      if (trial % 2 == 0) {
        const int g = shape.group_of(pick(rng));
        for (int r = g * shape.group_size; r < std::min(world, (g + 1) * shape.group_size); ++r) {
          gone[static_cast<std::size_t>(r)] = 1;
        }
      }
      check_shape(shape, gone);
    }
  }
}
