// Straggler detection at run time: 20 ranks in three groups on a real heartbeat mesh, each timing its steps; their
// paces go up the tree one frame per rank per window, and the root flags the one slow rank, once, after three
// windows; with every rank even (and noisy), nothing is flagged.
#include <catch2/catch.hpp>

#include <atomic>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "heartbeat.hpp"
#include "hooks_test_util.hpp"
#include "ckpt/inplace.hpp"
#include "pace.hpp"

using namespace ckpt;
using namespace ckpt::hooks;
using namespace ckpt::hooks::test;
using namespace std::chrono_literals;

namespace {

constexpr int kWorld = 20;

struct Job {
  TempDir dir;
  std::vector<std::unique_ptr<heartbeat::Mesh>> meshes = std::vector<std::unique_ptr<heartbeat::Mesh>>(kWorld);
  std::vector<std::shared_ptr<PaceTree>> trees = std::vector<std::shared_ptr<PaceTree>>(kWorld);
  std::mutex mu;
  std::vector<std::shared_ptr<PaceTree>> routes = std::vector<std::shared_ptr<PaceTree>>(kWorld);  // guarded by mu
  std::atomic<int> frames{0};
  std::vector<std::pair<straggler::Flag, std::string>> flags;  // guarded by mu

  explicit Job(straggler::Action action = straggler::Action::Report, const std::string& inplace_dir = "") {
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([this, r] {
        heartbeat::Settings s;
        s.rank = r;
        s.world_size = kWorld;
        s.rendezvous_dir = dir.sub("mesh");
        s.connect_timeout = 20s;
        auto m = heartbeat::Mesh::start(s, [this, r](const heartbeat::Event& e) {
          if (e.kind != heartbeat::Event::Kind::Frame) return;
          if (e.frame.type != heartbeat::kPace && e.frame.type != heartbeat::kSwap) return;
          if (e.frame.type == heartbeat::kPace) ++frames;
          std::shared_ptr<PaceTree> to;
          {
            std::lock_guard<std::mutex> lock(mu);
            to = routes[static_cast<std::size_t>(r)];
          }
          if (to) to->on_frame(e.frame, e.peer);
        });
        if (m) meshes[static_cast<std::size_t>(r)] = std::move(m).value();
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) {
      REQUIRE(meshes[static_cast<std::size_t>(r)]);
      Config c;
      c.rank = r;
      c.world_size = kWorld;
      c.straggler.window_steps = 5;
      c.straggler.action = action;
      if (!inplace_dir.empty()) {
        c.dir = inplace_dir;
        c.inplace_id = "run1";
      }
      trees[static_cast<std::size_t>(r)] = std::make_shared<PaceTree>(
          c, *meshes[static_cast<std::size_t>(r)],
          action == straggler::Action::Swap ? PaceTree::OnFlag()
                                            : [this](const straggler::Flag& f, const std::string& node) {
                                                std::lock_guard<std::mutex> lock(mu);  // the tree's lock is held
                                                flags.emplace_back(f, node);
                                              });
    }
    std::lock_guard<std::mutex> lock(mu);
    routes = trees;
  }
  ~Job() {
    {
      std::lock_guard<std::mutex> lock(mu);
      routes.assign(kWorld, nullptr);
    }
    for (auto& m : meshes) {
      if (m) m->say_bye();
    }
    meshes.clear();  // joins the mesh threads before the trees go
    trees.clear();
  }

  // Every rank runs `steps` steps from `first`; rank r's own work per step is `work(r)` seconds.
  template <class Work>
  void run(std::uint64_t first, std::uint64_t steps, Work work) {
    for (std::uint64_t s = first; s < first + steps; ++s) {
      for (int r = 0; r < kWorld; ++r) {
        auto& t = *trees[static_cast<std::size_t>(r)];
        t.on_work(work(r));
        t.on_step(s);
      }
      std::this_thread::sleep_for(2ms);  // frames travel while the next step runs
    }
  }
  std::size_t flag_count() {
    std::lock_guard<std::mutex> lock(mu);
    return flags.size();
  }
};

}  // namespace

TEST_CASE("pace over the mesh: the slow rank is flagged by the root alone, after three windows", "[straggler]") {
  Job job;
  std::mt19937 rng(7);
  std::lognormal_distribution<double> noise(0, 0.1);
  // Three even windows: nothing.
  job.run(0, 15, [&](int) { return 0.01 * noise(rng); });
  std::this_thread::sleep_for(200ms);
  CHECK(job.flag_count() == 0);
  // Every rank sends one frame per window whatever the world: 19 non-root ranks x 3 windows, give or take the
  // last window's frames still in flight.
  CHECK(job.frames.load() <= 19 * 3);
  CHECK(job.frames.load() >= 19 * 2);

  // Rank 13 (group 1, not a leader) runs at half speed from step 15 on.
  job.run(15, 15, [&](int r) { return (r == 13 ? 0.02 : 0.01) * noise(rng); });
  REQUIRE(wait_for([&] { return job.flag_count() >= 1; }, 3s));
  std::this_thread::sleep_for(100ms);
  {
    std::lock_guard<std::mutex> lock(job.mu);
    REQUIRE(job.flags.size() == 1);
    const auto& [flag, node] = job.flags.front();
    CHECK(flag.rank == 13);
    CHECK(flag.windows == 3);
    CHECK(flag.first_window == 3);
    CHECK(flag.last_window == 5);
    CHECK(flag.score < 0.7);
    CHECK(flag.score > 0.3);
  }
  CHECK(job.trees[0]->flags() == 1);
  for (int r = 1; r < kWorld; ++r) CHECK(job.trees[static_cast<std::size_t>(r)]->flags() == 0);

  // Still slow: flagged once per spell.
  job.run(30, 10, [&](int r) { return (r == 13 ? 0.02 : 0.01) * noise(rng); });
  std::this_thread::sleep_for(200ms);
  CHECK(job.flag_count() == 1);
}

TEST_CASE("pace frames: a subtree's pace survives the wire; frames naming ranks outside the world are dropped",
          "[straggler]") {
  straggler::Pace p{41, 0.012345, 3, 0.5, 17, 12};
  auto back = heartbeat::PaceFrame::from_frame(heartbeat::PaceFrame{p}.to_frame()).pace;
  CHECK(back.window == 41);
  CHECK(back.best_s == Approx(0.012345).margin(1e-6));
  CHECK(back.worst_s == Approx(0.5).margin(1e-6));
  CHECK(back.best_rank == 3);
  CHECK(back.worst_rank == 17);
  CHECK(back.ranks == 12);

  Job job;
  heartbeat::Frame f = heartbeat::PaceFrame{straggler::Pace{0, 0.01, 1, 9.0, 999, 1}}.to_frame();
  for (int i = 0; i < 3; ++i) {
    f.a = static_cast<std::uint64_t>(i);
    job.trees[0]->on_frame(f, 1);  // a rank of the world would never name rank 999
  }
  job.run(0, 20, [&](int) { return 0.01; });
  std::this_thread::sleep_for(200ms);
  CHECK(job.flag_count() == 0);
}

TEST_CASE("pace swap: with a free spare, the root names the slow node and its ranks leave; without, none does",
          "[straggler]") {
  // Every in-process rank publishes this host as its node: all of them are "on the slow node".
  for (bool spare : {true, false}) {
    CAPTURE(spare);
    TempDir ckpt;
    auto records = inplace::Records::open(inplace::records_dir(ckpt.path(), "run1"));
    REQUIRE(records);
    if (spare) {
      inplace::Spare s;
      s.node = "n9";
      s.pid = 4242;
      s.ready_unix = 1;
      REQUIRE(records->write_spare(s));
    }
    REQUIRE(records->free_spares().size() == (spare ? 1u : 0u));
    LogCapture log;
    Job job(straggler::Action::Swap, ckpt.path());
    std::mt19937 rng(11);
    std::lognormal_distribution<double> noise(0, 0.05);
    job.run(0, 30, [&](int r) { return (r == 13 ? 0.03 : 0.01) * noise(rng); });
    const bool all_leave = wait_for([&] {
      for (const auto& t : job.trees) {
        if (!t->leaving()) return false;
      }
      return true;
    }, 3s);
    CHECK(job.trees[0]->flags() == 1);
    if (spare) {
      CHECK(all_leave);
      CHECK(job.trees[13]->leaving_why().find("is slow") != std::string::npos);
      CHECK(log.has("its ranks hand over to a warm spare in place"));
    } else {
      CHECK_FALSE(all_leave);
      for (const auto& t : job.trees) CHECK_FALSE(t->leaving());
      CHECK(log.has("no warm spare is free"));
    }
  }
}
