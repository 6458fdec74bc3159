// Agreement across ranks: ranks run as threads in lockstep (a barrier per step stands in for the gradient
// all-reduce), each with its own checkpointer on a shared dir, agreeing over the heartbeat network (the tree).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <csignal>
#include <cstring>
#include <ctime>
#include <functional>
#include <thread>
#include <vector>

#include "coordinator.hpp"
#include "hooks_test_util.hpp"
#include "notice.hpp"

using namespace ckpt;
using namespace ckpt::hooks;
using namespace std::chrono_literals;

namespace {

struct RankRun {
  std::vector<std::uint64_t> snapshots;  // steps this rank checkpointed
  std::optional<std::uint64_t> stopped_at;
  Status closed;
  std::string error;  // Catch2 assertions are not thread-safe: rank threads report here
};

// Runs `ranks` ranks for up to `steps` steps; `on_step(rank, step)` runs before each step's after_step.
std::vector<RankRun> run_ranks(int ranks, std::uint64_t steps, const std::function<Options(int)>& make_options,
                               const std::function<void(int, std::uint64_t)>& on_step = nullptr) {
  std::vector<RankRun> runs(static_cast<std::size_t>(ranks));
  std::barrier sync(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      RankRun& run = runs[static_cast<std::size_t>(r)];
      std::vector<std::uint64_t> state(4096, 0);
      auto created = Checkpointer::create(make_options(r));
      if (!created) {
        run.error = created.error();
        sync.arrive_and_drop();
        return;
      }
      auto cp = std::move(created).value();
      Status ok = cp->register_region({"w", state.data(), state.size() * 8});
      auto restored = cp->restore();
      if (!ok || !restored || *restored != 0) run.error = "setup failed: " + ok.error() + restored.error();
      for (std::uint64_t step = 1; step <= steps && run.error.empty(); ++step) {
        std::this_thread::sleep_for(5ms);  // the forward and backward pass
        sync.arrive_and_wait();            // the all-reduce
        if (Status s = cp->before_update(); !s) run.error = s.error();
        state.assign(state.size(), step * 10 + static_cast<std::uint64_t>(r));
        if (on_step) on_step(r, step);
        auto d = cp->poll(step);
        auto stop = cp->after_step(step);
        if (!d || !stop) {
          run.error = "step " + std::to_string(step) + ": " + d.error() + stop.error();
          break;
        }
        if (d->snapshot) run.snapshots.push_back(step);
        if (*stop) {
          run.stopped_at = step;
          break;
        }
      }
      sync.arrive_and_drop();  // a rank that left early must not hang the others
      run.closed = cp->close();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const RankRun& run : runs) CHECK(run.error == "");
  return runs;
}

Options rank_options(const std::string& dir, int rank, std::initializer_list<std::pair<const char*, std::string>> kv) {
  Options o = test::options(kv);
  o.set("dir", dir);
  o.set("rank", std::to_string(rank));
  o.set("world_size", "2");
  o.set("copy_threads", "1");
  o.set("keep", "100");
  return o;
}

void check_committed(const std::string& dir, std::uint64_t step, int ranks) {
  for (int r = 0; r < ranks; ++r) {
    auto bytes = test::read_region(dir, step, r, "w");
    std::vector<std::uint64_t> words(bytes.size() / 8);
    std::memcpy(words.data(), bytes.data(), bytes.size());
    INFO("step " << step << " rank " << r);
    CHECK((words == std::vector<std::uint64_t>(words.size(), step * 10 + static_cast<std::uint64_t>(r))));
  }
}

}  // namespace

TEST_CASE("the control dir: exclusive requests, one namespace per run and resume step", "[hooks][coord]") {
  test::TempDir dir;
  ControlDir a(dir.path(), "run", 0), b(dir.path(), "run", 1), other(dir.path(), "other", 1);
  CHECK_FALSE(b.requested(5).has_value());  // nothing there yet, not even the directory
  REQUIRE(a.request(5, store::Kind::Periodic).ok());
  REQUIRE(a.request(5, store::Kind::Periodic).ok());  // asking twice is harmless
  CHECK(b.requested(5) == store::Kind::Periodic);
  CHECK_FALSE(b.requested(4).has_value());
  CHECK_FALSE(other.requested(5).has_value());
  REQUIRE(b.request(5, store::Kind::Terminal).ok());
  CHECK(a.requested(5) == store::Kind::Terminal);  // terminal wins
  b.begin(3);  // a run resumed from step 3 does not see the requests of the run before
  CHECK_FALSE(b.requested(5).has_value());
  REQUIRE(b.report_failure(7, "disk full").ok());
  a.begin(3);
  CHECK(a.failure(7, 1) == std::string("disk full"));
  CHECK_FALSE(a.failure(7, 0).has_value());
}

TEST_CASE("ranks agree on time-based checkpoints", "[hooks][coord]") {
  test::TempDir dir;
  test::LogCapture log;
  // A lead of 20 steps (100 ms here): the request crosses the network in time on a loaded host too.
  auto runs = run_ranks(2, 700, [&](int r) {
    return rank_options(dir.path(), r, {{"interval", "1s"}, {"agree_lead", "20"}});
  });
  REQUIRE(runs[0].closed.ok());
  REQUIRE(runs[1].closed.ok());
  CHECK(runs[0].snapshots.size() >= 2);
  CHECK(runs[0].snapshots == runs[1].snapshots);
  CHECK(test::committed_steps(dir.path()) == runs[0].snapshots);
  for (std::uint64_t step : runs[0].snapshots) check_committed(dir.path(), step, 2);
}

TEST_CASE("a signal stops every rank at the same step with a terminal checkpoint", "[hooks][coord][notice]") {
  test::TempDir dir;
  test::LogCapture log;
  auto runs = run_ranks(
      2, 200, [&](int r) { return rank_options(dir.path(), r, {{"interval", "1000steps"}, {"signals", "on"}}); },
      [](int rank, std::uint64_t step) {
        if (rank == 1 && step == 20) std::raise(SIGUSR1);
      });
  REQUIRE(runs[0].closed.ok());
  REQUIRE(runs[1].closed.ok());
  REQUIRE(runs[0].stopped_at.has_value());
  CHECK(runs[0].stopped_at == runs[1].stopped_at);
  CHECK(*runs[0].stopped_at >= 21);
  CHECK(*runs[0].stopped_at <= 23);
  auto m = store::read_manifest(dir.path(), *runs[0].stopped_at);
  REQUIRE(m.ok());
  CHECK(m->kind == store::Kind::Terminal);
  check_committed(dir.path(), *runs[0].stopped_at, 2);
  CHECK(log.has("signal " + std::to_string(SIGUSR1) + ": terminal checkpoint at step"));
}

TEST_CASE("the time limit stops every rank CKPT_GRACE before the end", "[hooks][coord][notice]") {
  test::TempDir dir;
  test::LogCapture log;
  const auto end = std::time(nullptr) + 100 + 1;  // within the grace time in about a second
  auto started = std::chrono::steady_clock::now();
  auto runs = run_ranks(2, 2000, [&](int r) {
    return rank_options(dir.path(), r, {{"interval", "1000steps"}, {"grace", "100s"}, {"end_time", std::to_string(end)}});
  });
  REQUIRE(runs[0].stopped_at.has_value());
  CHECK(runs[0].stopped_at == runs[1].stopped_at);
  CHECK(std::chrono::steady_clock::now() - started < 10s);
  auto m = store::read_manifest(dir.path(), *runs[0].stopped_at);
  REQUIRE(m.ok());
  CHECK(m->kind == store::Kind::Terminal);
  CHECK(log.has("the job's time limit is within the grace time"));
}

TEST_CASE("the writer commits only when every rank persisted", "[hooks][coord]") {
  test::TempDir dir;
  test::LogCapture log;
  SECTION("a rank that never writes: the commit times out") {
    std::uint64_t x = 1;
    test::IdleRank rank1(rank_options(dir.path(), 1, {{"interval", "1steps"}, {"commit_timeout", "1s"}}));
    auto cp = test::make(rank_options(dir.path(), 0, {{"interval", "1steps"}, {"commit_timeout", "1s"}}));
    REQUIRE(cp->register_region({"w", &x, sizeof x}).ok());
    REQUIRE_FALSE(*cp->after_step(1));
    Status s = cp->close();
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error(), Catch::Contains("1 of 2 ranks did not report a durable shard within 1s"));
    CHECK(rank1.release() == "");
    CHECK(test::committed_steps(dir.path()).empty());
    CHECK(cp->stats().failed == 1);
  }
  SECTION("without close(), the writer does not wait for ranks that may be gone") {
    std::uint64_t x = 1;
    auto started = std::chrono::steady_clock::now();
    test::IdleRank rank1(rank_options(dir.path(), 1, {{"interval", "1steps"}, {"commit_timeout", "60s"}}));
    {
      auto cp = test::make(rank_options(dir.path(), 0, {{"interval", "1steps"}, {"commit_timeout", "60s"}}));
      REQUIRE(cp->register_region({"w", &x, sizeof x}).ok());
      REQUIRE_FALSE(*cp->after_step(1));
    }  // an exception unwinding the training loop
    CHECK(std::chrono::steady_clock::now() - started < 20s);
    CHECK(test::committed_steps(dir.path()).empty());
    CHECK(log.has("training ended before every rank persisted"));
  }
  SECTION("a rank the network declares dead, its last words off: the commit fails at once, saying what it means") {
    // Rank 1 joins from a child process that then stops itself: frozen, its connection open, silent. Nothing is
    // triggered (the last words are off), so only the coordinator's own word ends the wait before its timeout.
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const auto o = [&](int r) {
      return rank_options(dir.path(), r, {{"interval", "1steps"}, {"commit_timeout", "60s"},
                                          {"heartbeat_timeout", "500ms"}});
    };
    pid_t rank1 = ::fork();
    if (rank1 == 0) {
      ::close(ready[0]);
      auto cp = Checkpointer::create(o(1));
      char ok = cp ? 1 : 0;
      (void)::write(ready[1], &ok, 1);
      ::raise(SIGSTOP);
      ::_exit(0);
    }
    ::close(ready[1]);
    std::uint64_t x = 1;
    auto cp = test::make(o(0));
    char ok = 0;
    REQUIRE(::read(ready[0], &ok, 1) == 1);
    ::close(ready[0]);
    REQUIRE(ok == 1);
    REQUIRE(cp->register_region({"w", &x, sizeof x}).ok());
    const auto started = std::chrono::steady_clock::now();
    REQUIRE_FALSE(*cp->after_step(1));
    Status s = cp->close();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    ::kill(rank1, SIGKILL);
    ::waitpid(rank1, nullptr, 0);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error(), Catch::Contains("rank 1 is gone from the heartbeat network (it died, or was silent past the "
                                          "heartbeat timeout): no checkpoint of this run can complete"));
    CHECK(took < 15);  // the commit's own timeout is 60 s
    CHECK(test::committed_steps(dir.path()).empty());
  }
  SECTION("a request that reaches a rank after it passed the step: the writer learns at once, and why") {
    // Rank 1 runs far ahead before rank 0 starts, so rank 0's timed request (1 s in, one step ahead) names a step
    // rank 1 has passed. Lockstep training never drifts this far; a slow network against a short lead looks alike.
    const auto o = [&](int r) {
      return rank_options(dir.path(), r, {{"interval", "1s"}, {"agree_lead", "1"}, {"commit_timeout", "60s"}});
    };
    std::atomic<bool> ahead{false}, done{false};
    std::string error1;
    std::thread rank1([&] {
      std::vector<std::uint64_t> w(512, 1);
      auto cp = Checkpointer::create(o(1));
      if (!cp) {
        error1 = cp.error();
        ahead = true;
        return;
      }
      (void)(*cp)->register_region({"w", w.data(), w.size() * 8});
      (void)(*cp)->restore();
      for (std::uint64_t step = 1; step <= 5000; ++step) {
        (void)(*cp)->before_update();
        (void)(*cp)->poll(step);
        (void)(*cp)->after_step(step);
      }
      ahead = true;
      while (!done) std::this_thread::sleep_for(10ms);
      (void)(*cp)->close();
    });
    std::vector<std::uint64_t> w(512, 0);
    auto cp = test::make(o(0));
    REQUIRE(cp->register_region({"w", w.data(), w.size() * 8}).ok());
    REQUIRE(cp->restore().ok());
    while (!ahead) std::this_thread::sleep_for(10ms);
    const auto started = std::chrono::steady_clock::now();
    std::string error0;
    for (std::uint64_t step = 1; step <= 1000 && error0.empty(); ++step) {
      std::this_thread::sleep_for(5ms);
      auto d = cp->poll(step);
      auto stop = cp->after_step(step);
      if (!d || !stop) error0 = d.error() + stop.error();
    }
    if (error0.empty()) error0 = cp->close().error();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    done = true;
    rank1.join();
    REQUIRE(error1 == "");
    CHECK_THAT(error0, Catch::Contains("rank 1 could not persist step"));
    CHECK_THAT(error0, Catch::Contains("after it had passed that step; CKPT_AGREE_LEAD=1 steps is too short"));
    CHECK(took < 20);  // the commit's own timeout is 60 s
    CHECK(log.has("reached this rank at step 5000"));
    // The lead that would have been in time: rank 0 asked at step S - 1 for step S, which came at step 5000.
    const auto at = error0.find("reached this rank at step 5000");
    const auto asked = error0.rfind("the request for step ", at);
    REQUIRE(asked != std::string::npos);
    const std::uint64_t s = std::stoull(error0.substr(asked + 21));
    CHECK_THAT(error0, Catch::Contains("(" + std::to_string(1 + (5000 - s) + 1) + " would have been in time here)"));
    CHECK(test::committed_steps(dir.path()).empty());
  }
  SECTION("a rank whose persist fails tells the writer at once") {
    auto started = std::chrono::steady_clock::now();
    auto runs = run_ranks(2, 1, [&](int r) {
      Options o = rank_options(dir.path(), r, {{"interval", "1steps"}, {"commit_timeout", "60s"}});
      if (r == 1) {
        o.persist_observer = [](store::SavePhase p) {
          if (p == store::SavePhase::ShardOpened) throw std::runtime_error("injected failure");
        };
      }
      return o;
    });
    CHECK(std::chrono::steady_clock::now() - started < 30s);
    REQUIRE_FALSE(runs[0].closed.ok());
    CHECK(runs[0].closed.error().find("rank 1 could not persist step 1") != std::string::npos);
    REQUIRE_FALSE(runs[1].closed.ok());
    CHECK(test::committed_steps(dir.path()).empty());
  }
}

// A terminal request that reaches a rank after it passed the step. Rank 0 runs far ahead of rank 1 (as in the late
// request above); rank 1's signal then asks for a terminal checkpoint of a step rank 0 passed long ago. Rank 1 stops
// there; rank 0 (the writer) must stop too and end at once, not wait out the commit timeout (60 s) for a
// checkpoint of its own that rank 1 will never take.
TEST_CASE("a terminal step one rank missed: every rank stops, none waits out the commit timeout", "[hooks][coord][notice]") {
  test::TempDir dir;
  test::LogCapture log;
  const auto o = [&](int r) {
    return rank_options(dir.path(), r,
                        {{"interval", "1000000steps"}, {"signals", "on"}, {"commit_timeout", "60s"}});
  };
  // own_first: rank 0 takes a terminal checkpoint of its own (its own signal) before rank 1's request reaches it.
  const bool own_first = GENERATE(false, true);
  INFO((own_first ? "rank 0 took its own terminal checkpoint first" : "rank 0 learns before its own"));
  std::atomic<bool> go1{false};
  std::optional<std::uint64_t> stopped1;
  std::string error1;
  Status closed1;
  std::thread rank1([&] {
    std::vector<std::uint64_t> w(512, 1);
    auto cp = Checkpointer::create(o(1));
    if (!cp) {
      error1 = cp.error();
      return;
    }
    (void)(*cp)->register_region({"w", w.data(), w.size() * 8});
    (void)(*cp)->restore();
    while (!go1) std::this_thread::sleep_for(10ms);
    for (std::uint64_t step = 1; step <= 1000 && !stopped1; ++step) {
      std::this_thread::sleep_for(5ms);
      if (step == 10) std::raise(SIGUSR1);
      (void)(*cp)->before_update();
      auto stop = (*cp)->after_step(step);
      if (!stop) error1 = stop.error();
      if (!stop || *stop) stopped1 = step;
    }
    closed1 = (*cp)->close();
  });
  std::vector<std::uint64_t> w(512, 0);
  auto cp = test::make(o(0));
  REQUIRE(cp->register_region({"w", w.data(), w.size() * 8}).ok());
  REQUIRE(cp->restore().ok());
  const auto started = std::chrono::steady_clock::now();
  std::optional<std::uint64_t> stopped0;
  for (std::uint64_t step = 1; step <= 6000 && !stopped0; ++step) {
    if (own_first && step == 5000) std::raise(SIGUSR1);
    if (!own_first && step == 5001) {  // rank 1 runs now; rank 0 goes on once its request came
      go1 = true;
      while (!log.has("reached this rank at step 5000") && std::chrono::steady_clock::now() - started < 30s) {
        std::this_thread::sleep_for(10ms);
      }
    }
    (void)cp->before_update();
    auto stop = cp->after_step(step);
    REQUIRE(stop.ok());
    if (*stop) stopped0 = step;
  }
  go1 = true;  // own_first: rank 1 starts once rank 0 stopped at its own terminal step
  const Status closed0 = cp->close();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  rank1.join();
  REQUIRE(error1 == "");
  REQUIRE(stopped1.has_value());
  REQUIRE(stopped0.has_value());
  CHECK(*stopped1 <= 13);  // its own request, a lead (2 steps) ahead (own_first: maybe rank 0's signal, at step 3)
  CHECK(took < 30);        // the commit's own timeout is 60 s
  REQUIRE_FALSE(closed0.ok());
  const std::string missed = "the terminal checkpoint of step " + std::to_string(*stopped1);
  if (own_first) {
    CHECK(*stopped0 == 5002);  // its own terminal step, taken before it knew
    CHECK_THAT(closed0.error(), Catch::Contains("step 5002: the other ranks stopped at " + missed));
  } else {
    CHECK(*stopped0 == 5001);  // at once, with no terminal of its own despite its signal
    CHECK_THAT(closed0.error(), Catch::Contains(missed + " was asked for after this rank had passed it"));
    CHECK_FALSE(log.has("terminal checkpoint at step 5003"));
  }
  CHECK(test::committed_steps(dir.path()).empty());
}

// The same where the rank that missed it is not the writer: rank 9 of 10, below rank 8 in the tree (groups of 8:
// rank 8 leads the second, under rank 0). Rank 8 took the terminal checkpoint and must not wait in close() for a
// count rank 9 will never send up, and rank 9 stops at once.
TEST_CASE("a terminal step a rank below another missed: neither waits", "[hooks][coord][notice]") {
  test::TempDir dir;
  test::LogCapture log;
  constexpr int kWorld = 10, kLate = 9;
  const auto o = [&](int r) {
    Options opt = rank_options(dir.path(), r, {{"interval", "1000000steps"}, {"commit_timeout", "60s"},
                                               {"signals", r == 1 || r == kLate ? "on" : "off"}});
    opt.set("world_size", std::to_string(kWorld));
    return opt;
  };
  std::vector<RankRun> runs(kWorld);
  std::barrier sync(kWorld - 1);
  std::atomic<bool> ahead{false};
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      RankRun& run = runs[static_cast<std::size_t>(r)];
      std::vector<std::uint64_t> w(512, static_cast<std::uint64_t>(r));
      auto created = Checkpointer::create(o(r));
      if (!created) {
        run.error = created.error();
        if (r != kLate) sync.arrive_and_drop();
        return;
      }
      auto cp = std::move(created).value();
      (void)cp->register_region({"w", w.data(), w.size() * 8});
      (void)cp->restore();
      if (r != kLate) {
        while (!ahead) std::this_thread::sleep_for(10ms);
      }
      for (std::uint64_t step = 1; step <= 6000 && !run.stopped_at && run.error.empty(); ++step) {
        if (r == kLate && step == 5001) {  // the others start now; it goes on once rank 1's request came
          ahead = true;
          while (!log.has("reached this rank at step 5000") && std::chrono::steady_clock::now() - started < 30s) {
            std::this_thread::sleep_for(10ms);
          }
        }
        if (r != kLate) {
          std::this_thread::sleep_for(5ms);
          sync.arrive_and_wait();
          if (r == 1 && step == 10) std::raise(SIGUSR1);
        }
        (void)cp->before_update();
        auto stop = cp->after_step(step);
        if (!stop) run.error = stop.error();
        if (stop && *stop) run.stopped_at = step;
      }
      if (r != kLate) sync.arrive_and_drop();
      run.closed = cp->close();
    });
  }
  for (std::thread& t : threads) t.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (const RankRun& run : runs) CHECK(run.error == "");
  for (int r = 0; r < kLate; ++r) {
    INFO("rank " << r);
    CHECK(runs[static_cast<std::size_t>(r)].stopped_at == std::optional<std::uint64_t>(12));
  }
  CHECK(runs[kLate].stopped_at == std::optional<std::uint64_t>(5001));
  CHECK(took < 30);  // the commit's own timeout is 60 s
  REQUIRE_FALSE(runs[0].closed.ok());
  CHECK_THAT(runs[0].closed.error(), Catch::Contains("rank 9 could not persist step 12"));
  CHECK(runs[8].closed.ok());
  REQUIRE_FALSE(runs[kLate].closed.ok());
  CHECK_THAT(runs[kLate].closed.error(), Catch::Contains("the terminal checkpoint of step 12 was asked for after"));
  CHECK(test::committed_steps(dir.path()).empty());
}
