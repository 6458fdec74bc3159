#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "ckpt/placement.hpp"

using ckpt::placement::hostfile;
using ckpt::placement::keep_nodes;
using ckpt::placement::failed_nodes;
using ckpt::placement::node_steps;
using ckpt::placement::StepEnd;
using Nodes = std::vector<std::string>;

TEST_CASE("placement: a relaunch keeps every rank on its node but the lost ones", "[placement]") {
  const Nodes alloc{"n1", "n2", "n3", "n4", "n5"};
  const Nodes before{"n1", "n1", "n2", "n2", "n3", "n3"};  // 2 ranks a node; n4, n5 free

  SECTION("the lost node's ranks go together to the first free node") {
    auto after = keep_nodes(before, {"n2"}, alloc);
    REQUIRE(after);
    CHECK(*after == Nodes{"n1", "n1", "n4", "n4", "n3", "n3"});  // srun's own order would have moved n3's ranks
  }
  SECTION("two lost nodes, in the order they first appear") {
    auto after = keep_nodes(before, {"n3", "n1"}, alloc);
    REQUIRE(after);
    CHECK(*after == Nodes{"n4", "n4", "n2", "n2", "n5", "n5"});
  }
  SECTION("never an excluded node, nor one the step already uses") {
    const Nodes shuffled{"n3", "n1", "n2"};  // a placement of its own (an earlier relaunch)
    auto after = keep_nodes(shuffled, {"n1", "n4"}, alloc);
    REQUIRE(after);
    CHECK(*after == Nodes{"n3", "n5", "n2"});
  }
  SECTION("too few free nodes, or nothing to keep") {
    CHECK_FALSE(keep_nodes(before, {"n1", "n2", "n3"}, alloc));
    CHECK_FALSE(keep_nodes(before, {"n2", "n4", "n5"}, alloc));
    CHECK_FALSE(keep_nodes({}, {"n2"}, alloc));
    CHECK_FALSE(keep_nodes({"n1", ""}, {}, alloc));
  }
  SECTION("nothing lost: the placement as it was") {
    CHECK(keep_nodes(before, {"n5"}, alloc) == before);
  }
  CHECK(hostfile({"n1", "n4", "n3"}) == "n1\nn4\nn3\n");
}

TEST_CASE("placement: ckpt-run --spares relaunches each node's step on its node, a spare in a failed node's place",
          "[placement]") {
  const Nodes alloc{"n1", "n2", "n3", "n4", "n5"};
  const Nodes training{"n1", "n2", "n3"};  // groups 0..2; n4, n5 the spares

  SECTION("the first launch: the first nodes train, the next ones wait, as many as asked") {
    auto steps = node_steps(training, {}, alloc, 1);
    REQUIRE(steps);
    CHECK(steps->training == training);
    CHECK(steps->spares == Nodes{"n4"});
    CHECK(node_steps(training, {}, alloc, 5)->spares == Nodes{"n4", "n5"});
  }
  SECTION("a failed node's group goes to the first spare; the other groups keep their nodes and node tiers") {
    auto steps = node_steps(training, {"n2"}, alloc, 2);
    REQUIRE(steps);
    CHECK(steps->training == Nodes{"n1", "n4", "n3"});  // srun's own order would have moved n3's group too
    CHECK(steps->spares == Nodes{"n5"});
  }
  SECTION("a spare that failed is not taken; an excluded spare is not one") {
    auto steps = node_steps(training, {"n3", "n4"}, alloc, 2);
    REQUIRE(steps);
    CHECK(steps->training == Nodes{"n1", "n2", "n5"});
    CHECK(steps->spares.empty());
  }
  SECTION("no node for a failed node's group, or no group at all") {
    CHECK_FALSE(node_steps(training, {"n1", "n2", "n4"}, alloc, 2));
    CHECK_FALSE(node_steps({}, {}, alloc, 2));
  }
}

TEST_CASE("placement: the nodes a relaunch of the node steps leaves out after the survivors gave up in place",
          "[placement]") {
  const std::map<int, std::string> node_of_rank{{0, "n1"}, {1, "n1"}, {2, "n4"}, {3, "n3"}};  // rank 2 moved to n4
  using Set = std::set<std::string>;
  SECTION("the nodes the lost ranks ran on last, not the ones they were launched on") {
    CHECK(failed_nodes(node_of_rank, {2}, {}, {}, 75) == Set{"n4"});
    CHECK(failed_nodes(node_of_rank, {3, 9}, {}, {}, 75) == Set{"n3"});  // a rank of no node: nothing
  }
  SECTION("nodes that lost all their ranks before, and steps that crashed or were killed; not those that gave up") {
    const std::vector<StepEnd> steps{{"n1", 75}, {"n2", 137}, {"n3", 0}, {"n4", std::nullopt}};
    CHECK(failed_nodes(node_of_rank, {}, {"n5"}, steps, 75) == Set{"n2", "n5"});
  }
  SECTION("where the survivors named their lost ranks, a killed step is no evidence: srun kills a step's other ranks "
          "once one gives up") {
    const std::vector<StepEnd> steps{{"n1", 137}, {"n3", 137}, {"n4", 137}};  // every step ended by srun
    CHECK(failed_nodes(node_of_rank, {3}, {}, steps, 75) == Set{"n3"});
    CHECK(failed_nodes(node_of_rank, {3}, {"n5"}, steps, 75) == Set{"n3", "n5"});
  }
  SECTION("nothing names a failed node: no relaunch") {
    CHECK(failed_nodes(node_of_rank, {}, {}, {{"n1", 75}, {"n3", 0}}, 75).empty());
  }
}
