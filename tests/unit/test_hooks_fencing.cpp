// Fencing through the hooks: two runs of one job against one dir, as after a requeue while a node of the earlier
// run was frozen. Once the newer run (restart count 1) has started, the older one's periodic and terminal
// checkpoints are refused, `ckpt latest` still names the newer run's step, and the two runs share no control files.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "coordinator.hpp"
#include "hooks_test_util.hpp"

using namespace ckpt;
using namespace ckpt::hooks;
using namespace std::chrono_literals;

namespace {

Options run_options(const std::string& dir, std::uint64_t restart_count) {
  return test::options({{"dir", dir},
                        {"interval", "1steps"},
                        {"keep", "10"},
                        {"job_id", "42"},
                        {"restart_count", std::to_string(restart_count)}});
}

// Trains `steps`, each an update of `state` and a periodic checkpoint, and waits until they are committed.
void train(Checkpointer& cp, std::vector<unsigned char>& state, std::vector<std::uint64_t> steps) {
  for (std::uint64_t step : steps) {
    REQUIRE(cp.before_update().ok());
    std::fill(state.begin(), state.end(), static_cast<unsigned char>(step));
    REQUIRE_FALSE(*cp.after_step(step));
  }
}

bool committed(const Checkpointer& cp, std::uint64_t step) {
  auto last = cp.stats().last_committed_step;
  return last && *last >= step;
}

// The output of `ckpt latest <dir>` from the build's CLI (next to the test binary's dir); empty when not built.
std::string ckpt_latest(const std::string& dir) {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  auto cli = exe.parent_path().parent_path() / "cli" / "ckpt";
  if (!std::filesystem::exists(cli)) return {};
  std::string cmd = cli.string() + " latest '" + dir + "' 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {};
  std::string out;
  std::array<char, 256> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) out += buf.data();
  ::pclose(p);
  return out;
}

}  // namespace

TEST_CASE("a stale run's checkpoints are refused once a newer run of the job started", "[hooks][store][fencing]") {
  test::TempDir dir;
  test::LogCapture log;
  std::vector<unsigned char> old_state(64 << 10, 0), new_state(64 << 10, 0);

  auto old_run = test::make(run_options(dir.path(), 0));
  REQUIRE(old_run->register_region({"w", old_state.data(), old_state.size()}).ok());
  REQUIRE(*old_run->restore() == 0);
  train(*old_run, old_state, {1, 2});
  REQUIRE(test::wait_for([&] { return committed(*old_run, 2); }, 10s));

  // The job is requeued while a node of the old run is frozen: the new run starts, resumes and trains.
  auto new_run = test::make(run_options(dir.path(), 1));
  REQUIRE(new_run->register_region({"w", new_state.data(), new_state.size()}).ok());
  REQUIRE(*new_run->restore() == 2);
  auto epoch = store::read_epoch(dir.path());
  REQUIRE(epoch.ok());
  REQUIRE(epoch->has_value());
  CHECK((*epoch)->epoch == 1);
  train(*new_run, new_state, {3, 4});
  REQUIRE(test::wait_for([&] { return committed(*new_run, 4); }, 10s));

  // The old run thaws: its periodic checkpoint and its terminal one are refused, and it says why.
  const std::string refusal = "run 0 of job 42 is fenced: run 1 has started";
  train(*old_run, old_state, {5});
  REQUIRE(old_run->save(6, store::Kind::Terminal).ok());  // taken; refused when persisted
  Status closed = old_run->close();
  REQUIRE_FALSE(closed.ok());
  CHECK(closed.error().find(refusal) != std::string::npos);
  CHECK(log.has(refusal));
  CHECK(old_run->stats().last_committed_step == std::optional<std::uint64_t>(2));
  CHECK_FALSE(std::filesystem::exists(dir.sub(store::step_dir_name(5))));
  CHECK_FALSE(std::filesystem::exists(dir.sub(store::step_dir_name(6))));

  // The new run's work is unaffected: it goes on, and a restart resolves to its step.
  train(*new_run, new_state, {7});
  REQUIRE(new_run->close().ok());
  CHECK(test::committed_steps(dir.path()) == std::vector<std::uint64_t>{1, 2, 3, 4, 7});
  store::ResumeChoice choice = store::resolve_resume(dir.path(), false);
  REQUIRE(choice.step);
  CHECK(*choice.step == 7);
  CHECK((test::read_region(dir.path(), 7, 0, "w") == std::vector<unsigned char>(new_state.size(), 7)));
  std::ifstream latest(dir.sub("latest"));
  std::string latest_name;
  latest >> latest_name;
  CHECK(latest_name == store::step_dir_name(7));
  std::string cli = ckpt_latest(dir.path());
  if (cli.empty()) {
    WARN("build/cli/ckpt not found next to the test binary: `ckpt latest` not checked");
  } else {
    CHECK(cli == dir.sub(store::step_dir_name(7)) + "\n");
  }

  // A rank of the old run that starts only now (frozen during start-up) is refused at once.
  auto late = Checkpointer::create(run_options(dir.path(), 0));
  REQUIRE_FALSE(late.ok());
  CHECK(late.error() == "ckpt: " + refusal);
}

TEST_CASE("a stale run takes no part in the newer run's coordination", "[hooks][fencing]") {
  test::TempDir dir;
  // The run ids the two runs derive differ by the restart count, and with them every control namespace: the
  // requests, failure reports and heartbeat mesh dir (<run id>-mesh) of one run are not the other's.
  auto old_config = load_config(run_options(dir.path(), 0));
  auto new_config = load_config(run_options(dir.path(), 1));
  REQUIRE(old_config.ok());
  REQUIRE(new_config.ok());
  CHECK(old_config->run_id != new_config->run_id);
  ControlDir old_control(dir.path(), old_config->run_id, 0), new_control(dir.path(), new_config->run_id, 0);
  old_control.begin(2);
  new_control.begin(2);
  CHECK(old_control.path() != new_control.path());
  REQUIRE(old_control.request(5, store::Kind::Terminal).ok());
  REQUIRE(old_control.report_failure(5, "stale").ok());
  CHECK_FALSE(new_control.requested(5).has_value());
  CHECK_FALSE(new_control.failure(5, 0).has_value());
}
