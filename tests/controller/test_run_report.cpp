// ckpt-run's reading of an in-place recovery's files (gen-<G>.plan and gen-<G>.phases, as slurm_ckpt.inplace
// writes them) into the event it sends the controller: what it takes, and what it refuses.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "run_report.hpp"

namespace {

using ckpt::run::read_in_place_phases;

const std::map<int, std::string> kNodeOfRank = {{0, "n1"}, {1, "n1"}, {2, "n2"}, {3, "n2"}, {4, "n3"}, {5, "n3"}};

const char* kPlan =
    R"({"addr": "10.0.0.1", "committed": true, "detect_unix": 1700000000.0, "generation": 1, "lost": [2, 3],)"
    R"( "port": 29500, "root": 0, "step": 120, "takeover": {"2": "n4.0", "3": "n4.1"}, "world": 6,)"
    R"( "written_unix": 1700000001.5})";
const char* kPhases =
    R"({"generation": 1, "detect": 1700000000.0, "decided": 1700000000.25, "last_words_done": 1700000001.0,)"
    R"( "plan": 1700000001.5, "group": 1700000003.0, "restored": 1700000004.5, "first_step": 1700000006.0,)"
    R"( "step": 120, "lost": [2, 3]})";

struct ControlDir {
  std::filesystem::path path;
  ControlDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "inplace.XXXXXX").string();
    REQUIRE(mkdtemp(templ.data()) != nullptr);
    path = templ;
  }
  ~ControlDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ControlDir(const ControlDir&) = delete;
  ControlDir& operator=(const ControlDir&) = delete;
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
  }
  auto read(std::uint32_t generation = 1) const {
    return read_in_place_phases(path.string(), generation, kNodeOfRank);
  }
};

}  // namespace

TEST_CASE("ckpt-run reads an in-place recovery from its plan and phases", "[controller][in-place]") {
  ControlDir dir;
  dir.write("gen-1.plan", kPlan);
  dir.write("gen-1.phases", kPhases);
  auto r = dir.read();
  REQUIRE(r);
  CHECK(r->generation == 1);
  CHECK(r->lost_ranks == std::vector<int>{2, 3});
  CHECK(r->failed_nodes == std::vector<std::string>{"n2"});  // each node once, when all its ranks were lost
  CHECK(r->resume_step == 120u);
  CHECK(r->phases.detected == 1700000000.0);
  CHECK(r->phases.agreed == 1700000000.25);
  CHECK(r->phases.last_words_done == 1700000001.0);
  CHECK(r->phases.regrouped == 1700000003.0);
  CHECK(r->phases.restored == 1700000004.5);
  CHECK(r->phases.resumed == 1700000006.0);
  CHECK(r->replacement_node == std::map<int, std::string>{{2, "n4"}, {3, "n4"}});  // where the ranks run now

  SECTION("a takeover that names no node is refused") {
    std::string plan = kPlan;
    plan.replace(plan.find("\"n4.0\""), 6, "\"$(x)\"");
    dir.write("gen-1.plan", plan);
    CHECK_FALSE(dir.read());
  }

  SECTION("a node that lost only some of its ranks is alive: no failed node") {
    std::string plan = kPlan;
    plan.replace(plan.find("[2, 3]"), 6, "[3]");
    dir.write("gen-1.plan", plan);
    r = dir.read();
    REQUIRE(r);
    CHECK(r->lost_ranks == std::vector<int>{3});
    CHECK(r->failed_nodes.empty());
  }

  SECTION("a phase the root did not see is 0") {
    std::string phases = kPhases;
    phases.replace(phases.find("1700000000.25"), 13, "null");
    dir.write("gen-1.phases", phases);
    r = dir.read();
    REQUIRE(r);
    CHECK(r->phases.agreed == 0);
  }
}

TEST_CASE("ckpt-run refuses an in-place recovery it cannot read whole", "[controller][in-place][security]") {
  ControlDir dir;
  dir.write("gen-1.plan", kPlan);
  SECTION("the first step is not done yet (no phases file)") { CHECK_FALSE(dir.read()); }
  SECTION("another generation") {
    dir.write("gen-1.phases", kPhases);
    CHECK_FALSE(dir.read(2));
    dir.write("gen-2.plan", kPlan);  // says generation 1
    dir.write("gen-2.phases", kPhases);
    CHECK_FALSE(dir.read(2));
  }
  SECTION("malformed files") {
    for (const std::string& phases : {std::string("{"), std::string("[]"), std::string(R"({"generation": 1})"),
                                     std::string(kPhases).replace(std::string(kPhases).find("1700000004.5"), 12, "-4"),
                                     std::string(kPhases).replace(std::string(kPhases).find("1700000004.5"), 12,
                                                                  "\"soon\""),
                                     std::string(kPhases).replace(std::string(kPhases).find("120"), 3, "-120")}) {
      dir.write("gen-1.phases", phases);
      INFO(phases);
      CHECK_FALSE(dir.read());
    }
  }
  SECTION("a plan that abandons, or whose lost ranks are unknown or malformed") {
    dir.write("gen-1.phases", kPhases);
    for (const std::string& plan : {std::string(R"({"abandon": "2 ranks lost, 0 spares ready", "generation": 1})"),
                                   std::string(R"({"generation": 1, "lost": [2, 9]})"),
                                   std::string(R"({"generation": 1, "lost": [2, 4294967298]})"),
                                   std::string(R"({"generation": 1, "lost": ["2"]})"),
                                   std::string(R"({"generation": 1, "lost": []})")}) {
      dir.write("gen-1.plan", plan);
      INFO(plan);
      CHECK_FALSE(dir.read());
    }
  }
  SECTION("a file too large, or a symlink") {
    dir.write("gen-1.phases", std::string(kPhases) + std::string(5 * 1024 * 1024, ' '));
    CHECK_FALSE(dir.read());
    dir.write("elsewhere", kPhases);
    std::filesystem::remove(dir.path / "gen-1.phases");
    std::filesystem::create_symlink(dir.path / "elsewhere", dir.path / "gen-1.phases");
    CHECK_FALSE(dir.read());
  }
  SECTION("no such dir") { CHECK_FALSE(read_in_place_phases("/nonexistent/inplace-x", 1, kNodeOfRank)); }
}

// The controller's view of a job as ckpt-run takes it: a field of the wrong type or range drops the whole view (a
// mistyped field once threw out of ckpt-run and crashed it), and node names must be host names (they go into -x).
TEST_CASE("ckpt-run type-checks every field of the controller's view", "[controller][security]") {
  using ckpt::run::parse_job_view;
  using nlohmann::json;
  SECTION("good inputs") {
    auto v = parse_job_view(json::parse(
        R"({"state": "relaunching", "reason": "node failure", "relaunch_step": 3, "exclude": ["n2", "gpu-07.rack1"],
            "clock": {"decided": 1700000000.5}, "other": [1, {"x": null}]})"));
    REQUIRE(v);
    CHECK(v->state == "relaunching");
    CHECK(v->relaunch_step == 3u);
    CHECK(v->exclude == std::vector<std::string>{"n2", "gpu-07.rack1"});
    CHECK(v->decided == 1700000000.5);
    CHECK(parse_job_view(json::parse(R"({"state": "running"})"))->state == "running");
    CHECK(parse_job_view(json::parse(R"({"state": "gave-up", "reason": null})")));
  }
  SECTION("bad inputs") {
    for (const char* bad : {R"([])", R"("gave-up")", R"({"state": 5})", R"({"state": ["gave-up"]})",
                            R"({"reason": {"a": 1}})", R"({"state": "relaunching"})",
                            R"({"state": "relaunching", "relaunch_step": -1})",
                            R"({"state": "relaunching", "relaunch_step": 4294967296})",
                            R"({"state": "relaunching", "relaunch_step": "3"})",
                            R"({"state": "relaunching", "relaunch_step": 1.5})",
                            R"({"exclude": "n2"})", R"({"exclude": [2]})", R"({"exclude": ["n2;rm -rf /"]})",
                            R"({"exclude": ["-w"]})", R"({"exclude": [""]})", R"({"clock": {"decided": "x"}})"}) {
      INFO(bad);
      CHECK_FALSE(parse_job_view(json::parse(bad)));
    }
  }
}
