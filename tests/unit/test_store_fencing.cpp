// Fencing of stale runs in the store: the epoch record, its decisions, and every change a run older than the newest
// one that started makes to the dir (shard, commit, latest, FAILED, gc, discard, control files) being refused while
// the newer run's work goes on.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/store.hpp"
#include "store_test_util.hpp"

using namespace ckpt;
using namespace ckpt::store;
namespace fs = std::filesystem;

namespace {

using test::TempDir;
using test::slurp;
using test::spit;

Manifest manifest_for(std::uint64_t step, int world) {
  Manifest m;
  m.step = step;
  m.world_size = world;
  m.layout.dp = world;
  for (int r = 0; r < world; ++r) m.ranks.push_back({r, r, 0, 0});
  return m;
}

Result<ShardRecord> write_shard(const std::string& root, std::uint64_t step, int rank,
                                const std::optional<Fence>& fence) {
  auto w = ShardWriter::open(root, step, rank, nullptr, fence);
  if (!w) return Error{w.error()};
  std::vector<char> data(4096, static_cast<char>(step + static_cast<std::uint64_t>(rank)));
  if (Status s = w->append("model", data.data(), data.size()); !s) return Error{s.error()};
  return w->finish();
}

Status save(const std::string& root, std::uint64_t step, const std::optional<Fence>& fence) {
  if (auto r = write_shard(root, step, 0, fence); !r) return Status::failure(r.error());
  return commit(root, manifest_for(step, 1), nullptr, fence);
}

const Fence kRun0{"42", 0};
const Fence kRun1{"42", 1};
const std::string kRefusal = "run 0 of job 42 is fenced: run 1 has started";

}  // namespace

TEST_CASE("fencing decisions", "[store][fencing]") {
  SECTION("no record: nobody is fenced, a starting run writes one") {
    CHECK_FALSE(fence_refusal(kRun0, std::nullopt));
    CHECK(plan_epoch_raise(kRun0, std::nullopt) == EpochAction::Write);
  }
  SECTION("a newer epoch of the same job fences the older one") {
    EpochRecord r{"42", 1, "42.r1"};
    REQUIRE(fence_refusal(kRun0, r));
    CHECK(*fence_refusal(kRun0, r) == kRefusal);
    CHECK(plan_epoch_raise(kRun0, r) == EpochAction::Fenced);
    CHECK_FALSE(fence_refusal(kRun1, r));
    CHECK(plan_epoch_raise(kRun1, r) == EpochAction::Keep);
    CHECK_FALSE(fence_refusal(Fence{"42", 2}, r));
    CHECK(plan_epoch_raise(Fence{"42", 2}, r) == EpochAction::Write);  // raised, never lowered
  }
  SECTION("restart in place: a later generation of the same run fences the earlier ones") {
    EpochRecord r{"42", 1, "42.r1.g2", 2};
    CHECK(*fence_refusal(Fence{"42", 1, 1}, r) ==
          "run 1 (generation 1) of job 42 is fenced: run 1 (generation 2) has started");
    CHECK(plan_epoch_raise(Fence{"42", 1, 1}, r) == EpochAction::Fenced);
    CHECK(fence_refusal(kRun1, r));                       // generation 0, a frozen rank that thawed
    CHECK_FALSE(fence_refusal(Fence{"42", 1, 2}, r));
    CHECK(plan_epoch_raise(Fence{"42", 1, 2}, r) == EpochAction::Keep);
    CHECK(plan_epoch_raise(Fence{"42", 1, 3}, r) == EpochAction::Write);
    CHECK(plan_epoch_raise(Fence{"42", 2, 0}, r) == EpochAction::Write);  // a requeue starts over at 0
    auto parsed = parse_epoch_record(to_json(r));
    REQUIRE(parsed.ok());
    CHECK(parsed->generation == 2);
    CHECK(parse_epoch_record(R"({"job_id":"42","epoch":1})")->generation == 0);  // written before generations
    CHECK_FALSE(parse_epoch_record(R"({"job_id":"42","epoch":1,"generation":-1})").ok());
  }
  SECTION("another job that started in the dir fences; a starting job takes the dir over") {
    EpochRecord r{"43", 0, ""};
    REQUIRE(fence_refusal(kRun1, r));
    CHECK(*fence_refusal(kRun1, r) == "run 1 of job 42 is fenced: job 43 (run 0) has started in this checkpoint dir");
    CHECK(plan_epoch_raise(kRun1, r) == EpochAction::Write);
    CHECK(*fence_refusal(Fence{"", 0}, EpochRecord{"", 3, ""}) == "run 0 of the job is fenced: run 3 has started");
  }
  SECTION("the record: good inputs") {
    EpochRecord r{"42", 7, "42.s0.r7"};
    auto back = parse_epoch_record(to_json(r));
    REQUIRE(back.ok());
    CHECK(back->job_id == "42");
    CHECK(back->epoch == 7);
    CHECK(back->run_id == "42.s0.r7");
    CHECK(parse_epoch_record(R"({"job_id":"","epoch":0})").ok());
  }
  SECTION("the record: bad inputs") {
    for (const char* bad : {"", "[]", "{}", "not json", R"({"job_id":42,"epoch":1})", R"({"job_id":"42"})",
                            R"({"job_id":"42","epoch":-1})", R"({"job_id":"42","epoch":1.5})",
                            R"({"job_id":"42","epoch":"1"})", R"({"job_id":"42","epoch":1,"run_id":3})"}) {
      INFO(bad);
      CHECK_FALSE(parse_epoch_record(bad).ok());
    }
  }
}

TEST_CASE("a run older than the newest one that started changes nothing in the dir", "[store][fencing]") {
  TempDir dir;
  const std::string root = dir.path();
  REQUIRE(raise_epoch(root, kRun0, "42.r0").ok());
  REQUIRE(save(root, 10, kRun0).ok());
  // A shard of step 20 written by run 0 before run 1 starts, and one still in flight when it does.
  REQUIRE(write_shard(root, 20, 0, kRun0).ok());
  auto in_flight = ShardWriter::open(root, 30, 0, nullptr, kRun0);
  REQUIRE(in_flight.ok());
  std::vector<char> bytes(8192, 'x');
  REQUIRE(in_flight->append("model", bytes.data(), bytes.size()).ok());

  // Run 1 starts.
  REQUIRE(raise_epoch(root, kRun1, "42.r1").ok());
  auto record = read_epoch(root);
  REQUIRE(record.ok());
  REQUIRE(record->has_value());
  CHECK((*record)->epoch == 1);

  SECTION("a shard write is refused, at open and at finish; nothing is published") {
    auto opened = ShardWriter::open(root, 40, 0, nullptr, kRun0);
    REQUIRE_FALSE(opened.ok());
    CHECK(opened.error() == kRefusal);
    CHECK_FALSE(fs::exists(dir / step_dir_name(40)));
    auto finished = in_flight->finish();
    REQUIRE_FALSE(finished.ok());
    CHECK(finished.error().find(kRefusal) != std::string::npos);
    CHECK(fs::is_empty(dir / step_dir_name(30)));  // neither the shard, nor its record, nor a temp file
  }
  SECTION("a commit is refused: no manifest, latest stays") {
    Status s = commit(root, manifest_for(20, 1), nullptr, kRun0);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().find(kRefusal) != std::string::npos);
    CHECK_FALSE(fs::exists(dir / (step_dir_name(20) + "/MANIFEST.json")));
    CHECK(slurp(dir / "latest") == step_dir_name(10) + "\n");
  }
  SECTION("marking FAILED is refused, also by a resolve that would mark") {
    spit(dir / (step_dir_name(10) + "/" + shard_file_name(0)), std::string(4096, 'z'));  // checksum mismatch
    Status s = mark_failed(root, 10, "bad", kRun0);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().find(kRefusal) != std::string::npos);
    ResumeChoice choice = resolve_resume(root, true, kRun0);
    CHECK_FALSE(choice.step);
    CHECK_FALSE(fs::exists(dir / (step_dir_name(10) + "/FAILED")));
    // The newer run may.
    REQUIRE(mark_failed(root, 10, "bad", kRun1).ok());
    CHECK(fs::exists(dir / (step_dir_name(10) + "/FAILED")));
  }
  SECTION("gc and discard are refused: nothing is deleted") {
    REQUIRE(save(root, 50, kRun1).ok());
    auto deleted = gc(root, 1, false, kRun0);
    REQUIRE_FALSE(deleted.ok());
    CHECK(deleted.error().find(kRefusal) != std::string::npos);
    CHECK(fs::exists(dir / step_dir_name(10)));
    Status discarded = discard_incomplete(root, 20, kRun0);
    REQUIRE_FALSE(discarded.ok());
    CHECK(discarded.error().find(kRefusal) != std::string::npos);
    CHECK(fs::exists(dir / (step_dir_name(20) + "/" + record_file_name(0))));
    // The newer run's retention and discard work.
    auto by_run1 = gc(root, 1, false, kRun1);
    REQUIRE(by_run1.ok());
    CHECK(*by_run1 == std::vector<std::uint64_t>{10, 20, 30});  // 30: the stale writer's hidden temp file
  }
  SECTION("control files are refused; the epoch record is written by raise_epoch only") {
    Status s = write_control_file(root, "auto-interval.json", "{}", kRun0);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error() == kRefusal);
    CHECK_FALSE(fs::exists(dir / ".control/auto-interval.json"));
    CHECK(write_control_file(root, "auto-interval.json", "{}", kRun1).ok());
    CHECK_FALSE(write_control_file(root, std::string(kEpochName), "{}").ok());
  }
  SECTION("the older run cannot lower the record by starting again") {
    Status s = raise_epoch(root, kRun0, "42.r0");
    REQUIRE_FALSE(s.ok());
    CHECK(s.error() == kRefusal);
    CHECK((*read_epoch(root))->epoch == 1);
  }
  SECTION("the newer run's work is unaffected, and callers without a fence are not fenced") {
    REQUIRE(save(root, 60, kRun1).ok());
    CHECK(slurp(dir / "latest") == step_dir_name(60) + "\n");
    REQUIRE(save(root, 70, std::nullopt).ok());  // the CLI, tools
    ResumeChoice choice = resolve_resume(root, false);
    REQUIRE(choice.step);
    CHECK(*choice.step == 70);
  }
  SECTION("a commit by the newer run writes its epoch back over a record an older run lowered") {
    spit(dir / ".control/epoch.json", to_json(EpochRecord{"42", 0, "42.r0"}));
    REQUIRE(save(root, 80, kRun1).ok());
    CHECK((*read_epoch(root))->epoch == 1);
    CHECK_FALSE(save(root, 90, kRun0).ok());
  }
  SECTION("an unreadable record refuses a fenced caller; a run that starts replaces it") {
    spit(dir / ".control/epoch.json", "garbage");
    Status s = commit(root, manifest_for(20, 1), nullptr, kRun1);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().find("cannot tell whether this run is fenced") != std::string::npos);
    REQUIRE(raise_epoch(root, Fence{"42", 2}).ok());
    CHECK(commit(root, manifest_for(20, 1), nullptr, Fence{"42", 2}).ok());
  }
}

TEST_CASE("a new job in a dir fences the job that used it before", "[store][fencing]") {
  TempDir dir;
  REQUIRE(raise_epoch(dir.path(), Fence{"41", 3}).ok());
  REQUIRE(save(dir.path(), 5, Fence{"41", 3}).ok());
  REQUIRE(raise_epoch(dir.path(), Fence{"42", 0}).ok());
  Status s = save(dir.path(), 6, Fence{"41", 3});
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().find("job 42 (run 0) has started") != std::string::npos);
  CHECK(save(dir.path(), 6, Fence{"42", 0}).ok());
}

TEST_CASE("a run's terminal checkpoint is claimed once: one side of a partition writes", "[store][fencing]") {
  TempDir dir;
  const std::string root = dir.path();
  REQUIRE(raise_epoch(root, kRun0, "42.r0").ok());
  const std::string name = last_words_claim_name(kRun0);
  CHECK(name == "last-words-42-0-0.claim");
  CHECK(last_words_claim_name(Fence{"4/2", 3, 1}) == "last-words-4_2-3-1.claim");
  auto first = claim_control_file(root, name, "{\"rank\":0}", kRun0);
  REQUIRE(first);
  CHECK(*first);
  auto second = claim_control_file(root, name, "{\"rank\":2}", kRun0);  // the other side, a moment later
  REQUIRE(second);
  CHECK_FALSE(*second);
  auto kept = read_control_file(root, name);
  REQUIRE(kept);
  CHECK(**kept == "{\"rank\":0}");
  // The next run claims its own; the old run's claim, once it is fenced, is refused.
  REQUIRE(raise_epoch(root, kRun1, "42.r1").ok());
  auto next = claim_control_file(root, last_words_claim_name(kRun1), "{}", kRun1);
  REQUIRE(next);
  CHECK(*next);
  CHECK_FALSE(claim_control_file(root, "last-words-42-0-9.claim", "{}", kRun0));
  CHECK_FALSE(claim_control_file(root, "../escape", "{}", kRun1));
}
