// Restore: bitwise, newest complete first, walking back past a checkpoint that does not load (marking it FAILED),
// honoring the plugin's choice, and refusing a checkpoint that does not fit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <vector>

#include "hooks_test_util.hpp"

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

void flip_byte(const std::string& path, long offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  f.seekp(offset);
  c = static_cast<char>(c ^ 0x5a);
  f.write(&c, 1);
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
    flip_byte(dir.path() + "/" + store::step_dir_name(3) + "/" + store::shard_file_name(0), 4321);
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
  SECTION("a plugin's choice that does not verify falls back to the newest that does") {
    flip_byte(dir.path() + "/" + store::step_dir_name(1) + "/" + store::shard_file_name(0), 10);
    auto r = restore_from(test::options({{"dir", dir.path()}, {"resume_step", "1"}}));
    REQUIRE(r.step.ok());
    CHECK(*r.step == 3);
    CHECK(log.has("does not verify"));
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
    auto o = test::options({{"dir", dir.path()}, {"rank", "1"}, {"world_size", "2"}, {"coordinator", "file"}});
    auto r = restore_from(o);
    REQUIRE(r.step.ok());
    CHECK(*r.step == 3);
    CHECK((r.a == state_at(1 << 20, 3)));
    auto r0 = restore_from(test::options({{"dir", dir.path()}, {"rank", "0"}, {"world_size", "2"}, {"coordinator", "file"}}));
    REQUIRE(r0.step.ok());
    CHECK((r0.a == state_at(1 << 20, 3)));
    CHECK(log.has("step 3 was written by 1 data-parallel ranks; this run has 2: rank r loads the replica of rank r % 1"));
  }
}

TEST_CASE("a checkpoint of another world size and another layout is refused", "[hooks][restore]") {
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
  auto r = cp->restore(false);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error() == "ckpt: step 4: written by 2 ranks (tp 2, pp 1); this run has 1");
  auto dp = test::make(test::options({{"dir", dir.path()}, {"rank", "0"}, {"world_size", "2"}, {"coordinator", "file"}}));
  CHECK(*dp->restore(false) == 4);  // the same world size: no question of replicas
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
