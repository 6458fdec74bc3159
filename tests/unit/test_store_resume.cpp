// The resume side of the store: the cheap check of manifests (check_records, resolve with checksums off), which
// rank's shard a rank restores, and each rank's own read, checked while it reads, with transient errors retried.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/store.hpp"
#include "store_test_util.hpp"

using namespace ckpt::store;
namespace fs = std::filesystem;

namespace {

using test::TempDir;
using test::flip_byte;
using test::thread_rchar;
using test::spit;

constexpr std::size_t kBytes = 1u << 20;

std::vector<char> bytes_for(std::uint64_t step, int rank) {
  std::vector<char> out(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) out[i] = static_cast<char>((step * 31 + rank * 7u + i * 13) % 251);
  return out;
}

// A complete periodic checkpoint of `world` data-parallel ranks, kBytes each.
void save(const std::string& root, std::uint64_t step, int world = 4) {
  Manifest m;
  m.step = step;
  m.world_size = world;
  m.layout.dp = world;
  for (int r = 0; r < world; ++r) {
    m.ranks.push_back(m.layout.coord_of(r));
    auto w = ShardWriter::open(root, step, r);
    REQUIRE(w.ok());
    auto data = bytes_for(step, r);
    REQUIRE(w->append("model", data.data(), data.size()).ok());
    w->add_covers(state_keys_of_rank(m.layout, m.ranks.back()));
    REQUIRE(w->finish().ok());
  }
  REQUIRE(commit(root, m).ok());
}

std::string shard_path(const TempDir& t, std::uint64_t step, int rank) {
  return t / (step_dir_name(step) + "/" + shard_file_name(rank));
}



ResolveOptions records_only() {
  ResolveOptions o;
  o.checksums = false;
  return o;
}

ShardRecord record_of(const std::string& root, std::uint64_t step, int rank) {
  auto r = read_record(root, step, rank);
  REQUIRE(r.ok());
  return *r;
}

}  // namespace

TEST_CASE("check_records reads the manifest only and tells a bad checkpoint from an unfinished one",
          "[store][resume]") {
  TempDir t;
  save(t.path(), 100);
  save(t.path(), 200);
  flip_byte(shard_path(t, 200, 1), 5000);  // no shard is read: this is for the ranks to find
  bool definite = true;
  std::uint64_t before = thread_rchar();
  auto m = check_records(t.path(), 200, &definite);
  REQUIRE(m.ok());
  CHECK(thread_rchar() - before < kBytes);
  CHECK(m->world_size == 4);
  CHECK(m->shards.size() == 4);

  SECTION("no manifest: an unfinished save, not marked") {
    fs::remove(t / (step_dir_name(200) + "/MANIFEST.json"));
    CHECK_THAT(check_records(t.path(), 200, &definite).error(), Catch::Contains("no manifest"));
    CHECK_FALSE(definite);
  }
  SECTION("a manifest of an incomplete checkpoint is bad") {
    auto text = test::slurp(t / (step_dir_name(200) + "/MANIFEST.json"));
    auto parsed = parse_manifest(text);
    REQUIRE(parsed.ok());
    parsed->shards.pop_back();
    spit(t / (step_dir_name(200) + "/MANIFEST.json"), to_json(*parsed));
    CHECK_THAT(check_records(t.path(), 200, &definite).error(), Catch::Contains("incomplete checkpoint"));
    CHECK(definite);
  }
  SECTION("a FAILED one is passed over, not marked again") {
    REQUIRE(mark_failed(t.path(), 200, "test").ok());
    CHECK_THAT(check_records(t.path(), 200, &definite).error(), Catch::Contains("marked FAILED: test"));
    CHECK_FALSE(definite);
  }
}

TEST_CASE("resolve with checksums off: newest complete by its manifest, no shard byte read", "[store][resume]") {
  TempDir t;
  save(t.path(), 100);
  save(t.path(), 200);
  save(t.path(), 300);
  flip_byte(shard_path(t, 300, 2), 1000);
  std::uint64_t before = thread_rchar();
  ResumeChoice choice = resolve_resume(t.path(), records_only());
  CHECK(thread_rchar() - before < kBytes);
  REQUIRE(choice.step == 300u);
  REQUIRE(choice.manifest);
  CHECK(choice.manifest->step == 300u);
  CHECK(choice.log.back() == "resume from step 300 (" + t / step_dir_name(300) + ")");

  SECTION("skipped steps, a garbage manifest (marked FAILED) and an unfinished save (not marked)") {
    spit(t / (step_dir_name(200) + "/MANIFEST.json"), "{");
    fs::create_directory(t / step_dir_name(400));
    ResolveOptions o = records_only();
    o.skip = {300};
    choice = resolve_resume(t.path(), o);
    CHECK(choice.step == 100u);
    REQUIRE(choice.log.size() == 3);
    CHECK(choice.log[0] == "step 400: skipped, incomplete: no manifest");
    CHECK_THAT(choice.log[1], Catch::StartsWith("step 200: manifest: not valid JSON") &&
                                  Catch::EndsWith("marked FAILED"));
    CHECK(fs::exists(t / (step_dir_name(200) + "/FAILED")));
    CHECK_FALSE(fs::exists(t / (step_dir_name(400) + "/FAILED")));
  }
  SECTION("a deadline that has passed gives no choice and says so") {
    ResolveOptions o = records_only();
    o.deadline = std::chrono::steady_clock::now();
    choice = resolve_resume(t.path(), o);
    CHECK_FALSE(choice.step);
    CHECK(choice.timed_out);
    CHECK_THAT(choice.log.back(), Catch::StartsWith("gave up before step 300"));
  }
  SECTION("with checksums the whole checkpoint is read, as `ckpt verify` does") {
    before = thread_rchar();
    choice = resolve_resume(t.path(), false);
    CHECK(choice.step == 200u);
    CHECK(thread_rchar() - before >= 6 * kBytes);  // step 300 up to its bad shard, then all of step 200
  }
}

TEST_CASE("read_shard reads each byte once and checks it as it reads", "[store][resume]") {
  TempDir t;
  save(t.path(), 100);
  ShardRecord record = record_of(t.path(), 100, 3);
  std::vector<char> into(record.size);
  ShardReadOptions fast;
  fast.backoff = std::chrono::milliseconds(1);

  SECTION("a good shard: its bytes, and no more read than it holds") {
    std::uint64_t before = thread_rchar();
    ShardRead read = read_shard(t.path(), 100, record, into.data(), fast);
    std::uint64_t read_bytes = thread_rchar() - before;
    REQUIRE(read.status.ok());
    CHECK(read.bytes == record.size);
    CHECK(read_bytes >= record.size);
    CHECK(read_bytes < record.size + 1024);  // and the read of /proc/thread-self/io itself
    CHECK(into == bytes_for(100, 3));
  }
  SECTION("a flipped bit is a definite failure naming the shard") {
    flip_byte(shard_path(t, 100, 3), 777);
    ShardRead read = read_shard(t.path(), 100, record, into.data(), fast);
    CHECK(read.definite);
    CHECK_THAT(read.status.error(), Catch::StartsWith("step 100: shard rank-00003.shard (rank 3): checksum mismatch"));
  }
  SECTION("a missing or short shard is definite") {
    fs::resize_file(shard_path(t, 100, 3), 10);
    ShardRead read = read_shard(t.path(), 100, record, into.data(), fast);
    CHECK(read.definite);
    CHECK_THAT(read.status.error(), Catch::EndsWith("10 bytes, manifest says 1048576"));
    fs::remove(shard_path(t, 100, 3));
    read = read_shard(t.path(), 100, record, into.data(), fast);
    CHECK(read.definite);
    CHECK(read.status.error() == "step 100: shard rank-00003.shard (rank 3): missing");
  }
  SECTION("a transient error is retried, and the read goes on where it stopped") {
    int reads = 0;
    fast.inject = [&](std::string_view op) {
      if (op == "read" && ++reads <= 2) return ESTALE;
      return 0;
    };
    std::uint64_t before = thread_rchar();
    ShardRead read = read_shard(t.path(), 100, record, into.data(), fast);
    REQUIRE(read.status.ok());
    CHECK(read.retries == 2);
    CHECK(thread_rchar() - before < record.size + 1024);
    CHECK(into == bytes_for(100, 3));
  }
  SECTION("an error that stays: permissions stop the restore without blaming the checkpoint, EIO blames it") {
    int opens = 0;
    fast.inject = [&](std::string_view op) { return op == "open" ? (++opens, EACCES) : 0; };
    ShardRead read = read_shard(t.path(), 100, record, into.data(), fast);
    CHECK_FALSE(read.status.ok());
    CHECK_FALSE(read.definite);
    CHECK(opens == 4);
    CHECK_THAT(read.status.error(), Catch::EndsWith("cannot open: Permission denied (tried 4 times)"));
    fast.inject = [](std::string_view op) { return op == "read" ? EIO : 0; };
    read = read_shard(t.path(), 100, record, into.data(), fast);
    CHECK(read.definite);
    CHECK_THAT(read.status.error(), Catch::Contains("read failed: Input/output error"));
  }
}

TEST_CASE("read_range and stream_range read one range, checked against its own checksum", "[store][resume]") {
  TempDir t;
  const std::string root = t.path();
  std::vector<char> a(300'000, 'a'), b(500'000);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(i % 253);
  {
    auto w = ShardWriter::open(root, 5, 0);
    REQUIRE(w.ok());
    REQUIRE(w->append("optim", a.data(), a.size()).ok());
    REQUIRE(w->append("model", b.data(), b.size()).ok());
    REQUIRE(w->finish().ok());
    Manifest m;
    m.step = 5;
    m.ranks = {m.layout.coord_of(0)};
    REQUIRE(commit(root, m).ok());
  }
  ShardRecord record = read_manifest(root, 5)->shards.at(0);
  REQUIRE(record.states.size() == 2);
  const StateRange& model = record.states[1];
  REQUIRE(model.checksum);
  CHECK(parse_shard_record(to_json(record))->states[1].checksum == model.checksum);  // recorded, read back
  std::vector<char> into(model.length);

  SECTION("its bytes, and no other byte of the shard read") {
    std::uint64_t before = thread_rchar();
    ShardRead read = read_range(root, 5, record, model, into.data());
    REQUIRE(read.status.ok());
    CHECK(read.bytes == model.length);
    CHECK(thread_rchar() - before < model.length + 1024);
    CHECK(into == b);
  }
  SECTION("a byte flipped inside it fails it; one flipped in another range does not") {
    flip_byte(shard_path(t, 5, 0), 1000);  // in "optim"
    CHECK(read_range(root, 5, record, model, into.data()).status.ok());
    CHECK_FALSE(read_shard(root, 5, record, std::vector<char>(record.size).data()).status.ok());
    flip_byte(shard_path(t, 5, 0), model.offset + 4242);
    ShardRead read = read_range(root, 5, record, model, into.data());
    CHECK(read.definite);
    CHECK_THAT(read.status.error(), Catch::Contains("range 'model': checksum mismatch"));
  }
  SECTION("streamed in chunks at their offsets in the file") {
    std::vector<char> got;
    std::uint64_t expect = model.offset;
    ShardRead read = stream_range(root, 5, record, model, [&](std::uint64_t offset, const char* data, std::size_t n) {
      CHECK(offset == expect);
      expect += n;
      got.insert(got.end(), data, data + n);
      return true;
    });
    REQUIRE(read.status.ok());
    CHECK(got == b);
  }
  SECTION("a range without a checksum of its own (an older checkpoint) is refused, not trusted") {
    StateRange older = model;
    older.checksum.reset();
    ShardRead read = read_range(root, 5, record, older, into.data());
    CHECK_FALSE(read.status.ok());
    CHECK_FALSE(read.definite);
    CHECK_THAT(read.status.error(), Catch::Contains("no checksum of its own"));
  }
}

TEST_CASE("locate_ranges: the ranges of other shards a resharded rank reads, each in one shard", "[store][resume]") {
  Manifest m;
  for (int r = 0; r < 3; ++r) {
    ShardRecord s;
    s.rank = r;
    s.file = shard_file_name(r);
    s.size = 1000;
    s.states = {{"model/w", 0, 100, {}, 1}, {"optim/" + std::to_string(2 * r) + "/exp_avg", 100, 10, {}, 2},
                {"optim/" + std::to_string(2 * r + 1) + "/exp_avg", 110, 10, {}, 3},
                {"optim/1" + std::to_string(r) + "/exp_avg", 120, 10, {}, 4}};
    m.shards.push_back(s);
  }
  auto got = locate_ranges(m, {"optim/1/", "optim/4/", "optim/9/"});
  REQUIRE(got);
  REQUIRE(got->size() == 2);
  CHECK((*got)[0].first == 0);
  CHECK((*got)[0].second.name == "optim/1/exp_avg");  // not optim/10/...: a prefix ends at its slash
  CHECK((*got)[1].first == 2);
  CHECK((*got)[1].second.offset == 100);
  CHECK(locate_ranges(m, {"optim/1/"}, 0)->empty());  // the shard loaded whole is passed over
  CHECK(locate_ranges(m, {""})->empty());
  m.shards[2].states[1].name = "optim/1/exp_avg";
  CHECK_THAT(locate_ranges(m, {"optim/1/"}).error(), Catch::Contains("is in rank-00000.shard and rank-00002.shard"));
}

TEST_CASE("replica_ranges: a resharded rank reads of its replica all but the other partitions", "[store][resume]") {
  const nlohmann::json partition = {{"shape", {4}}, {"replica_group", "rank"}};
  ShardRecord r;
  r.states = {{"model/w", 0, 16, {{"shape", {4}}, {"replica_group", "dp"}}, 1},
              {"optim/0/exp_avg", 16, 16, partition, 2},
              {"optim/1/exp_avg", 32, 16, partition, 3},
              {"optim/10/exp_avg", 48, 16, partition, 4},
              {"extras", 64, 8, nlohmann::json::object(), 5}};
  CHECK(replica_ranges(r, {"optim/1/"}) == std::vector<std::size_t>{0, 2, 4});
  CHECK(replica_ranges(r, {}) == std::vector<std::size_t>{0, 4});
  CHECK(replica_ranges(r, {"optim/0/", "optim/10/"}) == std::vector<std::size_t>{0, 1, 3, 4});
}

TEST_CASE("read_record: one rank's record, checked against its name", "[store][resume]") {
  TempDir t;
  save(t.path(), 100);
  auto manifest = read_manifest(t.path(), 100);
  REQUIRE(manifest.ok());
  ShardRecord own = record_of(t.path(), 100, 2);
  CHECK(own.checksum == manifest->shards[2].checksum);
  CHECK(own.size == manifest->shards[2].size);
  spit(t / (step_dir_name(100) + "/" + record_file_name(1)), to_json(own));
  bool definite = false;
  CHECK_THAT(read_record(t.path(), 100, 1, &definite).error(), Catch::Contains("names rank 2"));
  CHECK(definite);
}

TEST_CASE("restore_source: which shard a rank loads", "[store][resume]") {
  Manifest m;
  m.step = 7;
  m.world_size = 4;
  m.layout = Layout{2, 2, 1, false};
  for (int r = 0; r < 4; ++r) m.ranks.push_back(m.layout.coord_of(r));
  for (int r = 0; r < 4; ++r) {
    m.shards.push_back({r, shard_file_name(r), 8, 0, {}, state_keys_of_rank(m.layout, m.ranks[r])});
  }
  SECTION("its own, in a checkpoint of the same size") {
    CHECK(restore_source(m, 4, 3, m.layout, m.ranks[3]).rank == 3);
  }
  SECTION("a terminal checkpoint without its shard: the survivor that covers its keys") {
    m.kind = Kind::Terminal;
    m.shards.erase(m.shards.begin() + 3);  // dp1/tp1 died; dp0/tp1 (rank 1) covers tp1
    m.shards[1].covers = {"model/pp0/tp1", "optim/pp0/tp1"};
    RestoreSource s = restore_source(m, 4, 3, m.layout, m.ranks[3]);
    CHECK(s.rank == 1);
    CHECK_FALSE(s.replica);
    // Onto another split of the tensors, the survivors' blocks are assembled (plan_relayout).
    CHECK(restore_source(m, 4, 3, Layout{4, 1, 1, false}, {3, 3, 0, 0}).relayout);
  }
  SECTION("another world size: a replica of pure data parallelism; another split of the tensors otherwise") {
    RestoreSource tp = restore_source(m, 2, 1, Layout{2, 1, 1, false}, {1, 1, 0, 0});
    CHECK(tp.relayout);
    CHECK(tp.error.empty());
    CHECK(restore_source(m, 4, 1, Layout{1, 4, 1, false}, {1, 0, 1, 0}).relayout);  // the same size, tp 4
    CHECK_FALSE(restore_source(m, 4, 1, m.layout, m.ranks[1]).relayout);
    RestoreSource pp = restore_source(m, 2, 1, Layout{1, 1, 2, false}, {1, 0, 0, 1});
    CHECK(pp.rank == -1);
    CHECK_FALSE(pp.definite);
    CHECK(pp.error == "written by 4 ranks (tp 2, pp 1); this run has 2 (tp 1, pp 2): pipeline stages and ZeRO-1 "
                      "with tensor parallelism restore onto their own layout only");
    m.layout = Layout{4, 1, 1, false};
    RestoreSource dp = restore_source(m, 6, 5, Layout{6, 1, 1, false}, {5, 5, 0, 0});
    CHECK(dp.rank == 1);
    CHECK(dp.replica);
    CHECK_FALSE(dp.reshard);
    m.layout = Layout{4, 1, 1, true};  // ZeRO-1: the replica holds the model, the partitions are resharded
    RestoreSource zero = restore_source(m, 2, 1, Layout{2, 1, 1, true}, {1, 1, 0, 0});
    CHECK(zero.rank == 1);
    CHECK(zero.replica);
    CHECK(zero.reshard);
  }
  SECTION("a terminal checkpoint of pure data parallelism onto fewer ranks: the one shard that covers the model") {
    // DP=3's last words: rank 0 wrote the one replica; a job that shrank to 2 loads it on both ranks.
    Manifest t;
    t.step = 10;
    t.kind = Kind::Terminal;
    t.world_size = 3;
    t.layout = Layout{3, 1, 1, false};
    for (int r = 0; r < 3; ++r) t.ranks.push_back(t.layout.coord_of(r));
    t.shards.push_back({0, shard_file_name(0), 8, 0, {}, state_keys_of_rank(t.layout, t.ranks[0])});
    for (int r : {0, 1}) {
      RestoreSource s = restore_source(t, 2, r, Layout{2, 1, 1, false}, {r, r, 0, 0});
      CAPTURE(r);
      CHECK(s.rank == 0);
      CHECK(s.replica);
    }
    t.layout.zero1 = true;  // ZeRO-1: each rank's partition is its own, and rank 1's is missing
    CHECK(restore_source(t, 2, 1, Layout{2, 1, 1, true}, {1, 1, 0, 0}).error == "no shard for rank 1");
  }
  SECTION("a periodic checkpoint without the rank's shard is bad") {
    m.shards.pop_back();
    RestoreSource s = restore_source(m, 4, 3, m.layout, m.ranks[3]);
    CHECK(s.error == "no shard for rank 3");
    CHECK(s.definite);
  }
}
