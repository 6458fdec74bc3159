#include <catch2/catch.hpp>

#include <cmath>

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ckpt/memtier.hpp"

using namespace ckpt;
using memtier::Pairing;
using memtier::pair_ranks;
using memtier::stride_partner;
using memtier::stride_wards;
using memtier::uniform_tasks_per_node;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kGiB = 1ull << 30;

std::string node_name(std::size_t i) { return "n" + std::to_string(i + 1); }

// `counts[i]` ranks on node n<i+1>, the ranks dealt out round-robin so that a node's ranks are not adjacent.
std::vector<std::string> spread(const std::vector<int>& counts) {
  std::vector<int> left = counts;
  std::vector<std::string> out;
  for (bool more = true; more;) {
    more = false;
    for (std::size_t i = 0; i < left.size(); ++i) {
      if (left[i] == 0) continue;
      out.push_back(node_name(i));
      more = more || --left[i] > 0;
    }
  }
  return out;
}

// The same shape with each node's ranks adjacent, as Slurm's block distribution places them.
std::vector<std::string> blocks(const std::vector<int>& counts) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    out.insert(out.end(), static_cast<std::size_t>(counts[i]), node_name(i));
  }
  return out;
}

// Ranks per node for `nodes` nodes: every node `per` ranks, or (uneven) node i gets 1 + (i + per) % 4.
std::vector<int> shape(int nodes, int per, bool uneven) {
  std::vector<int> counts;
  for (int i = 0; i < nodes; ++i) counts.push_back(uneven ? 1 + (i + per) % 4 : per);
  return counts;
}

std::vector<int> ranks_on(const std::vector<std::string>& node_of_rank, const std::string& node) {
  std::vector<int> out;
  for (std::size_t r = 0; r < node_of_rank.size(); ++r) {
    if (node_of_rank[r] == node) out.push_back(static_cast<int>(r));
  }
  return out;
}

// What every pairing must satisfy: a partner on another node, wards the exact inverse of partners, ascending.
void check_pairing(const std::vector<std::string>& nodes, const Pairing& p) {
  REQUIRE(p.partner.size() == nodes.size());
  REQUIRE(p.wards.size() == nodes.size());
  std::vector<std::vector<int>> inverse(nodes.size());
  for (std::size_t r = 0; r < nodes.size(); ++r) {
    const int partner = p.partner[r];
    REQUIRE(partner >= 0);
    REQUIRE(static_cast<std::size_t>(partner) < nodes.size());
    REQUIRE(nodes[static_cast<std::size_t>(partner)] != nodes[r]);
    inverse[static_cast<std::size_t>(partner)].push_back(static_cast<int>(r));
  }
  CHECK(p.wards == inverse);
}

}  // namespace

TEST_CASE("memtier: every rank's partner is on another node", "[memtier]") {
  for (int nodes = 2; nodes <= 9; ++nodes) {
    for (int per = 1; per <= 4; ++per) {
      for (bool uneven : {false, true}) {
        for (int distance = 1; distance <= 3; ++distance) {
          if (distance % nodes == 0) continue;  // lands on the rank's own node: see the next case
          const std::vector<int> counts = shape(nodes, per, uneven);
          for (const auto& layout : {spread(counts), blocks(counts)}) {
            INFO(nodes << " nodes, " << per << " per node" << (uneven ? " (uneven)" : "") << ", distance "
                       << distance);
            check_pairing(layout, memtier::pair_ranks(layout, distance));
          }
        }
      }
    }
  }
}

TEST_CASE("memtier: the rule, spelled out", "[memtier]") {
  // n1: ranks 0, 2, 4; n2: 1, 3; n3: 5. Node names sort n1 < n2 < n3, whatever order the ranks list them in.
  const std::vector<std::string> nodes{"n1", "n2", "n1", "n2", "n1", "n3"};
  SECTION("distance 1: n1 -> n2 -> n3 -> n1") {
    const Pairing p = memtier::pair_ranks(nodes, 1);
    // n1's local 0, 1, 2 -> n2's local 0, 1, 0 (n2 has 2 ranks); n2's -> n3's only rank; n3's -> n1's local 0.
    CHECK(p.partner == std::vector<int>{1, 5, 3, 5, 1, 0});
    CHECK(p.wards == std::vector<std::vector<int>>{{5}, {0, 4}, {}, {2}, {}, {1, 3}});
  }
  SECTION("distance 2: n1 -> n3 -> n2 -> n1") {
    const Pairing p = memtier::pair_ranks(nodes, 2);
    CHECK(p.partner == std::vector<int>{5, 0, 5, 2, 5, 1});
  }
  SECTION("a distance below 1 counts as 1") {
    CHECK(memtier::pair_ranks(nodes, 0).partner == memtier::pair_ranks(nodes, 1).partner);
    CHECK(memtier::pair_ranks(nodes, -4).partner == memtier::pair_ranks(nodes, 1).partner);
  }
  SECTION("a distance past N wraps") {
    CHECK(memtier::pair_ranks(nodes, 4).partner == memtier::pair_ranks(nodes, 1).partner);
  }
}

TEST_CASE("memtier: no partner where a copy would share the rank's node", "[memtier]") {
  SECTION("one node") {
    const std::vector<std::string> one(4, "n1");
    for (int distance : {1, 2, 5}) {
      const Pairing p = memtier::pair_ranks(one, distance);
      CHECK(p.partner == std::vector<int>(4, -1));
      CHECK(p.wards == std::vector<std::vector<int>>(4));
      CHECK(memtier::lost_after(p, one, {"n1"}) == std::vector<int>{0, 1, 2, 3});
    }
  }
  SECTION("a distance that is a multiple of the node count") {
    const std::vector<std::string> three = blocks({2, 2, 2});
    for (int distance : {3, 6}) CHECK(memtier::pair_ranks(three, distance).partner == std::vector<int>(6, -1));
  }
  SECTION("no ranks") {
    const Pairing p = memtier::pair_ranks({}, 1);
    CHECK(p.partner.empty());
    CHECK(p.wards.empty());
  }
}

TEST_CASE("memtier: what node deaths lose", "[memtier]") {
  SECTION("any single node: nothing, whatever the shape") {
    for (int nodes = 2; nodes <= 9; ++nodes) {
      for (int per = 1; per <= 4; ++per) {
        for (int distance = 1; distance <= 3; ++distance) {
          if (distance % nodes == 0) continue;
          const auto layout = spread(shape(nodes, per, per % 2 == 0));
          const Pairing p = memtier::pair_ranks(layout, distance);
          for (int i = 0; i < nodes; ++i) {
            INFO(nodes << " nodes, " << per << " per node, distance " << distance << ", " << node_name(i) << " lost");
            CHECK(memtier::lost_after(p, layout, {node_name(static_cast<std::size_t>(i))}).empty());
          }
        }
      }
    }
  }
  SECTION("two adjacent nodes at distance 1: exactly the first one's ranks") {
    for (int nodes = 3; nodes <= 9; ++nodes) {
      const auto layout = spread(shape(nodes, 2, true));
      const Pairing p = memtier::pair_ranks(layout, 1);
      for (int i = 0; i < nodes; ++i) {
        const std::string first = node_name(static_cast<std::size_t>(i));
        const std::string next = node_name(static_cast<std::size_t>((i + 1) % nodes));
        INFO(nodes << " nodes, " << first << " and " << next << " lost");
        CHECK(memtier::lost_after(p, layout, {first, next}) == ranks_on(layout, first));
      }
    }
  }
  SECTION("two nodes, both lost: everything") {
    const auto layout = blocks({2, 3});
    CHECK(memtier::lost_after(memtier::pair_ranks(layout, 1), layout, {"n2", "n1"}) ==
          std::vector<int>{0, 1, 2, 3, 4});
  }
  SECTION("two nodes apart at distance 1 lose nothing; at distance 2 they are partners") {
    const auto layout = blocks({1, 1, 1, 1, 1});
    CHECK(memtier::lost_after(memtier::pair_ranks(layout, 1), layout, {"n1", "n3"}).empty());
    CHECK(memtier::lost_after(memtier::pair_ranks(layout, 2), layout, {"n1", "n3"}) == std::vector<int>{0});
  }
  SECTION("names nobody runs on, and a pairing shorter than the job") {
    const auto layout = blocks({1, 1});
    CHECK(memtier::lost_after(memtier::pair_ranks(layout, 1), layout, {"n9"}).empty());
    CHECK(memtier::lost_after(Pairing{}, layout, {"n1"}) == std::vector<int>{0});
  }
}

TEST_CASE("memtier: the budget", "[memtier]") {
  SECTION("staging and two copies per ward") {
    CHECK(memtier::tier_bytes(kGiB, kGiB, 1) == 3 * kGiB);
    CHECK(memtier::tier_bytes(kGiB, 512 * kMiB, 3) == 4 * kGiB);
    CHECK(memtier::tier_bytes(kGiB, kGiB, 0) == kGiB);  // no wards (one node): staging alone
    CHECK(memtier::tier_bytes(0, 0, 5) == 0);
  }
  SECTION("saturates rather than wraps") {
    const auto max = std::numeric_limits<std::uint64_t>::max();
    CHECK(memtier::tier_bytes(1, max / 2 + 1, 1) == max);
    CHECK(memtier::tier_bytes(max, 1, 1) == max);
    CHECK(memtier::tier_bytes(0, 2, std::numeric_limits<std::size_t>::max()) == max);
    CHECK(memtier::refuse(memtier::tier_bytes(1, max, 1), max - 1, 0).has_value());
  }
  SECTION("fits: no line") {
    CHECK_FALSE(memtier::refuse(3 * kGiB, 3 * kGiB, 0));
    CHECK_FALSE(memtier::refuse(0, 0, 0));
    CHECK_FALSE(memtier::refuse(kGiB, 4 * kGiB, 0));
  }
  SECTION("too big: one line with both sizes") {
    CHECK(memtier::refuse(memtier::tier_bytes(kGiB, kGiB, 1), 2 * kGiB, 3) ==
          std::string("the memory tier is off for the whole job: rank 3 needs 3.0 GiB (its own staging, and two "
                      "copies of each shard it keeps for another rank) but CKPT_MEMORY allows 2.0 GiB per rank: "
                      "checkpoints go to the file system alone"));
    const auto mib = memtier::refuse(1536 * kMiB, 640 * kMiB, 0);
    REQUIRE(mib);
    CHECK(mib->find("rank 0 needs 1.5 GiB") != std::string::npos);
    CHECK(mib->find("allows 640.0 MiB per rank") != std::string::npos);
    const auto none = memtier::refuse(1, 0, 0);
    REQUIRE(none);
    CHECK(none->find("needs 1 B (") != std::string::npos);
    CHECK(none->find("allows 0 B") != std::string::npos);
  }
}

TEST_CASE("memtier: auto interval: the fewest steps that cover a copy, a quarter to spare", "[memtier]") {
  CHECK(memtier::keep_up_interval(0.08, 1.0) == 1);   // a copy well inside a step: every step
  CHECK(memtier::keep_up_interval(0.8, 1.0) == 1);    // 1.25 x 0.8 = 1.0 step exactly
  CHECK(memtier::keep_up_interval(0.81, 1.0) == 2);
  CHECK(memtier::keep_up_interval(2.5, 1.0) == 4);    // 3.125 steps
  CHECK(memtier::keep_up_interval(0.6, 0.1) == 8);    // 7.5 steps
  SECTION("nothing measured yet: every step, where the first copy measures itself") {
    CHECK(memtier::keep_up_interval(0, 1.0) == 1);
    CHECK(memtier::keep_up_interval(1.0, 0) == 1);
    CHECK(memtier::keep_up_interval(std::nan(""), 1.0) == 1);
    CHECK(memtier::keep_up_interval(1.0, -1.0) == 1);
  }
  SECTION("bounded") {
    CHECK(memtier::keep_up_interval(1e9, 1e-9) == 10000);
    CHECK(memtier::keep_up_interval(std::numeric_limits<double>::infinity(), 1.0) == 10000);
    CHECK(memtier::keep_up_interval(100, 1.0, 50) == 50);
    CHECK(memtier::keep_up_interval(100, 1.0, 0) == 1);
  }
}

TEST_CASE("memtier: auto interval: Young's interval from the measured cost, never below the keep-up bound",
          "[memtier]") {
  memtier::AutoIntervalInputs in;
  in.busy_s = 0.08;
  in.step_s = 1.0;
  SECTION("no cost or no MTBF measured: the keep-up bound") {
    CHECK(memtier::auto_interval(in) == 1);
    in.cost_s = 0.05;
    CHECK(memtier::auto_interval(in) == 1);  // MTBF unknown
    in.mtbf_s = 3600;
    in.cost_s = 0;
    CHECK(memtier::auto_interval(in) == 1);
  }
  SECTION("√(2·cost·MTBF) in whole steps, rounded down") {
    in.cost_s = 0.05;
    in.mtbf_s = 3 * 3600;  // √(2 · 0.05 · 10800) = 32.9 s
    CHECK(memtier::auto_interval(in) == 32);
    in.step_s = 0.1;
    CHECK(memtier::auto_interval(in) == 328);
    in.mtbf_s = 60;  // √6 = 2.45 s: 24 steps of 0.1 s
    CHECK(memtier::auto_interval(in) == 24);
  }
  SECTION("a cheap checkpoint on a failing job: every step, as often as the copies keep up") {
    in.cost_s = 0.001;
    in.mtbf_s = 60;  // √0.12 = 0.35 s, under a step
    CHECK(memtier::auto_interval(in) == 1);
    in.busy_s = 2.5;  // a copy of 2.5 s: 4 steps
    CHECK(memtier::auto_interval(in) == 4);
  }
  SECTION("bounded") {
    in.cost_s = 1e9;
    in.mtbf_s = 1e9;
    CHECK(memtier::auto_interval(in) == 10000);
    CHECK(memtier::auto_interval(in, 50) == 50);
    in.cost_s = std::nan("");
    CHECK(memtier::auto_interval(in) == 1);
  }
}

TEST_CASE("memtier: the stride form is the rule for ranks that fill nodes in order", "[memtier]") {
  for (int nodes = 1; nodes <= 7; ++nodes) {
    for (int per_node = 1; per_node <= 4; ++per_node) {
      for (int distance = 0; distance <= 8; ++distance) {
        const int world = nodes * per_node;
        std::vector<std::string> node_of_rank;
        for (int r = 0; r < world; ++r) node_of_rank.push_back("n" + std::to_string(100 + r / per_node));
        const Pairing p = pair_ranks(node_of_rank, distance);
        for (int r = 0; r < world; ++r) {
          CAPTURE(nodes, per_node, distance, r);
          const int partner = stride_partner(r, world, per_node, distance);
          CHECK(partner == p.partner[static_cast<std::size_t>(r)]);
          if (partner >= 0) CHECK(partner / per_node != r / per_node);
          CHECK(stride_wards(r, world, per_node, distance) == p.wards[static_cast<std::size_t>(r)]);
        }
      }
    }
  }
  // Not a whole number of nodes: nobody pairs (the hooks then say why, once).
  CHECK(stride_partner(0, 5, 2, 1) == -1);
  CHECK(stride_wards(0, 5, 2, 1).empty());
  CHECK(stride_partner(-1, 4, 2, 1) == -1);
}

TEST_CASE("memtier: Slurm's task counts per node", "[memtier]") {
  CHECK(uniform_tasks_per_node("4") == 4);
  CHECK(uniform_tasks_per_node("2(x3)") == 2);
  CHECK(uniform_tasks_per_node("4(x2),4") == 4);
  CHECK(uniform_tasks_per_node("1(x16384)") == 1);
  CHECK_FALSE(uniform_tasks_per_node("4(x2),3"));
  CHECK_FALSE(uniform_tasks_per_node(""));
  CHECK_FALSE(uniform_tasks_per_node("0"));
  CHECK_FALSE(uniform_tasks_per_node("4,"));
  CHECK_FALSE(uniform_tasks_per_node("4(x)"));
  CHECK_FALSE(uniform_tasks_per_node("4(y2)"));
  CHECK_FALSE(uniform_tasks_per_node("-4"));
  CHECK_FALSE(uniform_tasks_per_node("99999999"));
}
