#include <catch2/catch.hpp>

#include <fcntl.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include <map>
#include <set>
#include <string>
#include <utility>

#include "ckpt/env_contract.hpp"
#include "ckpt/hooks.hpp"
#include "ckpt/options.hpp"
#include "ckpt/posix.hpp"
#include "hooks_test_util.hpp"
#include "rendezvous.hpp"

using namespace ckpt;
using namespace ckpt::hooks;
using ckpt::hooks::test::ScopedEnv;

namespace {

// load_config over a fake environment.
Result<Config> load(const std::map<std::string, std::string>& env, const Options& o = {}) {
  return load_config(o, [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST_CASE("hooks settings from the environment", "[hooks][config]") {
  SECTION("good inputs") {
    auto c = load({{"CKPT_DIR", "/ckpt//job/./7/"},
                   {"CKPT_INTERVAL", "500steps"},
                   {"CKPT_KEEP", "5"},
                   {"CKPT_LAST_WORDS", "off"},
                   {"CKPT_MTBF", "86400s"},
                   {"CKPT_GRACE", "90s"},
                   {"CKPT_MIN_INTERVAL", "5s"},
                   {"CKPT_MAX_INTERVAL", "2h"},
                   {"CKPT_MAX_RESTARTS", "4"},
                   {"CKPT_RESTART_COUNT", "2"},
                   {"CKPT_JOB_ID", "1234"},
                   {"CKPT_RESUME_STEP", "200"},
                   {"CKPT_RESUME_PATH", "/ckpt/job/7/000000000200"},
                   {"CKPT_END_TIME", "1700000000"},
                   {"CKPT_KILL_WAIT", "30s"},
                   {"SLURM_PROCID", "3"},
                   {"SLURM_NTASKS", "8"},
                   {"SLURM_LOCALID", "1"}});
    REQUIRE(c.ok());
    CHECK(c->dir == "/ckpt/job/7");
    CHECK(c->interval == Interval{Interval::Kind::Steps, 500});
    CHECK(c->keep == 5);
    CHECK_FALSE(c->last_words);
    CHECK(c->mtbf_s == 86400);
    CHECK(c->grace_s == 90);
    CHECK(c->min_interval_s == 5);
    CHECK(c->max_interval_s == 7200);
    CHECK(c->max_restarts == 4);
    CHECK(c->restart_count == 2);
    CHECK(c->job_id == "1234");
    CHECK(c->resume_step == 200u);
    CHECK(c->resume_path == "/ckpt/job/7/000000000200");
    CHECK(c->end_time == 1700000000);
    CHECK(c->kill_wait_s == 30);
    CHECK(c->rank == 3);
    CHECK(c->world_size == 8);
    CHECK(c->local_rank == 1);
    CHECK(c->rank_source == "slurm");
    CHECK(c->run_id == "1234.r2");
  }
  SECTION("defaults") {
    auto c = load({});
    REQUIRE(c.ok());
    CHECK(c->dir.empty());
    CHECK(c->interval.kind == Interval::Kind::Auto);
    CHECK(c->keep == BuiltinDefaults::keep);
    CHECK(c->grace_s == BuiltinDefaults::grace_s);
    CHECK(c->kill_wait_s == 5);
    CHECK(c->min_interval_s == SitePolicy{}.min_interval_s);
    CHECK(c->max_interval_s == 0);
    CHECK(c->rank == 0);
    CHECK(c->world_size == 1);
    CHECK(c->rank_source == "single");
    CHECK_FALSE(c->end_time.has_value());
    CHECK_FALSE(c->resume_step.has_value());
    CHECK(c->signals);
    CHECK(c->memory_bytes == 0);  // no memory tier
    CHECK(c->memory_interval == 1);
    CHECK(c->memory_distance == 1);
  }
  SECTION("the mailboxes restart in place watches while the heartbeat network forms") {
    CHECK(load({})->inplace_watch.empty());
    auto c = load({{"CKPT_INPLACE_WATCH", "10.0.0.2:5000,10.0.0.3:41234"}});
    REQUIRE(c.ok());
    using Watch = std::vector<std::pair<std::string, std::string>>;
    CHECK(c->inplace_watch == Watch{{"10.0.0.2", "5000"}, {"10.0.0.3", "41234"}});
  }
  SECTION("the memory tier") {
    auto c = load({{"CKPT_MEMORY", "4G"}, {"CKPT_MEMORY_INTERVAL", "10"}, {"CKPT_MEMORY_DISTANCE", "2"}});
    REQUIRE(c.ok());
    CHECK(c->memory_bytes == 4ull << 30);
    CHECK(c->memory_interval == 10);
    CHECK(c->memory_distance == 2);
    CHECK(load({{"CKPT_MEMORY_INTERVAL", "auto"}})->memory_interval == kMemoryIntervalAuto);
    CHECK(load({{"CKPT_MEMORY", "off"}})->memory_bytes == 0);
    CHECK(load({{"CKPT_MEMORY", "0"}})->memory_bytes == 0);
    CHECK(load({{"CKPT_MEMORY", "536870912"}})->memory_bytes == 512ull << 20);
    Options o;
    REQUIRE(o.set("memory", "2G").ok());
    REQUIRE(o.set("memory_interval", "3").ok());
    REQUIRE(o.set("memory_distance", "4").ok());
    auto over = load({{"CKPT_MEMORY", "8G"}, {"CKPT_MEMORY_INTERVAL", "1"}}, o);
    REQUIRE(over.ok());
    CHECK(over->memory_bytes == 2ull << 30);
    CHECK(over->memory_interval == 3);
    CHECK(over->memory_distance == 4);
  }
  SECTION("the node tier's dir") {
    CHECK(load({})->node_dir == "/dev/shm");
    CHECK(load({{"CKPT_NODE_DIR", "/local/ram/"}})->node_dir == "/local/ram");
    CHECK(load({{"CKPT_NODE_DIR", "off"}})->node_dir.empty());
    auto relative = load({{"CKPT_NODE_DIR", "shm"}});
    REQUIRE_FALSE(relative.ok());
    CHECK_THAT(relative.error(), Catch::Contains("CKPT_NODE_DIR='shm'"));
  }
  SECTION("torchrun variables win over srun's (torchrun under srun)") {
    auto c = load({{"RANK", "5"}, {"WORLD_SIZE", "6"}, {"LOCAL_RANK", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
    REQUIRE(c.ok());
    CHECK(c->rank == 5);
    CHECK(c->world_size == 6);
    CHECK(c->local_rank == 1);
    CHECK(c->rank_source == "torchrun");
  }
  SECTION("overrides win over the environment") {
    Options o;
    REQUIRE(o.set("dir", "/elsewhere").ok());
    REQUIRE(o.set("interval", "15m").ok());
    REQUIRE(o.set("rank", "1").ok());
    REQUIRE(o.set("world_size", "2").ok());
    auto c = load({{"CKPT_DIR", "/ckpt"}, {"CKPT_INTERVAL", "10steps"}, {"RANK", "0"}, {"WORLD_SIZE", "4"}}, o);
    REQUIRE(c.ok());
    CHECK(c->dir == "/elsewhere");
    CHECK(c->interval == Interval{Interval::Kind::Seconds, 900});
    CHECK(c->rank == 1);
    CHECK(c->world_size == 2);
    CHECK(c->rank_source == "override");
  }
  SECTION("the job's end time: CKPT_END_TIME, else SLURM_JOB_END_TIME") {
    CHECK(load({{"SLURM_JOB_END_TIME", "1700000123"}})->end_time == 1700000123);
    CHECK(load({{"SLURM_JOB_END_TIME", "1"}, {"CKPT_END_TIME", "2"}})->end_time == 2);
  }
  SECTION("run ids differ between launches and are safe file names") {
    auto a = load({{"MASTER_PORT", "29500"}});
    auto b = load({{"MASTER_PORT", "29501"}});
    auto c = load({{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "3"}, {"TORCHELASTIC_RUN_ID", "a/b c"}});
    REQUIRE((a.ok() && b.ok() && c.ok()));
    CHECK(a->run_id != b->run_id);
    CHECK(c->run_id == "77.s3.r0.a_b_c");
    CHECK(load({{"CKPT_RUN_ID", "mine-1"}})->run_id == "mine-1");
    CHECK(load({{"CKPT_RUN_ATTEMPT", "2"}})->run_id == "local.r0.a2");  // ckpt-run's relaunches differ too
  }
}

TEST_CASE("hooks settings reject bad values with one clear line", "[hooks][config]") {
  SECTION("bad inputs") {
    const std::map<std::string, std::string> bad[] = {
        {{"CKPT_DIR", "relative/dir"}},
        {{"CKPT_DIR", "/a/../b"}},
        {{"CKPT_INTERVAL", "often"}},
        {{"CKPT_INTERVAL", "0steps"}},
        {{"CKPT_INTERVAL", "10 steps"}},
        {{"CKPT_KEEP", "0"}},
        {{"CKPT_KEEP", "-1"}},
        {{"CKPT_KEEP", "3x"}},
        {{"CKPT_GRACE", "2 minutes"}},
        {{"CKPT_KILL_WAIT", "0s"}},
        {{"CKPT_KILL_WAIT", "-30"}},
        {{"CKPT_MTBF", "0s"}},
        {{"CKPT_MIN_INTERVAL", "0s"}},
        {{"CKPT_MAX_INTERVAL", "soon"}},
        {{"CKPT_MIN_INTERVAL", "10m"}, {"CKPT_MAX_INTERVAL", "5m"}},
        {{"CKPT_LAST_WORDS", "maybe"}},
        {{"CKPT_RESUME_STEP", "12a"}},
        {{"CKPT_END_TIME", "-5"}},
        {{"CKPT_END_TIME", "99999999999999999999"}},
        {{"CKPT_RENDEZVOUS", "mpi"}},
        {{"CKPT_COPY_THREADS", "65"}},
        {{"CKPT_AGREE_LEAD", "0"}},
        {{"CKPT_COMMIT_TIMEOUT", "0s"}},
        {{"CKPT_SIGNALS", "sometimes"}},
        {{"CKPT_RUN_ID", "../x"}},
        {{"CKPT_LOG", "loud"}},
        {{"CKPT_STRAGGLER", "1.5"}},
        {{"CKPT_STRAGGLER", "0.7,evict"}},
        {{"CKPT_MEMORY", "lots"}},
        {{"CKPT_MEMORY", "-1G"}},
        {{"CKPT_MEMORY", "4 G"}},
        {{"CKPT_MEMORY", "1.5G"}},
        {{"CKPT_MEMORY", "99999999999T"}},
        {{"CKPT_MEMORY_INTERVAL", "0"}},
        {{"CKPT_MEMORY_INTERVAL", "-1"}},
        {{"CKPT_MEMORY_INTERVAL", "2x"}},
        {{"CKPT_MEMORY_DISTANCE", "0"}},
        {{"CKPT_MEMORY_DISTANCE", "-1"}},
        {{"CKPT_MEMORY_DISTANCE", "99999999999"}},
        {{"CKPT_INPLACE_WATCH", "10.0.0.2"}},
        {{"CKPT_INPLACE_WATCH", ":5000"}},
        {{"CKPT_INPLACE_WATCH", "10.0.0.2:0"}},
        {{"CKPT_INPLACE_WATCH", "10.0.0.2:65536"}},
        {{"CKPT_INPLACE_WATCH", "10.0.0.2:5000,,10.0.0.3:5001"}},
        {{"RANK", "2"}, {"WORLD_SIZE", "2"}},
        {{"RANK", "0"}, {"WORLD_SIZE", "0"}},
        {{"RANK", "0"}},
        {{"RANK", "x"}, {"WORLD_SIZE", "2"}},
        {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}},
    };
    for (const auto& env : bad) {
      auto c = load(env);
      INFO(env.begin()->first << "=" << env.begin()->second);
      REQUIRE_FALSE(c.ok());
      CHECK(c.error().rfind("ckpt: ", 0) == 0);
      CHECK(c.error().find('\n') == std::string::npos);
    }
  }
  SECTION("the message names the variable and the value") {
    CHECK(load({{"CKPT_KEEP", "3x"}}).error().rfind("ckpt: CKPT_KEEP='3x': expected a whole number >= 1", 0) == 0);
    Options o;
    REQUIRE(o.set("interval", "soon").ok());
    CHECK(load({}, o).error().rfind("ckpt: interval='soon': expected auto, a duration like 15m, or <N>steps", 0) == 0);
    CHECK(load({{"CKPT_MEMORY", "4X"}}).error() ==
          "ckpt: CKPT_MEMORY='4X': expected off, or a size like 4G, 512M or 1T (bytes without a unit) (unknown unit "
          "'X' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB))");
    CHECK(load({{"CKPT_MEMORY_INTERVAL", "0"}}).error() ==
          "ckpt: CKPT_MEMORY_INTERVAL='0': expected a whole number of steps >= 1, or auto (must be at least 1)");
    CHECK(load({{"CKPT_MEMORY_DISTANCE", "0"}}).error() ==
          "ckpt: CKPT_MEMORY_DISTANCE='0': expected a whole number of nodes >= 1 (must be at least 1)");
  }
  SECTION("unknown keys") {
    Options o;
    Status s = o.set("intervall", "5m");
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().rfind("ckpt: unknown setting 'intervall' (known: dir, interval,", 0) == 0);
  }
}

TEST_CASE("CKPT_LOG reads the shared level vocabulary", "[hooks][config][log]") {
  SECTION("good inputs") {
    const std::pair<const char*, hooks::LogLevel> good[] = {{"error", hooks::LogLevel::Error},
                                                            {"warning", hooks::LogLevel::Warn},
                                                            {"warn", hooks::LogLevel::Warn},
                                                            {"info", hooks::LogLevel::Info},
                                                            {"debug", hooks::LogLevel::Debug}};
    for (const auto& [text, level] : good) {
      INFO(text);
      auto c = load({{"CKPT_LOG", text}});
      REQUIRE(c.ok());
      CHECK(c->log_level == level);
    }
  }
  SECTION("bad inputs") {
    for (const char* text : {"WARN", "warnings", "verbose"}) {
      INFO(text);
      auto c = load({{"CKPT_LOG", text}});
      REQUIRE_FALSE(c.ok());
      CHECK(c.error() == "ckpt: CKPT_LOG='" + std::string(text) +
                             "': expected error, warning (or warn), info or debug (unknown level)");
    }
  }
}

TEST_CASE("without a checkpoint dir every call is a no-op", "[hooks][config]") {
  auto o = test::options({});
  o.values.erase("dir");
  if (std::getenv("CKPT_DIR") != nullptr) {
    WARN("CKPT_DIR is set in this environment; not checked");
    return;
  }
  auto cp = test::make(o);
  CHECK_FALSE(cp->enabled());
  int x = 0;
  CHECK(cp->register_region({"x", &x, sizeof x}).ok());
  CHECK(*cp->restore() == 0);
  CHECK(cp->before_update().ok());
  CHECK_FALSE(*cp->after_step(1));
  CHECK(cp->close().ok());
}

TEST_CASE("the environment contract: what the plugin exports reads back as the same settings", "[hooks][config]") {
  Settings s;
  s.dir = "/scratch/alice/ckpt/77";
  s.keep = 7;
  s.last_words = true;
  s.mtbf_s = 3 * 3600;
  s.max_restarts = 9;
  s.grace_s = 240;
  s.min_interval_s = 30;
  s.max_interval_s = 7200;
  s.straggler = "0.55,exclude";
  s.memory_bytes = 3ull << 30;
  s.memory_interval = 7;
  for (const Interval& interval : {Interval{Interval::Kind::Auto, 0}, Interval{Interval::Kind::Seconds, 900},
                                   Interval{Interval::Kind::Steps, 500}}) {
    s.interval = interval;
    std::map<std::string, std::string> env;
    for (const auto& [name, value] : settings_environment(s)) {
      CAPTURE(name);
      CHECK(env::by_name(name) != nullptr);
      CHECK(env::by_name(name)->set_by == env::SetBy::Plugin);
      env[name] = value;
    }
    auto c = load(env);
    REQUIRE(c);
    CHECK(c->dir == s.dir);
    CHECK(c->node_dir == s.node_dir);
    CHECK(c->interval == s.interval);
    CHECK(c->keep == s.keep);
    CHECK(c->last_words == s.last_words);
    CHECK(c->mtbf_s == s.mtbf_s);
    CHECK(c->grace_s == s.grace_s);
    CHECK(c->min_interval_s == s.min_interval_s);
    CHECK(c->max_interval_s == s.max_interval_s);
    CHECK(c->max_restarts == s.max_restarts);
    CHECK(c->straggler.enabled);
    CHECK(c->straggler.threshold == Approx(0.55));
    CHECK(c->straggler.action == straggler::Action::Exclude);
    CHECK(c->memory_bytes == s.memory_bytes);
    CHECK(c->memory_interval == s.memory_interval);
  }
  // Without the variable (a job the plugin did not start), stragglers are reported at the built-in threshold.
  auto plain = load({{"CKPT_DIR", "/scratch/x"}});
  REQUIRE(plain);
  CHECK(plain->straggler.enabled);
  CHECK(plain->straggler.threshold == Approx(0.7));
  CHECK(plain->straggler.action == straggler::Action::Report);
}

TEST_CASE("the environment contract: one row per key and per variable; every hooks setting in it", "[hooks][config]") {
  std::set<std::string> keys, names;
  for (const env::Var& v : env::contract()) {
    CHECK(keys.insert(v.key).second);
    CHECK(names.insert(v.name).second);
    CHECK(std::string(v.expected).size() > 0);
  }
  for (const OptionKey& k : option_keys()) {
    CAPTURE(k.key);
    REQUIRE(env::by_key(k.key) != nullptr);
    CHECK(std::string(k.env) == env::by_key(k.key)->name);
  }
  CHECK(option_keys().size() == 40);  // every key of config.cpp's list found in the contract
  CHECK(env::name_of("no-such-key").empty());
}

TEST_CASE("the rendezvous: PMIx only where it numbers this very world, address files otherwise", "[hooks][config]") {
  test::TempDir dir;
  posix::Fd fd(::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  REQUIRE(fd.valid());
  auto made = [&](RendezvousKind kind, int world) {
    auto r = make_rendezvous(kind, fd.get(), dir.path(), 0, world);
    return r ? std::string(r.value()->name()) : r.error();
  };
  SECTION("no PMIx server: files") {
    ScopedEnv env({{"PMIX_RANK", nullptr}, {"PMIX_NAMESPACE", nullptr}});
    CHECK(made(RendezvousKind::Auto, 4) == "files");
  }
  SECTION("a launcher's ranks inside a PMIx task (the step has 2 tasks, the world 8): files, PMIx never started") {
    ScopedEnv env({{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "slurm.pmix.12.0"}, {"SLURM_STEP_NUM_TASKS", "2"},
                   {"SLURM_NTASKS", "2"}});
    CHECK(made(RendezvousKind::Auto, 8) == "files");
  }
  SECTION("files when asked, whatever PMIx says") {
    ScopedEnv env({{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "slurm.pmix.12.0"}, {"SLURM_STEP_NUM_TASKS", "4"}});
    CHECK(made(RendezvousKind::Files, 4) == "files");
  }
  SECTION("a later generation of restart in place, or any rank of a job that restarts in place: files") {
    Config c;
    CHECK(rendezvous_for(c) == RendezvousKind::Auto);
    c.generation = 2;
    CHECK(rendezvous_for(c) == RendezvousKind::Files);
    c.generation = 0;
    c.inplace_id = "run-7";
    CHECK(rendezvous_for(c) == RendezvousKind::Files);
    c.rendezvous = RendezvousKind::Pmix;
    CHECK(rendezvous_for(c) == RendezvousKind::Pmix);  // asked for: make_rendezvous refuses it where PMIx disagrees
  }
  SECTION("address files: a published line is found, a withdrawn one tells that the rank left") {
    auto r = make_rendezvous(RendezvousKind::Files, fd.get(), dir.path(), 3, 4);
    REQUIRE(r);
    Rendezvous& files = *r.value();
    CHECK(files.tells_leaves());
    CHECK_FALSE(files.lookup(3).has_value());
    REQUIRE(files.publish("10.77.0.3 40123 n3", std::chrono::seconds(1)).ok());
    auto fields = files.lookup(3);
    REQUIRE(fields);
    CHECK((*fields == std::vector<std::string>{"10.77.0.3", "40123", "n3"}));
    files.withdraw();
    CHECK_FALSE(files.lookup(3).has_value());
  }
}

TEST_CASE("a job script that still sets CKPT_COORDINATOR is told once that it chooses nothing", "[hooks][config]") {
  test::TempDir dir;
  test::LogCapture log;
  {
    ScopedEnv env({{"CKPT_COORDINATOR", "file"}});
    auto cp = test::make(test::options({{"dir", dir.path()}}));
    REQUIRE(cp->close().ok());
  }
  CHECK(log.has("CKPT_COORDINATOR is no longer read: every job of more than one rank agrees over the heartbeat "
                "network; CKPT_RENDEZVOUS=auto|files|pmix chooses how its ranks find each other"));
  test::LogCapture quiet;
  auto cp = test::make(test::options({{"dir", dir.path()}}));
  REQUIRE(cp->close().ok());
  CHECK_FALSE(quiet.has("CKPT_COORDINATOR"));
}
