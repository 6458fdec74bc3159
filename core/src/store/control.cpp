// The store's deleting side (discard, gc), its control files, and fencing of stale runs.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <optional>
#include <string>

#include "ckpt/store.hpp"
#include "io.hpp"

namespace ckpt::store {

using namespace detail;

Status detail::remove_tree(int parent_fd, const std::string& name, int depth) {
  int fd = ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::success();
    if (errno == ENOTDIR || errno == ELOOP) {
      if (::unlinkat(parent_fd, name.c_str(), 0) == 0 || errno == ENOENT) return Status::success();
    }
    return Status::failure("cannot remove " + name + ": " + errno_text(errno));
  }
  Fd dir(fd);
  auto entries = list_dir(fd);
  if (!entries.ok()) return Status::failure("cannot remove " + name + ": " + entries.error.message);
  for (const DirEntry& e : *entries.value) {
    if (S_ISDIR(e.st.st_mode)) {
      if (depth >= kMaxTreeDepth) return Status::failure("cannot remove " + name + ": nested too deep");
      if (Status s = remove_tree(fd, e.name, depth + 1); !s) return s;
    } else if (::unlinkat(fd, e.name.c_str(), 0) != 0 && errno != ENOENT) {
      return Status::failure("cannot remove " + name + "/" + e.name + ": " + errno_text(errno));
    }
  }
  if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return Status::failure("cannot remove " + name + ": " + errno_text(errno));
  }
  return Status::success();
}

Status remove_tree(const std::string& parent, const std::string& name) {
  Fd fd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Status::failure("cannot open " + parent + ": " + errno_text(errno));
  if (Status s = detail::remove_tree(fd.get(), name); !s) return Status::failure(parent + ": " + s.error());
  return Status::success();
}

namespace {

// Deletes a step dir so that no half-deleted checkpoint is ever visible: renamed out of the namespace first.
Status remove_step_dir(int root_fd, std::uint64_t step) {
  std::string name = step_dir_name(step);
  std::string trash = std::string(kTrashPrefix) + name + "-" + random_suffix();
  if (::renameat(root_fd, name.c_str(), root_fd, trash.c_str()) != 0) {
    if (errno == ENOENT) return Status::success();
    return Status::failure("cannot delete " + name + ": " + errno_text(errno));
  }
  if (Status s = fsync_fd(root_fd, "the checkpoint dir"); !s) return s;
  return remove_tree(root_fd, trash, 0);
}

}  // namespace

// ---- deleting ---------------------------------------------------------------------------------------------------

Status discard_incomplete(const std::string& root, std::uint64_t step, const std::optional<Fence>& fence) {
  const std::string at = "cannot discard step " + std::to_string(step) + ": ";
  try {
    auto root_fd = open_root(root);
    if (!root_fd) {
      if (errno == ENOENT) return Status::success();  // no root, no step dir
      return Status::failure(at + root_fd.error());
    }
    auto dir = open_step_dir(root_fd->get(), step);
    if (!dir.ok()) {
      if (dir.error.err == ENOENT) return Status::success();
      return Status::failure(at + dir.error.message);
    }
    int fd = dir.value->get();
    if (exists_at(fd, std::string(kManifestName))) return Status::failure(at + "it is committed");
    if (exists_at(fd, std::string(kFailedName))) return Status::failure(at + "it is marked FAILED");
    auto entries = list_dir(fd);
    if (!entries.ok()) return Status::failure(at + entries.error.message);
    if (std::string link = first_symlink(*entries.value); !link.empty()) {
      return Status::failure(at + "symlink planted: " + link + "; left for inspection");
    }
    if (Status s = check_fence_fd(root_fd->get(), fence); !s) return Status::failure(at + s.error());
    if (Status s = remove_step_dir(root_fd->get(), step); !s) return Status::failure(at + s.error());
    return Status::success();
  } catch (const std::exception& e) {
    return Status::failure(at + e.what());
  }
}

Result<std::vector<std::uint64_t>> gc(const std::string& root, std::uint64_t keep, bool dry_run,
                                      const std::optional<Fence>& fence) {
  try {
    if (keep < 1) return Error{"keep must be at least 1"};
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    auto entries = scan(root);
    if (!entries) return Error{entries.error()};
    std::optional<std::uint64_t> newest_verified;
    std::vector<std::uint64_t> candidates = resume_candidates(*entries);
    for (std::uint64_t step : candidates) {
      if (verify_fd(root_fd->get(), step, /*checksums=*/true).status) {
        newest_verified = step;
        break;
      }
    }
    if (!candidates.empty() && !newest_verified) {
      return Error{"no complete checkpoint in '" + root + "' verifies; nothing deleted"};
    }
    std::vector<std::uint64_t> plan = plan_gc(*entries, keep, newest_verified);
    if (dry_run) return plan;
    if (Status s = check_fence_fd(root_fd->get(), fence); !s) return Error{"nothing deleted: " + s.error()};
    // Leftovers of an earlier gc that was killed mid-removal.
    if (auto names = list_dir(root_fd->get()); names.ok()) {
      for (const DirEntry& e : *names.value) {
        if (e.name.rfind(kTrashPrefix, 0) == 0 && S_ISDIR(e.st.st_mode)) (void)remove_tree(root_fd->get(), e.name, 0);
      }
    }
    std::vector<std::uint64_t> deleted;
    for (std::uint64_t step : plan) {
      // Checked again before each removal: a newer run may have started while the plan was made or carried out.
      Status s = check_fence_fd(root_fd->get(), fence);
      if (s) s = remove_step_dir(root_fd->get(), step);
      if (!s) {
        std::string done;
        for (std::uint64_t d : deleted) done += (done.empty() ? "" : ", ") + std::to_string(d);
        return Error{s.error() + (done.empty() ? "" : " (deleted before: " + done + ")")};
      }
      deleted.push_back(step);
    }
    return deleted;
  } catch (const std::exception& e) {
    return Error{std::string("gc failed: ") + e.what()};
  }
}

Status write_control_file(const std::string& root, std::string_view name, std::string_view content,
                          const std::optional<Fence>& fence) {
  try {
    if (!is_safe_name(name)) return Status::failure("not a safe control file name: '" + std::string(name) + "'");
    if (name == kEpochName) return Status::failure(std::string(kEpochName) + " is written by raise_epoch only");
    auto root_fd = open_root(root);
    if (!root_fd) return Status::failure(root_fd.error());
    auto control = open_control_dir(root_fd->get(), /*create=*/true);
    if (!control.ok()) return Status::failure(join(root, control.error.message));
    AtomicWriteOptions write;
    write.hooks.before_publish = [&] { return check_fence_fd(root_fd->get(), fence); };
    return write_file_atomic(control.value->get(), name, content, join(kControlDir, std::string(name)), write);
  } catch (const std::exception& e) {
    return Status::failure(std::string("cannot write a control file: ") + e.what());
  }
}

Result<bool> claim_control_file(const std::string& root, std::string_view name, std::string_view content,
                                const std::optional<Fence>& fence) {
  try {
    if (!is_safe_name(name)) return Error{"not a safe control file name: '" + std::string(name) + "'"};
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    auto control = open_control_dir(root_fd->get(), /*create=*/true);
    if (!control.ok()) return Error{join(root, control.error.message)};
    posix::ExclusiveOptions exclusive;
    exclusive.write.hooks.before_publish = [&] { return check_fence_fd(root_fd->get(), fence); };
    bool existed = false;
    const std::string what = join(kControlDir, std::string(name));
    if (Status s = posix::create_file_exclusive(control.value->get(), name, content, what, exclusive, &existed); !s) {
      return Error{s.error()};
    }
    return !existed;
  } catch (const std::exception& e) {
    return Error{std::string("cannot claim a control file: ") + e.what()};
  }
}

std::string last_words_claim_name(const Fence& run) {
  std::string job;
  for (char c : run.job_id) job += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return "last-words-" + (job.empty() ? std::string("nojob") : job) + "-" + std::to_string(run.epoch) + "-" +
         std::to_string(run.generation) + ".claim";
}

Result<std::optional<std::string>> read_control_file(const std::string& root, std::string_view name) {
  try {
    if (!is_safe_name(name)) return Error{"not a safe control file name: '" + std::string(name) + "'"};
    struct stat st {};
    if (::stat(root.c_str(), &st) != 0 && errno == ENOENT) return std::optional<std::string>();  // not created yet
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    int fd = ::openat(root_fd->get(), kControlDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return std::optional<std::string>();
    if (fd < 0) return Error{"cannot open " + join(root, kControlDir) + ": " + errno_text(errno)};
    Fd control(fd);
    auto text = read_small_file(control.get(), std::string(name), kMaxControlFile);
    if (!text.ok() && text.error.err == ENOENT) return std::optional<std::string>();
    if (!text.ok()) return Error{join(kControlDir, text.error.message)};
    return std::optional<std::string>(std::move(*text.value));
  } catch (const std::exception& e) {
    return Error{std::string("cannot read a control file: ") + e.what()};
  }
}

// ---- fencing ---------------------------------------------------------------------------------------------------
//
// What remains racy, and why it is acceptable: a check reads the record and the rename that follows it is a
// separate system call, so a newer run that raises the record between the two does not stop that one rename. Every
// check sits after the fsync of what it publishes and immediately before the rename, so the window is one system
// call long (microseconds), while a newer run starts seconds after the older one was given up (Slurm requeues,
// the plugin resolves the resume step). A stale writer's bytes stay in hidden temp files, which nothing reads,
// until that rename. A rename that does slip through publishes a shard record or a manifest of a step the newer
// run has not written (it resumed from an older step and discards incomplete step dirs above it when it starts),
// or moves `latest` to a step that resolution re-checks anyway: resolution never trusts `latest`, it scans.

namespace detail {

namespace {

// The record, nullopt when none; an error when it cannot be read or parsed.
IoResult<std::optional<EpochRecord>> read_epoch_fd(int root_fd) {
  auto control = open_control_dir(root_fd, /*create=*/false);
  if (!control.ok()) {
    if (control.error.err == ENOENT) return {std::optional<EpochRecord>(), {}};
    return {std::nullopt, control.error};
  }
  auto text = read_small_file(control.value->get(), std::string(kEpochName), kMaxControlFile);
  if (!text.ok()) {
    if (text.error.err == ENOENT) return {std::optional<EpochRecord>(), {}};
    return {std::nullopt, {std::string(kControlDir) + "/" + text.error.message, text.error.err}};
  }
  auto record = parse_epoch_record(*text.value);
  if (!record) {
    return {std::nullopt, {std::string(kControlDir) + "/" + std::string(kEpochName) + ": " + record.error(), 0}};
  }
  return {std::optional<EpochRecord>(std::move(record).value()), {}};
}

Status write_epoch_fd(int root_fd, const EpochRecord& record) {
  auto control = open_control_dir(root_fd, /*create=*/true);
  if (!control.ok()) return Status::failure(control.error.message);
  return write_file_atomic(control.value->get(), kEpochName, to_json(record),
                           std::string(kControlDir) + "/" + std::string(kEpochName));
}

}  // namespace

Status check_fence_fd(int root_fd, const std::optional<Fence>& fence) {
  if (!fence) return Status::success();
  auto record = read_epoch_fd(root_fd);
  // A run that cannot tell whether it is stale must not change the dir.
  if (!record.ok()) return Status::failure("cannot tell whether this run is fenced: " + record.error.message);
  if (auto refusal = fence_refusal(*fence, *record.value)) return Status::failure(*refusal);
  return Status::success();
}

Status reassert_epoch_fd(int root_fd, const Fence& fence) {
  auto record = read_epoch_fd(root_fd);
  if (!record.ok()) return Status::failure("cannot tell whether this run is fenced: " + record.error.message);
  if (auto refusal = fence_refusal(fence, *record.value)) return Status::failure(*refusal);
  const std::optional<EpochRecord>& r = *record.value;
  if (r && r->epoch == fence.epoch) return Status::success();
  // Missing, or an older epoch of this job: a run that started without raising it, or an older run's late raise
  // that read the record before this run raised it and renamed over it after.
  return write_epoch_fd(root_fd, EpochRecord{fence.job_id, fence.epoch, r ? r->run_id : std::string()});
}

}  // namespace detail

Status raise_epoch(const std::string& root, const Fence& run, std::string_view run_id) {
  const std::string at = "cannot record the start of run " + std::to_string(run.epoch) + ": ";
  try {
    auto root_fd = open_root(root);
    if (!root_fd) {
      // The root itself may be created here (one level, like mkdir without -p), as ShardWriter::open does.
      if (::mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
        return Status::failure(at + "cannot create checkpoint dir '" + root + "': " + errno_text(errno));
      }
      root_fd = open_root(root);
      if (!root_fd) return Status::failure(at + root_fd.error());
    }
    auto record = read_epoch_fd(root_fd->get());
    // An unreadable record is replaced: it cannot be trusted to fence anything, and this run is the newest.
    std::optional<EpochRecord> current = record.ok() ? *record.value : std::nullopt;
    switch (plan_epoch_raise(run, current)) {
      case EpochAction::Keep: return Status::success();
      case EpochAction::Fenced: return Status::failure(*fence_refusal(run, current));
      case EpochAction::Write: break;
    }
    if (Status s = write_epoch_fd(root_fd->get(), EpochRecord{run.job_id, run.epoch, std::string(run_id), run.generation});
        !s) {
      return Status::failure(at + s.error());
    }
    return Status::success();
  } catch (const std::exception& e) {
    return Status::failure(at + e.what());
  }
}

Result<std::optional<EpochRecord>> read_epoch(const std::string& root) {
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    auto record = read_epoch_fd(root_fd->get());
    if (!record.ok()) return Error{record.error.message};
    return *record.value;
  } catch (const std::exception& e) {
    return Error{std::string("cannot read the epoch record: ") + e.what()};
  }
}

}  // namespace ckpt::store
