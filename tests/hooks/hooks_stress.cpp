// hooks_stress: training threads mutate their state as fast as they can while checkpoints are taken; afterwards
// every committed checkpoint must equal the state at its step, bit for bit.
//
// Each rank is a thread with its own checkpointer (on one dir, agreeing over the heartbeat network); a barrier per step stands in for
// the gradient all-reduce. Per step a rank writes its "stats" region during the forward pass (a sync region, like
// BatchNorm statistics), passes the barrier, calls before_update(), overwrites every word of its parameters, puts
// the step in a blob, and calls after_step(). The value of every word is a function of (step, index, rank), so a
// checkpoint that caught a word from another step is found. Exit status: 0 when every check holds.
#include <barrier>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/hooks.hpp"
#include "hooks_test_util.hpp"

using namespace ckpt;
using namespace ckpt::hooks;

namespace {

struct Args {
  std::string dir;
  int ranks = 2;
  std::uint64_t steps = 400;
  std::size_t mib = 8;
  std::string interval = "7steps";
  std::uint64_t min_checkpoints = 5;
  std::uint64_t notice_at = 0;  // raise SIGUSR1 on rank 0 at this step (0: never)
  unsigned copy_threads = 2;
  unsigned step_us = 0;  // a forward pass of at least this long per step (paces time-interval runs)
  std::uint64_t lead = 2;  // agree_lead: the steps a timed request has to reach every rank
  bool guard = true;  // --no-guard skips before_update(): a deliberate race, for the TSAN harness's control run
};

std::uint64_t word(std::uint64_t step, std::uint64_t i, int rank) {
  std::uint64_t z = step * 0x9E3779B97F4A7C15ULL ^ (i << 8) ^ static_cast<std::uint64_t>(rank);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void fill(std::vector<std::uint64_t>& v, std::uint64_t step, int rank) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = word(step, i, rank);
}

struct RankResult {
  std::vector<std::uint64_t> snapshots;
  std::optional<std::uint64_t> stopped_at;
  std::string error;
  Stats stats;
};

void run_rank(const Args& a, int rank, std::barrier<>& sync, RankResult& out) {
  Options o;
  for (const auto& [k, v] : std::initializer_list<std::pair<const char*, std::string>>{
           {"dir", a.dir}, {"interval", a.interval}, {"rank", std::to_string(rank)},
           {"world_size", std::to_string(a.ranks)},
           {"keep", "100000"}, {"copy_threads", std::to_string(a.copy_threads)}, {"run_id", "stress"},
           {"signals", a.notice_at > 0 ? "on" : "off"}, {"agree_lead", std::to_string(a.lead)}, {"log", "warn"}}) {
    (void)o.set(k, v);
  }
  auto created = Checkpointer::create(o);
  if (!created) {
    out.error = created.error();
    sync.arrive_and_drop();
    return;
  }
  auto cp = std::move(created).value();
  std::vector<std::uint64_t> params(a.mib * (1u << 20) / 8), small(4096 / 8 + 3), stats(64);
  fill(params, 0, rank);
  fill(small, 0, rank);
  fill(stats, 0, rank);
  Status s = cp->register_region({"params", params.data(), params.size() * 8});
  if (s) s = cp->register_region({"small", small.data(), small.size() * 8});
  if (s) s = cp->register_region({"stats", stats.data(), stats.size() * 8, Memory::Host, true});
  auto restored = cp->restore();
  if (!s || !restored || *restored != 0) out.error = "setup: " + s.error() + restored.error();
  for (std::uint64_t step = 1; step <= a.steps && out.error.empty(); ++step) {
    if (a.step_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(a.step_us));
    fill(stats, step, rank);  // the forward pass changes sync state before the guard
    // The notice between two barriers: every rank has polled the step before and none polls this one before it is
    // raised, so each sees it at this step's poll and asks for the same terminal step itself. Raised before one
    // barrier, a rank still in the previous step's poll saw it a step early (CI: ranks 1 and 2 stopped at 301, rank
    // 0 at 302); after it, a rank that polled first saw it a step late. Either relied on a request crossing the
    // network within a step, which a loaded host does not promise.
    if (step == a.notice_at) {
      sync.arrive_and_wait();
      if (rank == 0) std::raise(SIGUSR1);
    }
    sync.arrive_and_wait();
    if (a.guard) {
      if (Status g = cp->before_update(); !g) out.error = g.error();
    }
    fill(params, step, rank);  // the update: every word, as fast as it goes
    fill(small, step, rank);
    if (Status b = cp->put_blob("step", &step, sizeof step); !b) out.error = b.error();
    auto d = cp->poll(step);
    auto stop = cp->after_step(step);
    if (!d || !stop) {
      out.error = "step " + std::to_string(step) + ": " + d.error() + stop.error();
      break;
    }
    if (d->snapshot) out.snapshots.push_back(step);
    if (*stop) {
      out.stopped_at = step;
      break;
    }
  }
  sync.arrive_and_drop();
  if (Status c = cp->close(); !c && out.error.empty()) out.error = "close: " + c.error();
  out.stats = cp->stats();
}

// Every word of every region of every rank at `step`.
std::string verify_step(const Args& a, std::uint64_t step) {
  for (int rank = 0; rank < a.ranks; ++rank) {
    const std::pair<const char*, std::size_t> regions[] = {
        {"params", a.mib * (1u << 20) / 8}, {"small", 4096 / 8 + 3}, {"stats", 64}};
    for (const auto& [name, words] : regions) {
      auto bytes = test::read_region(a.dir, step, rank, name);
      if (bytes.size() != words * 8) return std::string(name) + ": wrong size";
      for (std::size_t i = 0; i < words; ++i) {
        std::uint64_t got = 0;
        std::memcpy(&got, bytes.data() + i * 8, 8);
        if (got != word(step, i, rank)) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "rank %d region %s word %zu: %016llx is not the value of step %llu", rank,
                        name, i, static_cast<unsigned long long>(got), static_cast<unsigned long long>(step));
          return buf;
        }
      }
    }
    auto blob = test::read_region(a.dir, step, rank, "step");
    std::uint64_t saved = 0;
    if (blob.size() != 8) return "blob: wrong size";
    std::memcpy(&saved, blob.data(), 8);
    if (saved != step) return "blob holds step " + std::to_string(saved);
  }
  return {};
}

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--no-guard") {
      a.guard = false;
      continue;
    }
    if (i + 1 >= argc) return false;
    std::string v = argv[++i];
    if (k == "--dir") a.dir = v;
    else if (k == "--ranks") a.ranks = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoull(v);
    else if (k == "--mib") a.mib = std::stoul(v);
    else if (k == "--interval") a.interval = v;
    else if (k == "--min-checkpoints") a.min_checkpoints = std::stoull(v);
    else if (k == "--notice-at") a.notice_at = std::stoull(v);
    else if (k == "--lead") a.lead = std::stoull(v);
    else if (k == "--step-us") a.step_us = static_cast<unsigned>(std::stoul(v));
    else if (k == "--copy-threads") a.copy_threads = static_cast<unsigned>(std::stoul(v));
    else return false;
  }
  return !a.dir.empty() && a.ranks >= 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) {
    std::fprintf(stderr,
                 "usage: hooks_stress --dir DIR [--ranks N] [--steps N] [--mib N] [--interval 7steps|1s] "
                 "[--min-checkpoints N] [--notice-at STEP] [--copy-threads N] [--step-us N] [--lead STEPS] [--no-guard]\n");
    return 2;
  }
  std::barrier<> sync(a.ranks);
  std::vector<RankResult> results(static_cast<std::size_t>(a.ranks));
  std::vector<std::thread> threads;
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < a.ranks; ++r) {
    threads.emplace_back([&, r] { run_rank(a, r, sync, results[static_cast<std::size_t>(r)]); });
  }
  for (std::thread& t : threads) t.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int failures = 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "hooks_stress: FAIL: %s\n", what.c_str());
    ++failures;
  };
  for (int r = 0; r < a.ranks; ++r) {
    const RankResult& res = results[static_cast<std::size_t>(r)];
    if (!res.error.empty()) fail("rank " + std::to_string(r) + ": " + res.error);
    if (res.snapshots != results[0].snapshots) fail("rank " + std::to_string(r) + " checkpointed other steps");
    if (res.stopped_at != results[0].stopped_at) fail("rank " + std::to_string(r) + " stopped at another step");
  }
  std::vector<std::uint64_t> committed = test::committed_steps(a.dir);
  if (committed != results[0].snapshots) {
    fail("committed " + std::to_string(committed.size()) + " checkpoints, took " +
         std::to_string(results[0].snapshots.size()));
  }
  if (committed.size() < a.min_checkpoints) {
    fail("only " + std::to_string(committed.size()) + " checkpoints; expected at least " +
         std::to_string(a.min_checkpoints));
  }
  if (a.notice_at > 0 && !results[0].stopped_at) fail("the notice did not stop the run");
  for (std::uint64_t step : committed) {
    if (std::string e = verify_step(a, step); !e.empty()) fail("step " + std::to_string(step) + ": " + e);
  }
  if (results[0].stopped_at) {
    auto m = store::read_manifest(a.dir, *results[0].stopped_at);
    if (!m || m->kind != store::Kind::Terminal) fail("the last checkpoint is not terminal");
  }
  const Stats& s = results[0].stats;
  std::printf("hooks_stress: %d ranks, %s MiB/rank, interval %s: %zu checkpoints verified bit for bit in %.1f s "
              "(%llu back-pressure waits, mean stall %.2f ms)%s\n",
              a.ranks, std::to_string(a.mib).c_str(), a.interval.c_str(), committed.size(), seconds,
              static_cast<unsigned long long>(s.backpressure_waits),
              s.snapshots > 0 ? 1000 * s.total_stall_s / static_cast<double>(s.snapshots) : 0.0,
              results[0].stopped_at ? (", stopped at step " + std::to_string(*results[0].stopped_at)).c_str() : "");
  return failures == 0 ? 0 : 1;
}
