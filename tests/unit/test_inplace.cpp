// Restart in place (ckpt/inplace.hpp): the state machine's table, every decision of a generation, the plan's way
// down the tree, and the run's records (what a reader refuses, what a writer leaves).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "ckpt/inplace.hpp"
#include "ckpt/overlay.hpp"

using namespace ckpt::inplace;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/ckpt-inplace-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

Failure failure_of(std::vector<int> lost, int root = -1, std::optional<std::uint64_t> step = std::nullopt) {
  Failure f;
  f.lost = std::move(lost);
  f.root = root;
  f.step = step;
  f.detect_unix = 100;
  return f;
}

}  // namespace

TEST_CASE("the generation state machine follows its table", "[inplace]") {
  SECTION("a training rank's life through two recoveries") {
    Machine m(State::Forming);
    REQUIRE(m.on(Event::Formed));
    REQUIRE(m.on(Event::PeerLost));
    CHECK(m.state() == State::Recovering);
    CHECK(m.generation() == 1);
    REQUIRE(m.on(Event::Planned));
    REQUIRE(m.on(Event::JoinFailed));  // a replacement died before the group formed
    CHECK(m.generation() == 2);
    REQUIRE(m.on(Event::Planned));
    REQUIRE(m.on(Event::Formed));
    REQUIRE(m.on(Event::Returned));
    CHECK(m.state() == State::Finished);
  }
  SECTION("a spare enters the generation its claim names") {
    Machine m(State::Waiting);
    CHECK_FALSE(m.on(Event::Claimed));  // no generation: refused, nothing changes
    CHECK(m.state() == State::Waiting);
    REQUIRE(m.on(Event::Claimed, 3u));
    CHECK(m.state() == State::Forming);
    CHECK(m.generation() == 3);
  }
  SECTION("an unneeded spare leaves") {
    Machine m(State::Waiting);
    REQUIRE(m.on(Event::Unneeded));
    CHECK(m.state() == State::Left);
  }
  SECTION("what is not in the table is an error naming both") {
    Machine m(State::Finished);
    auto s = m.on(Event::PeerLost);
    CHECK_FALSE(s);
    CHECK_THAT(s.error(), Catch::Contains("from finished on peer-lost"));
    CHECK_FALSE(next_state(State::Recovering, Event::Formed));
    CHECK_FALSE(next_state(State::Waiting, Event::Returned));
    CHECK_FALSE(next_state(State::Left, Event::Planned));
  }
  SECTION("nothing leaves Finished or Left") {
    for (Event e : {Event::Claimed, Event::Unneeded, Event::Formed, Event::JoinFailed, Event::Returned,
                    Event::PeerLost, Event::Planned, Event::Failed, Event::HandedOver}) {
      CHECK_FALSE(next_state(State::Finished, e));
      CHECK_FALSE(next_state(State::Left, e));
    }
  }
}

TEST_CASE("what run() does after train() of a generation", "[inplace]") {
  TrainOutcome o;
  CHECK(after_train(0, o) == AfterTrain::Return);
  o.raised = true;
  CHECK(after_train(0, o) == AfterTrain::Raise);
  o.mesh_failed = true;
  CHECK(after_train(0, o) == AfterTrain::Raise);  // generation 0 has no replacement to lose
  CHECK(after_train(2, o) == AfterTrain::RollCall);
  o.lost_peer = true;
  CHECK(after_train(2, o) == AfterTrain::Recover);  // the loss is known: no roll call
  o = {};
  o.lost_peer = true;
  CHECK(after_train(0, o) == AfterTrain::Recover);
  o.counted_dead = true;
  CHECK(after_train(0, o) == AfterTrain::Leave);
  // Rank 0 finished: a peer lost after this rank's train() returned is no failure; a raise still is one.
  o = {};
  o.lost_peer = true;
  o.finished = true;
  CHECK(after_train(1, o) == AfterTrain::Return);
  o.counted_dead = true;
  CHECK(after_train(1, o) == AfterTrain::Return);
  o.raised = true;
  CHECK(after_train(1, o) == AfterTrain::Leave);
  // The marker is read only where it can change the answer.
  CHECK_FALSE(finished_matters(o));
  o = {};
  CHECK_FALSE(finished_matters(o));
  o.lost_peer = true;
  CHECK(finished_matters(o));
  o = {};
  o.counted_dead = true;
  CHECK(finished_matters(o));
  o.raised = true;
  CHECK_FALSE(finished_matters(o));
}

TEST_CASE("a generation that did not form", "[inplace]") {
  CHECK(after_join_failure(0, std::vector<int>{1}) == AfterJoinFailure::Raise);
  CHECK(after_join_failure(1, std::nullopt) == AfterJoinFailure::HandOver);  // the store's host is gone
  CHECK(after_join_failure(1, std::vector<int>{}) == AfterJoinFailure::HandOver);
  CHECK(after_join_failure(1, std::vector<int>{3}) == AfterJoinFailure::Recover);

  Plan plan;
  plan.generation = 4;
  plan.root = 2;
  plan.step = 40;
  Failure f = join_failure(plan, {5, 3, 5}, 7.5);
  CHECK(f.lost == std::vector<int>{3, 5});
  CHECK(f.root == 2);
  CHECK(f.step == std::optional<std::uint64_t>(40));
  CHECK(f.detect_unix == 7.5);
  CHECK(join_failure(plan, {2}, 1).root == -1);  // the plan's root is among the missing
}

TEST_CASE("a rank that has not joined is gone for good only once its mailbox refused a connection", "[inplace]") {
  // The join fails at once on the ranks absent and refused; one refused but since checked in counts as there.
  CHECK(gone_for_good({3, 5}, {}).empty());
  CHECK(gone_for_good({5, 3, 7}, {7, 3, 9}) == std::vector<int>{3, 7});
  CHECK(gone_for_good({}, {3}).empty());
  // The roll call ends when nobody is absent, or every absent rank is gone for good; a rank that may be slow
  // (absent, its mailbox not refusing) keeps it open until its deadline.
  CHECK(roll_call_settled({}, {}));
  CHECK(roll_call_settled({}, {4}));
  CHECK(roll_call_settled({4}, {4}));
  CHECK(roll_call_settled({4, 6}, {6, 4, 1}));
  CHECK_FALSE(roll_call_settled({4}, {}));
  CHECK_FALSE(roll_call_settled({4, 6}, {4}));
}

TEST_CASE("training_stuck: a thread that neither returned nor used CPU after the last words ended", "[inplace]") {
  using ckpt::inplace::kStuckIdleS;
  // Stuck: last words done, train() still running, no CPU for the idle limit.
  CHECK(training_stuck(TrainingThread{true, false, kStuckIdleS}));
  CHECK(training_stuck(TrainingThread{true, false, kStuckIdleS * 10}));
  // Computing (its CPU time advances), or idle for less: it will reach a failing collective itself.
  CHECK_FALSE(training_stuck(TrainingThread{true, false, kStuckIdleS - 0.1}));
  CHECK_FALSE(training_stuck(TrainingThread{true, false, 0}));
  // Waiting on the last words (before_update waits for them, close too): not stuck until they are done.
  CHECK_FALSE(training_stuck(TrainingThread{false, false, kStuckIdleS * 10}));
  // Returned: recovery goes on, however long the thread was idle.
  CHECK_FALSE(training_stuck(TrainingThread{true, true, kStuckIdleS * 10}));
}

TEST_CASE("the recovery's root and the plan's way down the tree", "[inplace]") {
  SECTION("the decider when it survived, else the lowest survivor") {
    CHECK(recovery_root(8, failure_of({3}, 5)) == 5);
    CHECK(recovery_root(8, failure_of({0, 1})) == 2);
    CHECK(recovery_root(8, failure_of({0}, 0)) == 1);  // a decider counted as lost is no root
  }
  SECTION("every survivor is handed the plan once, by a live parent, with constant fan-out") {
    for (int world : {2, 7, 64, 1000}) {
      for (const std::vector<int>& lost : {std::vector<int>{1}, std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7},
                                           std::vector<int>{world - 1}}) {
        const Failure f = failure_of(lost);
        const int root = recovery_root(world, f);
        std::map<int, int> handed;  // survivor -> times a parent lists it
        std::size_t widest = 0;
        for (int r = 0; r < world; ++r) {
          Role role = recovery_role(world, f, r, false);
          CAPTURE(world, r);
          if (role.lost) {
            CHECK(role.sources == std::vector<int>{root});
            CHECK(role.children.empty());
            continue;
          }
          CHECK(role.writes_plan == (r == root));
          if (r != root) CHECK_FALSE(role.sources.empty());
          for (int s : role.sources) CHECK(std::find(lost.begin(), lost.end(), s) == lost.end());
          for (int c : role.children) ++handed[c];
          widest = std::max(widest, role.children.size());
        }
        CAPTURE(world);
        CHECK(widest <= static_cast<std::size_t>(ckpt::overlay::kGroupSize + 2));
        for (int r = 0; r < world; ++r) {
          const bool survivor = std::find(lost.begin(), lost.end(), r) == lost.end();
          if (survivor && r != root) CHECK(handed[r] == 1);
          if (!survivor || r == root) CHECK(handed[r] == 0);
        }
      }
    }
  }
  SECTION("the root waits on its parent when the plan exists already; the tree's top asks the writer") {
    const Failure f = failure_of({3}, 9);  // the decider is not the tree's top (rank 0)
    Role top = recovery_role(16, f, 0, false);
    CHECK(top.sources == std::vector<int>{9});
    Role again = recovery_role(16, f, 9, true);
    CHECK_FALSE(again.writes_plan);
    CHECK_FALSE(again.sources.empty());
  }
}

TEST_CASE("the root's plan: a spare per lost rank, or an abandonment", "[inplace]") {
  const Failure f = failure_of({1, 4}, 0, 12);
  Plan p = plan_generation(3, 6, 0, f, {"n5.0", "n6.0", "n7.0"});
  CHECK_FALSE(p.abandons());
  CHECK(p.generation == 3);
  CHECK(p.world == 6);
  CHECK(p.lost == std::vector<int>{1, 4});
  CHECK(p.takeover == std::map<int, std::string>{{1, "n5.0"}, {4, "n6.0"}});
  CHECK(p.step == std::optional<std::uint64_t>(12));
  Plan short_of = plan_generation(3, 6, 0, f, {"n5.0"});
  CHECK(short_of.abandons());
  CHECK(short_of.abandon == "2 ranks lost, 1 spares ready");

  CHECK(verdict(std::nullopt, 0) == Verdict::NoPlan);
  CHECK(verdict(short_of, 0) == Verdict::Abandoned);
  CHECK(verdict(p, 4) == Verdict::CountedLost);
  CHECK(verdict(p, 2) == Verdict::Go);
}

TEST_CASE("with too few spares and --ckpt-shrink, pure data parallelism goes on with the survivors", "[inplace]") {
  ckpt::store::Layout dp4{4, 1, 1, false};
  const Failure f = failure_of({1}, 0, 12);
  SECTION("the lost rank is dropped and the survivors renumbered in order") {
    Plan p = plan_generation(2, 4, 0, f, {}, Shrink{1}, dp4);
    REQUIRE_FALSE(p.abandons());
    CHECK(p.shrinks());
    CHECK(p.world == 3);
    CHECK(p.world_before == 4);
    CHECK(p.lost == std::vector<int>{1});
    CHECK(p.takeover.empty());
    CHECK(p.step == std::optional<std::uint64_t>(12));
    CHECK(rank_after(p, 0) == 0);
    CHECK(rank_after(p, 1) == -1);
    CHECK(rank_after(p, 2) == 1);
    CHECK(rank_after(p, 3) == 2);
    CHECK(verdict(p, 1) == Verdict::CountedLost);
    CHECK(verdict(p, 3) == Verdict::Go);
    CHECK(state_donors(p, dp4).empty());  // a layout of the failed generation's world
    CHECK(state_donors(p, {3, 1, 1, false}).empty());  // nobody to hand state to: the survivors keep theirs
    // The root is renumbered too (the plan is the new generation's).
    Plan rooted = plan_generation(2, 4, 3, failure_of({0, 2}, 3, 12), {}, Shrink{1}, dp4);
    CHECK(rooted.world == 2);
    CHECK(rooted.root == 1);
  }
  SECTION("a survivor behind the step takes a live replica's state, in the new numbering") {
    Failure behind = failure_of({1}, 0, 12);
    behind.behind = {3, 1};  // the lost rank is no survivor behind
    Plan p = plan_generation(2, 4, 0, behind, {}, Shrink{1}, dp4);
    REQUIRE(p.shrinks());
    CHECK(p.behind == std::vector<int>{3});  // numbered as `lost`: the failed generation's ranks
    p.addr = "10.0.0.1";
    p.port = 4000;
    auto parsed = parse_plan(to_json(p));
    REQUIRE(parsed.ok());
    CHECK(parsed->behind == std::vector<int>{3});  // rank 3 of the 4 before, though the plan's world is 3
    CHECK(state_donors(p, {3, 1, 1, false}) == std::map<int, Donor>{{2, Donor{0, false}}});  // old 3 is new 2
    behind.behind = {0, 2, 3};  // nobody at the step: each reads its shard
    CHECK(state_donors(plan_generation(2, 4, 0, behind, {}, Shrink{1}, dp4), {3, 1, 1, false}).empty());
    behind.step.reset();  // the newest complete checkpoint: nobody is behind it
    CHECK(plan_generation(2, 4, 0, behind, {}, Shrink{1}, dp4).behind.empty());
  }
  SECTION("spares come first: a plan that can replace every lost rank does") {
    Plan p = plan_generation(2, 4, 0, f, {"n5.0"}, Shrink{1}, dp4);
    CHECK_FALSE(p.shrinks());
    CHECK(p.world == 4);
    CHECK(p.takeover == std::map<int, std::string>{{1, "n5.0"}});
    CHECK(rank_after(p, 3) == 3);
  }
  SECTION("off, below the floor, or not pure data parallelism: an abandonment that says why") {
    CHECK(plan_generation(2, 4, 0, f, {}).abandon == "1 ranks lost, 0 spares ready");
    CHECK(plan_generation(2, 4, 0, f, {}, Shrink{4}, dp4).abandon ==
          "1 ranks lost, 0 spares ready; shrinking to 3 replicas is below the floor of 4 (--ckpt-shrink)");
    CHECK(plan_generation(2, 4, 0, f, {}, Shrink{3}, dp4).world == 3);
    CHECK(plan_generation(2, 4, 0, f, {}, Shrink{1}, ckpt::store::Layout{2, 2, 1, false}).abandon ==
          "1 ranks lost, 0 spares ready; shrinking needs pure data parallelism (layout dp=2,tp=2,pp=1)");
    CHECK_THAT(plan_generation(2, 4, 0, f, {}, Shrink{1}, ckpt::store::Layout{4, 1, 1, true}).abandon,
               Catch::Contains("zero1=on"));
    CHECK_THAT(plan_generation(2, 4, 0, f, {}, Shrink{1}).abandon, Catch::Contains("needs the job's layout"));
    CHECK(plan_generation(2, 1, 0, failure_of({0}, -1, 3), {}, Shrink{1}, ckpt::store::Layout{1, 1, 1, false})
              .abandons());  // nobody left
  }
  SECTION("the option's values") {
    CHECK(parse_shrink("off")->min_dp == 0);
    CHECK(parse_shrink("on")->min_dp == 1);
    CHECK(parse_shrink("6")->min_dp == 6);
    CHECK(format_shrink(*parse_shrink("6")) == "6");
    CHECK(format_shrink(*parse_shrink("on")) == "on");
    CHECK(format_shrink(Shrink{}) == "off");
    CHECK_FALSE(parse_shrink("0"));
    CHECK_FALSE(parse_shrink("yes"));
    CHECK_FALSE(parse_shrink("-2"));
  }
  SECTION("a shrinking plan round-trips, and a record that does not add up is refused") {
    Plan p = plan_generation(2, 4, 0, f, {}, Shrink{1}, dp4);
    p.addr = "10.0.0.1";
    p.port = 4000;
    auto back = parse_plan(to_json(p));
    REQUIRE(back);
    CHECK(back->world_before == 4);
    CHECK(back->lost == std::vector<int>{1});
    CHECK(rank_after(*back, 3) == 2);
    const std::string base = R"("generation":1,"addr":"a","port":5,"root":0,"step":null,"detect_unix":1,)"
                             R"("written_unix":1)";
    CHECK(parse_plan("{" + base + R"(,"world":3,"world_before":4,"lost":[3],"takeover":{}})"));
    CHECK_THAT(parse_plan("{" + base + R"(,"world":2,"world_before":4,"lost":[3],"takeover":{}})").error(),
               Catch::Contains("'world_before'"));
    CHECK_THAT(parse_plan("{" + base + R"(,"world":3,"world_before":4,"lost":[3],"takeover":{"3":"n4.0"}})").error(),
               Catch::Contains("'takeover'"));
    CHECK_THAT(parse_plan("{" + base + R"(,"world":3,"world_before":3,"lost":[],"takeover":{}})").error(),
               Catch::Contains("'world_before'"));
  }
}

TEST_CASE("free spares: ready, unclaimed, well named, sorted", "[inplace]") {
  CHECK(free_spares({"spare-n5.0", "claim-n4.0", "spare-n4.0", ".spare-n6.0.x1.tmp", "spare-n3.1", "gen-0.plan",
                     "spare-bad name.0", "spare-n7"}) == std::vector<std::string>{"n3.1", "n5.0"});
  CHECK(parse_slot("n12.3") == std::optional<std::pair<std::string, int>>({"n12", 3}));
  CHECK_FALSE(parse_slot("n12"));
  CHECK_FALSE(parse_slot(".3"));
  CHECK_FALSE(parse_slot("n1/../x.0"));
  CHECK_FALSE(parse_slot("n1.-1"));
}

TEST_CASE("records parse what they wrote and refuse the rest", "[inplace][security]") {
  SECTION("good records round-trip") {
    Plan p = plan_generation(2, 4, 0, failure_of({3}, 0, 9), {"n4.0"});
    p.addr = "10.0.0.1";
    p.port = 4000;
    p.written_unix = 5;
    auto back = parse_plan(to_json(p));
    REQUIRE(back);
    CHECK(back->takeover == p.takeover);
    CHECK(back->step == p.step);
    CHECK(back->addr == "10.0.0.1");
    Plan gone;
    gone.generation = 2;
    gone.abandon = "1 ranks lost, 0 spares ready";
    auto abandon = parse_plan(to_json(gone));
    REQUIRE(abandon);
    CHECK(abandon->abandons());
    Phases ph;
    ph.generation = 2;
    ph.detect = 1;
    ph.first_step = 3;
    ph.lost = {3};
    auto phb = parse_phases(to_json(ph));
    REQUIRE(phb);
    CHECK(phb->as_report().resumed == 3);
    CHECK_FALSE(phb->step);
    Spare s{"n4", 0, 77, 1.5, SpareMailbox{"10.0.0.4", 5000, "abc"}};
    auto sb = parse_spare(to_json(s));
    REQUIRE(sb);
    CHECK(sb->mailbox->token == "abc");
    CHECK(parse_mailbox(to_json(Mailbox{3, 2, "10.0.0.3", 6000, 9})));
    CHECK(parse_claim(to_json(Claim{2, 3}))->rank == 3);
  }
  SECTION("bad records: one line naming the field") {
    const std::string base = R"("generation":1,"world":4,"addr":"a","port":5,"root":0,"step":null,"detect_unix":1,)"
                             R"("written_unix":1)";
    CHECK(parse_plan("{" + base + R"(,"lost":[1],"takeover":{"1":"n4.0"}})"));
    CHECK_THAT(parse_plan("{" + base + R"(,"lost":[4],"takeover":{}})").error(), Catch::Contains("'lost'"));
    CHECK_THAT(parse_plan("{" + base + R"(,"lost":[-1],"takeover":{}})").error(), Catch::Contains("'lost'"));
    CHECK_THAT(parse_plan("{" + base + R"(,"lost":[1],"takeover":{"1":"../x"}})").error(),
               Catch::Contains("'takeover'"));
    CHECK_THAT(parse_plan("{" + base + R"(,"lost":[1],"takeover":{"9":"n4.0"}})").error(),
               Catch::Contains("'takeover'"));
    CHECK_THAT(parse_plan(R"({"generation":1,"world":4,"lost":[]})").error(), Catch::Contains("is missing"));
    CHECK_THAT(parse_plan(R"({"generation":-1,"abandon":"x"})").error(), Catch::Contains("'generation'"));
    CHECK_THAT(parse_plan(R"({"generation":1,"abandon":""})").error(), Catch::Contains("'abandon'"));
    CHECK_THAT(parse_plan("[1]").error(), Catch::Contains("not a JSON object"));
    CHECK_THAT(parse_plan(std::string(5 << 20, ' ')).error(), Catch::Contains("too large"));
    CHECK_THAT(parse_phases(R"({"generation":1,"detect":-3})").error(), Catch::Contains("'detect'"));
    CHECK_THAT(parse_phases(R"({"generation":1,"detect":"now"})").error(), Catch::Contains("'detect'"));
    CHECK_THAT(parse_spare(R"({"node":"n 1","local":0,"pid":1,"ready_unix":1})").error(), Catch::Contains("'node'"));
    CHECK_THAT(parse_spare(R"({"node":"n1","local":0,"pid":1,"ready_unix":1,"mailbox":{"addr":"a"}})").error(),
               Catch::Contains("'mailbox'"));
    CHECK_THAT(parse_mailbox(R"({"rank":1,"generation":0,"addr":"a","port":70000,"pid":1})").error(),
               Catch::Contains("'port'"));
    std::string deep(100000, '[');
    CHECK_FALSE(parse_plan(deep));  // never recurses into a crash
  }
}

TEST_CASE("the run's dir: private, written whole, stale or torn records unread", "[inplace][security]") {
  TempDir t;
  const std::string dir = t.path + "/.control/inplace-j1";
  auto opened = Records::open(dir);
  REQUIRE(opened);
  Records& r = opened.value();
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);

  SECTION("a plan with its claims; claimed spares are not free") {
    REQUIRE(r.write_spare(Spare{"n4", 0, 1, 1, std::nullopt}));
    REQUIRE(r.write_spare(Spare{"n5", 0, 2, 1, std::nullopt}));
    CHECK(r.free_spares() == std::vector<std::string>{"n4.0", "n5.0"});
    Plan p = plan_generation(1, 4, 0, failure_of({2}), r.free_spares());
    p.addr = "10.0.0.1";
    p.port = 4000;
    auto written = r.write_plan(p, {{"n4.0", 2}});
    REQUIRE(written);
    CHECK(written->written_unix > 0);
    CHECK(r.free_spares() == std::vector<std::string>{"n5.0"});
    CHECK(r.read_claim("n4.0")->rank == 2);
    CHECK(r.has_plan(1));
    CHECK(r.read_plan(1)->takeover.at(2) == "n4.0");
    CHECK_FALSE(r.read_plan(2));
  }
  SECTION("a torn or foreign record reads as absent") {
    write_file(dir + "/gen-3.plan", R"({"generation":3,"world":)");
    CHECK_FALSE(r.read_plan(3));
    write_file(dir + "/gen-4.plan", R"({"generation":5,"abandon":"x","written_unix":1})");
    CHECK_FALSE(r.read_plan(4));  // a plan of another generation under this name
    write_file(dir + "/mailbox-2", R"({"rank":3,"generation":0,"addr":"a","port":5,"pid":1})");
    CHECK_FALSE(r.read_mailbox(2));
    REQUIRE(::symlink("/etc/passwd", (dir + "/gen-6.plan").c_str()) == 0);
    CHECK_FALSE(r.read_plan(6));
    CHECK_FALSE(r.read_spare("../../x.0"));
  }
  SECTION("markers") {
    CHECK_FALSE(r.marked("finished"));
    REQUIRE(r.mark("abandoned", "no spare"));
    CHECK(r.marked("abandoned"));
    CHECK_THAT(read_file(dir + "/abandoned"), Catch::Contains("no spare"));
    CHECK_FALSE(r.mark("../evil", "x"));
    CHECK(r.read_abandoned(4)->lost.empty());
  }
  SECTION("the abandoned marker names the ranks lost, for ckpt-run's relaunch; a bad one reads as absent") {
    CHECK_FALSE(r.read_abandoned(4));
    REQUIRE(r.mark("abandoned", "training is stuck", {1, 3}));
    auto a = r.read_abandoned(4);
    REQUIRE(a);
    CHECK(a->why == "training is stuck");
    CHECK(a->lost == std::vector<int>{1, 3});
    CHECK_FALSE(r.read_abandoned(3));  // rank 3 is no rank of a world of 3
    write_file(dir + "/abandoned", R"({"why":"x","unix":1,"lost":"1"})");
    CHECK_FALSE(r.read_abandoned(4));
    write_file(dir + "/abandoned", R"({"why":"x","unix":1})");  // written before markers named the lost
    CHECK(r.read_abandoned(4)->lost.empty());
  }
  SECTION("one private secret for every process; a readable one is refused") {
    auto a = r.secret();
    auto b = Records::open(dir)->secret();
    REQUIRE(a);
    REQUIRE(b);
    CHECK(*a == *b);
    REQUIRE(::chmod((dir + "/secret").c_str(), 0644) == 0);
    CHECK_THAT(r.secret().error(), Catch::Contains("private 32-byte"));
  }
  SECTION("a dir another user could enter is refused") {
    REQUIRE(::chmod(dir.c_str(), 0755) == 0);
    CHECK_THAT(Records::open(dir).error(), Catch::Contains("mode 0755"));
  }
}

TEST_CASE("plan_generation: a lost rank's partner copy is named where a survivor holds it; the plan keeps it",
          "[inplace][memtier]") {
  Failure f = failure_of({1, 3}, 0, 20);
  f.stand_ins = {{1, 2}, {3, 1}, {0, 3}};  // 3 held rank 1's copy... and died; 0 was not lost
  Plan p = plan_generation(1, 4, 0, f, {"n5.0", "n5.1"});
  CHECK(p.copies == std::map<int, int>{{1, 2}});
  p.addr = "10.0.0.1";
  p.port = 4000;
  auto back = parse_plan(to_json(p));
  REQUIRE(back);
  CHECK(back->copies == p.copies);
  f.step.reset();  // no terminal checkpoint: the copies are of no agreed step
  CHECK(plan_generation(1, 4, 0, f, {"n5.0", "n5.1"}).copies.empty());
  const std::string base = R"({"generation":1,"addr":"a","port":5,"root":0,"step":7,"detect_unix":1,)"
                           R"("written_unix":1,"world":4,"lost":[1],"takeover":{"1":"n5.0"},"copies":)";
  CHECK(parse_plan(base + R"({"1":2}})"));
  for (const char* bad : {R"({"2":1}})", R"({"1":1}})", R"({"1":4}})", R"({"1":-1}})", R"([1]})", R"({"1":"2"}})"}) {
    CAPTURE(bad);
    CHECK_THAT(parse_plan(base + bad).error(), Catch::Contains("copies"));
  }
}

TEST_CASE("plan_generation: the survivors behind the terminal checkpoint's step travel in the plan", "[inplace]") {
  Failure f = failure_of({1}, 0, 20);
  f.behind = {3, 2, 3, 1, 7};  // unsorted, repeated, a lost rank, one outside the world
  Plan p = plan_generation(1, 4, 0, f, {"n5.0"});
  CHECK(p.behind == std::vector<int>{2, 3});
  p.addr = "10.0.0.1";
  p.port = 4000;
  auto back = parse_plan(to_json(p));
  REQUIRE(back);
  CHECK(back->behind == p.behind);
  f.step.reset();  // no terminal checkpoint: the survivors resume from the newest complete one, from the dir
  CHECK(plan_generation(1, 4, 0, f, {"n5.0"}).behind.empty());
  CHECK(plan_generation(1, 4, 0, failure_of({1}, 0, 20), {"n5.0"}).behind.empty());
  const std::string base = R"({"generation":1,"addr":"a","port":5,"root":0,"step":7,"detect_unix":1,)"
                           R"("written_unix":1,"world":4,"lost":[1],"takeover":{"1":"n5.0"},"behind":)";
  CHECK(parse_plan(base + "[2,3]}"));
  for (const char* bad : {"[1]}", "[4]}", "[-1]}", R"({"2":1}})", R"(["2"]})"}) {
    CAPTURE(bad);
    CHECK_THAT(parse_plan(base + bad).error(), Catch::Contains("behind"));
  }
}

TEST_CASE("state_donors: a survivor holding the same replica hands its state to each replacement, in turn",
          "[inplace]") {
  Plan p;
  p.world = 8;
  p.step = 40;
  p.lost = {5, 1};
  ckpt::store::Layout dp{8, 1, 1, false};
  auto donors = state_donors(p, dp);
  REQUIRE(donors.size() == 2);
  CHECK(donors.at(1) == Donor{0, false});  // the survivors in rank order, one replacement each
  CHECK(donors.at(5) == Donor{2, false});
  for (auto [to, from] : donors) CHECK(std::find(p.lost.begin(), p.lost.end(), from.rank) == p.lost.end());

  SECTION("more replacements than replicas: none serves more than its share") {
    p.world = 4;
    p.lost = {0, 1, 2};
    auto d = state_donors(p, {4, 1, 1, false});
    REQUIRE(d.size() == 3);
    for (auto [to, from] : d) CHECK(from.rank == 3);  // the only survivor: ceil(3 / 1)
    p.lost = {0, 2};
    d = state_donors(p, {4, 1, 1, false});
    CHECK(d.at(0).rank == 1);
    CHECK(d.at(2).rank == 3);
  }
  SECTION("tensor parallelism: a donor of the same tensor-parallel rank") {
    p.world = 4;
    p.lost = {0};
    ckpt::store::Layout dp2tp2{2, 2, 1, false};  // ranks 0, 1 replica dp0 (tp0, tp1); 2, 3 replica dp1
    auto d = state_donors(p, dp2tp2);
    REQUIRE(d.size() == 1);
    CHECK(d.at(0) == Donor{2, false});
    p.lost = {0, 2};  // tp0 lost in both replicas: nobody holds it
    CHECK(state_donors(p, dp2tp2).empty());
    p.copies = {{2, 1}};  // ... but rank 1 holds rank 2's partner copy
    CHECK(state_donors(p, dp2tp2) == std::map<int, Donor>{{2, Donor{1, true}}});
  }
  SECTION("ZeRO-1: each partition is its own; the partner copy is the only donor") {
    ckpt::store::Layout zero{8, 1, 1, true};
    CHECK(state_donors(p, zero).empty());
    p.copies = {{1, 2}, {5, 6}};
    CHECK(state_donors(p, zero) == std::map<int, Donor>{{1, Donor{2, true}}, {5, Donor{6, true}}});
    p.copies = {{1, 5}};  // a holder that is lost itself holds nothing
    CHECK(state_donors(p, zero).empty());
  }
  SECTION("a live replica comes before a partner copy") {
    p.copies = {{1, 3}};
    CHECK(state_donors(p, dp).at(1) == Donor{0, false});
  }
  SECTION("a survivor behind the agreed step gets a live replica's state, after the replacements") {
    p.behind = {0, 3};  // 0 and 3 hold step 39: they neither send nor are sent to by each other
    auto d = state_donors(p, dp);
    REQUIRE(d.size() == 4);
    CHECK(d.at(1) == Donor{2, false});
    CHECK(d.at(5) == Donor{4, false});
    CHECK(d.at(0) == Donor{6, false});
    CHECK(d.at(3) == Donor{7, false});
    for (auto [to, from] : d) {
      CHECK(std::find(p.lost.begin(), p.lost.end(), from.rank) == p.lost.end());
      CHECK(std::find(p.behind.begin(), p.behind.end(), from.rank) == p.behind.end());
    }
    p.world = 4;
    p.lost = {3};
    p.behind = {1, 2};  // one replica left at the step: it serves all three
    d = state_donors(p, {4, 1, 1, false});
    CHECK(d == std::map<int, Donor>{{1, Donor{0, false}}, {2, Donor{0, false}}, {3, Donor{0, false}}});
    p.behind = {0, 1, 2};  // nobody holds the step live: the replacement and the survivors read their shards
    CHECK(state_donors(p, {4, 1, 1, false}).empty());
  }
  SECTION("ZeRO-1: a survivor behind has no live donor; one that holds a partner copy still sends it") {
    ckpt::store::Layout zero{8, 1, 1, true};
    p.copies = {{1, 2}, {5, 6}};
    p.behind = {2, 3};
    CHECK(state_donors(p, zero) == std::map<int, Donor>{{1, Donor{2, true}}, {5, Donor{6, true}}});
  }
  SECTION("nothing to hand over") {
    Plan newest = p;
    newest.step.reset();  // the newest complete checkpoint: the survivors hold a later step
    CHECK(state_donors(newest, dp).empty());
    CHECK(state_donors(p, {4, 1, 1, false}).empty());  // a layout of another world
    Plan abandoned = p;
    abandoned.abandon = "too few spares";
    CHECK(state_donors(abandoned, dp).empty());
  }
}
