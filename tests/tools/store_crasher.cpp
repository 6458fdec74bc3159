// store_crasher: saves a checkpoint the way a job does (every rank's shard, then the commit) and can SIGKILL
// itself at a chosen SavePhase, so that tests can look at what a crash leaves behind. Also resolves, as a
// restarting job would (marking FAILED).
//
//   store_crasher save ROOT STEP [--world N] [--bytes N] [--kind periodic|terminal] [--dead R]...
//                                [--kill-at PHASE] [--kill-rank R]
//   store_crasher resolve ROOT [--no-mark]
//
// save exits 0 after a commit, 1 on an error; with --kill-at it dies by SIGKILL when the phase is reached
// (writer phases on --kill-rank only, default the last writer). resolve prints the chosen step, or "none" and
// exits 1.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/parse.hpp"
#include "ckpt/store.hpp"

namespace {

namespace store = ckpt::store;

constexpr store::SavePhase kPhases[] = {
    store::SavePhase::ShardOpened,         store::SavePhase::ShardHalfWritten, store::SavePhase::ShardsDurable,
    store::SavePhase::ManifestHalfWritten, store::SavePhase::ManifestTempWritten,
    store::SavePhase::ManifestRenamed,     store::SavePhase::Committed};

int usage(const char* why) {
  std::fprintf(stderr, "store_crasher: %s\nusage: store_crasher save ROOT STEP [options] | resolve ROOT [--no-mark]\n",
               why);
  return 2;
}

// Deterministic bytes per (step, rank), so that a shard from another save never checksums equal by accident.
std::vector<char> shard_bytes(std::uint64_t step, int rank, std::uint64_t size) {
  std::vector<char> out(size);
  std::uint64_t x = step * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(rank) + 1;
  for (std::uint64_t i = 0; i < size; i += 8) {
    x += 0x9E3779B97F4A7C15ULL;  // splitmix64
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<std::uint64_t>(8, size - i));
  }
  return out;
}

std::optional<std::uint64_t> number(const char* text) {
  auto value = ckpt::parse_uint(text);
  if (!value) return std::nullopt;
  return *value;
}

struct SaveOptions {
  std::string root;
  std::uint64_t step = 0;
  int world = 4;
  std::uint64_t bytes = 1 << 20;
  store::Kind kind = store::Kind::Periodic;
  std::set<int> dead;
  std::optional<store::SavePhase> kill_at;
  int kill_rank = -1;
};

// Returns 0, or usage()'s status after saying what is wrong.
int parse_save_options(int argc, char** argv, SaveOptions& o) {
  if (argc < 4) return usage("save needs ROOT and STEP");
  o.root = argv[2];
  auto step = number(argv[3]);
  if (!step) return usage("bad STEP");
  o.step = *step;
  for (int i = 4; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) return usage(("missing value after " + arg).c_str());
    const char* value = argv[++i];
    if (arg == "--world") {
      auto n = number(value);
      if (!n || *n < 1 || *n > 4096) return usage("bad --world");
      o.world = static_cast<int>(*n);
    } else if (arg == "--bytes") {
      auto n = number(value);
      if (!n || *n > (std::uint64_t{8} << 30)) return usage("bad --bytes");
      o.bytes = *n;
    } else if (arg == "--kind") {
      if (std::string(value) == "terminal") {
        o.kind = store::Kind::Terminal;
      } else if (std::string(value) != "periodic") {
        return usage("bad --kind");
      }
    } else if (arg == "--dead") {
      auto n = number(value);
      if (!n || *n > 4096) return usage("bad --dead");
      o.dead.insert(static_cast<int>(*n));
    } else if (arg == "--kill-at") {
      for (store::SavePhase p : kPhases) {
        if (std::string(value) == store::to_string(p)) o.kill_at = p;
      }
      if (!o.kill_at) return usage("bad --kill-at");
    } else if (arg == "--kill-rank") {
      auto n = number(value);
      if (!n || *n > 4096) return usage("bad --kill-rank");
      o.kill_rank = static_cast<int>(*n);
    } else {
      return usage(("unknown option " + arg).c_str());
    }
  }
  return 0;
}

// Writes one rank's shard: half the bytes as "model", the rest as "optim", covering the rank's state keys.
ckpt::Status write_shard(const SaveOptions& o, const store::Layout& layout, const store::RankCoord& coord,
                         store::PhaseObserver observer) {
  auto writer = store::ShardWriter::open(o.root, o.step, coord.rank, std::move(observer));
  if (!writer) return ckpt::Status::failure(writer.error());
  std::vector<char> data = shard_bytes(o.step, coord.rank, o.bytes);
  std::uint64_t half = o.bytes / 2;
  nlohmann::json meta = {{"dtype", "bf16"}, {"shape", nlohmann::json::array({half / 2})}};
  ckpt::Status s = writer->append("model", data.data(), half, meta);
  if (s) s = writer->append("optim", data.data() + half, o.bytes - half, {{"dtype", "u8"}});
  if (!s) return s;
  writer->add_covers(store::state_keys_of_rank(layout, coord));
  if (auto record = writer->finish(); !record) return ckpt::Status::failure(record.error());
  return {};
}

int save(int argc, char** argv) {
  SaveOptions o;
  if (int rc = parse_save_options(argc, argv, o); rc != 0) return rc;

  // The layout: pure data parallel, so every rank holds the whole model and optimizer slice.
  store::Layout layout;
  layout.dp = o.world;
  store::Manifest manifest;
  manifest.step = o.step;
  manifest.kind = o.kind;
  manifest.world_size = o.world;
  manifest.layout = layout;
  std::vector<int> writers;
  for (int rank = 0; rank < o.world; ++rank) {
    manifest.ranks.push_back(store::RankCoord{rank, rank, 0, 0});
    if (o.dead.count(rank) == 0) writers.push_back(rank);
  }
  // A terminal checkpoint: the lowest survivor writes the state everyone holds; the others write nothing.
  if (o.kind == store::Kind::Terminal && !writers.empty()) writers.resize(1);
  if (o.kill_rank < 0 && !writers.empty()) o.kill_rank = writers.back();

  auto observer_for = [&](int rank) -> store::PhaseObserver {
    return [&, rank](store::SavePhase phase) {
      if (o.kill_at && phase == *o.kill_at && (rank == o.kill_rank || rank < 0)) {
        std::fflush(nullptr);
        std::raise(SIGKILL);
      }
    };
  };
  // A step saved again (e.g. after a restart) must not mix with a dead save's leftovers.
  ckpt::Status s = store::discard_incomplete(o.root, o.step);
  for (std::size_t i = 0; s && i < writers.size(); ++i) {
    int rank = writers[i];
    s = write_shard(o, layout, manifest.ranks[static_cast<std::size_t>(rank)], observer_for(rank));
  }
  if (s) s = store::commit(o.root, manifest, observer_for(-1));
  if (!s) {
    std::fprintf(stderr, "store_crasher: %s\n", s.error().c_str());
    return 1;
  }
  std::printf("committed %llu\n", static_cast<unsigned long long>(o.step));
  return 0;
}

int resolve(int argc, char** argv) {
  if (argc < 3) return usage("resolve needs ROOT");
  bool mark = true;
  for (int i = 3; i < argc; ++i) {
    if (std::string(argv[i]) != "--no-mark") return usage("unknown option");
    mark = false;
  }
  store::ResumeChoice choice = store::resolve_resume(argv[2], mark);
  for (const std::string& line : choice.log) std::fprintf(stderr, "store_crasher: %s\n", line.c_str());
  if (!choice.step) {
    std::printf("none\n");
    return 1;
  }
  std::printf("%llu\n", static_cast<unsigned long long>(*choice.step));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("no command");
  std::string command = argv[1];
  if (command == "save") return save(argc, argv);
  if (command == "resolve") return resolve(argc, argv);
  return usage("unknown command");
}
