// The store's side of a job whose ranks agree over a tree (the hooks' tree coordinator): records gathered up the
// tree, so that the committing rank reads a constant number of files, and retention whose deletions each rank
// does for its own files. What one rank does here is bounded by a constant, whatever the world size.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/store.hpp"
#include "io.hpp"

namespace ckpt::store {

using namespace detail;

namespace {

// One file per gathering rank and step: a parent that falls a checkpoint or two behind its child (it waits for its
// own shard) still finds the step it asks for. Removed with the step's retirement (remove_retired_own).
std::string gathered_name(std::uint64_t step, int rank) {
  char name[48];
  std::snprintf(name, sizeof name, "gathered-%s-%05d", step_dir_name(step).c_str(), rank);
  return name;
}

std::string retired_name(std::uint64_t step) { return std::string(kTrashPrefix) + step_dir_name(step); }

// A retired step dir: ".gc-" and 12 digits, nothing else (gc's trash names carry a suffix).
std::optional<std::uint64_t> parse_retired_name(std::string_view name) {
  if (name.substr(0, kTrashPrefix.size()) != kTrashPrefix) return std::nullopt;
  return parse_step_dir_name(name.substr(kTrashPrefix.size()));
}

}  // namespace

// ---- records gathered up a tree ---------------------------------------------------------------------------------

Status write_gathered(const std::string& root, std::uint64_t step, int rank, const std::vector<ShardRecord>& records) {
  const std::string name = gathered_name(step, rank);
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Status::failure("cannot write " + name + ": " + root_fd.error());
    auto control = open_control_dir(root_fd->get(), true);
    if (!control.ok()) return Status::failure("cannot write " + name + ": " + control.error.message);
    nlohmann::json list = nlohmann::json::array();
    for (const ShardRecord& r : records) list.push_back(nlohmann::json::parse(to_json(r)));
    const nlohmann::json doc = {{"step", step}, {"records", std::move(list)}};
    return write_file_atomic(control.value->get(), name, doc.dump(), name);
  } catch (const std::exception& e) {
    return Status::failure("cannot write " + name + ": " + e.what());
  }
}

Result<std::vector<ShardRecord>> read_gathered(const std::string& root, std::uint64_t step, int rank) {
  const std::string name = gathered_name(step, rank);
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    auto control = open_control_dir(root_fd->get(), false);
    if (!control.ok()) return Error{control.error.message};
    auto text = read_small_file(control.value->get(), name, kMaxManifestFile);
    if (!text.ok()) return Error{text.error.message};
    auto doc = nlohmann::json::parse(*text.value, nullptr, false);
    if (!doc.is_object() || !doc.contains("records") || !doc["records"].is_array() || !doc.contains("step") ||
        !doc["step"].is_number_unsigned()) {
      return Error{name + " is not a step's list of records"};
    }
    if (doc["step"].get<std::uint64_t>() != step) {
      return Error{name + " holds step " + std::to_string(doc["step"].get<std::uint64_t>()) + ", not " +
                   std::to_string(step)};
    }
    const auto& list = doc["records"];
    std::vector<ShardRecord> out;
    out.reserve(list.size());
    for (const auto& item : list) {
      auto record = parse_shard_record(item.dump());
      if (!record) return Error{name + ": " + record.error()};
      out.push_back(std::move(*record));
    }
    return out;
  } catch (const std::exception& e) {
    return Error{"cannot read " + name + ": " + e.what()};
  }
}

// ---- retention, shared out ---------------------------------------------------------------------------------------

namespace {

// Step dirs retired by an earlier round: their ranks have removed their own files by now. Whatever is left
// (files of ranks that are gone, or of a run of another size) goes here.
Status remove_earlier_retired(int rfd, const std::vector<DirEntry>& names) {
  for (const DirEntry& e : names) {
    if (!parse_retired_name(e.name) || !S_ISDIR(e.st.st_mode)) continue;
    if (::unlinkat(rfd, e.name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) continue;
    if (Status s = remove_tree(rfd, e.name); !s) return s;
  }
  return Status::success();
}

// What plan_gc needs: the step dirs by name, with the state their MANIFEST and FAILED names give. Nothing is
// parsed, so that this costs the same whatever the world size.
std::vector<Entry> step_entries_by_name(int rfd, const std::vector<DirEntry>& names) {
  std::vector<Entry> entries;
  for (const DirEntry& e : names) {
    auto step = parse_step_dir_name(e.name);
    if (!step || !S_ISDIR(e.st.st_mode)) continue;
    auto dir = open_step_dir(rfd, *step);
    if (!dir.ok()) continue;
    Entry entry;
    entry.step = *step;
    if (exists_at(dir.value->get(), std::string(kFailedName))) {
      entry.state = State::Failed;
    } else if (exists_at(dir.value->get(), std::string(kManifestName))) {
      entry.state = State::Complete;
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

// What became of one step plan_gc dropped.
enum class StepRetirement { Retired, AlreadyGone, Fenced };

// Renames one step dir to its retired name, unless the run is fenced by now, and removes its manifest.
Result<StepRetirement> retire_step(int rfd, std::uint64_t step, const std::optional<Fence>& fence) {
  const std::string to = retired_name(step);
  // A leftover under the same name (a round that died before it was cleaned) goes first.
  if (exists_at(rfd, to)) {
    if (Status s = remove_tree(rfd, to); !s) return Error{s.error()};
  }
  // Checked again before each rename: a newer run may have started meanwhile.
  if (Status s = check_fence_fd(rfd, fence); !s) return StepRetirement::Fenced;
  if (::renameat(rfd, step_dir_name(step).c_str(), rfd, to.c_str()) != 0) {
    if (errno == ENOENT) return StepRetirement::AlreadyGone;
    return Error{"cannot retire step " + std::to_string(step) + ": " + errno_text(errno)};
  }
  // The manifest is nobody's but the writer's; the ranks remove their own shards and records.
  if (int fd = ::openat(rfd, to.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); fd >= 0) {
    Fd dir(fd);
    (void)::unlinkat(fd, std::string(kManifestName).c_str(), 0);
  }
  return StepRetirement::Retired;
}

}  // namespace

Result<std::vector<std::uint64_t>> retire(const std::string& root, std::uint64_t keep, std::uint64_t committed,
                                          const std::optional<Fence>& fence) {
  try {
    if (keep < 1) return Error{"keep must be at least 1"};
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    const int rfd = root_fd->get();
    auto names = list_dir(rfd);
    if (!names.ok()) return Error{"cannot read checkpoint dir '" + root + "': " + names.error.message};
    if (Status s = check_fence_fd(rfd, fence); !s) return Error{"nothing retired: " + s.error()};
    if (Status s = remove_earlier_retired(rfd, *names.value); !s) return Error{s.error()};

    std::vector<std::uint64_t> retired;
    for (std::uint64_t step : plan_gc(step_entries_by_name(rfd, *names.value), keep, committed)) {
      auto outcome = retire_step(rfd, step, fence);
      if (!outcome) return Error{outcome.error()};
      if (*outcome == StepRetirement::Fenced) break;
      if (*outcome == StepRetirement::Retired) retired.push_back(step);
    }
    if (!retired.empty()) {
      if (Status s = fsync_fd(rfd, "the checkpoint dir"); !s) return Error{s.error()};
    }
    return retired;
  } catch (const std::exception& e) {
    return Error{std::string("retention failed: ") + e.what()};
  }
}

Status remove_retired_own(const std::string& root, std::uint64_t step, int rank) {
  const std::string at = "cannot remove rank " + std::to_string(rank) + "'s files of retired step " +
                         std::to_string(step) + ": ";
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Status::failure(at + root_fd.error());
    const std::string dir_name = retired_name(step);
    int fd = ::openat(root_fd->get(), dir_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      Fd dir(fd);
      for (const std::string& name : {shard_file_name(rank), record_file_name(rank)}) {
        if (::unlinkat(fd, name.c_str(), 0) != 0 && errno != ENOENT) return Status::failure(at + errno_text(errno));
      }
    } else if (errno != ENOENT) {
      return Status::failure(at + errno_text(errno));
    }
    // The records this rank gathered for the step, if it gathered any.
    if (auto control = open_control_dir(root_fd->get(), false); control.ok()) {
      if (::unlinkat(control.value->get(), gathered_name(step, rank).c_str(), 0) != 0 && errno != ENOENT) {
        return Status::failure(at + errno_text(errno));
      }
    }
    return Status::success();
  } catch (const std::exception& e) {
    return Status::failure(at + e.what());
  }
}

}  // namespace ckpt::store
