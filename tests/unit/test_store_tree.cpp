// The store's side of a job that agrees over a tree: records gathered up it, a commit from them that reads no
// record file, and retention shared out (the writer renames a dropped step dir, each rank removes its own files,
// the next round removes what is left).
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/store.hpp"
#include "store_test_util.hpp"

using namespace ckpt::store;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

// Every rank of a periodic checkpoint of `world` data-parallel ranks writes its shard; returns the records.
std::vector<ShardRecord> write_shards(const std::string& root, std::uint64_t step, int world) {
  std::vector<ShardRecord> records;
  Layout layout;
  layout.dp = world;
  for (int r = 0; r < world; ++r) {
    auto w = ShardWriter::open(root, step, r);
    REQUIRE(w.ok());
    std::string data(100 + static_cast<std::size_t>(r), static_cast<char>('a' + r));
    REQUIRE(w->append("model", data.data(), data.size()).ok());
    w->add_covers(state_keys_of_rank(layout, layout.coord_of(r)));
    auto record = w->finish();
    REQUIRE(record.ok());
    records.push_back(*record);
  }
  return records;
}

Manifest manifest_of(std::uint64_t step, int world, std::vector<ShardRecord> shards) {
  Manifest m;
  m.step = step;
  m.world_size = world;
  m.layout.dp = world;
  for (int r = 0; r < world; ++r) m.ranks.push_back(m.layout.coord_of(r));
  m.shards = std::move(shards);
  return m;
}

void save(const std::string& root, std::uint64_t step, int world) {
  auto records = write_shards(root, step, world);
  REQUIRE(commit_gathered(root, manifest_of(step, world, records)).ok());
}

}  // namespace

TEST_CASE("gathered records read back for their step only", "[store][tree]") {
  TempDir t;
  auto records = write_shards(t.path(), 10, 3);
  REQUIRE(write_gathered(t.path(), 10, 8, records).ok());
  auto back = read_gathered(t.path(), 10, 8);
  REQUIRE(back.ok());
  REQUIRE(back->size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(to_json((*back)[i]) == to_json(records[i]));
  }
  // One file per step: a parent a checkpoint behind still reads the step it asks for.
  REQUIRE(write_gathered(t.path(), 20, 8, {records[0]}).ok());
  REQUIRE(read_gathered(t.path(), 10, 8).ok());
  REQUIRE(read_gathered(t.path(), 20, 8)->size() == 1);
  CHECK_FALSE(read_gathered(t.path(), 20, 9).ok());  // nobody gathered under rank 9

  // A file that names another step, or an unsafe shard name, is refused.
  const std::string name = t / (".control/gathered-" + step_dir_name(30) + "-00008");
  test::spit(name, "{\"step\": 20, \"records\": []}");
  auto stale = read_gathered(t.path(), 30, 8);
  REQUIRE_FALSE(stale.ok());
  CHECK(stale.error().find("holds step 20, not 30") != std::string::npos);
  test::spit(name, "{\"step\": 30, \"records\": [{\"rank\": 0, \"file\": \"../x\"}]}");
  REQUIRE_FALSE(read_gathered(t.path(), 30, 8).ok());

  // Removed with its step's retirement, by the rank that gathered it.
  REQUIRE(remove_retired_own(t.path(), 10, 8).ok());
  CHECK_FALSE(read_gathered(t.path(), 10, 8).ok());
  CHECK(read_gathered(t.path(), 20, 8).ok());
}

TEST_CASE("a commit from gathered records reads no record file and refuses an incomplete set", "[store][tree]") {
  TempDir t;
  auto records = write_shards(t.path(), 10, 4);
  auto three = records;
  three.pop_back();
  auto refused = commit_gathered(t.path(), manifest_of(10, 4, three));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().find("not complete") != std::string::npos);
  CHECK_FALSE(fs::exists(t / "000000000010/MANIFEST.json"));

  // The record files are not what it commits: with them gone, the gathered set still commits, in rank order.
  for (int r = 0; r < 4; ++r) fs::remove(t / ("000000000010/" + record_file_name(r)));
  std::vector<ShardRecord> shuffled = {records[2], records[0], records[3], records[1]};
  REQUIRE(commit_gathered(t.path(), manifest_of(10, 4, shuffled)).ok());
  auto m = read_manifest(t.path(), 10);
  REQUIRE(m.ok());
  REQUIRE(m->shards.size() == 4);
  for (int r = 0; r < 4; ++r) CHECK(m->shards[static_cast<std::size_t>(r)].rank == r);
  CHECK(verify(t.path(), 10).ok());
  CHECK_FALSE(commit_gathered(t.path(), manifest_of(10, 4, records)).ok());  // committed already
}

TEST_CASE("retention shared out: rename, each rank's own files, then the empty dir", "[store][tree]") {
  TempDir t;
  for (std::uint64_t step : {10, 20, 30}) save(t.path(), step, 4);
  // A FAILED one is evidence and stays; a save newer than the newest complete one stops retention.
  auto retired = retire(t.path(), 2, 30);
  REQUIRE(retired.ok());
  REQUIRE(*retired == std::vector<std::uint64_t>{10});
  CHECK_FALSE(fs::exists(t / "000000000010"));
  REQUIRE(fs::exists(t / ".gc-000000000010"));
  auto entries = scan(t.path());
  REQUIRE(entries.ok());
  CHECK(entries->size() == 2);  // gone from the index at once

  for (int r = 0; r < 3; ++r) REQUIRE(remove_retired_own(t.path(), 10, r).ok());
  REQUIRE(remove_retired_own(t.path(), 10, 0).ok());   // twice is harmless
  REQUIRE(remove_retired_own(t.path(), 77, 0).ok());   // a step never retired
  CHECK_FALSE(fs::exists(t / ".gc-000000000010/rank-00000.shard"));
  CHECK(fs::exists(t / ".gc-000000000010/rank-00003.shard"));  // rank 3 never came

  save(t.path(), 40, 4);
  retired = retire(t.path(), 2, 40);
  REQUIRE(retired.ok());
  REQUIRE(*retired == std::vector<std::uint64_t>{20});
  CHECK_FALSE(fs::exists(t / ".gc-000000000010"));  // what rank 3 left, removed by the next round
  CHECK(fs::exists(t / ".gc-000000000020"));
  for (int r = 0; r < 4; ++r) REQUIRE(remove_retired_own(t.path(), 20, r).ok());
  CHECK(fs::is_empty(t / ".gc-000000000020"));

  // An incomplete save above the newest complete one: a save may be in flight, nothing is retired.
  write_shards(t.path(), 50, 2);
  save(t.path(), 45, 4);
  retired = retire(t.path(), 1, 45);
  REQUIRE(retired.ok());
  CHECK(retired->empty());
  CHECK(fs::exists(t / "000000000030"));
}

TEST_CASE("a fenced run retires nothing", "[store][tree]") {
  TempDir t;
  for (std::uint64_t step : {10, 20, 30}) save(t.path(), step, 2);
  REQUIRE(raise_epoch(t.path(), Fence{"42", 1}).ok());
  auto retired = retire(t.path(), 1, 30, Fence{"42", 0});
  REQUIRE_FALSE(retired.ok());
  CHECK(retired.error().find("fenced") != std::string::npos);
  CHECK(fs::exists(t / "000000000010"));
  CHECK(fs::exists(t / "000000000020"));
}
