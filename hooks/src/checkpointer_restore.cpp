// The restore, on the training thread before the first step: the plugin's choice or the newest checkpoint that
// verifies, this rank's shard read into host staging and checked again, then copied into the regions; a checkpoint
// that fails to load is marked FAILED and the next older one is tried.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "checkpointer_impl.hpp"
#include "log.hpp"

namespace ckpt::hooks {

namespace {

using store::errno_text;
using store::join;

}  // namespace

// Reads this rank's shard of `step` under `root` into host staging; a definite error means the checkpoint is bad.
Status Checkpointer::Impl::load_shard(const std::string& root, std::uint64_t step, bool& definite) {
  definite = false;
  const std::string at = "ckpt: step " + std::to_string(step) + ": ";
  auto m = store::read_manifest(root, step);
  if (!m) return Status::failure(at + m.error());
  int source = rank;
  if (m->world_size != config.world_size) {
    // Pure data parallelism: every shard holds a full replica, so a job relaunched on fewer or more nodes can
    // go on from any of them (per-rank extras such as RNG states come from the replica it loads).
    const store::Layout& l = m->layout;
    if (l.tp != 1 || l.pp != 1 || l.zero1 || m->world_size < 1) {
      return Status::failure(at + "written by " + std::to_string(m->world_size) + " ranks (tp " +
                             std::to_string(l.tp) + ", pp " + std::to_string(l.pp) + (l.zero1 ? ", ZeRO-1" : "") +
                             "); this run has " + std::to_string(config.world_size));
    }
    source = rank % m->world_size;
    if (rank == 0) {
      log::warn(rank, "step " + std::to_string(step) + " was written by " + std::to_string(m->world_size) +
                          " data-parallel ranks; this run has " + std::to_string(config.world_size) +
                          ": rank r loads the replica of rank r % " + std::to_string(m->world_size));
    }
  }
  const store::ShardRecord* record = nullptr;
  for (const store::ShardRecord& r : m->shards) {
    if (r.rank == source) record = &r;
  }
  if (record == nullptr && m->kind == store::Kind::Terminal && m->world_size == config.world_size) {
    // Last words: only survivors wrote, each state key once; this rank loads the shard that covers its keys.
    if (Status s = terminal_source(*m, record); !s) {
      definite = true;
      return Status::failure(at + s.error());
    }
  }
  if (record == nullptr) {
    definite = true;
    return Status::failure(at + "no shard for rank " + std::to_string(source));
  }
  if (Status s = grow_host(static_cast<std::size_t>(record->size)); !s) return s;
  (void)ask_staging(host.size(), 0);
  const std::string path = join(join(root, store::step_dir_name(step)), record->file);
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::failure(at + "cannot open " + path + ": " + errno_text(errno));
  std::uint64_t done = 0;
  while (done < record->size) {
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(record->size - done, 1u << 30));
    ssize_t n = ::pread(fd, host.data() + done, want, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      definite = n == 0;
      return Status::failure(at + "cannot read " + path + ": " + (n == 0 ? "file too short" : errno_text(err)));
    }
    done += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  // Verified before, but what is loaded is what counts: the same checksum over the bytes in memory.
  if (XXH3_64bits(host.data(), static_cast<std::size_t>(record->size)) != record->checksum) {
    definite = true;
    return Status::failure(at + record->file + ": checksum mismatch after loading");
  }
  restored.clear();
  for (const store::StateRange& s : record->states) {
    if (s.offset > record->size || s.length > record->size - s.offset) {
      definite = true;
      return Status::failure(at + "region '" + s.name + "' lies outside its shard");
    }
    restored.push_back({s.name, s.meta.dump(), host.data() + s.offset, static_cast<std::size_t>(s.length)});
  }
  return Status::success();
}

// The shard of a terminal checkpoint that covers every state key of this rank (a rank of the same layout).
Status Checkpointer::Impl::terminal_source(const store::Manifest& m, const store::ShardRecord*& record) const {
  const store::Layout& l = m.layout;
  if (l.dp != config.layout.dp || l.tp != config.layout.tp || l.pp != config.layout.pp || l.zero1 != config.layout.zero1) {
    return Status::failure("a terminal checkpoint of another layout (dp " + std::to_string(l.dp) + ", tp " +
                           std::to_string(l.tp) + ", pp " + std::to_string(l.pp) + ")");
  }
  std::vector<std::string> keys = store::state_keys_of_rank(config.layout, config.coord);
  record = nullptr;
  for (const store::ShardRecord& r : m.shards) {
    if (std::find(r.covers.begin(), r.covers.end(), keys.front()) != r.covers.end()) record = &r;
  }
  if (record == nullptr) return Status::failure("no shard covers " + keys.front());
  for (const std::string& key : keys) {
    if (std::find(record->covers.begin(), record->covers.end(), key) == record->covers.end()) {
      // A plan never splits a rank's keys among ranks other than itself (ZeRO-1 shards have no other copy).
      return Status::failure(key + " lies in another shard than " + keys.front() + ": not a last-words plan");
    }
  }
  if (record->rank != rank) {
    log::info(rank, "terminal checkpoint of step " + std::to_string(m.step) + ": loading the shard of rank " +
                        std::to_string(record->rank) + " (it covers " + keys.front() + ")");
  }
  return Status::success();
}

// The first candidate: the plugin's choice when it gave one, and it verifies.
std::optional<std::pair<std::string, std::uint64_t>> Checkpointer::Impl::plugin_choice() {
  std::string root = config.dir;
  std::optional<std::uint64_t> step = config.resume_step;
  if (!config.resume_path.empty()) {
    auto slash = config.resume_path.find_last_of('/');
    auto parsed = store::parse_step_dir_name(config.resume_path.substr(slash + 1));
    if (!parsed) {
      log::warn(rank, "CKPT_RESUME_PATH=" + config.resume_path + " is not a step dir; ignored");
    } else {
      root = slash == 0 ? "/" : config.resume_path.substr(0, slash);
      step = parsed;
    }
  }
  if (!step) return std::nullopt;
  if (Status s = store::verify(root, *step); !s) {
    log::warn(rank, "the checkpoint the job was given (step " + std::to_string(*step) + ") does not verify: " +
                        s.error() + "; looking for another");
    return std::nullopt;
  }
  return std::make_pair(root, *step);
}

Result<std::uint64_t> Checkpointer::Impl::restore(bool copy_into_regions) {
  if (started) return Error{"ckpt: restore() must come before the first after_step()"};
  wait_idle();
  std::optional<std::pair<std::string, std::uint64_t>> choice = plugin_choice();
  std::vector<std::uint64_t> failed;
  bool loaded = false;
  while (!loaded) {
    if (!choice) {
      struct stat st {};
      if (::stat(config.dir.c_str(), &st) != 0 && errno == ENOENT) break;  // a first run: nothing to look at
      store::ResumeChoice resolved = store::resolve_resume(config.dir, true, run_fence(config));
      for (const std::string& line : resolved.log) {
        if (rank == 0) {
          log::info(rank, line);
        } else {
          log::debug(rank, line);
        }
      }
      if (!resolved.step) break;
      if (std::find(failed.begin(), failed.end(), *resolved.step) != failed.end()) {
        return Error{"ckpt: step " + std::to_string(*resolved.step) + " failed to load and could not be marked FAILED"};
      }
      choice = std::make_pair(config.dir, *resolved.step);
    }
    bool definite = false;
    Status status = load_shard(choice->first, choice->second, definite);
    if (status) {
      loaded = true;
      break;
    }
    if (!definite) return Error{status.error()};
    log::warn(rank, status.error() + "; marking it FAILED and walking back");
    (void)store::mark_failed(choice->first, choice->second, status.error(), run_fence(config));
    failed.push_back(choice->second);
    choice.reset();
    restored.clear();
  }
  const std::uint64_t step = loaded ? choice->second : 0;
  if (copy_into_regions && loaded) {
    for (const RegionSpec& r : regions) {
      auto it = std::find_if(restored.begin(), restored.end(), [&](const RestoredRegion& x) { return x.name == r.name; });
      if (it == restored.end()) {
        return Error{"ckpt: step " + std::to_string(step) + " has no region '" + r.name + "'"};
      }
      if (it->size != r.size) {
        return Error{"ckpt: region '" + r.name + "' is " + std::to_string(r.size) + " bytes; step " +
                     std::to_string(step) + " has " + std::to_string(it->size)};
      }
      if (r.size == 0) continue;
      if (r.memory == Memory::Host) {
        std::memcpy(r.data, it->data, r.size);
      } else if (Status s = device->upload(r.data, it->data, r.size); !s) {
        return Error{s.error()};
      }
    }
  }
  if (loaded) log::info(rank, "restored step " + std::to_string(step) + " from " + choice->first);
  start(step);
  return step;
}

}  // namespace ckpt::hooks
