// Restore: bitwise, newest complete first, walking back past a checkpoint that does not load (marking it FAILED),
// honoring the plugin's choice, and refusing a checkpoint that does not fit.
#include <catch2/catch.hpp>

#include <numeric>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <fstream>
#include <thread>
#include <vector>

#include "hooks_test_util.hpp"
#include "restore_agreement.hpp"
#include "store_test_util.hpp"

using namespace ckpt;
using namespace ckpt::hooks;

namespace {

// The state at `step`: every byte depends on the step and its position.
std::vector<unsigned char> state_at(std::size_t n, std::uint64_t step) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 2654435761u + step * 97) >> 7);
  return v;
}

// Trains steps 1..last with a checkpoint at each, into dir.
void train(const std::string& dir, std::uint64_t last) {
  auto a = state_at(1 << 20, 0), b = state_at(100, 0);
  auto cp = test::make(test::options({{"dir", dir}, {"interval", "1steps"}, {"keep", "10"}}));
  REQUIRE(cp->register_region({"a", a.data(), a.size()}).ok());
  REQUIRE(cp->register_region({"b", b.data(), b.size(), Memory::Host, false, R"({"dtype":"uint8"})"}).ok());
  REQUIRE(*cp->restore() == 0);
  for (std::uint64_t step = 1; step <= last; ++step) {
    REQUIRE(cp->before_update().ok());
    auto next_a = state_at(a.size(), step), next_b = state_at(b.size(), step);
    std::copy(next_a.begin(), next_a.end(), a.begin());  // the update: same buffers, new bytes
    std::copy(next_b.begin(), next_b.end(), b.begin());
    std::string extra = "step " + std::to_string(step);
    REQUIRE(cp->put_blob("extra", extra.data(), extra.size()).ok());
    REQUIRE_FALSE(*cp->after_step(step));
  }
  REQUIRE(cp->close().ok());
}

struct Restored {
  Result<std::uint64_t> step = Error{"not run"};
  std::vector<unsigned char> a, b;
  std::string extra;
};

Restored restore_from(const Options& o, std::size_t a_size = 1 << 20) {
  Restored r;
  r.a.assign(a_size, 0);
  r.b.assign(100, 0);
  auto cp = test::make(o);
  REQUIRE(cp->register_region({"a", r.a.data(), r.a.size()}).ok());
  REQUIRE(cp->register_region({"b", r.b.data(), r.b.size()}).ok());
  r.step = cp->restore();
  for (const RestoredRegion& x : cp->restored()) {
    if (x.name == "extra") r.extra.assign(reinterpret_cast<const char*>(x.data), x.size);
    if (x.name == "b") CHECK(x.meta_json == R"({"dtype":"uint8"})");
  }
  REQUIRE(cp->close().ok());
  return r;
}


}  // namespace

TEST_CASE("restore loads the newest complete checkpoint bitwise", "[hooks][restore]") {
  test::TempDir dir;
  test::LogCapture log;
  SECTION("nothing to restore") {
    auto r = restore_from(test::options({{"dir", dir.sub("none")}}));
    REQUIRE(r.step.ok());
    CHECK(*r.step == 0);
    CHECK((r.a == std::vector<unsigned char>(1 << 20, 0)));
  }
  train(dir.path(), 3);
  SECTION("the newest") {
    auto r = restore_from(test::options({{"dir", dir.path()}}));
    REQUIRE(r.step.ok());
    CHECK(*r.step == 3);
    CHECK((r.a == state_at(1 << 20, 3)));
    CHECK((r.b == state_at(100, 3)));
    CHECK(r.extra == "step 3");
  }
  SECTION("a corrupt newest checkpoint is marked FAILED and skipped") {
    store::test::flip_byte(dir.path() + "/" + store::step_dir_name(3) + "/" + store::shard_file_name(0), 4321);
    auto r = restore_from(test::options({{"dir", dir.path()}}));
    REQUIRE(r.step.ok());
    CHECK(*r.step == 2);
    CHECK((r.a == state_at(1 << 20, 2)));
    CHECK(r.extra == "step 2");
    auto entries = store::scan(dir.path());
    REQUIRE(entries.ok());
    CHECK(entries->back().step == 3);
    CHECK(entries->back().state == store::State::Failed);
    CHECK(log.has("marked FAILED"));
  }
  SECTION("the plugin's choice comes first") {
    auto r = restore_from(test::options({{"dir", dir.path()}, {"resume_step", "1"}}));
    REQUIRE(r.step.ok());
    CHECK(*r.step == 1);
    CHECK((r.a == state_at(1 << 20, 1)));
    auto p = restore_from(test::options({{"dir", dir.path()}, {"resume_path", dir.path() + "/000000000002"}}));
    REQUIRE(p.step.ok());
    CHECK(*p.step == 2);
  }
  SECTION("a plugin's choice whose manifest is gone falls back to the newest complete one") {
    REQUIRE(::unlink((dir.path() + "/" + store::step_dir_name(1) + "/MANIFEST.json").c_str()) == 0);
    auto r = restore_from(test::options({{"dir", dir.path()}, {"resume_step", "1"}}));
    REQUIRE(r.step.ok());
    CHECK(*r.step == 3);
    CHECK(log.has("does not verify"));
  }
  SECTION("a plugin's choice whose shard does not load is marked FAILED; the newest that loads comes next") {
    store::test::flip_byte(dir.path() + "/" + store::step_dir_name(1) + "/" + store::shard_file_name(0), 10);
    auto r = restore_from(test::options({{"dir", dir.path()}, {"resume_step", "1"}}));
    REQUIRE(r.step.ok());
    CHECK(*r.step == 3);
    CHECK(log.has("checksum mismatch"));
    CHECK(log.has("marked FAILED"));
    auto entries = store::scan(dir.path());
    REQUIRE(entries.ok());
    CHECK(entries->front().state == store::State::Failed);
  }
  SECTION("a checkpoint that does not fit the registered state is refused") {
    auto r = restore_from(test::options({{"dir", dir.path()}}), 1000);
    REQUIRE_FALSE(r.step.ok());
    CHECK(r.step.error() == "ckpt: region 'a' is 1000 bytes; step 3 has 1048576");
    auto cp = test::make(test::options({{"dir", dir.path()}}));
    int c = 0;
    REQUIRE(cp->register_region({"c", &c, sizeof c}).ok());
    CHECK(cp->restore().error() == "ckpt: step 3 has no region 'c'");
  }
  SECTION("a data-parallel checkpoint restores into another world size, replica by replica") {
    std::vector<Restored> r(2);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        r[static_cast<std::size_t>(rank)] = restore_from(test::options(
            {{"dir", dir.path()}, {"rank", std::to_string(rank)}, {"world_size", "2"}}));
      });
    }
    for (auto& t : ranks) t.join();
    for (const Restored& x : r) {
      REQUIRE(x.step.ok());
      CHECK(*x.step == 3);
      CHECK((x.a == state_at(1 << 20, 3)));
    }
    CHECK(log.has("step 3 was written by 1 data-parallel ranks; this run has 2: rank r loads the replica of rank r % 1"));
  }
}

TEST_CASE("a tensor-parallel checkpoint whose regions do not say where they lie restores onto its own layout only",
          "[hooks][restore]") {
  test::TempDir dir;
  test::LogCapture log;
  // Two tensor-parallel ranks, each with half of the model.
  for (int rank = 0; rank < 2; ++rank) {
    auto w = store::ShardWriter::open(dir.path(), 4, rank);
    REQUIRE(w.ok());
    REQUIRE(w->append("a", "xy", 2).ok());
    REQUIRE(w->finish().ok());
  }
  store::Manifest m;
  m.step = 4;
  m.world_size = 2;
  m.layout = store::Layout{1, 2, 1, false};
  m.ranks = {{0, 0, 0, 0}, {1, 0, 1, 0}};
  REQUIRE(store::commit(dir.path(), m).ok());
  auto cp = test::make(test::options({{"dir", dir.path()}}));
  char a[2] = {};
  REQUIRE(cp->register_region({"a", a, sizeof a, Memory::Host, false, "{}"}).ok());
  auto r = cp->restore(false);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error() == "ckpt: step 4: 'a' was saved by 2 tensor-parallel ranks without its place in the whole tensor "
                     "(global_shape, offset): it restores onto its own layout only");
  // The same world size: no question of replicas.
  std::vector<Result<std::uint64_t>> steps(2, Error{"not run"});
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      auto dp = test::make(test::options(
          {{"dir", dir.path()}, {"rank", std::to_string(rank)}, {"world_size", "2"}}));
      steps[static_cast<std::size_t>(rank)] = dp->restore(false);
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& step : steps) CHECK(*step == 4);
}

TEST_CASE("a start discards incomplete saves newer than the resume step", "[hooks][restore]") {
  test::TempDir dir;
  test::LogCapture log;
  train(dir.path(), 2);
  {
    // A save of step 5 that died after its shard: records but no manifest.
    auto w = store::ShardWriter::open(dir.path(), 5, 0);
    REQUIRE(w.ok());
    REQUIRE(w->append("a", "x", 1).ok());
    REQUIRE(w->finish().ok());
  }
  auto r = restore_from(test::options({{"dir", dir.path()}}));
  REQUIRE(r.step.ok());
  CHECK(*r.step == 2);
  auto entries = store::scan(dir.path());
  REQUIRE(entries.ok());
  for (const store::Entry& e : *entries) CHECK(e.step != 5);
  CHECK(log.has("discarded the incomplete checkpoint of step 5"));
}

namespace {

constexpr std::size_t kShardBytes = 4u << 20;

// A committed checkpoint of `world` ranks at `step`: rank r's region "a" holds state_at(kShardBytes, step + r).
void write_job_checkpoint(const std::string& dir, std::uint64_t step, int world) {
  store::Manifest m;
  m.step = step;
  m.world_size = world;
  m.layout = store::Layout{world, 1, 1, false};
  for (int rank = 0; rank < world; ++rank) {
    m.ranks.push_back(m.layout.coord_of(rank));
    auto w = store::ShardWriter::open(dir, step, rank);
    REQUIRE(w.ok());
    auto bytes = state_at(kShardBytes, step + static_cast<std::uint64_t>(rank));
    REQUIRE(w->append("a", bytes.data(), bytes.size()).ok());
    w->add_covers(store::state_keys_of_rank(m.layout, m.ranks.back()));
    REQUIRE(w->finish().ok());
  }
  REQUIRE(store::commit(dir, m).ok());
}

struct RankRestore {
  Result<std::uint64_t> step = Error{"not run"};
  std::vector<unsigned char> a;
  std::uint64_t read_bytes = 0;
};

// Every rank of a `world`-rank job restores at once, each on its own thread, as separate processes would.
std::vector<RankRestore> restore_job(const std::string& dir, int world, const std::string& run_id) {
  std::vector<RankRestore> out(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      RankRestore& me = out[static_cast<std::size_t>(rank)];
      me.a.assign(kShardBytes, 0);
      auto cp = test::make(test::options({{"dir", dir}, {"rank", std::to_string(rank)},
                                          {"world_size", std::to_string(world)},
                                          {"run_id", run_id}, {"copy_threads", "0"}}));
      if (!cp->register_region({"a", me.a.data(), me.a.size()})) return;
      std::uint64_t before = store::test::thread_rchar();
      me.step = cp->restore();
      me.read_bytes = store::test::thread_rchar() - before;
      (void)cp->close();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

TEST_CASE("every rank reads its own shard once at restore, checked as it is read", "[hooks][restore]") {
  test::TempDir dir;
  test::LogCapture log;
  write_job_checkpoint(dir.path(), 2, 4);
  write_job_checkpoint(dir.path(), 3, 4);
  std::vector<RankRestore> ranks = restore_job(dir.path(), 4, "io");
  for (int rank = 0; rank < 4; ++rank) {
    const RankRestore& r = ranks[static_cast<std::size_t>(rank)];
    CAPTURE(rank);
    REQUIRE(r.step.ok());
    CHECK(*r.step == 3);
    CHECK((r.a == state_at(kShardBytes, 3 + static_cast<std::uint64_t>(rank))));
    // Its shard, once, and a few small files (its record; rank 0 the manifest; the agreement's files).
    CHECK(r.read_bytes >= kShardBytes);
    CHECK(r.read_bytes < kShardBytes + (64u << 10));
  }
}

TEST_CASE("a shard that does not load walks every rank back to the same step, marked FAILED once",
          "[hooks][restore]") {
  test::TempDir dir;
  test::LogCapture log;
  write_job_checkpoint(dir.path(), 2, 4);
  write_job_checkpoint(dir.path(), 3, 4);
  const std::string step3 = dir.path() + "/" + store::step_dir_name(3) + "/";
  SECTION("a corrupt shard is found by the rank that loads it") {
    store::test::flip_byte(step3 + store::shard_file_name(2), 12345);
    std::vector<RankRestore> ranks = restore_job(dir.path(), 4, "corrupt");
    for (int rank = 0; rank < 4; ++rank) {
      const RankRestore& r = ranks[static_cast<std::size_t>(rank)];
      CAPTURE(rank);
      REQUIRE(r.step.ok());
      CHECK(*r.step == 2);
      CHECK((r.a == state_at(kShardBytes, 2 + static_cast<std::uint64_t>(rank))));
    }
    CHECK(log.has("rank 2: step 3: shard rank-00002.shard (rank 2): checksum mismatch"));
    std::ifstream failed(step3 + "FAILED");
    std::string reason;
    std::getline(failed, reason);
    CHECK(reason.rfind("rank 2: step 3: shard rank-00002.shard (rank 2): checksum mismatch", 0) == 0);
  }
  SECTION("a missing shard, as the plugin's choice: the plugin checks manifests only") {
    REQUIRE(::unlink((step3 + store::shard_file_name(1)).c_str()) == 0);
    auto plugin = store::resolve_resume(dir.path(), store::ResolveOptions{true, std::nullopt, false, {}, {}});
    REQUIRE(plugin.step == 3u);
    std::vector<RankRestore> ranks = restore_job(dir.path(), 4, "missing");
    for (const RankRestore& r : ranks) {
      REQUIRE(r.step.ok());
      CHECK(*r.step == 2);
    }
    CHECK(log.has("rank 1: step 3: shard rank-00001.shard (rank 1): missing"));
    CHECK(store::scan(dir.path())->back().state == store::State::Failed);
  }
  SECTION("a launch that reuses a run id is refused, not sent to an old plan") {
    REQUIRE(restore_job(dir.path(), 4, "again")[0].step.ok());
    std::vector<RankRestore> ranks = restore_job(dir.path(), 4, "again");
    CHECK_FALSE(ranks[0].step.ok());
    CHECK_THAT(ranks[0].step.error(), Catch::Contains("give each launch its own CKPT_RUN_ID"));
  }
}

TEST_CASE("a survivor's own memory is used where it holds the checkpoint's bytes; only the rest is read",
          "[hooks][restore]") {
  test::TempDir dir;
  test::LogCapture log;
  train(dir.path(), 3);
  std::vector<unsigned char> held_a = state_at(1 << 20, 3), held_b = state_at(100, 3);
  auto restore_holding = [&](std::vector<RegionSpec> live) {
    Restored r;
    r.a.assign(1 << 20, 0);
    r.b.assign(100, 0);
    auto cp = test::make(test::options({{"dir", dir.path()}}));
    REQUIRE(cp->register_region({"a", r.a.data(), r.a.size()}).ok());
    REQUIRE(cp->register_region({"b", r.b.data(), r.b.size()}).ok());
    RestoreOptions options;
    options.live = std::move(live);
    r.step = cp->restore(options);
    for (const RestoredRegion& x : cp->restored()) {
      if (x.name == "extra") r.extra.assign(reinterpret_cast<const char*>(x.data), x.size);
    }
    Stats s = cp->stats();
    REQUIRE(cp->close().ok());
    return std::pair{r, s};
  };
  SECTION("what it holds is taken from memory, checked; the blob it does not hold is read") {
    auto [r, s] = restore_holding({{"a", held_a.data(), held_a.size()}, {"b", held_b.data(), held_b.size()}});
    REQUIRE(r.step.ok());
    CHECK(*r.step == 3);
    CHECK((r.a == state_at(1 << 20, 3)));
    CHECK((r.b == state_at(100, 3)));
    CHECK(r.extra == "step 3");
    CHECK(s.restore_live_bytes == (1u << 20) + 100);
    CHECK(s.restore_read_bytes == std::string("step 3").size());
    CHECK(log.has("2 of 3 ranges"));
  }
  SECTION("a byte of it that differs: that range is read from the checkpoint") {
    held_a[777] ^= 0x10;
    auto [r, s] = restore_holding({{"a", held_a.data(), held_a.size()}, {"b", held_b.data(), held_b.size()}});
    REQUIRE(r.step.ok());
    CHECK((r.a == state_at(1 << 20, 3)));
    CHECK(s.restore_live_bytes == 100);
    CHECK(s.restore_read_bytes == (1u << 20) + std::string("step 3").size());
  }
  SECTION("the state of another step matches nothing: the whole shard is read") {
    auto older = state_at(1 << 20, 2);
    auto [r, s] = restore_holding({{"a", older.data(), older.size()}});
    REQUIRE(r.step.ok());
    CHECK((r.a == state_at(1 << 20, 3)));
    CHECK(s.restore_live_bytes == 0);
    CHECK(s.restore_read_bytes >= (1u << 20));
  }
  SECTION("the memory may be the registered region itself") {
    Restored r;
    r.a = held_a;
    r.b.assign(100, 0);
    auto cp = test::make(test::options({{"dir", dir.path()}}));
    REQUIRE(cp->register_region({"a", r.a.data(), r.a.size()}).ok());
    REQUIRE(cp->register_region({"b", r.b.data(), r.b.size()}).ok());
    RestoreOptions options;
    options.live = {{"a", r.a.data(), r.a.size()}};
    REQUIRE(*cp->restore(options) == 3);
    CHECK((r.a == state_at(1 << 20, 3)));
    CHECK((r.b == state_at(100, 3)));
    REQUIRE(cp->close().ok());
  }
}

TEST_CASE("a rank waiting on the restore's leader stops once a rank of the job died", "[hooks][restore]") {
  // The leader (rank 0) never proposes: it is recovering from the same death already. Rank 1 must not poll for
  // the plan until its deadline: the tally's word that the job broke ends the wait with the reason.
  test::TempDir dir;
  std::atomic<bool> died{false};
  RestoreTally tally;
  tally.report = [](int) {};
  tally.wait_all = [](int, std::chrono::milliseconds) { return false; };
  tally.announce = [](int, RestoreFile) {};
  tally.await = [](int, RestoreFile, std::chrono::steady_clock::time_point) { return false; };
  tally.broken = [&]() -> std::optional<std::string> {
    if (!died.load()) return std::nullopt;
    return std::string("rank 2 of the job died");
  };
  RestoreAgreement agreement(dir.path(), "broken-run", 1, 3, std::chrono::seconds(60), std::move(tally));
  std::thread death([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    died = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto plan = agreement.proposal(0);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  death.join();
  REQUIRE_FALSE(plan);
  CHECK_THAT(plan.error(), Catch::Contains("the restore cannot complete: rank 2 of the job died"));
  CHECK(took >= 0.3);
  CHECK(took < 5.0);
}

TEST_CASE("a region declares where its block lies in the whole tensor; a block outside it is refused",
          "[hooks][restore]") {
  test::TempDir dir;
  std::vector<float> w(6 * 4, 1.5f);  // rows 6..11 of a 12 x 4 tensor split by rows across 2 tensor-parallel ranks
  const std::string chunk = R"({"dtype":"float32","shape":[6,4],"global_shape":[12,4],"offset":[6,0],)"
                            R"("replica_group":"dp"})";
  {
    auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1steps"}}));
    Status bad = cp->register_region({"w", w.data(), w.size() * 4, Memory::Host, false,
                                      R"({"dtype":"float32","shape":[6,4],"global_shape":[12,4],"offset":[7,0]})"});
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error() == "ckpt: region 'w': metadata: the block of shape [6,4] at 'offset' [7,0] lies outside "
                         "'global_shape' [12,4]");
    CHECK_FALSE(cp->register_region({"w", w.data(), w.size() * 4, Memory::Host, false,
                                     R"({"shape":[6,4],"replica_group":"tp"})"}).ok());
    REQUIRE(cp->register_region({"w", w.data(), w.size() * 4, Memory::Host, false, chunk}).ok());
    REQUIRE(*cp->restore() == 0);
    REQUIRE(cp->before_update().ok());
    REQUIRE_FALSE(*cp->after_step(1));
    REQUIRE(cp->close().ok());
  }
  auto m = store::read_manifest(dir.path(), 1);
  REQUIRE(m);
  const store::StateRange& range = m->shards.at(0).states.at(0);
  auto c = store::tensor_chunk(range.meta);
  REQUIRE(c);
  REQUIRE(*c);
  CHECK((*c)->global_shape == std::vector<std::uint64_t>{12, 4});
  CHECK((*c)->offset == std::vector<std::uint64_t>{6, 0});
  CHECK((*c)->replica_group == "dp");
  CHECK_FALSE((*c)->whole());

  // The same block restores; another block that the saved one holds is cut out of it; a block it does not hold
  // is refused, naming the tensor, and the checkpoint is not marked FAILED.
  std::vector<float> same(6 * 4, 0.0f), other(6 * 4, 0.0f), inside(2 * 4, 0.0f);
  {
    auto cp = test::make(test::options({{"dir", dir.path()}}));
    REQUIRE(cp->register_region({"w", same.data(), same.size() * 4, Memory::Host, false, chunk}).ok());
    CHECK(*cp->restore() == 1);
    CHECK(same == w);
    REQUIRE(cp->close().ok());
  }
  {
    auto cp = test::make(test::options({{"dir", dir.path()}}));
    REQUIRE(cp->register_region({"w", other.data(), other.size() * 4, Memory::Host, false,
                                 R"({"dtype":"float32","shape":[6,4],"global_shape":[12,4],"offset":[0,0]})"})
                .ok());
    auto refused = cp->restore();
    REQUIRE_FALSE(refused);
    CHECK_THAT(refused.error(), Catch::Contains("tensor 'w': the saved blocks hold 0 of the 24 elements of the "
                                                "block at [0,0] of shape [6,4] that this rank holds"));
    (void)cp->close();
  }
  {
    std::iota(w.begin(), w.end(), 0.0f);  // rows 6..11 numbered, as saved below
    auto cp = test::make(test::options({{"dir", dir.path()}, {"interval", "1steps"}}));
    REQUIRE(cp->register_region({"w", w.data(), w.size() * 4, Memory::Host, false, chunk}).ok());
    REQUIRE(*cp->restore() == 1);
    REQUIRE(cp->before_update().ok());
    std::iota(w.begin(), w.end(), 0.0f);
    REQUIRE_FALSE(*cp->after_step(2));
    REQUIRE(cp->close().ok());
  }
  {
    auto cp = test::make(test::options({{"dir", dir.path()}}));
    REQUIRE(cp->register_region({"w", inside.data(), inside.size() * 4, Memory::Host, false,
                                 R"({"dtype":"float32","shape":[2,4],"global_shape":[12,4],"offset":[9,0]})"})
                .ok());
    CHECK(*cp->restore() == 2);
    CHECK(inside == std::vector<float>(w.begin() + 12, w.begin() + 20));  // rows 9 and 10: the saved rows 3 and 4
    REQUIRE(cp->close().ok());
  }
  auto entries = store::scan(dir.path());
  REQUIRE(entries);
  CHECK(entries->back().state != store::State::Failed);
}
