// Last words at run time: the layout settings, the update tracker, the heartbeat mesh (reset and silence), and
// whole checkpointers as rank threads where one rank goes away and the survivors write a terminal checkpoint (or,
// when a stage is lost, nothing), then a new run restores from it.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "device.hpp"
#include "heartbeat.hpp"
#include "hooks_test_util.hpp"
#include "last_words_frames.hpp"
#include "last_words_runtime.hpp"

using namespace ckpt;
using namespace ckpt::hooks;
using namespace ckpt::hooks::test;
using namespace std::chrono_literals;

namespace {

// One rank's state: 64 doubles, every one equal to 1000 * (tp + 1) + 100 * pp + step (the same on every replica).
double value_of(const store::RankCoord& c, std::uint64_t step) {
  return 1000.0 * (c.tp + 1) + 100.0 * c.pp + static_cast<double>(step);
}

// The doubles of each rank's state; a test may give the ranks of its child process more.
std::size_t state_doubles = 64;
// Whether make_ranks' checkpointers start their last words at SIGTERM (a child process's, set in the child).
bool ranks_take_signals = false;

struct Rank {
  std::unique_ptr<Checkpointer> cp;
  std::vector<double> state = std::vector<double>(state_doubles, 0.0);
};

// Restores every rank of `ranks` at once: ranks agree on the checkpoint they restore, so none returns alone.
std::vector<Result<std::uint64_t>> restore_all(std::vector<Rank>& ranks) {
  std::vector<Result<std::uint64_t>> steps(ranks.size(), Error{"not run"});
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] { steps[r] = ranks[r].cp->restore(); });
  }
  for (auto& t : threads) t.join();
  return steps;
}

// Creates the checkpointers of `mine` (all ranks when empty) at once, with the given layout; the mesh needs every
// rank of the world, so the others must be created at the same time (in a child process).
std::vector<Rank> make_ranks(const std::string& dir, int world, const std::string& layout, const std::string& run_id,
                             std::vector<int> mine = {}, const std::string& interval = "1000steps") {
  if (mine.empty()) {
    for (int r = 0; r < world; ++r) mine.push_back(r);
  }
  std::vector<Rank> ranks(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  for (int r : mine) {
    threads.emplace_back([&, r] {
      try {
        // exit_grace 0s: these ranks are threads of the test process, which the library must not end.
        Options o = options({{"dir", dir}, {"rank", std::to_string(r)}, {"world_size", std::to_string(world)},
                             {"layout", layout}, {"last_words", "on"}, {"exit_grace", "0s"}, {"interval", interval},
                             {"run_id", run_id}, {"copy_threads", "0"}});
        if (ranks_take_signals) (void)o.set("signals", "on");
        Rank& me = ranks[static_cast<std::size_t>(r)];
        me.cp = make(o);
        if (Status s = me.cp->register_region({"model", me.state.data(), me.state.size() * sizeof(double)}); !s) {
          errors[static_cast<std::size_t>(r)] = s.error();
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) {
    if (!e.empty()) throw std::runtime_error(e);
  }
  return ranks;
}

// Runs every rank through steps [from + 1, to] (the state follows value_of); false on an error. `pause` after each
// step gives the background work of a step time to end (a memory checkpoint is skipped while the last one's copy
// is still under way).
bool train(std::vector<Rank>& ranks, std::uint64_t from, std::uint64_t to,
           std::chrono::milliseconds pause = std::chrono::milliseconds(0)) {
  for (std::uint64_t step = from + 1; step <= to; ++step) {
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    for (Rank& r : ranks) {
      if (!r.cp) continue;
      if (!r.cp->before_update()) return false;
      std::fill(r.state.begin(), r.state.end(), value_of(r.cp->config().coord, step));
      auto stop = r.cp->after_step(step);
      if (!stop || *stop) return false;
    }
  }
  return true;
}

// Ranks `theirs` live in a child process that trains them to `steps`, then waits to be SIGKILLed: its sockets
// close the way a killed rank's do. Returns the child's pid once it reached `steps`.
struct Child {
  pid_t pid = -1;
  int ready_fd = -1;
};

// `in_child` runs first in the child (its environment is its own); `settled` is waited for (10 s at most) after
// the training, before the child says it is ready.
Child spawn(const std::string& dir, int world, const std::string& layout, const std::string& run_id,
            const std::vector<int>& theirs, std::uint64_t steps, const std::string& interval = "1000steps",
            const std::function<void()>& in_child = nullptr,
            const std::function<bool(std::vector<Rank>&)>& settled = nullptr,
            std::chrono::milliseconds pause = std::chrono::milliseconds(0)) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    char ok = 0;
    try {
      if (in_child) in_child();
      std::vector<Rank> ranks = make_ranks(dir, world, layout, run_id, theirs, interval);
      for (Rank& r : ranks) {
        if (r.cp && !r.cp->restore()) ::_exit(3);
      }
      ok = train(ranks, 0, steps, pause) ? 1 : 2;
      if (ok == 1 && settled && !wait_for([&] { return settled(ranks); }, 10s)) ok = 5;
      (void)::write(fds[1], &ok, 1);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(4);
    }
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

// Waits until the child trained its ranks (and they settled).
void wait_ready(Child& c) {
  char ok = 0;
  REQUIRE(::read(c.ready_fd, &ok, 1) == 1);
  REQUIRE(ok == 1);
  ::close(c.ready_fd);
}

// SIGKILLs a child (frozen or not) and reaps it.
void end_child(const Child& c) {
  ::kill(c.pid, SIGKILL);
  int status = 0;
  ::waitpid(c.pid, &status, 0);
}

void kill_child(Child& c) {
  wait_ready(c);
  end_child(c);
}

// Whether every rank of `who` ended its last words within `limit`.
bool last_words_done(std::vector<Rank>& ranks, const std::vector<int>& who, std::chrono::seconds limit) {
  return wait_for([&] {
    for (int r : who) {
      if (!ranks[static_cast<std::size_t>(r)].cp->last_words_report().done) return false;
    }
    return true;
  }, limit);
}

// Every rank of `who` committed the terminal checkpoint and counts exactly `lost` as lost.
void check_lost(std::vector<Rank>& ranks, const std::vector<int>& who, const std::vector<int>& lost) {
  for (int r : who) {
    CAPTURE(r);
    const auto report = ranks[static_cast<std::size_t>(r)].cp->last_words_report();
    CHECK(report.committed);
    CHECK(report.lost == lost);
  }
}

// A node of 8 ranks (heartbeat group 2: ranks 16 to 23) of a dp job of 24, as two children trained to step 5: its
// leader (rank 16) alone, and its members; beside it the 16 survivors (threads here), restored and trained alike.
struct NodeOfEight {
  std::vector<int> survivors;
  std::vector<int> members{17, 18, 19, 20, 21, 22, 23};
  Child leader, rest;
  std::vector<Rank> ranks;
};

NodeOfEight node_of_eight(const std::string& dir, const std::string& run_id) {
  NodeOfEight n;
  for (int r = 0; r < 16; ++r) n.survivors.push_back(r);
  n.leader = spawn(dir, 24, "dp=24", run_id, {16}, 5);
  n.rest = spawn(dir, 24, "dp=24", run_id, n.members, 5);
  n.ranks = make_ranks(dir, 24, "dp=24", run_id, n.survivors);
  for (int r : n.survivors) REQUIRE(n.ranks[static_cast<std::size_t>(r)].cp->restore().value() == 0);
  REQUIRE(train(n.ranks, 0, 5));
  wait_ready(n.rest);
  wait_ready(n.leader);
  return n;
}

// Ranks `frozen` (a child process) stop at once after step 5 of a dp job of `world`; every other rank (threads
// here) must end its last words with the terminal checkpoint committed and exactly `frozen` counted lost.
void check_frozen_counted_lost(const std::string& dir, int world, const std::string& run_id,
                               const std::vector<int>& frozen) {
  const std::string layout = "dp=" + std::to_string(world);
  std::vector<int> survivors;
  for (int r = 0; r < world; ++r) {
    if (std::find(frozen.begin(), frozen.end(), r) == frozen.end()) survivors.push_back(r);
  }
  Child child = spawn(dir, world, layout, run_id, frozen, 5);
  std::vector<Rank> ranks = make_ranks(dir, world, layout, run_id, survivors);
  for (int r : survivors) REQUIRE(ranks[static_cast<std::size_t>(r)].cp->restore().value() == 0);
  REQUIRE(train(ranks, 0, 5));
  wait_ready(child);
  ::kill(child.pid, SIGSTOP);
  const bool done = last_words_done(ranks, survivors, 15s);
  end_child(child);
  REQUIRE(done);
  check_lost(ranks, survivors, frozen);
  for (Rank& r : ranks) {
    if (r.cp) (void)r.cp->close();
  }
}

// Raises SIGTERM and returns the manifest of the terminal checkpoint the ranks commit at `step`.
store::Manifest terminal_after_sigterm(const std::string& dir, std::uint64_t step) {
  std::raise(SIGTERM);
  REQUIRE(wait_for([&] { return committed_steps(dir) == std::vector<std::uint64_t>{step}; }, 10s));
  auto m = store::read_manifest(dir, step);
  REQUIRE(m);
  CHECK(m->kind == store::Kind::Terminal);
  return *m;
}

}  // namespace

TEST_CASE("layout and coord settings", "[hooks][last_words]") {
  auto env = [](const char*) -> const char* { return nullptr; };
  SECTION("good inputs") {
    Options o = options({{"rank", "3"}, {"world_size", "8"}, {"layout", "dp=2,tp=2,pp=2,zero1=on"}});
    auto c = load_config(o, env);
    REQUIRE(c);
    CHECK(c->layout_declared);
    CHECK(c->layout.dp == 2);
    CHECK(c->layout.tp == 2);
    CHECK(c->layout.pp == 2);
    CHECK(c->layout.zero1);
    // Default order: tp fastest, then dp, then pp.
    CHECK(c->coord.tp == 1);
    CHECK(c->coord.dp == 1);
    CHECK(c->coord.pp == 0);
    REQUIRE(o.set("coord", "dp=0,tp=1,pp=1"));
    c = load_config(o, env);
    REQUIRE(c);
    CHECK(c->coord.rank == 3);
    CHECK(c->coord.dp == 0);
    CHECK(c->coord.pp == 1);
    auto none = load_config(options({{"rank", "1"}, {"world_size", "4"}}), env);
    REQUIRE(none);
    CHECK_FALSE(none->layout_declared);
    CHECK(none->layout.dp == 4);
    CHECK(none->coord.dp == 1);
    CHECK_FALSE(last_words_armed(*none));
  }
  SECTION("bad inputs") {
    for (const char* bad : {"", "dp=2,tp=3", "dp=2,tp=2,pp=1,pp=1", "dp=x,tp=4", "dp=0,tp=4", "dp=4,mp=1",
                            "dp=4,zero1=maybe", "dp=4,", "dp=-4", "dp=4x"}) {
      CAPTURE(bad);
      Options o = options({{"rank", "0"}, {"world_size", "4"}, {"layout", bad}});
      auto c = load_config(o, env);
      REQUIRE_FALSE(c);
      CHECK(c.error().find("layout='") != std::string::npos);
    }
    for (const char* bad : {"dp=2", "tp=2", "dp=0,tp=0,pp=1", "dp=1,xx=0", "dp=a"}) {
      CAPTURE(bad);
      Options o = options({{"rank", "0"}, {"world_size", "4"}, {"layout", "dp=2,tp=2"}, {"coord", bad}});
      CHECK_FALSE(load_config(o, env));
    }
    Options o = options({{"rank", "0"}, {"world_size", "4"}, {"coord", "dp=1"}});
    CHECK_FALSE(load_config(o, env));  // a coord needs a layout
  }
}

TEST_CASE("coordinates pack into a hello and back", "[hooks][last_words]") {
  store::RankCoord c{7, 3, 1, 2};
  store::RankCoord back = unpack_coord(7, pack_coord(c));
  CHECK(back.rank == 7);
  CHECK(back.dp == 3);
  CHECK(back.tp == 1);
  CHECK(back.pp == 2);
}

TEST_CASE("a last words report travels as a kReport frame and back", "[hooks][last_words]") {
  heartbeat::ReportFrame report;
  report.rank = 5;
  report.step = 300;
  report.coord = pack_coord(store::RankCoord{5, 1, 1, 0});
  report.mid_update = true;
  report.can_write = false;
  heartbeat::Frame f = report.to_frame();
  // The wire format the peers read: subject = rank, a = step, b = packed coordinate, flags 1 | 2.
  CHECK(f.type == heartbeat::kReport);
  CHECK(f.subject == 5);
  CHECK(f.a == 300);
  CHECK(f.b == report.coord);
  CHECK(f.flags == 3);
  heartbeat::ReportFrame back = heartbeat::ReportFrame::from_frame(f);
  CHECK(back.rank == 5);
  CHECK(back.step == 300);
  CHECK(back.coord == report.coord);
  CHECK(back.mid_update);
  CHECK_FALSE(back.can_write);
  CHECK(heartbeat::ReportFrame::from_frame(heartbeat::ReportFrame{}.to_frame()).can_write);
  CHECK(heartbeat::ReportFrame{}.to_frame().flags == 0);
}

TEST_CASE("the update tracker freezes training outside an update", "[hooks][last_words]") {
  UpdateTracker t;
  CHECK(t.progress().mid_update);  // before restore() or a step: the state is no step's, not writable
  t.finish_step(10);
  CHECK(t.enter_update());
  CHECK(t.progress().mid_update);
  t.finish_step(11);
  CHECK_FALSE(t.progress().mid_update);
  UpdateTracker::Progress p = t.freeze();
  CHECK(p.step == 11);
  CHECK_FALSE(p.mid_update);
  CHECK_FALSE(t.enter_update());
  UpdateTracker mid;
  mid.finish_step(0);  // restore() found nothing: the initial state is step 0's
  CHECK_FALSE(mid.progress().mid_update);
  CHECK(mid.enter_update());
  CHECK(mid.freeze().mid_update);
}

TEST_CASE("the update tracker lets an update in progress end when asked, until a deadline", "[hooks][last_words]") {
  UpdateTracker t;
  t.finish_step(7);
  REQUIRE(t.enter_update());
  std::thread trainer([&] {
    std::this_thread::sleep_for(100ms);
    t.finish_step(8);
  });
  UpdateTracker::Progress p = t.freeze(std::chrono::steady_clock::now() + 5s);
  trainer.join();
  CHECK(p.step == 8);
  CHECK_FALSE(p.mid_update);
  CHECK_FALSE(t.enter_update());  // the next update does not start
  UpdateTracker stuck;
  stuck.finish_step(3);
  REQUIRE(stuck.enter_update());
  const auto t0 = std::chrono::steady_clock::now();
  UpdateTracker::Progress q = stuck.freeze(t0 + 200ms);
  CHECK(q.mid_update);
  CHECK(std::chrono::steady_clock::now() - t0 >= 200ms);
}

TEST_CASE("the heartbeat mesh sees a closed peer at once and a silent one after the limit", "[hooks][last_words]") {
  TempDir dir;
  std::mutex mu;
  std::vector<heartbeat::Event> events;
  auto collect = [&](const heartbeat::Event& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  };
  auto dead = [&](int peer) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& e : events) {
      if (e.kind == heartbeat::Event::Kind::PeerDead && e.peer == peer) return e.why;
    }
    return std::string();
  };
  // Rank `rank` of `world` in this test's mesh dir.
  auto settings = [&](int rank, int world, std::chrono::milliseconds connect_timeout) {
    heartbeat::Settings s;
    s.rank = rank;
    s.world_size = world;
    s.rendezvous_dir = dir.sub("mesh");
    s.connect_timeout = connect_timeout;
    return s;
  };

  SECTION("a new rank that is gone before it joins: the join gives up at once where its mailbox refuses") {
    // A listener that stands for rank 1's mailbox: open (its process lives, maybe slowly), or closed (gone).
    const int box = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(box >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(box, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(box, 4) == 0);
    REQUIRE(::getsockname(box, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    heartbeat::Settings s = settings(0, 2, 2s);
    s.watched = {{"127.0.0.1", std::to_string(ntohs(a.sin_port))}};
    auto t0 = std::chrono::steady_clock::now();
    auto alive = heartbeat::Mesh::start(s, [](const heartbeat::Event&) {});
    REQUIRE_FALSE(alive);
    CHECK(std::chrono::steady_clock::now() - t0 >= 2s);  // a rank that may only be slow is waited for
    CHECK_THAT(alive.error(), Catch::Contains("not every rank joined the mesh within 2 s"));
    ::close(box);
    t0 = std::chrono::steady_clock::now();
    auto gone = heartbeat::Mesh::start(s, [](const heartbeat::Event&) {});
    REQUIRE_FALSE(gone);
    CHECK(std::chrono::steady_clock::now() - t0 < 1500ms);
    CHECK_THAT(gone.error(), Catch::Contains("not every rank joined the mesh: a new rank is gone (its mailbox at "
                                             "127.0.0.1:" + std::to_string(ntohs(a.sin_port)) +
                                             " refuses connections)"));
  }

  SECTION("a closed connection") {
    std::vector<std::unique_ptr<heartbeat::Mesh>> meshes(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        heartbeat::Settings s = settings(r, 3, 10s);
        s.hello = static_cast<std::uint64_t>(100 + r);
        auto m = heartbeat::Mesh::start(s, r == 0 ? heartbeat::Handler(collect) : [](const heartbeat::Event&) {});
        if (m) meshes[static_cast<std::size_t>(r)] = std::move(m).value();
      });
    }
    for (auto& t : threads) t.join();
    for (auto& m : meshes) REQUIRE(m);
    // One group: rank 0 leads it and is the root; the others link to it only.
    CHECK(meshes[0]->link_count() == 2);
    CHECK(meshes[1]->link_count() == 1);
    CHECK(meshes[0]->links().is_root);
    std::this_thread::sleep_for(300ms);  // heartbeats flow; nobody is dead
    CHECK(dead(1).empty());
    CHECK(dead(2).empty());
    meshes[2]->say_bye();  // an orderly leave is no failure
    meshes[2].reset();
    auto t0 = std::chrono::steady_clock::now();
    meshes[1].reset();  // closes its sockets without a word: what a killed process does
    REQUIRE(wait_for([&] { return !dead(1).empty(); }, 2s));
    CHECK(std::chrono::steady_clock::now() - t0 < 500ms);
    CHECK(dead(2).empty());
    CHECK(meshes[0]->died() == std::vector<int>{1});
    CHECK(meshes[0]->gone() == overlay::Gone{0, 1, 1});
  }

  SECTION("20 ranks in 3 groups: a killed leader is seen by every rank, and the group re-forms around the next") {
    constexpr int kWorld = 20;
    std::vector<std::unique_ptr<heartbeat::Mesh>> meshes(kWorld);
    std::vector<std::mutex> locks(kWorld);
    std::vector<std::vector<std::pair<int, std::string>>> deaths(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        heartbeat::Settings s = settings(r, kWorld, 20s);
        auto m = heartbeat::Mesh::start(s, [&, r](const heartbeat::Event& e) {
          if (e.kind != heartbeat::Event::Kind::PeerDead) return;
          std::lock_guard<std::mutex> lock(locks[static_cast<std::size_t>(r)]);
          deaths[static_cast<std::size_t>(r)].emplace_back(e.peer, e.why);
        });
        if (m) meshes[static_cast<std::size_t>(r)] = std::move(m).value();
      });
    }
    for (auto& t : threads) t.join();
    for (auto& m : meshes) REQUIRE(m);
    // Links per rank stay within a group's size plus the tree's three, whatever the world.
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      CHECK(meshes[static_cast<std::size_t>(r)]->link_count() <= static_cast<std::size_t>(overlay::kGroupSize + 2));
    }
    CHECK(meshes[8]->links().up == 0);   // group 1's leader hangs below group 0's
    CHECK(meshes[9]->links().up == 8);
    CHECK(meshes[16]->links().up == 0);  // group 2's too
    auto saw = [&](int r, int peer) {
      std::lock_guard<std::mutex> lock(locks[static_cast<std::size_t>(r)]);
      for (const auto& [p, why] : deaths[static_cast<std::size_t>(r)]) {
        if (p == peer) return true;
      }
      return false;
    };
    meshes[8].reset();  // group 1's leader dies without a word
    auto t0 = std::chrono::steady_clock::now();
    REQUIRE(wait_for([&] {
      for (int r = 0; r < kWorld; ++r) {
        if (r != 8 && !saw(r, 8)) return false;
      }
      return true;
    }, 3s));
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);
    // Rank 9 now leads group 1: its members and the root link to it.
    REQUIRE(wait_for([&] { return meshes[0]->links().down == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 9, 16}; }, 3s));
    REQUIRE(wait_for([&] { return meshes[10]->links().up == 9 && meshes[9]->links().up == 0; }, 3s));
    REQUIRE(wait_for([&] { return meshes[9]->link_count() == 7; }, 5s));  // 6 members and the root
    // The new leader is watched like the old one: its death too reaches every rank.
    meshes[9].reset();
    REQUIRE(wait_for([&] {
      for (int r = 0; r < kWorld; ++r) {
        if (r != 8 && r != 9 && !saw(r, 9)) return false;
      }
      return true;
    }, 5s));
    for (int r = 0; r < kWorld; ++r) {
      if (r == 8 || r == 9) continue;
      CAPTURE(r);
      CHECK(meshes[static_cast<std::size_t>(r)]->died() == std::vector<int>{8, 9});
    }
    // Nobody else was taken for dead.
    std::this_thread::sleep_for(300ms);
    for (int r = 0; r < kWorld; ++r) {
      std::lock_guard<std::mutex> lock(locks[static_cast<std::size_t>(r)]);
      for (const auto& [p, why] : deaths[static_cast<std::size_t>(r)]) {
        CAPTURE(r, p, why);
        CHECK((p == 8 || p == 9));
      }
    }
    for (auto& m : meshes) {
      if (m) m->say_bye();
    }
  }

  SECTION("20 ranks leave in order at about the same time: nobody is taken for dead") {
    // The end of training: each rank says goodbye, then closes. Every leave changes its neighbours' views, and they
    // link to new up neighbours while the others leave: a link that completes around a rank's goodbye must get the
    // goodbye too, or its close reads as a death.
    constexpr int kWorld = 20;
    for (int round = 0; round < 12; ++round) {
      CAPTURE(round);
      std::vector<std::unique_ptr<heartbeat::Mesh>> meshes(kWorld);
      std::mutex deaths_mu;
      std::vector<std::string> deaths;
      std::vector<std::thread> threads;
      for (int r = 0; r < kWorld; ++r) {
        threads.emplace_back([&, r] {
          heartbeat::Settings s = settings(r, kWorld, 20s);
          s.rendezvous_dir = dir.sub("mesh-leave-" + std::to_string(round));
          auto m = heartbeat::Mesh::start(s, [&, r](const heartbeat::Event& e) {
            if (e.kind != heartbeat::Event::Kind::PeerDead) return;
            std::lock_guard<std::mutex> lock(deaths_mu);
            deaths.push_back("rank " + std::to_string(r) + " took rank " + std::to_string(e.peer) +
                             " for dead: " + e.why);
          });
          if (m) meshes[static_cast<std::size_t>(r)] = std::move(m).value();
        });
      }
      for (auto& t : threads) t.join();
      threads.clear();
      for (auto& m : meshes) REQUIRE(m);
      std::this_thread::sleep_for(100ms);
      for (int r = 0; r < kWorld; ++r) {
        threads.emplace_back([&, r] {
          // Spread over a few milliseconds, as ranks end their last step; the close follows the goodbye closely.
          std::this_thread::sleep_for(std::chrono::microseconds((r * 7919 + round * 104729) % 20000));
          meshes[static_cast<std::size_t>(r)]->say_bye();
          std::this_thread::sleep_for(std::chrono::microseconds((r * 6151 + round * 3571) % 1000));
          meshes[static_cast<std::size_t>(r)].reset();
        });
      }
      for (auto& t : threads) t.join();
      std::lock_guard<std::mutex> lock(deaths_mu);
      CHECK(deaths == std::vector<std::string>{});
    }
  }

  SECTION("a rank's forked children do not keep its connections open") {
    // Rank 1 lives in a child process that forks a long-lived worker (as a data loader does), then dies.
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    pid_t rank1 = ::fork();
    if (rank1 == 0) {
      ::close(ready[0]);
      auto m = heartbeat::Mesh::start(settings(1, 2, 10s), [](const heartbeat::Event&) {});
      if (!m) ::_exit(3);
      pid_t worker = ::fork();
      if (worker == 0) {
        ::sleep(5);
        ::_exit(0);
      }
      char ok = 1;
      (void)::write(ready[1], &ok, 1);
      ::_exit(0);  // no goodbye: a crash, with the worker still running
    }
    ::close(ready[1]);
    heartbeat::Settings s = settings(0, 2, 10s);
    s.dead_after = 3000ms;  // silence would take this long; the closed connection is seen well before
    auto mesh = heartbeat::Mesh::start(s, collect);
    REQUIRE(mesh);
    char ok = 0;
    REQUIRE(::read(ready[0], &ok, 1) == 1);
    auto t0 = std::chrono::steady_clock::now();
    ::close(ready[0]);
    int status = 0;
    ::waitpid(rank1, &status, 0);
    REQUIRE(wait_for([&] { return !dead(1).empty(); }, 5s));
    CHECK(std::chrono::steady_clock::now() - t0 < 2500ms);
    CHECK(dead(1).find("no heartbeat") == std::string::npos);  // EOF or a reset, not 3 s of silence
  }

  SECTION("silence") {
    // Rank 1 joins the mesh in a child process, which is then stopped: a frozen node, its connection open.
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    pid_t rank1 = ::fork();
    if (rank1 == 0) {
      ::close(ready[0]);
      auto m = heartbeat::Mesh::start(settings(1, 2, 5s), [](const heartbeat::Event&) {});
      if (!m) ::_exit(3);
      char ok = 1;
      (void)::write(ready[1], &ok, 1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    std::thread frozen([&] {
      char ok = 0;
      if (::read(ready[0], &ok, 1) == 1) ::kill(rank1, SIGSTOP);  // silent from its first heartbeat at most
      ::close(ready[0]);
    });
    heartbeat::Settings s = settings(0, 2, 5s);
    s.dead_after = 400ms;
    auto t0 = std::chrono::steady_clock::now();
    auto mesh = heartbeat::Mesh::start(s, collect);
    REQUIRE(mesh);
    REQUIRE(wait_for([&] { return !dead(1).empty(); }, 1200ms));
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(took >= 0.4);
    CHECK(dead(1).find("no heartbeat") != std::string::npos);
    frozen.join();
    ::kill(rank1, SIGKILL);
    ::waitpid(rank1, nullptr, 0);
  }
}

TEST_CASE("last words armed: periodic checkpoints and restores are counted over the heartbeat network",
          "[hooks][last_words]") {
  TempDir dir;
  // 12 ranks: two groups, so the counts of group 1 reach the root through its leader.
  constexpr int kWorld = 12;
  {
    std::vector<Rank> ranks = make_ranks(dir.path(), kWorld, "dp=12", "tree1", {}, "2steps");
    for (const auto& got : restore_all(ranks)) REQUIRE(got.value() == 0);
    REQUIRE(train(ranks, 0, 8));
    // The commit of step 8 retires step 2 (keep 3): the writer renames it away and every rank removes its own
    // two files, so it stands empty until the next commit removes it.
    const std::string retired = dir.path() + "/.gc-" + ckpt::store::step_dir_name(2);
    CHECK(wait_for([&] { return std::filesystem::exists(retired) && std::filesystem::is_empty(retired); }, 10s));
    REQUIRE(train(ranks, 8, 10));
    for (Rank& r : ranks) CHECK(r.cp->close());
    CHECK(ranks[0].cp->stats().committed == 5);
  }
  CHECK(committed_steps(dir.path()).back() == 10);
  // The records came up the tree: the leader of group 1 (rank 8) gathered its group's for the last checkpoint.
  auto gathered = ckpt::store::read_gathered(dir.path(), 10, 8);
  REQUIRE(gathered.ok());
  CHECK(gathered->size() == 4);
  // Only the newest `keep` remain.
  CHECK(committed_steps(dir.path()) == std::vector<std::uint64_t>{6, 8, 10});
  // Every rank's shard was counted, none through a file of its own in the control dir.
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path() + "/.control")) {
    CAPTURE(e.path().string());
    CHECK(e.path().filename().string().rfind("done-", 0) != 0);
  }
  // A new run restores every rank from step 10, its rounds counted the same way.
  std::vector<Rank> again = make_ranks(dir.path(), kWorld, "dp=12", "tree2", {}, "2steps");
  for (const auto& got : restore_all(again)) CHECK(got.value() == 10);
  for (Rank& r : again) {
    CHECK(r.state.front() == value_of(r.cp->config().coord, 10));
    CHECK(r.cp->close());
  }
}

TEST_CASE("last words: survivors of a DP2xTP2 job commit a terminal checkpoint that restores",
          "[hooks][last_words]") {
  TempDir dir;
  LogCapture logs;
  {
    Child child = spawn(dir.path(), 4, "dp=2,tp=2,pp=1", "lw1", {3}, 7);
    std::vector<Rank> ranks = make_ranks(dir.path(), 4, "dp=2,tp=2,pp=1", "lw1", {0, 1, 2});
    for (int r : {0, 1, 2}) REQUIRE(ranks[static_cast<std::size_t>(r)].cp->restore().value() == 0);
    REQUIRE(train(ranks, 0, 7));
    // Rank 2 (dp1/tp0) is caught mid-update: replica dp0 must write.
    REQUIRE(ranks[2].cp->before_update());
    kill_child(child);  // rank 3 (dp1/tp1) is SIGKILLed
    REQUIRE(wait_for([&] { return committed_steps(dir.path()) == std::vector<std::uint64_t>{7}; }, 10s));
    auto m = store::read_manifest(dir.path(), 7);
    REQUIRE(m);
    CHECK(m->kind == store::Kind::Terminal);
    REQUIRE(m->shards.size() == 2);
    CHECK(m->shards[0].rank == 0);
    CHECK(m->shards[1].rank == 1);
    CHECK(logs.has("last words: writing a terminal checkpoint at step 7"));
    CHECK(wait_for([&] { return logs.has("committed the terminal checkpoint of step 7"); }, 5s));
    // Training is stopped: the next update is refused.
    CHECK_FALSE(ranks[0].cp->before_update());
    for (Rank& r : ranks) {
      if (r.cp) (void)r.cp->close();
    }
  }
  // A new run restores every rank from the survivors' shards, rank 3 from rank 1's (both tp1).
  std::vector<Rank> again = make_ranks(dir.path(), 4, "dp=2,tp=2,pp=1", "lw2");
  std::vector<std::uint64_t> steps;
  for (const auto& got : restore_all(again)) {
    REQUIRE(got);
    steps.push_back(*got);
  }
  CHECK(steps == std::vector<std::uint64_t>{7, 7, 7, 7});
  for (Rank& r : again) {
    CAPTURE(r.cp->config().rank);
    CHECK(r.state.front() == value_of(r.cp->config().coord, 7));
    CHECK(r.state.back() == value_of(r.cp->config().coord, 7));
  }
  CHECK(logs.has("loading the shard of rank 1"));
  for (Rank& r : again) CHECK(r.cp->close());
}

TEST_CASE("last words: pure DP survivors caught mid-update end the update and write that step",
          "[hooks][last_words]") {
  TempDir dir;
  LogCapture logs;
  {
    Child child = spawn(dir.path(), 3, "dp=3", "lwmid", {2}, 7);
    std::vector<Rank> ranks = make_ranks(dir.path(), 3, "dp=3", "lwmid", {0, 1});
    for (int r : {0, 1}) REQUIRE(ranks[static_cast<std::size_t>(r)].cp->restore().value() == 0);
    REQUIRE(train(ranks, 0, 7));
    // Both survivors are inside the update of step 8 when their peer dies: neither holds a step whole yet.
    for (int r : {0, 1}) REQUIRE(ranks[static_cast<std::size_t>(r)].cp->before_update());
    kill_child(child);
    std::this_thread::sleep_for(300ms);
    for (int r : {0, 1}) {
      Rank& me = ranks[static_cast<std::size_t>(r)];
      std::fill(me.state.begin(), me.state.end(), value_of(me.cp->config().coord, 8));
      REQUIRE(me.cp->after_step(8));
    }
    REQUIRE(wait_for([&] { return committed_steps(dir.path()) == std::vector<std::uint64_t>{8}; }, 10s));
    CHECK(store::read_manifest(dir.path(), 8)->kind == store::Kind::Terminal);
    CHECK(logs.has("last words: let the update of step 8 end before reporting"));
    CHECK(logs.has("last words: writing a terminal checkpoint at step 8"));
    CHECK_FALSE(ranks[0].cp->before_update());  // training is stopped
    for (Rank& r : ranks) {
      if (r.cp) (void)r.cp->close();
    }
  }
  std::vector<Rank> again = make_ranks(dir.path(), 3, "dp=3", "lwmid2");
  for (const auto& got : restore_all(again)) CHECK(got.value() == 8);
  for (Rank& r : again) {
    CHECK(r.state.front() == value_of(r.cp->config().coord, 8));
    CHECK(r.cp->close());
  }
}

TEST_CASE("last words: a step committed already is the outcome, as if written", "[hooks][last_words]") {
  // The survivors hold step 5, whose periodic checkpoint is complete when the peer dies: nothing is written, and
  // the outcome names step 5 as committed (restart in place then hands that state over from a survivor's memory).
  TempDir dir;
  LogCapture logs;
  {
    Child child = spawn(dir.path(), 3, "dp=3", "lwdone", {2}, 5, "5steps");
    std::vector<Rank> ranks = make_ranks(dir.path(), 3, "dp=3", "lwdone", {0, 1}, "5steps");
    for (int r : {0, 1}) REQUIRE(ranks[static_cast<std::size_t>(r)].cp->restore().value() == 0);
    REQUIRE(train(ranks, 0, 5));
    REQUIRE(wait_for([&] { return committed_steps(dir.path()) == std::vector<std::uint64_t>{5}; }, 10s));
    kill_child(child);
    REQUIRE(wait_for([&] { return ranks[0].cp->last_words_report().done && ranks[1].cp->last_words_report().done; },
                     10s));
    CHECK(logs.has("last words: step 5 is committed already; nothing to write"));
    for (int r : {0, 1}) {
      CAPTURE(r);
      auto report = ranks[static_cast<std::size_t>(r)].cp->last_words_report();
      CHECK(report.committed);
      CHECK(report.step == 5);
    }
    CHECK(store::read_manifest(dir.path(), 5)->kind == store::Kind::Periodic);
    for (Rank& r : ranks) {
      if (r.cp) (void)r.cp->close();
    }
  }
}

namespace {

// The node of eight dies in turn: its members are frozen, its leader killed, and the members killed `after` that;
// every survivor must count all 8 as lost.
void node_dies_in_turn(const std::string& dir, const std::string& run_id, std::chrono::milliseconds after) {
  NodeOfEight n = node_of_eight(dir, run_id);
  ::kill(n.rest.pid, SIGSTOP);
  end_child(n.leader);
  std::this_thread::sleep_for(after);
  end_child(n.rest);
  REQUIRE(last_words_done(n.ranks, n.survivors, 10s));
  std::vector<int> node{16};
  node.insert(node.end(), n.members.begin(), n.members.end());
  check_lost(n.ranks, n.survivors, node);
  for (Rank& r : n.ranks) {
    if (r.cp) (void)r.cp->close();
  }
}

}  // namespace

TEST_CASE("last words: every rank of a dead node counts as lost, found by the mesh in time or not",
          "[hooks][last_words]") {
  // A node of 8 ranks (heartbeat group 2: ranks 16 to 23) dies, its members a little after their leader: rank 16
  // is killed while 17 to 23 are frozen, and they are killed once rank 0's dialer, which probes the group's next
  // leader, hangs in a handshake with frozen rank 17 (a probe that connects and then fails tells the dialer
  // nothing): 400 ms, as rank 0 probes rank 17 300 ms after rank 16's death. Only rank 16 was linked to a
  // survivor. The survivors (16 of 24) decide as soon as they have reported; every rank the decision went without
  // whose process is gone must count as lost, or restart in place plans one spare where eight are needed and its
  // next generation waits out the join timeout for the other seven.
  TempDir dir;
  LogCapture logs;
  node_dies_in_turn(dir.path(), "lwnode", 400ms);
}

TEST_CASE("last words: a rank that dies while the decision's probe waits on it counts as lost",
          "[hooks][last_words]") {
  // The node's members are frozen when their leader dies, and are killed while the decision's probe waits for their
  // answer: their kernels took the probe's connection into the listener's queue and reset it at the exit. A
  // connection closed without an answer proves nothing about a live rank, but the dial that follows it does: the
  // listener is gone, so it is refused, and all 8 count as lost before the decision floods, well within the
  // probe's limit. The decision comes 500 ms after the death (every survivor reported and the plan writes) and
  // probes for dead_after (1,500 ms here): the members die 1,000 ms after their leader.
  TempDir dir;
  LogCapture logs;
  node_dies_in_turn(dir.path(), "lwprobed", 1000ms);
  CHECK(logs.has("its connection is refused"));
  CHECK_FALSE(logs.has("no answer to a probe within"));
}

TEST_CASE("last words: every rank of a frozen node counts as lost", "[hooks][last_words]") {
  // A node of 8 ranks (heartbeat group 2: ranks 16 to 23) freezes whole: its processes stop, its kernel still
  // accepts connections. Rank 16's parent finds it silent after dead_after; the members were linked to rank 16
  // alone, and a dial of one connects and never gets an answer. The decision probes the ranks it has not heard
  // from: no answer within the limit counts a rank as lost, so every survivor counts all 8 (restart in place
  // plans eight spares, not one whose next generation waits out the join timeout for the other seven).
  TempDir dir;
  LogCapture logs;
  check_frozen_counted_lost(dir.path(), 24, "lwfrozen", {16, 17, 18, 19, 20, 21, 22, 23});
  CHECK(logs.has("no answer to a probe within"));
}

TEST_CASE("last words: every rank of two frozen nodes, one below the other, counts as lost", "[hooks][last_words]") {
  // 40 ranks, 5 groups; the parent of group g is (g-1)/2. Groups 1 (ranks 8 to 15) and 3 (24 to 31, below group
  // 1) freeze at once, as nodes behind one switch do. Rank 8's parent (rank 0) finds it silent; rank 24 was
  // linked to rank 8 and its members to rank 24: nobody alive was linked to them. The probe must reach below rank
  // 24 too, or restart in place plans spares for 9 ranks where 16 are needed.
  TempDir dir;
  LogCapture logs;
  check_frozen_counted_lost(dir.path(), 40, "lwtwo", {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
}

TEST_CASE("last words: every rank of nine frozen nodes counts as lost, more than 64 found by the probe",
          "[hooks][last_words]") {
  // 96 ranks, 12 groups; groups 1 to 9 (ranks 8 to 79) freeze at once, as a switch's nodes do. Their parents find
  // the leaders of groups 1, 2, 4 and 5 silent (ranks 8, 16, 32, 40); the other 68 were linked only to frozen ranks
  // and are found by the decision's probe, all in one limit.
  TempDir dir;
  LogCapture logs;
  std::vector<int> frozen;
  for (int r = 8; r < 80; ++r) frozen.push_back(r);
  check_frozen_counted_lost(dir.path(), 96, "lwswitch", frozen);
}

TEST_CASE("last words: a frozen leader's live members are not counted lost", "[hooks][last_words]") {
  // The same node, only its leader (rank 16) frozen: ranks 17 to 23 find it silent too, link to the rest again and
  // report, or answer the decision's probe. Only rank 16 counts as lost.
  TempDir dir;
  LogCapture logs;
  NodeOfEight n = node_of_eight(dir.path(), "lwleader");
  ::kill(n.leader.pid, SIGSTOP);
  const bool done = last_words_done(n.ranks, n.survivors, 15s);
  end_child(n.leader);
  end_child(n.rest);
  REQUIRE(done);
  check_lost(n.ranks, n.survivors, {16});
  for (Rank& r : n.ranks) {
    if (r.cp) (void)r.cp->close();
  }
}

TEST_CASE("last words: a lost pipeline stage writes nothing", "[hooks][last_words]") {
  TempDir dir;
  LogCapture logs;
  // DP2xPP2: ranks 2 and 3 hold stage 1, both go.
  Child child = spawn(dir.path(), 4, "dp=2,tp=1,pp=2", "lw3", {2, 3}, 5);
  std::vector<Rank> ranks = make_ranks(dir.path(), 4, "dp=2,tp=1,pp=2", "lw3", {0, 1});
  for (int r : {0, 1}) REQUIRE(ranks[static_cast<std::size_t>(r)].cp->restore().value() == 0);
  REQUIRE(train(ranks, 0, 5));
  kill_child(child);
  REQUIRE(wait_for([&] { return logs.has("last words: not writing a terminal checkpoint"); }, 10s));
  std::this_thread::sleep_for(200ms);
  CHECK(committed_steps(dir.path()).empty());
  CHECK_FALSE(ranks[0].cp->before_update());
  for (Rank& r : ranks) {
    if (r.cp) (void)r.cp->close();
  }
}

TEST_CASE("last words: SIGTERM on a healthy job writes a terminal checkpoint of the current step",
          "[hooks][last_words]") {
  TempDir dir;
  LogCapture logs;
  std::vector<Rank> ranks(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Options o = options({{"dir", dir.path()}, {"rank", std::to_string(r)}, {"world_size", "2"},
                           {"layout", "dp=2,tp=1,pp=1"}, {"last_words", "on"}, {"exit_grace", "0s"}, {"interval", "1000steps"},
                           {"run_id", "lw4"}, {"copy_threads", "0"}, {"signals", "on"}});
      Rank& me = ranks[static_cast<std::size_t>(r)];
      me.cp = make(o);
      (void)me.cp->register_region({"model", me.state.data(), me.state.size() * sizeof(double)});
    });
  }
  for (auto& t : threads) t.join();
  for (Rank& r : ranks) REQUIRE(r.cp->restore().value() == 0);
  REQUIRE(train(ranks, 0, 4));
  store::Manifest m = terminal_after_sigterm(dir.path(), 4);
  CHECK(m.shards.size() == 1);  // replica dp0 covers every key
  CHECK(wait_for([&] { return logs.has("last words: signal 15"); }, 5s));
  for (Rank& r : ranks) (void)r.cp->close();
}

namespace {

// A device whose memory is host memory: the library's device path (snapshot, restore, the last words' marks and
// rescue) without a GPU. A rescue of `hang_src` hangs until its deadline, like a copy stuck behind a dead kernel.
class HostDevice final : public DeviceBackend {
 public:
  static inline std::atomic<int> marks{0};
  static inline std::atomic<const void*> hang_src{nullptr};

  Result<void*> alloc_pinned(std::size_t bytes) override {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) return Error{"out of memory"};
    return p;
  }
  void free_pinned(void* p) override { std::free(p); }
  Status snapshot(const std::vector<DeviceCopy>& copies) override {
    for (const DeviceCopy& c : copies) std::memcpy(c.dst, c.src, c.size);
    return Status::success();
  }
  Status guard() override { return Status::success(); }
  Status wait() override { return Status::success(); }
  Status upload(void* dst, const void* src, std::size_t size) override {
    std::memcpy(dst, src, size);
    return Status::success();
  }
  Status mark_updates(const std::vector<void*>& streams) override {
    marks += static_cast<int>(streams.size());
    return Status::success();
  }
  Status rescue(const std::vector<DeviceCopy>& copies, std::chrono::steady_clock::time_point deadline) override {
    for (const DeviceCopy& c : copies) {
      if (c.src == hang_src.load()) {
        std::this_thread::sleep_until(deadline);
        return Status::failure("ckpt: the device copy did not finish before the last words' deadline");
      }
    }
    for (const DeviceCopy& c : copies) std::memcpy(c.dst, c.src, c.size);
    return Status::success();
  }
};

struct HostDeviceScope {
  HostDeviceScope() {
    HostDevice::marks = 0;
    HostDevice::hang_src = nullptr;
    set_device_backend_factory([]() -> Result<std::unique_ptr<DeviceBackend>> {
      return std::unique_ptr<DeviceBackend>(std::make_unique<HostDevice>());
    });
  }
  ~HostDeviceScope() { set_device_backend_factory({}); }
};

// Two DP ranks (threads of this process) whose state is one region, with signals handled.
std::vector<Rank> make_signal_ranks(const std::string& dir, const std::string& run_id, Memory memory,
                                    const std::string& layout = "dp=2,tp=1,pp=1") {
  std::vector<Rank> ranks(2);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Options o = options({{"dir", dir}, {"rank", std::to_string(r)}, {"world_size", "2"},
                           {"layout", layout}, {"last_words", "on"}, {"exit_grace", "0s"}, {"interval", "1000steps"},
                           {"run_id", run_id}, {"copy_threads", "0"}, {"signals", "on"}});
      Rank& me = ranks[static_cast<std::size_t>(r)];
      me.cp = make(o);
      RegionSpec region{"model", me.state.data(), me.state.size() * sizeof(double)};
      region.memory = memory;
      if (Status s = me.cp->register_region(region); !s) errors[static_cast<std::size_t>(r)] = s.error();
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) {
    if (!e.empty()) throw std::runtime_error(e);
  }
  return ranks;
}

// make_signal_ranks, fresh (nothing to restore), trained through `steps`.
std::vector<Rank> trained_signal_ranks(const std::string& dir, const std::string& run_id, Memory memory,
                                       std::uint64_t steps, const std::string& layout = "dp=2,tp=1,pp=1") {
  std::vector<Rank> ranks = make_signal_ranks(dir, run_id, memory, layout);
  for (Rank& r : ranks) REQUIRE(r.cp->restore().value() == 0);
  REQUIRE(train(ranks, 0, steps));
  return ranks;
}

}  // namespace

TEST_CASE("last words: device state is copied to the host as it was after the last update, then written",
          "[hooks][last_words]") {
  HostDeviceScope device;
  TempDir dir;
  LogCapture logs;
  {
    std::vector<Rank> ranks = trained_signal_ranks(dir.path(), "lw5", Memory::Device, 6);
    CHECK(HostDevice::marks == 12);  // one mark per rank and update
    store::Manifest m = terminal_after_sigterm(dir.path(), 6);
    CHECK(logs.has("last words: copied 0.0 MiB of device state to host memory"));
    REQUIRE(m.shards.size() == 1);
    CHECK(m.shards[0].rank == 0);
    for (Rank& r : ranks) (void)r.cp->close();
  }
  std::vector<Rank> again = make_signal_ranks(dir.path(), "lw6", Memory::Device);
  for (const auto& got : restore_all(again)) CHECK(got.value() == 6);
  for (Rank& r : again) {
    CHECK(r.state.front() == value_of(r.cp->config().coord, 6));
    CHECK(r.state.back() == value_of(r.cp->config().coord, 6));
  }
  for (Rank& r : again) CHECK(r.cp->close());
}

TEST_CASE("last words: a rank whose device copy hangs is passed over for a replica that copied in time",
          "[hooks][last_words]") {
  HostDeviceScope device;
  TempDir dir;
  LogCapture logs;
  std::vector<Rank> ranks = trained_signal_ranks(dir.path(), "lw7", Memory::Device, 3);
  HostDevice::hang_src = ranks[0].state.data();
  store::Manifest m = terminal_after_sigterm(dir.path(), 3);
  CHECK(logs.has("last words: this rank cannot write its state: ckpt: the device copy did not finish"));
  CHECK(logs.has("rank 0 cannot write its state"));
  REQUIRE(m.shards.size() == 1);
  CHECK(m.shards[0].rank == 1);  // dp1 writes: dp0's copy did not finish
  for (Rank& r : ranks) (void)r.cp->close();
}

TEST_CASE("last words: with ZeRO-1 every rank writes its own shard and restores from it", "[hooks][last_words]") {
  TempDir dir;
  LogCapture logs;
  {
    std::vector<Rank> ranks = trained_signal_ranks(dir.path(), "lw8", Memory::Host, 5, "dp=2,tp=1,pp=1,zero1=on");
    store::Manifest m = terminal_after_sigterm(dir.path(), 5);
    REQUIRE(m.shards.size() == 2);  // each optimizer shard has one holder
    for (Rank& r : ranks) (void)r.cp->close();
  }
  std::vector<Rank> again = make_signal_ranks(dir.path(), "lw9", Memory::Host, "dp=2,tp=1,pp=1,zero1=on");
  for (const auto& got : restore_all(again)) CHECK(got.value() == 5);
  for (Rank& r : again) {
    CHECK(r.state.front() == value_of(r.cp->config().coord, 5));
  }
  CHECK_FALSE(logs.has("loading the shard of rank"));
  for (Rank& r : again) CHECK(r.cp->close());
}

namespace {

// A ZeRO-1 job of three ranks with the memory tier on every step: ranks 0 and 1 here on "node-a", rank 2 in a
// child process on "node-b". One rank per node (LOCAL_WORLD_SIZE=1), so partners are the next rank: rank 2's
// copies go to rank 0 (on another node); rank 0's partner, rank 1, shares its node, so rank 0 keeps its own only.
struct MemoryTierJob {
  explicit MemoryTierJob(const char* memory_interval = "1", const char* lead = "2")
      : env{{"CKPT_MEMORY", "1G"}, {"CKPT_MEMORY_INTERVAL", memory_interval}, {"CKPT_AGREE_LEAD", lead},
            {"LOCAL_WORLD_SIZE", "1"}, {"SLURM_STEP_TASKS_PER_NODE", nullptr}, {"SLURM_TASKS_PER_NODE", nullptr},
            {"SLURMD_NODENAME", "node-a"}} {}
  TempDir dir;
  LogCapture logs;
  ScopedEnv env;
  std::vector<Rank> ranks;  // 0 and 1; 2 lives in `child`

  // Trains every rank `steps` steps; the child says it is ready once rank 0 kept its copy of step `steps`.
  // `then` runs in the child once it is ready, with its rank 2; `signals`: the child's last words start at SIGTERM.
  Child start(const std::string& run_id, std::uint64_t steps, bool signals = false,
              const std::function<bool(Rank&)>& then = nullptr) {
    Child child = spawn(dir.path(), 3, "dp=3,tp=1,pp=1,zero1=on", run_id, {2}, steps, "1000steps",
                        [signals] {
                          ::setenv("SLURMD_NODENAME", "node-b", 1);
                          ranks_take_signals = signals;
                        },
                        [steps, then](std::vector<Rank>& mine) {
                          if (mine[2].cp->stats().partner_copies < steps) return false;
                          return !then || then(mine[2]);
                        },
                        30ms);
    ranks = make_ranks(dir.path(), 3, "dp=3,tp=1,pp=1,zero1=on", run_id, {0, 1});
    for (int r : {0, 1}) REQUIRE(ranks[static_cast<std::size_t>(r)].cp->restore().value() == 0);
    REQUIRE(train(ranks, 0, steps, 30ms));
    // The survivors' own last memory checkpoint is whole in staging too (rank 1 sent its copy of it).
    REQUIRE(wait_for([&] { return ranks[1].cp->stats().partner_copies + ranks[1].cp->stats().partner_failures >= steps; },
                     10s));
    return child;
  }

  void close_survivors() {
    for (Rank& r : ranks) {
      if (r.cp) (void)r.cp->close();
    }
  }
};

// Every rank of a new run (no memory tier) restores `step` with its own state, rank 2's from the shard its
// partner wrote; `live[r]`, where given, is memory rank r offers the restore (RestoreOptions::live).
void check_restores(const std::string& dir, const std::string& run_id, std::uint64_t step,
                    const std::map<int, std::vector<RegionSpec>>& live = {}) {
  std::vector<Rank> again = make_ranks(dir, 3, "dp=3,tp=1,pp=1,zero1=on", run_id);
  std::vector<Result<std::uint64_t>> got(again.size(), Error{"not run"});
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < again.size(); ++r) {
    threads.emplace_back([&, r] {
      RestoreOptions options;
      if (auto it = live.find(static_cast<int>(r)); it != live.end()) options.live = it->second;
      got[r] = again[r].cp->restore(options);
    });
  }
  for (auto& t : threads) t.join();
  for (Rank& r : again) {
    const int rank = r.cp->config().rank;
    CAPTURE(rank);
    CHECK(got[static_cast<std::size_t>(rank)].value() == step);
    CHECK(r.state.front() == value_of(r.cp->config().coord, step));
    CHECK(r.state.back() == value_of(r.cp->config().coord, step));
    if (live.count(rank) != 0) {  // everything from memory, checked against the checksums; nothing read
      CHECK(r.cp->stats().restore_read_bytes == 0);
      CHECK(r.cp->stats().restore_live_bytes == r.state.size() * sizeof(double));
    }
    CHECK(r.cp->close());
  }
}

// Makes the pages wholly inside `state` unreadable, and a thread that reads them wait there for good: a write of
// the state that cannot end (the process is killed in it). False when no whole page lies inside.
bool stall_reads_of(std::vector<double>& state) {
  struct sigaction stall {};
  stall.sa_handler = [](int) {
    for (;;) ::pause();
  };
  sigemptyset(&stall.sa_mask);
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<std::uintptr_t>(state.data()) + page - 1) / page * page;
  const auto end = reinterpret_cast<std::uintptr_t>(state.data() + state.size()) / page * page;
  return end > begin && ::sigaction(SIGSEGV, &stall, nullptr) == 0 &&
         ::mprotect(reinterpret_cast<void*>(begin), end - begin, PROT_NONE) == 0;
}

// A MemoryCopy's ranges as memory a restore may take them from.
std::vector<RegionSpec> live_of(const MemoryCopy& copy) {
  std::vector<RegionSpec> out;
  for (const store::StateRange& r : copy.ranges) out.push_back({r.name, copy.data.get() + r.offset, r.length});
  return out;
}

}  // namespace

TEST_CASE("memory tier: a ZeRO-1 rank is killed, and its partner's copy writes its shard of the last step",
          "[hooks][last_words][memtier]") {
  MemoryTierJob job;
  std::map<int, std::vector<RegionSpec>> live;
  std::vector<MemoryCopy> kept;
  {
    Child child = job.start("mt1", 6);
    CHECK(job.logs.has("memory tier: a checkpoint in memory every 1 step(s)"));
    CHECK(job.logs.has("runs on node node-a, this rank's own: this rank keeps its memory checkpoints in its own staging"));
    CHECK(committed_steps(job.dir.path()).empty());  // nothing but memory checkpoints so far
    kill_child(child);
    REQUIRE(wait_for([&] { return committed_steps(job.dir.path()) == std::vector<std::uint64_t>{6}; }, 10s));
    auto m = store::read_manifest(job.dir.path(), 6);
    REQUIRE(m);
    CHECK(m->kind == store::Kind::Terminal);
    REQUIRE(m->shards.size() == 3);
    CHECK(m->shards[2].rank == 2);
    CHECK(job.logs.has("the copy of rank 2's step 6"));
    CHECK(job.logs.has("last words: wrote rank 2's terminal shard of step 6 from its partner copy"));
    CHECK(job.ranks[1].cp->last_words_report().stand_ins == std::map<int, int>{{2, 0}});
    CHECK(job.ranks[0].cp->release_memory_copies().empty());  // not before the checkpointer closed
    job.close_survivors();
    // The copies outlive their checkpointers: rank 0 holds rank 2's last two copies and its own staging's last two
    // snapshots, rank 1 its own two.
    std::map<int, std::set<std::uint64_t>> steps;
    for (int r : {0, 1}) {
      for (MemoryCopy& c : job.ranks[static_cast<std::size_t>(r)].cp->release_memory_copies()) {
        steps[c.rank].insert(c.step);
        if (c.step == 6) live[c.rank] = live_of(c);
        kept.push_back(std::move(c));
      }
      CHECK(job.ranks[static_cast<std::size_t>(r)].cp->release_memory_copies().empty());  // once
    }
    CHECK(steps == std::map<int, std::set<std::uint64_t>>{{0, {5, 6}}, {1, {5, 6}}, {2, {5, 6}}});
    CHECK(live.size() == 3);
    job.ranks.clear();
  }
  check_restores(job.dir.path(), "mt2", 6, live);
}

TEST_CASE("memory tier: a writer that cannot write its shard has it written from its partner copy",
          "[hooks][last_words][memtier]") {
  // A SIGTERM to rank 2 (the child) starts every rank's last words; all three report whole at step 4 and the plan
  // has each write its own shard. Rank 2's state pages are unreadable, so its write cannot end: where it copies
  // them (through the writer's bounce buffer) it stalls there for good and is killed in it, as a node's ranks die
  // one after another while their memory is torn down; where the kernel reads them (a direct write from a
  // page-aligned buffer, as TSAN's allocator gives) the write fails. Either way the root has rank 0, which holds
  // rank 2's copy of step 4, write that shard: the terminal checkpoint is committed, and restores.
  struct Doubles {
    std::size_t before = state_doubles;
    Doubles() { state_doubles = 2048; }  // 16 KiB: whole pages inside
    ~Doubles() { state_doubles = before; }
  } doubles;
  MemoryTierJob job;
  {
    Child child = job.start("mt9", 4, true, [](Rank& r) { return stall_reads_of(r.state); });
    wait_ready(child);
    ::kill(child.pid, SIGTERM);
    REQUIRE(wait_for([&] { return job.logs.has("last words: writing a terminal checkpoint at step 4"); }, 10s));
    const std::string failed = "last words: rank 2 failed its shard of step 4: its partner copy on rank 0 stands in";
    const bool write_failed = wait_for([&] { return job.logs.has(failed); }, 2s);
    if (!write_failed) CHECK(committed_steps(job.dir.path()).empty());  // rank 2 is inside its write, for good
    end_child(child);
    REQUIRE(wait_for([&] { return committed_steps(job.dir.path()) == std::vector<std::uint64_t>{4}; }, 10s));
    if (!write_failed) {
      CHECK(job.logs.has("last words: rank 2 died before its shard of step 4 was durable: its partner copy on rank "
                         "0 stands in"));
    }
    CHECK(job.logs.has("last words: wrote rank 2's terminal shard of step 4 from its partner copy"));
    REQUIRE(wait_for([&] { return job.ranks[1].cp->last_words_report().done; }, 10s));
    for (int r : {0, 1}) {
      CAPTURE(r);
      const auto report = job.ranks[static_cast<std::size_t>(r)].cp->last_words_report();
      CHECK(report.committed);
      if (!write_failed) CHECK(report.lost == std::vector<int>{2});
      CHECK(report.stand_ins == std::map<int, int>{{2, 0}});
    }
    job.close_survivors();
    job.ranks.clear();
  }
  check_restores(job.dir.path(), "mt10", 4);
}

TEST_CASE("memory tier: ZeRO-1 survivors caught mid-update write the step their staging holds",
          "[hooks][last_words][memtier]") {
  MemoryTierJob job;
  {
    Child child = job.start("mt3", 5);
    // Both survivors are inside the update of step 6, which under ZeRO-1 may wait on the dead peer: their live
    // state is no step's, and their staging holds step 5 whole.
    for (int r : {0, 1}) REQUIRE(job.ranks[static_cast<std::size_t>(r)].cp->before_update());
    for (int r : {0, 1}) {
      Rank& me = job.ranks[static_cast<std::size_t>(r)];
      std::fill(me.state.begin(), me.state.begin() + 10, -1.0);  // half-updated
    }
    kill_child(child);
    REQUIRE(wait_for([&] { return committed_steps(job.dir.path()) == std::vector<std::uint64_t>{5}; }, 10s));
    CHECK(job.logs.has("last words: wrote the terminal shard of step 5 from staging"));
    CHECK(job.logs.has("last words: wrote rank 2's terminal shard of step 5 from its partner copy"));
    job.close_survivors();
  }
  check_restores(job.dir.path(), "mt4", 5);
}

TEST_CASE("memory tier: a rank it does not fit turns it off for the whole job and rank 0 says so once",
          "[hooks][last_words][memtier]") {
  TempDir dir;
  LogCapture logs;
  // 1 MiB per rank: ranks 0 and 1 (512 B each) fit; rank 2 (512 KiB: two snapshots in staging and two copies of
  // its ward's shard, as it estimates it) does not.
  ScopedEnv env{{{"CKPT_MEMORY", "1M"}, {"CKPT_MEMORY_INTERVAL", "1"}, {"LOCAL_WORLD_SIZE", "1"},
                 {"SLURM_STEP_TASKS_PER_NODE", nullptr}, {"SLURM_TASKS_PER_NODE", nullptr},
                 {"SLURMD_NODENAME", "node-a"}}};
  Child child = spawn(dir.path(), 3, "dp=3,tp=1,pp=1,zero1=on", "off1", {2}, 4, "1000steps",
                      [] {
                        ::setenv("SLURMD_NODENAME", "node-b", 1);
                        state_doubles = 64 * 1024;
                      },
                      nullptr, 30ms);
  std::vector<Rank> ranks = make_ranks(dir.path(), 3, "dp=3,tp=1,pp=1,zero1=on", "off1", {0, 1});
  for (int r : {0, 1}) REQUIRE(ranks[static_cast<std::size_t>(r)].cp->restore().value() == 0);
  REQUIRE(wait_for([&] { return logs.has("the memory tier is off for the whole job"); }, 10s));
  // Each rank hears the word on its own (rank 0's line says only that rank 0 has): both, before training.
  REQUIRE(wait_for([&] { return ranks[0].cp->stats().memory_tier_off && ranks[1].cp->stats().memory_tier_off; }, 10s));
  const Stats before = ranks[1].cp->stats();
  REQUIRE(train(ranks, 0, 10, 30ms));
  // Neither rank takes a memory checkpoint now, nor sends a copy.
  CHECK(ranks[0].cp->stats().memory_checkpoints == 0);
  CHECK(ranks[1].cp->stats().memory_checkpoints == 0);
  CHECK(ranks[1].cp->stats().partner_copies == before.partner_copies);
  CHECK(ranks[1].cp->stats().partner_failures == before.partner_failures);
  std::size_t said = 0;
  for (const std::string& line : logs.lines()) {
    if (line.find("the memory tier is off for the whole job") == std::string::npos) continue;
    ++said;
    CHECK_THAT(line, Catch::Contains("rank 0: the memory tier is off for the whole job: rank 2 needs 2.0 MiB"));
    CHECK_THAT(line, Catch::Contains("but CKPT_MEMORY allows 1.0 MiB per rank"));
  }
  CHECK(said == 1);
  kill_child(child);
  for (Rank& r : ranks) {
    if (r.cp) (void)r.cp->close();
  }
}

TEST_CASE("memory tier: memory checkpoints every step do not hold back a timed periodic checkpoint",
          "[hooks][last_words][memtier]") {
  MemoryTierJob job("1");
  job.ranks = make_ranks(job.dir.path(), 2, "dp=2,tp=1,pp=1", "mtt", {}, "1s");
  for (Rank& r : job.ranks) REQUIRE(r.cp->restore().value() == 0);
  // 2.4 s of 30 ms steps with a memory checkpoint at every one: the 1 s interval runs from the last periodic
  // checkpoint (here the start), not from the last memory checkpoint.
  REQUIRE(train(job.ranks, 0, 80, 30ms));
  const Stats s0 = job.ranks[0].cp->stats();
  CHECK(s0.memory_checkpoints >= 40);
  CHECK(s0.snapshots >= 1);
  job.close_survivors();
  CHECK_FALSE(committed_steps(job.dir.path()).empty());
}

TEST_CASE("memory tier: auto interval: Young's interval from the measured cost where failures are rare",
          "[hooks][last_words][memtier]") {
  // Both ranks on one node: each keeps its memory checkpoints in its own staging, which is what they cost here. A
  // lead of 10 steps of 30 ms: under TSAN a request flooded 4 steps of 10 ms ahead came after some ranks passed it.
  // A job that fails once a day: the copies' cost outweighs the little work a failure loses. (One that fails every
  // second takes every step: the next test.)
  MemoryTierJob job("auto", "10");
  ScopedEnv daily{{{"CKPT_MTBF", "24h"}}};
  job.ranks = make_ranks(job.dir.path(), 2, "dp=2,tp=1,pp=1", "mya");
  for (Rank& r : job.ranks) REQUIRE(r.cp->restore().value() == 0);
  REQUIRE(train(job.ranks, 0, 80, 30ms));
  const Stats s = job.ranks[0].cp->stats();
  job.close_survivors();
  INFO("memory interval " << s.memory_interval << ", memory checkpoints " << s.memory_checkpoints);
  CHECK(job.logs.has("s: Young's interval at MTBF 86400 s is"));
  CHECK(s.memory_interval > 20);
  CHECK(s.memory_checkpoints < 30);
}

TEST_CASE("memory tier: auto interval: every rank takes the memory checkpoints rank 0 asks for",
          "[hooks][last_words][memtier]") {
  // A lead of 10 steps: the two processes start their steps apart by a little. A job that fails every second,
  // with steps of 500 ms: Young's interval √(2 · cost · 1 s) stays below a step for any cost under 125 ms (TSAN on
  // a loaded host measured 16 ms, which with 30 ms steps made it 6 steps), so the copies' keep-up bound decides.
  MemoryTierJob job("auto", "10");
  ScopedEnv often{{{"CKPT_MTBF", "1s"}}};
  {
    Child child = spawn(job.dir.path(), 3, "dp=3,tp=1,pp=1,zero1=on", "mta", {2}, 20, "1000steps",
                        [] { ::setenv("SLURMD_NODENAME", "node-b", 1); },
                        // Its copies of steps 11..20 all landed: killed before the last, it would leave step 19.
                        [](std::vector<Rank>& mine) { return mine[2].cp->stats().partner_copies >= 10; }, 500ms);
    job.ranks = make_ranks(job.dir.path(), 3, "dp=3,tp=1,pp=1,zero1=on", "mta", {0, 1});
    for (int r : {0, 1}) REQUIRE(job.ranks[static_cast<std::size_t>(r)].cp->restore().value() == 0);
    REQUIRE(train(job.ranks, 0, 20, 500ms));
    CHECK(job.logs.has("memory tier: a checkpoint in memory at Young's interval for its measured cost"));
    CHECK(job.logs.has("memory tier: a checkpoint in memory every 1 step(s) (auto: a copy takes"));
    // Small copies keep up with 500 ms steps: every step from the first one asked for (1 + lead) on.
    const Stats s0 = job.ranks[0].cp->stats(), s1 = job.ranks[1].cp->stats();
    CHECK(s0.memory_interval == 1);
    CHECK(s0.memory_checkpoints == 10);  // steps 11..20
    CHECK(s1.memory_checkpoints == s0.memory_checkpoints);
    CHECK(s1.memory_interval == 0);  // rank 0 alone chooses
    CHECK_FALSE(job.logs.has("was asked for after this rank passed it"));
    // The child's rank 2 took the same steps: its copy of the last one stands in for it.
    kill_child(child);
    REQUIRE(wait_for([&] { return committed_steps(job.dir.path()) == std::vector<std::uint64_t>{20}; }, 10s));
    CHECK(job.logs.has("last words: wrote rank 2's terminal shard of step 20 from its partner copy"));
    job.close_survivors();
  }
  check_restores(job.dir.path(), "mtb", 20);
}
