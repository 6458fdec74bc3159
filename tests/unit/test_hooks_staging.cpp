#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "hooks_test_util.hpp"
#include "staging.hpp"

using namespace ckpt;
using namespace ckpt::hooks;

namespace {

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7 + (i >> 9)) & 0xff);
  return v;
}

test::Gate* g_gate = nullptr;
void gate_hook() { g_gate->wait(); }

}  // namespace

TEST_CASE("plan_staging lays regions out aligned and back to back", "[hooks][staging]") {
  std::vector<std::byte> a(100), b(1), c(64);
  std::vector<RegionSpec> regions = {{"a", a.data(), a.size()},
                                     {"dev", a.data(), 10, Memory::Device},
                                     {"b", b.data(), b.size()},
                                     {"empty", nullptr, 0},
                                     {"c", c.data(), c.size()}};
  StagingPlan plan = plan_staging(regions);
  REQUIRE(plan.host.size() == 4);
  REQUIRE(plan.device.size() == 1);
  CHECK(plan.host[0].offset == 0);
  CHECK(plan.host[1].offset == 128);  // after 100 bytes, aligned to 64
  CHECK(plan.host[1].region == 2);
  CHECK(plan.host[2].offset == 192);
  CHECK(plan.host[3].offset == 192);  // an empty region takes no room
  CHECK(plan.host_bytes == 256);
  CHECK(plan.device[0].region == 1);
  CHECK(plan.device_bytes == 10);
  for (const Slot& s : plan.host) CHECK(s.offset % kStagingAlign == 0);
  // Padding is bounded: state + 63 bytes per region.
  CHECK(plan.host_bytes <= 100 + 1 + 0 + 64 + 63 * 4);
}

TEST_CASE("split_copies covers every byte once", "[hooks][staging]") {
  std::vector<std::byte> src(1000), dst(1000);
  auto chunks = split_copies({{dst.data(), src.data(), 1000}, {dst.data(), src.data(), 0}}, 300);
  REQUIRE(chunks.size() == 4);
  CHECK(chunks[3].size == 100);
  std::size_t total = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    CHECK(chunks[i].dst == dst.data() + total);
    total += chunks[i].size;
  }
  CHECK(total == 1000);
}

TEST_CASE("HostBuffer maps whole pages once and moves", "[hooks][staging]") {
  auto empty = HostBuffer::allocate(0);
  REQUIRE(empty.ok());
  CHECK(empty->data() == nullptr);
  auto one = HostBuffer::allocate(1);
  REQUIRE(one.ok());
  CHECK(one->size() == static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
  std::byte* p = one->data();
  p[0] = std::byte{7};
  HostBuffer moved = std::move(one).value();
  CHECK(moved.data() == p);
  CHECK(moved.data()[0] == std::byte{7});
}

TEST_CASE("CopyPool copies every chunk, with or without threads, batch after batch", "[hooks][staging]") {
  for (unsigned threads : {0u, 1u, 3u}) {
    INFO("threads " << threads);
    CopyPool pool(threads);
    for (unsigned round = 0; round < 4; ++round) {
      std::vector<std::vector<std::byte>> src, dst;
      std::vector<CopyChunk> copies;
      for (std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{1} << 20, std::size_t{777777}}) {
        src.push_back(pattern(n, round * 10 + static_cast<unsigned>(src.size())));
        dst.emplace_back(n);
        copies.push_back({dst.back().data(), src.back().data(), n});
      }
      pool.start(split_copies(copies, 65536));
      if (round % 2 == 0) {
        pool.help_and_wait();
      } else {
        pool.wait();
      }
      CHECK(pool.idle());
      for (std::size_t i = 0; i < src.size(); ++i) CHECK((src[i] == dst[i]));
    }
  }
}

TEST_CASE("CopyPool: wait and help_and_wait return only when the last chunk is copied", "[hooks][staging][guard]") {
  test::Gate gate;
  g_gate = &gate;
  set_copy_hook_for_testing(gate_hook);
  {
    CopyPool pool(2);
    auto src = pattern(1 << 16, 1);
    std::vector<std::byte> dst(src.size());
    pool.start(split_copies({{dst.data(), src.data(), src.size()}}, 4096));
    std::atomic<bool> waited{false}, helped{false};
    std::thread waiter([&] {
      pool.wait();
      waited = true;
    });
    std::thread helper([&] {
      pool.help_and_wait();
      helped = true;
    });
    REQUIRE(gate.await_arrivals(3));  // both copy threads and the helper hold a chunk
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(waited);
    CHECK_FALSE(helped);
    CHECK_FALSE(pool.idle());
    gate.open();
    waiter.join();
    helper.join();
    CHECK(waited);
    CHECK(helped);
    CHECK((dst == src));
  }
  set_copy_hook_for_testing(nullptr);
  g_gate = nullptr;
}

TEST_CASE("staging is allocated once, in the background, and reused", "[hooks][staging]") {
  test::TempDir dir;
  test::LogCapture log;
  auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1steps"}, {"copy_threads", "2"}}));
  std::vector<std::byte> big = pattern(3u << 20, 1), odd = pattern(12345, 2), tiny = pattern(3, 3);
  REQUIRE(cp->register_region({"big", big.data(), big.size()}).ok());
  REQUIRE(cp->register_region({"odd", odd.data(), odd.size()}).ok());
  REQUIRE(cp->register_region({"tiny", tiny.data(), tiny.size(), Memory::Host, true}).ok());
  REQUIRE(cp->put_blob("extra", "hello", 5).ok());
  REQUIRE(*cp->restore() == 0);
  const std::uint64_t state = big.size() + odd.size() + tiny.size();
  std::uint64_t staging = 0;
  for (std::uint64_t step = 1; step <= 4; ++step) {
    REQUIRE(cp->before_update().ok());
    big[step] = std::byte{0xff};
    REQUIRE_FALSE(*cp->after_step(step));
    Stats s = cp->stats();
    if (step == 1) staging = s.staging_bytes;
    CHECK(s.staging_bytes == staging);  // never re-allocated
    CHECK(s.state_bytes == state);
  }
  REQUIRE(cp->close().ok());
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  CHECK(staging >= state);
  CHECK(staging <= state + 3 * 63 + page);  // 1x state plus alignment and page rounding
  CHECK(cp->stats().blob_bytes == 5);
  CHECK_FALSE(log.has("inside the snapshot"));  // the background allocation was ready in time
  CHECK(test::committed_steps(dir.path()).back() == 4);
}

TEST_CASE("staging grows once the restored state is loaded, not while the restore runs", "[hooks][staging]") {
  // A restore from memory needs no staging: mapping gigabytes then would hold it up and share the CPU with it.
  using namespace std::chrono_literals;
  test::TempDir dir;
  test::LogCapture log;
  auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1steps"}}));
  std::vector<std::byte> big = pattern(3u << 20, 1);
  REQUIRE(cp->register_region({"big", big.data(), big.size()}).ok());
  std::this_thread::sleep_for(300ms);  // time enough for a background growth of 3 MiB, were it started
  CHECK(cp->stats().staging_bytes == 0);
  SECTION("restore() copying into the regions: at its end") {
    REQUIRE(*cp->restore() == 0);
  }
  SECTION("restore() leaving the load to the program: at its next registration") {
    REQUIRE(*cp->restore(false) == 0);
    std::this_thread::sleep_for(300ms);
    CHECK(cp->stats().staging_bytes == 0);
    REQUIRE(cp->register_region({"big", big.data(), big.size()}).ok());
  }
  CHECK(test::wait_for([&] { return cp->stats().staging_bytes >= big.size(); }, 5s));
  REQUIRE(cp->before_update().ok());
  REQUIRE_FALSE(*cp->after_step(1));
  REQUIRE(cp->close().ok());
  CHECK_FALSE(log.has("inside the snapshot"));
  CHECK(test::committed_steps(dir.path()).back() == 1);
}

TEST_CASE("staging of a program without a restore grows at its first step", "[hooks][staging]") {
  test::TempDir dir;
  auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1steps"}}));
  std::vector<std::byte> big = pattern(1u << 20, 1);
  REQUIRE(cp->register_region({"big", big.data(), big.size()}).ok());
  REQUIRE(cp->before_update().ok());
  REQUIRE_FALSE(*cp->after_step(1));
  CHECK(cp->stats().staging_bytes >= big.size());
  REQUIRE(cp->close().ok());
  CHECK(test::committed_steps(dir.path()).back() == 1);
}

TEST_CASE("buffer reserve: kept while open, taken by size, emptied by a request it cannot fill",
          "[hooks][staging][reserve]") {
  BufferReserve& reserve = BufferReserve::process();
  reserve.close();
  const std::size_t mib = 1u << 20;
  auto make = [](std::size_t bytes) { return std::move(HostBuffer::allocate(bytes)).value(); };
  reserve.give(make(mib));
  CHECK(reserve.kept_bytes() == 0);  // closed: unmapped at once
  reserve.open();
  HostBuffer one = make(mib), two = make(2 * mib), big = make(16 * mib);
  std::byte* one_at = one.data();
  std::byte* two_at = two.data();
  reserve.give(std::move(two));
  reserve.give(std::move(one));
  reserve.give(std::move(big));
  CHECK(reserve.kept_bytes() == 19 * mib);
  SECTION("the smallest that fits, never one much larger") {
    auto a = reserve.take_or_allocate(mib - 100);
    REQUIRE(a);
    CHECK(a->data() == one_at);
    auto b = reserve.take_or_allocate(2 * mib);
    REQUIRE(b);
    CHECK(b->data() == two_at);
    CHECK(reserve.kept_bytes() == 16 * mib);
    auto c = reserve.take_or_allocate(8 * mib);  // 16 MiB is twice that: a miss, which lets go of it first
    REQUIRE(c);
    CHECK(c->size() == 8 * mib);
    CHECK(reserve.kept_bytes() == 0);
  }
  SECTION("a file's pages that no node tier handed over are never kept") {
    test::TempDir dir;
    const std::string path = dir.path() + "/f";
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
    REQUIRE(fd >= 0);
    auto file = HostBuffer::map_file(fd, mib, true);
    ::close(fd);
    REQUIRE(file);
    CHECK_FALSE(file->anonymous());
    reserve.give(std::move(file).value());
    CHECK(reserve.kept_bytes() == 19 * mib);
  }
  SECTION("close lets go of everything, and of what comes later") {
    reserve.close();
    CHECK(reserve.kept_bytes() == 0);
    reserve.give(make(mib));
    CHECK(reserve.kept_bytes() == 0);
  }
  reserve.close();
}

TEST_CASE("buffer reserve: the next checkpointer's staging takes the buffer the last one left",
          "[hooks][staging][reserve]") {
  using namespace std::chrono_literals;
  BufferReserve& reserve = BufferReserve::process();
  const std::size_t mib = 1u << 20;
  reserve.open();
  reserve.give(std::move(HostBuffer::allocate(3 * mib)).value());  // the size the staging below asks for
  reserve.give(std::move(HostBuffer::allocate(16 * mib)).value());  // one it has no use for
  test::TempDir dir;
  auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1steps"}}));
  std::vector<std::byte> big = pattern(3 * mib, 1);
  REQUIRE(cp->register_region({"big", big.data(), big.size()}).ok());
  REQUIRE(*cp->restore() == 0);
  CHECK(test::wait_for([&] { return cp->stats().staging_bytes >= big.size(); }, 5s));
  CHECK(reserve.kept_bytes() == 16 * mib);  // taken, not emptied by a miss
  for (std::uint64_t step = 1; step <= 3; ++step) {
    REQUIRE(cp->before_update().ok());
    REQUIRE_FALSE(*cp->after_step(step));
  }
  CHECK(reserve.kept_bytes() == 0);  // the third snapshot let go of what nothing took
  REQUIRE(cp->close().ok());
  CHECK(test::committed_steps(dir.path()).back() == 3);
}
