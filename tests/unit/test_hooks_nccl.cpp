// The NCCL watcher's logic (poll, abort, report) against a stand-in NCCL defined in this executable, which exports
// it, so the watcher's lookup in the process finds it exactly as it finds a linked NCCL. The real NCCL is
// exercised by the gpu-labelled test (tests/hooks/gpu_test.cpp).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hooks_test_util.hpp"
#include "nccl_watch.hpp"

namespace {

struct FakeComm {
  std::atomic<int> async_error{0};  // what ncclCommGetAsyncError reports
  std::atomic<int> aborts{0};
  std::atomic<int> polls{0};
};

}  // namespace

extern "C" {
__attribute__((visibility("default"))) int ncclCommGetAsyncError(void* comm, int* async_error) {
  auto* c = static_cast<FakeComm*>(comm);
  c->polls++;
  *async_error = c->async_error.load();
  return 0;
}
__attribute__((visibility("default"))) int ncclCommAbort(void* comm) {
  static_cast<FakeComm*>(comm)->aborts++;
  return 0;
}
__attribute__((visibility("default"))) const char* ncclGetErrorString(int result) {
  return result == 6 ? "remote process exited or there was a network error" : "some error";
}
}

using namespace ckpt::hooks;
using namespace std::chrono_literals;

TEST_CASE("the NCCL watcher aborts a failed communicator and reports it once", "[hooks][nccl]") {
  std::mutex mu;
  std::vector<std::string> reports;
  NcclWatch::Hooks hooks;
  hooks.on_error = [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    reports.push_back(why);
  };
  auto watch = NcclWatch::start(hooks, 10ms);
  REQUIRE(watch.ok());
  FakeComm healthy, failing;
  REQUIRE((*watch)->add(&healthy).ok());
  REQUIRE((*watch)->add(&failing).ok());
  REQUIRE((*watch)->add(&failing).ok());  // twice is once
  CHECK_FALSE((*watch)->add(nullptr).ok());

  REQUIRE(test::wait_for([&] { return healthy.polls > 3 && failing.polls > 3; }, 2s));
  CHECK(failing.aborts == 0);  // ncclSuccess: nothing to do
  failing.async_error = 7;     // ncclInProgress is not an error
  std::this_thread::sleep_for(60ms);
  CHECK(failing.aborts == 0);

  failing.async_error = 6;  // ncclRemoteError: a peer is gone
  REQUIRE(test::wait_for([&] { return failing.aborts == 1; }, 2s));
  REQUIRE(test::wait_for([&] {
    std::lock_guard<std::mutex> lock(mu);
    return reports.size() == 1;
  }, 2s));
  {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(reports[0] ==
          "a watched NCCL communicator reported NCCL error 6 (remote process exited or there was a network error); "
          "aborted it");
  }
  const int polls_after_abort = failing.polls;
  std::this_thread::sleep_for(60ms);
  CHECK(failing.polls == polls_after_abort);  // an aborted communicator is freed: never touched again
  CHECK(failing.aborts == 1);
  CHECK(healthy.aborts == 0);
  CHECK((*watch)->aborted() == 1);

  (*watch)->abort_all("test");
  (*watch)->abort_all("again");
  CHECK(healthy.aborts == 1);
  CHECK(failing.aborts == 1);
  CHECK((*watch)->aborted() == 2);
  std::lock_guard<std::mutex> lock(mu);
  CHECK(reports.size() == 1);
}

TEST_CASE("the NCCL watcher aborts every communicator once the last words start", "[hooks][nccl]") {
  std::atomic<bool> last_words{false};
  NcclWatch::Hooks hooks;
  hooks.abort_requested = [&] { return last_words.load(); };
  auto watch = NcclWatch::start(hooks, 10ms);
  REQUIRE(watch.ok());
  FakeComm a, b;
  REQUIRE((*watch)->add(&a).ok());
  REQUIRE((*watch)->add(&b).ok());
  std::this_thread::sleep_for(50ms);
  CHECK(a.aborts + b.aborts == 0);
  const auto t0 = std::chrono::steady_clock::now();
  last_words = true;
  REQUIRE(test::wait_for([&] { return a.aborts == 1 && b.aborts == 1; }, 2s));
  CHECK(std::chrono::steady_clock::now() - t0 < 500ms);  // one poll period, with a margin for a loaded machine
  std::this_thread::sleep_for(50ms);
  CHECK(a.aborts == 1);
  CHECK(b.aborts == 1);
}

TEST_CASE("watch_nccl on a checkpointer reports an NCCL failure in the log", "[hooks][nccl]") {
  test::TempDir dir;
  test::LogCapture log;
  auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1000steps"}}));
  FakeComm comm;
  REQUIRE(cp->watch_nccl(&comm).ok());
  comm.async_error = 3;  // ncclInternalError
  REQUIRE(test::wait_for([&] { return comm.aborts == 1; }, 2s));
  REQUIRE(test::wait_for(
      [&] { return log.has("a watched NCCL communicator reported NCCL error 3 (some error)"); }, 2s));
  REQUIRE(cp->close().ok());
  FakeComm after;
  CHECK(cp->watch_nccl(&after).ok());  // closed: nothing is watched any more
  std::this_thread::sleep_for(50ms);
  CHECK(after.polls == 0);
}
