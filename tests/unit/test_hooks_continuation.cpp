// After a terminal checkpoint for the time limit: the record the controller reads, the no-progress budget and the
// line that says which path continues the job. CKPT_REQUEUE=self runs scontrol; its cluster test covers that path.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "continuation.hpp"
#include "ckpt/store.hpp"
#include "hooks_test_util.hpp"

using namespace ckpt::hooks;

namespace {

nlohmann::json record(const std::string& dir) {
  auto text = ckpt::store::read_control_file(dir, kTimeLimitStopFile);
  REQUIRE(text.ok());
  REQUIRE(text->has_value());
  return nlohmann::json::parse(**text);
}

}  // namespace

TEST_CASE("a time-limit stop records the run and says who continues the job", "[hooks][continuation]") {
  test::TempDir dir;
  test::LogCapture log;
  TimeLimitStop stop{dir.path(), "77", 2, 566, 300, 3, "controller"};

  SECTION("progress: the controller continues it") {
    continue_after_time_limit(stop);
    auto j = record(dir.path());
    CHECK(j["job_id"] == "77");
    CHECK(j["restart_count"] == 2);
    CHECK(j["step"] == 566);
    CHECK(j["progress"] == true);
    CHECK(j["no_progress"] == 0);
    CHECK(log.has("time-limit stop at step 566: the recovery controller continues the job in a new allocation"));
  }
  SECTION("stops without progress count up to CKPT_MAX_RESTARTS, then the job ends") {
    stop.step = 300;  // nothing beyond the step this run resumed from
    for (int i = 1; i <= 3; ++i) {
      continue_after_time_limit(stop);
      CHECK(record(dir.path())["no_progress"] == i);
    }
    CHECK_FALSE(log.has("without progress"));
    continue_after_time_limit(stop);
    CHECK(record(dir.path())["no_progress"] == 4);
    CHECK(log.has("4 stops in a row without progress (CKPT_MAX_RESTARTS=3): the job is not continued"));
  }
  SECTION("progress resets the count; another job's record does not carry over") {
    stop.step = 300;
    continue_after_time_limit(stop);
    continue_after_time_limit(stop);
    CHECK(record(dir.path())["no_progress"] == 2);
    stop.job_id = "78";
    continue_after_time_limit(stop);
    CHECK(record(dir.path())["no_progress"] == 1);
    stop.step = 301;
    continue_after_time_limit(stop);
    CHECK(record(dir.path())["no_progress"] == 0);
  }
  SECTION("off: the job ends here") {
    stop.requeue = "off";
    continue_after_time_limit(stop);
    CHECK(log.has("CKPT_REQUEUE=off: the job ends here"));
  }
  SECTION("self outside Slurm: nothing to requeue") {
    stop.requeue = "self";
    stop.job_id = "";
    continue_after_time_limit(stop);
    CHECK(log.has("not a Slurm job: nothing to requeue"));
  }
}
