// The store against real files in a private temp dir: commit, scan, verify, walk-back, marking, gc, hostile input.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <xxhash.h>

#include "ckpt/store.hpp"
#include "store_test_util.hpp"

using namespace ckpt::store;
namespace fs = std::filesystem;

namespace {

using test::TempDir;
using test::slurp;
using test::spit;

std::vector<char> bytes_for(std::uint64_t step, int rank, std::size_t n) {
  std::vector<char> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = static_cast<char>((step * 31 + static_cast<std::uint64_t>(rank) * 7 + i * 13) % 251);
  }
  return out;
}

Manifest manifest_for(std::uint64_t step, int world, Kind kind = Kind::Periodic) {
  Manifest m;
  m.step = step;
  m.kind = kind;
  m.world_size = world;
  m.layout.dp = world;
  for (int r = 0; r < world; ++r) m.ranks.push_back({r, r, 0, 0});
  return m;
}

void write_shard(const std::string& root, std::uint64_t step, int rank, std::size_t n = 4096) {
  auto w = ShardWriter::open(root, step, rank);
  REQUIRE(w.ok());
  auto data = bytes_for(step, rank, n);
  REQUIRE(w->append("model", data.data(), n / 2, {{"dtype", "bf16"}}).ok());
  REQUIRE(w->append("optim", data.data() + n / 2, n - n / 2).ok());
  w->add_covers(state_keys_of_rank(Layout{4, 1, 1, false}, {rank, rank, 0, 0}));
  auto rec = w->finish();
  REQUIRE(rec.ok());
}

// A complete periodic checkpoint of `world` ranks.
void save(const std::string& root, std::uint64_t step, int world = 4, std::size_t n = 4096) {
  for (int r = 0; r < world; ++r) write_shard(root, step, r, n);
  auto status = commit(root, manifest_for(step, world));
  INFO(status.error());
  REQUIRE(status.ok());
}

std::string dir_of(const TempDir& t, std::uint64_t step) { return t / step_dir_name(step); }

State state_of(const std::string& root, std::uint64_t step) {
  auto entries = scan(root);
  REQUIRE(entries.ok());
  for (const Entry& e : *entries) {
    if (e.step == step) return e.state;
  }
  FAIL("no entry for step " << step);
  return State::Corrupt;
}

std::string detail_of(const std::string& root, std::uint64_t step) {
  auto entries = scan(root);
  REQUIRE(entries.ok());
  for (const Entry& e : *entries) {
    if (e.step == step) return e.detail;
  }
  return {};
}

void flip_bit(const std::string& path, off_t offset) {
  int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  char c = 0;
  REQUIRE(::pread(fd, &c, 1, offset) == 1);
  c = static_cast<char>(c ^ 0x10);
  REQUIRE(::pwrite(fd, &c, 1, offset) == 1);
  ::close(fd);
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("save, commit, scan, verify, resolve", "[store][fs]") {
  TempDir t;
  save(t.path(), 100);
  save(t.path(), 200);

  auto entries = scan(t.path());
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == 2);
  CHECK((*entries)[0].step == 100);
  CHECK((*entries)[1].state == State::Complete);
  CHECK((*entries)[1].bytes > 4 * 4096);
  CHECK((*entries)[1].mtime > 0);
  REQUIRE((*entries)[1].manifest.has_value());
  CHECK((*entries)[1].manifest->world_size == 4);
  CHECK((*entries)[1].manifest->wall_time > 1e9);

  CHECK(verify(t.path(), 200).ok());
  CHECK(verify(t.path(), 200, false).ok());
  CHECK(slurp(t / "latest") == "000000000200\n");
  CHECK(latest_committed_step(t.path()) == std::optional<std::uint64_t>{200});
  spit(t / "latest", "000000000300\n");  // names a step with no manifest: no hint
  CHECK_FALSE(latest_committed_step(t.path()));
  spit(t / "latest", "../etc\n");
  CHECK_FALSE(latest_committed_step(t.path()));
  spit(t / "latest", "000000000200\n");

  auto records = read_records(t.path(), 200);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 4);
  CHECK((*records)[2].file == "rank-00002.shard");
  REQUIRE((*records)[2].states.size() == 2);
  CHECK((*records)[2].states[1].name == "optim");
  CHECK((*records)[2].states[1].offset == 2048);
  CHECK((*records)[2].states[0].meta["dtype"] == "bf16");
  // The record files agree with the manifest.
  auto present = read_present_records(t.path(), 200);
  REQUIRE(present.ok());
  CHECK(to_json((*present)[2]) == to_json((*records)[2]));

  ResumeChoice choice = resolve_resume(t.path());
  REQUIRE(choice.step == 200u);
  CHECK(choice.path == dir_of(t, 200));
  CHECK(choice.log.back() == "resume from step 200 (" + dir_of(t, 200) + ")");
  // No stray temp files after a clean save.
  for (const std::string& name : names_in(dir_of(t, 200))) CHECK(name[0] != '.');
}

TEST_CASE("commit refuses what is not complete, and writes no manifest", "[store][fs]") {
  TempDir t;
  write_shard(t.path(), 100, 0);
  write_shard(t.path(), 100, 2);
  ckpt::Status s = commit(t.path(), manifest_for(100, 4));
  CHECK_FALSE(s.ok());
  CHECK(s.error() == "cannot commit step 100: not complete: missing 2 of 4 ranks: 1, 3");
  CHECK_FALSE(fs::exists(dir_of(t, 100) + "/MANIFEST.json"));
  CHECK(state_of(t.path(), 100) == State::Incomplete);
  CHECK(detail_of(t.path(), 100) == "no manifest; 2 shard records");
  CHECK_FALSE(fs::exists(t / "latest"));

  SECTION("a manifest whose rank coordinates lie outside the layout is refused before it is written") {
    write_shard(t.path(), 100, 1);
    write_shard(t.path(), 100, 3);
    Manifest m = manifest_for(100, 4);
    m.ranks[3].tp = 5;
    CHECK_THAT(commit(t.path(), m).error(), Catch::Contains("ranks[3].tp"));
    CHECK_FALSE(fs::exists(dir_of(t, 100) + "/MANIFEST.json"));
    CHECK(commit(t.path(), manifest_for(100, 4)).ok());
  }
  SECTION("a committed step is not written again") {
    write_shard(t.path(), 100, 1);
    write_shard(t.path(), 100, 3);
    REQUIRE(commit(t.path(), manifest_for(100, 4)).ok());
    CHECK_THAT(commit(t.path(), manifest_for(100, 4)).error(), Catch::Contains("already committed"));
    auto again = ShardWriter::open(t.path(), 100, 0);
    REQUIRE_FALSE(again.ok());
    CHECK_THAT(again.error(), Catch::Contains("already committed"));
    CHECK(verify(t.path(), 100).ok());
  }
  SECTION("a commit with a stray record of the wrong rank fails closed") {
    write_shard(t.path(), 100, 1);
    write_shard(t.path(), 100, 3);
    fs::copy_file(dir_of(t, 100) + "/rank-00001.rec", dir_of(t, 100) + "/rank-00004.rec");
    CHECK_THAT(commit(t.path(), manifest_for(100, 4)).error(), Catch::Contains("rank-00004.rec: names rank 1"));
  }
}

namespace {

// A terminal checkpoint's manifest (no shards yet) of a DP2 x TP2 job at `step`.
Manifest dp2_tp2_terminal(std::uint64_t step) {
  Manifest m;
  m.step = step;
  m.kind = Kind::Terminal;
  m.world_size = 4;
  m.layout = Layout{2, 2, 1, false};
  m.ranks = {{0, 0, 0, 0}, {1, 0, 1, 0}, {2, 1, 0, 0}, {3, 1, 1, 0}};
  return m;
}

// `rank`'s shard of m's step, covering that rank's state keys.
void write_terminal_shard(const std::string& root, const Manifest& m, int rank) {
  auto w = ShardWriter::open(root, m.step, rank);
  REQUIRE(w.ok());
  auto data = bytes_for(m.step, rank, 1000);
  REQUIRE(w->append("all", data.data(), data.size()).ok());
  w->add_covers(state_keys_of_rank(m.layout, m.ranks[static_cast<std::size_t>(rank)]));
  REQUIRE(w->finish().ok());
}

}  // namespace

TEST_CASE("terminal checkpoints: complete when every state key is covered once", "[store][fs]") {
  TempDir t;
  const Manifest m = dp2_tp2_terminal(500);
  auto write = [&](int rank) { write_terminal_shard(t.path(), m, rank); };
  write(0);  // tp0; rank 1 (tp1) is dead
  CHECK_THAT(commit(t.path(), m).error(), Catch::Contains("uncovered: model/pp0/tp1"));
  write(3);  // tp1 replica
  REQUIRE(commit(t.path(), m).ok());
  CHECK(verify(t.path(), 500).ok());
  auto mf = read_manifest(t.path(), 500);
  REQUIRE(mf.ok());
  CHECK(mf->kind == Kind::Terminal);
  CHECK(mf->shards.size() == 2);
}

TEST_CASE("a terminal commit counts only its writers: a cut-short periodic persist of the step stays out",
          "[store][fs]") {
  TempDir t;
  const Manifest m = dp2_tp2_terminal(83);
  auto write = [&](int rank) { write_terminal_shard(t.path(), m, rank); };
  write(0);  // rank 0 persisted its periodic shard of step 83, then rank 1 died: replica dp1 writes last words
  write(2);
  write(3);
  CHECK_THAT(commit(t.path(), m).error(), Catch::Contains("model/pp0/tp0 covered by ranks 0 and 2"));
  REQUIRE(commit(t.path(), m, nullptr, std::nullopt, std::vector<int>{2, 3}).ok());
  CHECK(verify(t.path(), 83).ok());
  auto mf = read_manifest(t.path(), 83);
  REQUIRE(mf.ok());
  REQUIRE(mf->shards.size() == 2);
  CHECK(mf->shards[0].rank == 2);
  CHECK(mf->shards[1].rank == 3);
  SECTION("a writer that is missing still leaves it incomplete") {
    TempDir u;
    auto w = ShardWriter::open(u.path(), 83, 0);
    REQUIRE(w.ok());
    REQUIRE(w->finish().ok());
    CHECK_FALSE(commit(u.path(), m, nullptr, std::nullopt, std::vector<int>{2, 3}).ok());
  }
}

TEST_CASE("shard writer contract", "[store][fs]") {
  TempDir t;
  auto w = ShardWriter::open(t.path(), 7, 0);
  REQUIRE(w.ok());
  char data[4] = {1, 2, 3, 4};
  CHECK(w->append("a", data, 4).ok());
  CHECK_THAT(w->append("a", data, 4).error(), Catch::Contains("appended twice"));
  CHECK_THAT(w->append("", data, 4).error(), Catch::Contains("empty"));
  CHECK_THAT(w->append(std::string("\xff\xfe"), data, 4).error(), Catch::Contains("UTF-8"));
  CHECK_THAT(w->append("b", nullptr, 4).error(), Catch::Contains("no data"));
  CHECK(w->append("empty", nullptr, 0).ok());
  auto rec = w->finish();
  REQUIRE(rec.ok());
  CHECK(rec->size == 4);
  CHECK(rec->states.size() == 2);
  CHECK_FALSE(w->finish().ok());
  CHECK_FALSE(w->append("c", data, 4).ok());
  CHECK(fs::file_size(dir_of(t, 7) + "/rank-00000.shard") == 4);

  ShardWriter moved = std::move(w).value();
  CHECK_FALSE(moved.append("d", data, 4).ok());  // still finished after a move

  CHECK_FALSE(ShardWriter::open(t.path(), kMaxStep + 1, 0).ok());
  CHECK_FALSE(ShardWriter::open(t.path(), 8, -1).ok());

  SECTION("an abandoned writer leaves no file behind") {
    {
      auto abandoned = ShardWriter::open(t.path(), 9, 1);
      REQUIRE(abandoned.ok());
      REQUIRE(abandoned->append("x", data, 4).ok());
    }
    CHECK(names_in(dir_of(t, 9)).empty());
  }
  SECTION("the root is created when missing, its parent is not") {
    CHECK(ShardWriter::open(t / "new-root", 1, 0).ok());
    auto deep = ShardWriter::open(t / "no/such/parent", 1, 0);
    REQUIRE_FALSE(deep.ok());
    CHECK_THAT(deep.error(), Catch::Contains("cannot create checkpoint dir"));
  }
}

TEST_CASE("corrupt input is detected and walked back from; nothing is wrongly deleted", "[store][fs]") {
  TempDir t;
  save(t.path(), 100);
  save(t.path(), 200);
  save(t.path(), 300);
  const std::string d300 = dir_of(t, 300);

  SECTION("a flipped bit: verify names the shard, resolve marks FAILED and walks back") {
    flip_bit(d300 + "/rank-00002.shard", 1000);
    CHECK(state_of(t.path(), 300) == State::Complete);  // scan reads no bytes
    ckpt::Status s = verify(t.path(), 300);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error(), Catch::StartsWith("step 300: shard rank-00002.shard (rank 2): checksum mismatch"));
    CHECK(verify(t.path(), 300, /*checksums=*/false).ok());

    // gc before the walk-back must not take the only good one: 300 is the newest, 200 the newest verified.
    auto planned = gc(t.path(), 1, /*dry_run=*/true);
    REQUIRE(planned.ok());
    CHECK(*planned == std::vector<std::uint64_t>{100});

    ResumeChoice no_mark = resolve_resume(t.path(), false);
    CHECK(no_mark.step == 200u);
    CHECK_FALSE(fs::exists(d300 + "/FAILED"));

    ResumeChoice choice = resolve_resume(t.path());
    CHECK(choice.step == 200u);
    REQUIRE(choice.log.size() == 2);
    CHECK_THAT(choice.log[0], Catch::Contains("checksum mismatch") && Catch::EndsWith("marked FAILED"));
    CHECK_THAT(slurp(d300 + "/FAILED"), Catch::Contains("rank-00002.shard"));
    CHECK(state_of(t.path(), 300) == State::Failed);
    CHECK_THAT(verify(t.path(), 300).error(), Catch::Contains("marked FAILED"));
    // Resolving again skips it without verifying.
    CHECK(resolve_resume(t.path()).step == 200u);

    auto deleted = gc(t.path(), 1, false);
    REQUIRE(deleted.ok());
    CHECK(*deleted == std::vector<std::uint64_t>{100});
    CHECK(fs::exists(d300 + "/rank-00002.shard"));
    CHECK(fs::exists(dir_of(t, 200) + "/MANIFEST.json"));
  }
  SECTION("a truncated shard") {
    fs::resize_file(d300 + "/rank-00001.shard", 100);
    CHECK(state_of(t.path(), 300) == State::Corrupt);
    CHECK_THAT(detail_of(t.path(), 300), Catch::Contains("rank-00001.shard (rank 1): 100 bytes, manifest says 4096"));
    CHECK_THAT(verify(t.path(), 300).error(), Catch::Contains("rank-00001.shard"));
    CHECK(resolve_resume(t.path()).step == 200u);
  }
  SECTION("a missing shard") {
    fs::remove(d300 + "/rank-00003.shard");
    CHECK(state_of(t.path(), 300) == State::Corrupt);
    CHECK(verify(t.path(), 300).error() == "step 300: shard rank-00003.shard (rank 3): missing");
    CHECK(resolve_resume(t.path()).step == 200u);
  }
  SECTION("a garbage manifest") {
    spit(d300 + "/MANIFEST.json", "\x01\x02garbage{{{");
    CHECK(state_of(t.path(), 300) == State::Corrupt);
    CHECK(verify(t.path(), 300).error() == "step 300: manifest: not valid JSON");
    CHECK(resolve_resume(t.path()).step == 200u);
  }
  SECTION("an empty manifest") {
    spit(d300 + "/MANIFEST.json", "");
    CHECK(state_of(t.path(), 300) == State::Corrupt);
    CHECK(resolve_resume(t.path()).step == 200u);
  }
  SECTION("a manifest naming ../ paths") {
    std::string text = slurp(d300 + "/MANIFEST.json");
    auto pos = text.find("\"rank-00000.shard\"");
    REQUIRE(pos != std::string::npos);
    text.replace(pos, 18, "\"../000000000200/rank-00000.shard\"");
    spit(d300 + "/MANIFEST.json", text);
    CHECK(state_of(t.path(), 300) == State::Corrupt);
    CHECK_THAT(verify(t.path(), 300).error(), Catch::Contains("unsafe name '../000000000200/rank-00000.shard'"));
    CHECK(resolve_resume(t.path()).step == 200u);
  }
  SECTION("a manifest that claims another step") {
    fs::copy_file(dir_of(t, 200) + "/MANIFEST.json", d300 + "/MANIFEST.json", fs::copy_options::overwrite_existing);
    CHECK_THAT(verify(t.path(), 300).error(), Catch::Contains("manifest says step 200"));
    CHECK(resolve_resume(t.path()).step == 200u);
  }
  SECTION("a shard replaced by a symlink to an identical copy outside") {
    fs::copy_file(d300 + "/rank-00000.shard", t / "outside.shard");
    fs::remove(d300 + "/rank-00000.shard");
    fs::create_symlink(t / "outside.shard", d300 + "/rank-00000.shard");
    CHECK(state_of(t.path(), 300) == State::Corrupt);
    CHECK(detail_of(t.path(), 300) == "symlink planted: rank-00000.shard");
    CHECK(verify(t.path(), 300).error() == "step 300: symlink planted: rank-00000.shard");
    ResumeChoice choice = resolve_resume(t.path());
    CHECK(choice.step == 200u);
    auto deleted = gc(t.path(), 1, false);
    REQUIRE(deleted.ok());
    CHECK(*deleted == std::vector<std::uint64_t>{100});
    CHECK(fs::is_symlink(d300 + "/rank-00000.shard"));
    CHECK(fs::exists(t / "outside.shard"));
  }
  SECTION("a symlink planted anywhere in the step dir") {
    fs::create_symlink("/etc", d300 + "/evil");
    CHECK(state_of(t.path(), 300) == State::Corrupt);
    CHECK(resolve_resume(t.path()).step == 200u);
  }
  SECTION("a step dir that is a symlink") {
    fs::create_directory_symlink(dir_of(t, 200), dir_of(t, 400));
    CHECK(state_of(t.path(), 400) == State::Corrupt);
    CHECK(detail_of(t.path(), 400) == "step dir is a symlink");
    CHECK(resolve_resume(t.path()).step == 300u);
    // Writers refuse to go through it, and gc leaves it alone.
    auto w = ShardWriter::open(t.path(), 400, 0);
    REQUIRE_FALSE(w.ok());
    CHECK_THAT(w.error(), Catch::Contains("symlink or not a directory"));
    CHECK_FALSE(mark_failed(t.path(), 400, "x").ok());
    CHECK_FALSE(fs::exists(dir_of(t, 200) + "/FAILED"));
    auto deleted = gc(t.path(), 2, false);
    REQUIRE(deleted.ok());
    CHECK(*deleted == std::vector<std::uint64_t>{100});
    CHECK(fs::is_symlink(dir_of(t, 400)));
    CHECK(verify(t.path(), 200).ok());
  }
  SECTION("a FIFO planted as the manifest does not hang a reader") {
    fs::remove(d300 + "/MANIFEST.json");
    REQUIRE(::mkfifo((d300 + "/MANIFEST.json").c_str(), 0600) == 0);
    CHECK(state_of(t.path(), 300) == State::Corrupt);
    CHECK_THAT(verify(t.path(), 300).error(), Catch::Contains("not a regular file"));
    CHECK(resolve_resume(t.path()).step == 200u);
  }
  SECTION("every checkpoint bad: nothing to resume from, gc deletes nothing") {
    for (std::uint64_t step : {100, 200, 300}) flip_bit(dir_of(t, step) + "/rank-00000.shard", 5);
    auto refused = gc(t.path(), 1, false);
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(refused.error(), Catch::Contains("verifies; nothing deleted"));
    ResumeChoice choice = resolve_resume(t.path());
    CHECK_FALSE(choice.step.has_value());
    CHECK(choice.log.size() == 4);
    for (std::uint64_t step : {100, 200, 300}) {
      CHECK(state_of(t.path(), step) == State::Failed);
      CHECK(fs::exists(dir_of(t, step) + "/rank-00000.shard"));
    }
  }
}

TEST_CASE("writes never follow a symlink planted for a shard or record", "[store][fs]") {
  TempDir t;
  fs::create_directory(t / "000000000100");
  spit(t / "target", "precious");
  fs::create_symlink(t / "target", t / "000000000100/rank-00000.shard");
  fs::create_symlink(t / "target", t / "000000000100/rank-00000.rec");
  write_shard(t.path(), 100, 0);
  CHECK(slurp(t / "target") == "precious");
  CHECK_FALSE(fs::is_symlink(t / "000000000100/rank-00000.shard"));
  CHECK_FALSE(fs::is_symlink(t / "000000000100/rank-00000.rec"));

  fs::create_symlink(t / "target", t / "000000000100/MANIFEST.json.old");
  for (int r = 1; r < 4; ++r) write_shard(t.path(), 100, r);
  CHECK_THAT(commit(t.path(), manifest_for(100, 4)).error(), Catch::Contains("symlink planted: MANIFEST.json.old"));
  CHECK(slurp(t / "target") == "precious");
}

TEST_CASE("mark_failed is atomic and idempotent when many processes race", "[store][fs]") {
  TempDir t;
  save(t.path(), 100, 2);
  constexpr int kProcs = 12;
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcs; ++i) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      bool ok = mark_failed(t.path(), 100, "reason " + std::to_string(i)).ok();
      ::_exit(ok ? 0 : 1);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  std::string reason = slurp(dir_of(t, 100) + "/FAILED");
  CHECK_THAT(reason, Catch::StartsWith("reason "));
  CHECK(reason.back() == '\n');
  // No temp files left by the losers.
  CHECK(names_in(dir_of(t, 100)) == std::vector<std::string>{"FAILED", "MANIFEST.json", "rank-00000.rec",
                                                             "rank-00000.shard", "rank-00001.rec",
                                                             "rank-00001.shard"});
  CHECK(mark_failed(t.path(), 100, "again").ok());
  CHECK(slurp(dir_of(t, 100) + "/FAILED") == reason);
  CHECK(state_of(t.path(), 100) == State::Failed);
  CHECK_FALSE(mark_failed(t.path(), 999, "no such step").ok());
}

TEST_CASE("gc on real files", "[store][fs]") {
  TempDir t;
  save(t.path(), 100, 2);
  save(t.path(), 200, 2);
  write_shard(t.path(), 150, 0);  // a leftover of a save that died
  save(t.path(), 300, 2);

  SECTION("dry run deletes nothing") {
    auto plan = gc(t.path(), 2, true);
    REQUIRE(plan.ok());
    CHECK(*plan == std::vector<std::uint64_t>{100, 150});
    CHECK(fs::exists(dir_of(t, 100)));
    CHECK(fs::exists(dir_of(t, 150)));
  }
  SECTION("deletes old complete ones and leftovers, keeps the rest intact") {
    auto deleted = gc(t.path(), 2, false);
    REQUIRE(deleted.ok());
    CHECK(*deleted == std::vector<std::uint64_t>{100, 150});
    CHECK(names_in(t.path()) == std::vector<std::string>{"000000000200", "000000000300", "latest"});
    CHECK(verify(t.path(), 200).ok());
    CHECK(verify(t.path(), 300).ok());
  }
  SECTION("nothing while a newer save is in flight") {
    write_shard(t.path(), 400, 0);
    auto deleted = gc(t.path(), 1, false);
    REQUIRE(deleted.ok());
    CHECK(deleted->empty());
    CHECK(names_in(t.path()).size() == 6);
  }
  SECTION("keep 0 is refused") { CHECK_FALSE(gc(t.path(), 0, false).ok()); }
  SECTION("a missing root is an error") {
    auto missing = gc(t / "nope", 1, false);
    REQUIRE_FALSE(missing.ok());
    CHECK_THAT(missing.error(), Catch::Contains("No such file or directory"));
  }
}

TEST_CASE("discard_incomplete clears a dead save's leftovers, and only those", "[store][fs]") {
  TempDir t;
  write_shard(t.path(), 100, 0);
  write_shard(t.path(), 100, 1);
  CHECK(discard_incomplete(t.path(), 100).ok());
  CHECK_FALSE(fs::exists(dir_of(t, 100)));
  CHECK(discard_incomplete(t.path(), 100).ok());  // already gone
  CHECK(discard_incomplete(t / "no-root", 100).ok());

  save(t.path(), 200, 2);
  CHECK_THAT(discard_incomplete(t.path(), 200).error(), Catch::Contains("committed"));
  CHECK(verify(t.path(), 200).ok());
  write_shard(t.path(), 300, 0);
  fs::create_symlink("/etc", dir_of(t, 300) + "/x");
  CHECK_THAT(discard_incomplete(t.path(), 300).error(), Catch::Contains("symlink planted"));
  CHECK(fs::exists(dir_of(t, 300)));
}

TEST_CASE("dead_saves_above finds saves that died, and no committed or FAILED step", "[store][fs]") {
  TempDir t;
  save(t.path(), 100, 2);
  write_shard(t.path(), 200, 0);  // a save that died: no manifest
  save(t.path(), 300, 2);
  write_shard(t.path(), 400, 1);
  write_shard(t.path(), 500, 0);
  REQUIRE(mark_failed(t.path(), 500, "test").ok());
  auto dead = dead_saves_above(t.path(), 100);
  REQUIRE(dead.ok());
  CHECK(*dead == std::vector<std::uint64_t>{200, 400});
  CHECK(*dead_saves_above(t.path(), 300) == std::vector<std::uint64_t>{400});
  CHECK_FALSE(dead_saves_above(t / "nope", 0).ok());
}

TEST_CASE("scan and resolve on a missing or odd root", "[store][fs]") {
  TempDir t;
  auto missing = scan(t / "nope");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error() == "cannot open checkpoint dir '" + (t / "nope") + "': No such file or directory");
  ResumeChoice choice = resolve_resume(t / "nope");
  CHECK_FALSE(choice.step.has_value());
  CHECK(choice.log.size() == 1);

  spit(t / "file", "x");
  CHECK_THAT(scan(t / "file").error(), Catch::Contains("Not a directory"));

  // Names that are not step dirs are ignored; a step-named file is corrupt.
  fs::create_directory(t / "notes");
  spit(t / "000000000001", "not a dir");
  auto entries = scan(t.path());
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == 1);
  CHECK((*entries)[0].state == State::Corrupt);
  CHECK(resolve_resume(t.path()).log.back() == "no complete checkpoint to resume from in " + t.path());
}

TEST_CASE("shard bytes and checksum are exact for any region size and alignment", "[store][fs][direct]") {
  TempDir t;
  auto w = ShardWriter::open(t.path(), 11, 0);
  REQUIRE(w.ok());
  INFO("O_DIRECT: " << w->direct());
  // Aligned and unaligned sources; sizes around the block and bounce-buffer sizes, and one region larger than it.
  const std::vector<std::pair<std::size_t, std::size_t>> regions = {
      {0, 1},       {1, 4095},      {0, 4096},           {0, 4097},  {3, 8192},
      {4096, 4096}, {0, (17u << 20) + 5}, {4096, 33u << 20}, {7, 12345}, {0, 0}};
  std::vector<char> expected;
  std::size_t index = 0;
  for (auto [offset, size] : regions) {
    std::vector<char> storage(offset + size + 4096);
    char* base = storage.data() + (4096 - reinterpret_cast<std::uintptr_t>(storage.data()) % 4096) % 4096;
    char* p = base + offset;
    for (std::size_t i = 0; i < size; ++i) p[i] = static_cast<char>((i * 131 + index * 7) & 0xff);
    std::string name = "r";  // not "r" + ...: GCC 12 warns falsely (-Wrestrict) about that at -O3
    name += std::to_string(index++);
    REQUIRE(w->append(name, p, size).ok());
    expected.insert(expected.end(), p, p + size);
  }
  auto rec = w->finish();
  REQUIRE(rec.ok());
  CHECK(rec->size == expected.size());
  CHECK(rec->checksum == XXH3_64bits(expected.data(), expected.size()));
  std::ifstream in(dir_of(t, 11) + "/rank-00000.shard", std::ios::binary);
  std::vector<char> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(got.size() == expected.size());
  CHECK(got == expected);
}

TEST_CASE("control files: atomic, read back whole, never through a symlink", "[store][fs]") {
  TempDir t;
  auto absent = read_control_file(t.path(), "auto-interval.json");
  REQUIRE(absent.ok());
  CHECK_FALSE(absent->has_value());
  CHECK_FALSE(read_control_file(t / "no-root", "x")->has_value());  // a root not created yet

  REQUIRE(write_control_file(t.path(), "auto-interval.json", "{\"version\": 1}").ok());
  REQUIRE(write_control_file(t.path(), "auto-interval.json", "{\"version\": 2}").ok());  // replaced whole
  auto back = read_control_file(t.path(), "auto-interval.json");
  REQUIRE(back.ok());
  CHECK(**back == "{\"version\": 2}");
  CHECK((fs::status(t / ".control").permissions() & fs::perms::others_all) == fs::perms::none);

  CHECK_THAT(write_control_file(t.path(), "../escape", "x").error(), Catch::Contains("not a safe control file name"));
  CHECK_FALSE(fs::exists(t / "escape"));
  CHECK_THAT(read_control_file(t.path(), "..").error(), Catch::Contains("not a safe control file name"));

  fs::create_symlink("/etc/hostname", t / ".control/planted");
  CHECK_THAT(read_control_file(t.path(), "planted").error(), Catch::Contains("symlink"));
  TempDir other;
  fs::create_directory(other / "real");
  fs::create_directory_symlink(other / "real", other / ".control");
  CHECK_FALSE(write_control_file(other.path(), "x", "y").ok());
  CHECK_FALSE(fs::exists(other / "real/x"));
}

// A shard record's range named `name` at `offset` holding `bytes`, with their checksum.
static StateRange range_holding(const std::string& name, std::uint64_t offset, const std::vector<unsigned char>& bytes) {
  StateRange r;
  r.name = name;
  r.offset = offset;
  r.length = bytes.size();
  r.checksum = XXH3_64bits(bytes.data(), bytes.size());
  return r;
}

TEST_CASE("match_live_ranges: memory that holds a range's bytes exactly, by name, length and checksum",
          "[store][fs]") {
  ShardRecord record;
  std::vector<unsigned char> a(4096, 7), b(64, 9);
  StateRange ra = range_holding("a", 0, a);
  StateRange rb = range_holding("b", a.size(), b);
  StateRange old;  // written before ranges had checksums
  old.name = "old";
  old.length = b.size();
  record.states = {ra, rb, old};
  std::vector<unsigned char> b2 = b;
  b2[3] = 0;
  auto m = match_live_ranges(record, {{"b", b.data(), b.size()}, {"a", a.data(), a.size()}, {"old", b.data(), b.size()}});
  REQUIRE(m.size() == 3);
  CHECK(m[0] == std::optional<std::size_t>(1));
  CHECK(m[1] == std::optional<std::size_t>(0));
  CHECK_FALSE(m[2]);  // no checksum of its own: never taken from memory
  m = match_live_ranges(record, {{"a", a.data(), a.size() - 1}, {"b", b2.data(), b2.size()}});
  CHECK_FALSE(m[0]);  // another length
  CHECK_FALSE(m[1]);  // another byte
  std::vector<unsigned char> a2 = a;
  a2[0] = 1;
  m = match_live_ranges(record, {{"a", a2.data(), a2.size()}, {"a", a.data(), a.size()}, {"a", a.data(), a.size()}});
  CHECK(m[0] == std::optional<std::size_t>(1));  // a name given more than once: the first whose bytes match
  m = match_live_ranges(record, {{"a", a.data(), a.size()}, {"a", a.data(), a.size()}});
  CHECK(m[0] == std::optional<std::size_t>(0));
}

TEST_CASE("match_live_ranges: memory recorded with the range's checksum comes first; recorded otherwise, never",
          "[store][fs]") {
  std::vector<unsigned char> a(4096, 7), fresh(4096, 0);
  StateRange ra = range_holding("a", 0, a);
  ShardRecord record;
  record.states = {ra};
  std::vector<unsigned char> tier = a;  // a node tier's copy of the same bytes
  // A relaunch: the program's fresh tensor first, the node tier's range after it, recorded with the range's sum.
  auto m = match_live_ranges(record, {{"a", fresh.data(), fresh.size(), {}}, {"a", tier.data(), tier.size(), *ra.checksum}});
  CHECK(m[0] == std::optional<std::size_t>(1));
  // The program's memory holds the bytes too: the recorded range still comes first (its checksum is the record's).
  m = match_live_ranges(record, {{"a", a.data(), a.size(), {}}, {"a", tier.data(), tier.size(), *ra.checksum}});
  CHECK(m[0] == std::optional<std::size_t>(1));
  // Recorded with that checksum but its bytes changed since: checked, refused, and the program's memory used.
  tier[10] ^= 1;
  m = match_live_ranges(record, {{"a", a.data(), a.size(), {}}, {"a", tier.data(), tier.size(), *ra.checksum}});
  CHECK(m[0] == std::optional<std::size_t>(0));
  // Recorded with another checksum (another step's bytes): never taken, even where the bytes would match now.
  tier = a;
  m = match_live_ranges(record, {{"a", tier.data(), tier.size(), *ra.checksum + 1}});
  CHECK_FALSE(m[0]);
  m = match_live_ranges(record, {{"a", tier.data(), tier.size(), *ra.checksum + 1}, {"a", a.data(), a.size(), {}}});
  CHECK(m[0] == std::optional<std::size_t>(1));
}
