// Guard ordering and back-pressure: the snapshot runs while training goes on, before_update() waits for it and
// for nothing else, and a snapshot due while the previous persist runs waits for it and says so.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "hooks_test_util.hpp"
#include "staging.hpp"

using namespace ckpt;
using namespace ckpt::hooks;
using namespace std::chrono_literals;

namespace {

test::Gate* g_copy_gate = nullptr;
void copy_gate_hook() { g_copy_gate->wait(); }

// Installs the copy hook for a scope.
struct CopyGate {
  test::Gate gate;
  CopyGate() {
    g_copy_gate = &gate;
    set_copy_hook_for_testing(copy_gate_hook);
  }
  ~CopyGate() {
    gate.open();
    set_copy_hook_for_testing(nullptr);
  }
};

std::vector<std::uint64_t> filled(std::size_t words, std::uint64_t value) { return std::vector<std::uint64_t>(words, value); }

bool region_holds(const std::string& root, std::uint64_t step, const std::string& name, std::uint64_t value,
                  std::size_t words) {
  auto bytes = test::read_region(root, step, 0, name);
  if (bytes.size() != words * 8) return false;
  std::vector<std::uint64_t> got(words);
  std::memcpy(got.data(), bytes.data(), bytes.size());
  return got == filled(words, value);
}

}  // namespace

TEST_CASE("the snapshot runs while training goes on; before_update waits for it", "[hooks][guard]") {
  test::TempDir dir;
  test::LogCapture log;
  const std::size_t words = 1 << 17;  // 1 MiB: one copy chunk
  auto state = filled(words, 1);
  CopyGate copy;
  auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1steps"}, {"copy_threads", "1"}}));
  REQUIRE(cp->register_region({"w", state.data(), words * 8}).ok());
  REQUIRE(*cp->restore() == 0);

  // The copy thread is held at the gate with the only chunk: after_step must not wait for it.
  auto after = std::async(std::launch::async, [&] { return *cp->after_step(1); });
  REQUIRE(after.wait_for(5s) == std::future_status::ready);
  CHECK_FALSE(after.get());
  REQUIRE(copy.gate.await_arrivals(1));

  auto guard = std::async(std::launch::async, [&] { return cp->before_update().ok(); });
  CHECK(guard.wait_for(100ms) == std::future_status::timeout);  // blocked: the snapshot has not copied yet
  copy.gate.open();
  REQUIRE(guard.wait_for(5s) == std::future_status::ready);
  CHECK(guard.get());

  // The update right after the guard must not reach the checkpoint of step 1.
  state.assign(words, 2);
  REQUIRE(cp->close().ok());
  CHECK(region_holds(dir.path(), 1, "w", 1, words));
  CHECK(cp->stats().committed == 1);
}

TEST_CASE("sync regions are copied inside after_step", "[hooks][guard]") {
  test::TempDir dir;
  test::LogCapture log;
  auto params = filled(1024, 1);
  auto stats = filled(16, 1);  // like BatchNorm statistics: a forward pass changes them before the next update
  CopyGate copy;
  auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1steps"}, {"copy_threads", "1"}}));
  REQUIRE(cp->register_region({"params", params.data(), params.size() * 8}).ok());
  REQUIRE(cp->register_region({"stats", stats.data(), stats.size() * 8, Memory::Host, true}).ok());
  REQUIRE_FALSE(*cp->after_step(1));
  stats.assign(16, 2);  // the next forward pass, while the asynchronous copy of params is still held
  copy.gate.open();
  REQUIRE(cp->before_update().ok());
  params.assign(1024, 2);
  REQUIRE(cp->close().ok());
  CHECK(region_holds(dir.path(), 1, "stats", 1, 16));
  CHECK(region_holds(dir.path(), 1, "params", 1, 1024));
}

TEST_CASE("training never waits for a persist, except when the next snapshot is due; that is reported",
          "[hooks][guard][backpressure]") {
  test::TempDir dir;
  test::LogCapture log;
  const std::size_t words = 4096;
  auto state = filled(words, 1);
  test::Gate persist_gate;
  std::atomic<int> opened{0};
  auto o = test::options({{"dir", dir.path()}, {"interval", "1steps"}});
  o.persist_observer = [&](store::SavePhase phase) {
    // Hold the first persist right after it opened its shard.
    if (phase == store::SavePhase::ShardOpened && opened.fetch_add(1) == 0) persist_gate.wait();
  };
  auto cp = test::make(o);
  REQUIRE(cp->register_region({"w", state.data(), words * 8}).ok());
  REQUIRE(*cp->restore() == 0);

  REQUIRE_FALSE(*cp->after_step(1));
  REQUIRE(persist_gate.await_arrivals(1));
  auto guard = std::async(std::launch::async, [&] { return cp->before_update().ok(); });
  REQUIRE(guard.wait_for(5s) == std::future_status::ready);  // the persist is held; the guard is not
  CHECK(guard.get());
  state.assign(words, 2);

  auto next = std::async(std::launch::async, [&] { return *cp->after_step(2); });
  CHECK(next.wait_for(100ms) == std::future_status::timeout);  // back-pressure: staging is still being written
  persist_gate.open();
  REQUIRE(next.wait_for(10s) == std::future_status::ready);
  CHECK_FALSE(next.get());
  REQUIRE(cp->before_update().ok());
  state.assign(words, 3);
  REQUIRE(cp->close().ok());

  Stats s = cp->stats();
  CHECK(s.backpressure_waits == 1);
  CHECK(s.backpressure_s >= 0.09);
  CHECK(s.last_stall_s >= 0.09);  // the wait is part of what training lost to that checkpoint
  CHECK(log.has("back-pressure: the checkpoint of step 2 waited"));
  CHECK(region_holds(dir.path(), 1, "w", 1, words));
  CHECK(region_holds(dir.path(), 2, "w", 2, words));
}

TEST_CASE("a snapshot not guarded by before_update is finished before the next one", "[hooks][guard]") {
  test::TempDir dir;
  test::LogCapture log;
  auto state = filled(1 << 16, 7);
  auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1steps"}}));
  REQUIRE(cp->register_region({"w", state.data(), state.size() * 8}).ok());
  for (std::uint64_t step = 1; step <= 3; ++step) REQUIRE_FALSE(*cp->after_step(step));
  REQUIRE(cp->close().ok());
  CHECK(test::committed_steps(dir.path()) == std::vector<std::uint64_t>{1, 2, 3});
  for (std::uint64_t step = 1; step <= 3; ++step) CHECK(region_holds(dir.path(), step, "w", 7, state.size()));
}

TEST_CASE("the loop's contract is checked", "[hooks][guard]") {
  test::TempDir dir;
  test::LogCapture log;
  std::uint64_t x = 1;
  auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1h"}}));
  REQUIRE(cp->register_region({"x", &x, sizeof x}).ok());
  REQUIRE_FALSE(*cp->after_step(5));
  SECTION("steps must increase") {
    auto again = cp->after_step(5);
    REQUIRE_FALSE(again.ok());
    CHECK(again.error() == "ckpt: step 5 follows step 5: steps must increase");
    CHECK_FALSE(cp->after_step(4).ok());
    CHECK(cp->after_step(6).ok());
  }
  SECTION("restore comes before the first step") {
    auto r = cp->restore();
    REQUIRE_FALSE(r.ok());
    CHECK(r.error() == "ckpt: restore() must come before the first after_step()");
  }
  SECTION("a terminal save stops the loop and is committed as terminal") {
    REQUIRE(cp->save(6, store::Kind::Terminal).ok());
    CHECK(*cp->after_step(7));
    REQUIRE(cp->close().ok());
    auto m = store::read_manifest(dir.path(), 6);
    REQUIRE(m.ok());
    CHECK(m->kind == store::Kind::Terminal);
    CHECK_FALSE(cp->save(6).ok());
  }
  SECTION("region names are checked") {
    CHECK(cp->register_region({"", &x, sizeof x}).error() == "ckpt: a region needs a name");
    CHECK_FALSE(cp->register_region({"y", nullptr, 8}).ok());
    CHECK_FALSE(cp->register_region({"y", &x, sizeof x, Memory::Host, false, "{not json"}).ok());
    CHECK_FALSE(cp->put_blob("x", "a", 1).ok());  // a region has that name
    CHECK_FALSE(cp->set_regions({{"a", &x, 8}, {"a", &x, 8}}).ok());
  }
  REQUIRE(cp->close().ok());
}
