// The engine's pools for probes and checkpoint reads: a global bound on what runs at once, whatever the number of
// failing jobs, and results and exceptions through futures.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "task_pool.hpp"

using ckpt::controller::TaskPool;

TEST_CASE("task pool: at most its threads run at once, every task runs", "[controller][security]") {
  TaskPool pool(3);
  REQUIRE(pool.threads() == 3);
  std::atomic<int> running{0}, most{0};
  std::vector<std::future<int>> results;
  for (int i = 0; i < 40; ++i) {
    results.push_back(pool.submit([&, i] {
      const int now = ++running;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      --running;
      return i * 2;
    }));
  }
  for (int i = 0; i < 40; ++i) CHECK(results[static_cast<std::size_t>(i)].get() == i * 2);
  CHECK(most.load() <= 3);
  CHECK(most.load() >= 2);
}

TEST_CASE("task pool: an exception reaches the future; no thread runs work inline", "[controller]") {
  TaskPool pool(1);
  auto failing = pool.submit([]() -> int { throw std::runtime_error("probe failed"); });
  CHECK_THROWS_WITH(failing.get(), "probe failed");
  TaskPool none(0);  // a host out of threads at start
  CHECK(none.threads() == 0);
  const auto caller = std::this_thread::get_id();
  CHECK(none.submit([&] { return std::this_thread::get_id() == caller; }).get());
}
