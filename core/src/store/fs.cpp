// The store's reading side: scan, verify, mark FAILED, resolve, read manifests and records back.
// The helpers live in io.cpp; writing in writer.cpp; deleting, control files and fencing in
// control.cpp.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <new>
#include <optional>

#include "ckpt/store.hpp"
#include "io.hpp"

namespace ckpt::store {

namespace detail {

namespace {

constexpr std::size_t kReadBuffer = 4u << 20;  // streaming checksum buffer

}  // namespace

std::optional<std::string> failed_reason(int step_fd) {
  auto st = stat_at(step_fd, std::string(kFailedName));
  if (!st.ok()) return std::nullopt;
  auto text = read_small_file(step_fd, std::string(kFailedName), kMaxMarkerFile);
  return text.ok() ? one_line(*text.value, 300) : std::string("(reason unreadable)");
}

IoResult<Manifest> load_manifest(int step_fd, std::uint64_t step) {
  auto text = read_small_file(step_fd, std::string(kManifestName), kMaxManifestFile);
  if (!text.ok()) {
    if (text.error.err == ENOENT) return {std::nullopt, {"no manifest (incomplete)", ENOENT}};
    return {std::nullopt, text.error};
  }
  auto parsed = parse_manifest(*text.value);
  if (!parsed) return {std::nullopt, {parsed.error(), 0}};
  if (parsed->step != step) {
    return {std::nullopt,
            {"manifest says step " + std::to_string(parsed->step) + " in dir " + step_dir_name(step), 0}};
  }
  return {std::move(parsed).value(), {}};
}

namespace {

// What scan learns of one step dir, without reading shard bytes.
Entry inspect_step(int root_fd, const std::string& name, std::uint64_t step) {
  Entry entry;
  entry.step = step;
  auto corrupt = [&](std::string why) {
    entry.state = State::Corrupt;
    entry.detail = std::move(why);
    return entry;
  };
  auto st = stat_at(root_fd, name);
  if (!st.ok()) return corrupt("cannot stat: " + errno_text(st.error.err));
  entry.mtime = to_seconds(st.value->st_mtim);
  if (S_ISLNK(st.value->st_mode)) return corrupt("step dir is a symlink");
  if (!S_ISDIR(st.value->st_mode)) return corrupt("step dir is not a directory");
  auto dir = open_step_dir(root_fd, step);
  if (!dir.ok()) return corrupt(dir.error.message);
  int fd = dir.value->get();
  auto entries = list_dir(fd);
  if (!entries.ok()) return corrupt(entries.error.message);
  int records = 0;
  for (const DirEntry& e : *entries.value) {
    if (S_ISREG(e.st.st_mode)) entry.bytes += static_cast<std::uint64_t>(e.st.st_size);
    entry.mtime = std::max(entry.mtime, to_seconds(e.st.st_mtim));
    if (S_ISREG(e.st.st_mode) && parse_record_file_name(e.name)) ++records;
  }
  auto manifest = load_manifest(fd, step);
  if (manifest.ok()) entry.manifest = *manifest.value;

  if (std::string link = first_symlink(*entries.value); !link.empty()) return corrupt("symlink planted: " + link);
  if (auto reason = failed_reason(fd)) {
    entry.state = State::Failed;
    entry.detail = *reason;
    return entry;
  }
  if (!manifest.ok()) {
    if (manifest.error.err == ENOENT) {
      entry.state = State::Incomplete;
      entry.detail = "no manifest; " + std::to_string(records) + " shard records";
      return entry;
    }
    return corrupt(manifest.error.message);
  }
  const Manifest& m = *manifest.value;
  CommitDecision decision = decide_commit(m.kind, m.layout, m.world_size, m.shards);
  if (!decision.complete) return corrupt("manifest lists an incomplete checkpoint: " + decision.reason);
  for (const ShardRecord& r : m.shards) {
    auto shard = stat_at(fd, r.file);
    if (!shard.ok()) return corrupt(shard_label(r) + ": " + errno_text(shard.error.err));
    if (!S_ISREG(shard.value->st_mode)) return corrupt(shard_label(r) + ": not a regular file");
    auto size = static_cast<std::uint64_t>(shard.value->st_size);
    if (size != r.size) {
      return corrupt(shard_label(r) + ": " + std::to_string(size) + " bytes, manifest says " + std::to_string(r.size));
    }
  }
  entry.state = State::Complete;
  entry.detail = std::to_string(m.shards.size()) + " shards";
  return entry;
}

}  // namespace

bool is_circumstantial(int err) {
  switch (err) {
    case EACCES: case EPERM: case EMFILE: case ENFILE: case ENOMEM: case EAGAIN: case EINTR: case ESTALE:
    case ETIMEDOUT: case ENOENT:
      return true;
    default:
      return false;
  }
}

namespace {

// Why a step does not verify, before the step is named, and whether that is definite (see VerifyOutcome).
struct Flaw {
  std::string why;
  bool definite = false;
};

// Streams shard files through one buffer and one XXH3 state, reused for every shard of a step.
class ShardHasher {
 public:
  ShardHasher() : buffer_(new (std::nothrow) char[kReadBuffer]), state_(XXH3_createState(), XXH3_freeState) {}
  // False when the buffer or the state could not be allocated.
  bool ready() const { return buffer_ && state_; }

  // Reads `shard_fd` to its end; nullopt when its length and checksum are the ones `r` records.
  std::optional<Flaw> check(int shard_fd, const ShardRecord& r) {
    ::posix_fadvise(shard_fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    XXH3_64bits_reset(state_.get());
    std::uint64_t total = 0;
    for (;;) {
      ssize_t n = ::read(shard_fd, buffer_.get(), kReadBuffer);
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        return Flaw{"read failed: " + errno_text(err), !is_circumstantial(err)};
      }
      if (n == 0) break;
      XXH3_64bits_update(state_.get(), buffer_.get(), static_cast<std::size_t>(n));
      total += static_cast<std::uint64_t>(n);
    }
    if (total != r.size) {
      return Flaw{"read " + std::to_string(total) + " bytes, manifest says " + std::to_string(r.size), true};
    }
    std::uint64_t sum = XXH3_64bits_digest(state_.get());
    if (sum != r.checksum) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "checksum mismatch (manifest %016llx, file %016llx)",
                    static_cast<unsigned long long>(r.checksum), static_cast<unsigned long long>(sum));
      return Flaw{buf, true};
    }
    return std::nullopt;
  }

 private:
  std::unique_ptr<char[]> buffer_;
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
};

// Checks one shard's size, and its bytes when `hasher` is given; nullopt when it matches the manifest.
std::optional<Flaw> check_shard(int step_fd, const ShardRecord& r, ShardHasher* hasher) {
  struct stat st {};
  auto file = open_regular(step_fd, r.file, &st);
  if (!file.ok()) {
    if (file.error.err == ENOENT) return Flaw{"missing", true};
    return Flaw{file.error.message, file.error.err == 0 || !is_circumstantial(file.error.err)};
  }
  auto size = static_cast<std::uint64_t>(st.st_size);
  if (size != r.size) return Flaw{std::to_string(size) + " bytes, manifest says " + std::to_string(r.size), true};
  if (hasher == nullptr) return std::nullopt;
  return hasher->check(file.value->get(), r);
}

}  // namespace

VerifyOutcome verify_fd(int root_fd, std::uint64_t step, bool checksums) {
  const std::string at = "step " + std::to_string(step) + ": ";
  auto bad = [&](std::string why, bool definite) { return VerifyOutcome{Status::failure(at + why), definite}; };
  auto dir = open_step_dir(root_fd, step);
  if (!dir.ok()) return {Status::failure(dir.error.message), dir.error.err == 0};  // names the step itself
  int fd = dir.value->get();
  auto entries = list_dir(fd);
  if (!entries.ok()) return bad(entries.error.message, false);
  if (std::string link = first_symlink(*entries.value); !link.empty()) return bad("symlink planted: " + link, true);
  if (auto reason = failed_reason(fd)) return bad("marked FAILED: " + *reason, false);
  auto manifest = load_manifest(fd, step);
  if (!manifest.ok()) {
    bool definite = manifest.error.err == 0 || manifest.error.err == ENOENT || manifest.error.err == EIO;
    return bad(manifest.error.message, definite);
  }
  const Manifest& m = *manifest.value;
  CommitDecision decision = decide_commit(m.kind, m.layout, m.world_size, m.shards);
  if (!decision.complete) return bad("manifest lists an incomplete checkpoint: " + decision.reason, true);

  // Allocated once for the whole step, and only when the bytes are read.
  std::optional<ShardHasher> hasher;
  if (checksums) {
    hasher.emplace();
    if (!hasher->ready()) return bad("out of memory", false);
  }
  for (const ShardRecord& r : m.shards) {
    if (auto flaw = check_shard(fd, r, hasher ? &*hasher : nullptr)) {
      return bad(shard_label(r) + ": " + flaw->why, flaw->definite);
    }
  }
  return {Status::success(), false};
}

IoResult<std::vector<ShardRecord>> present_records_fd(int step_fd) {
  auto entries = list_dir(step_fd);
  if (!entries.ok()) return {std::nullopt, entries.error};
  std::vector<ShardRecord> records;
  for (const DirEntry& e : *entries.value) {
    auto rank = parse_record_file_name(e.name);
    if (!rank) continue;
    auto text = read_small_file(step_fd, e.name, kMaxRecordFile);
    if (!text.ok()) return {std::nullopt, text.error};
    auto record = parse_shard_record(*text.value);
    if (!record) return {std::nullopt, {e.name + ": " + record.error(), 0}};
    if (record->rank != *rank || record->file != shard_file_name(*rank)) {
      return {std::nullopt, {e.name + ": names rank " + std::to_string(record->rank) + " and file " + record->file, 0}};
    }
    auto shard = stat_at(step_fd, record->file);
    if (!shard.ok()) {
      return {std::nullopt, {shard_label(*record) + ": " + errno_text(shard.error.err), shard.error.err}};
    }
    if (!S_ISREG(shard.value->st_mode)) return {std::nullopt, {shard_label(*record) + ": not a regular file", 0}};
    if (static_cast<std::uint64_t>(shard.value->st_size) != record->size) {
      return {std::nullopt,
              {shard_label(*record) + ": " + std::to_string(shard.value->st_size) + " bytes, record says " +
                   std::to_string(record->size), 0}};
    }
    records.push_back(std::move(record).value());
  }
  std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return {std::move(records), {}};
}

}  // namespace detail

using namespace detail;

namespace {

Status mark_failed_fd(int root_fd, std::uint64_t step, std::string_view reason, const std::optional<Fence>& fence) {
  const std::string at = "cannot mark step " + std::to_string(step) + " FAILED: ";
  auto dir = open_step_dir(root_fd, step);
  if (!dir.ok()) return Status::failure(at + dir.error.message);
  int fd = dir.value->get();
  const std::string marker(kFailedName);
  auto is_marked = [&]() -> std::optional<Status> {
    auto st = stat_at(fd, marker);
    if (!st.ok()) return std::nullopt;
    if (S_ISREG(st.value->st_mode)) return Status::success();  // idempotent: the first reason stays
    return Status::failure(at + "FAILED exists and is not a regular file");
  };
  if (auto done = is_marked()) return *done;

  std::string content = one_line(reason, 2000) + "\n";
  // Exclusive: when another node got there first, racing markers never replace each other. Without hard links a
  // rename is still atomic, and any racer's reason is as good as ours.
  posix::ExclusiveOptions write;
  write.rename_without_links = true;
  write.write.hooks.before_publish = [&] { return check_fence_fd(root_fd, fence); };
  if (Status s = posix::create_file_exclusive(fd, marker, content, "the FAILED marker", write); !s) {
    return Status::failure(at + s.error());
  }
  if (auto done = is_marked()) return *done;
  return Status::failure(at + "the marker vanished");
}

}  // namespace

// ---- reading ----------------------------------------------------------------------------------------------------

Result<std::vector<Entry>> scan(const std::string& root) {
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    auto entries = list_dir(root_fd->get());
    if (!entries.ok()) return Error{"cannot read checkpoint dir '" + root + "': " + errno_text(entries.error.err)};
    std::vector<Entry> out;
    for (const DirEntry& e : *entries.value) {
      if (auto step = parse_step_dir_name(e.name)) out.push_back(inspect_step(root_fd->get(), e.name, *step));
    }
    std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.step < b.step; });
    return out;
  } catch (const std::exception& e) {
    return Error{std::string("cannot scan '") + root + "': " + e.what()};
  }
}

Result<std::vector<std::uint64_t>> dead_saves_above(const std::string& root, std::uint64_t step) {
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    auto entries = list_dir(root_fd->get());
    if (!entries.ok()) return Error{"cannot read checkpoint dir '" + root + "': " + errno_text(entries.error.err)};
    std::vector<std::uint64_t> out;
    for (const DirEntry& e : *entries.value) {
      auto s = parse_step_dir_name(e.name);
      if (!s || *s <= step || !S_ISDIR(e.st.st_mode)) continue;
      auto dir = open_step_dir(root_fd->get(), *s);
      if (!dir.ok()) continue;
      if (!exists_at(dir.value->get(), std::string(kManifestName)) &&
          !exists_at(dir.value->get(), std::string(kFailedName))) {
        out.push_back(*s);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  } catch (const std::exception& e) {
    return Error{std::string("cannot scan '") + root + "': " + e.what()};
  }
}

Status verify(const std::string& root, std::uint64_t step, bool checksums) {
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Status::failure(root_fd.error());
    return verify_fd(root_fd->get(), step, checksums).status;
  } catch (const std::exception& e) {
    return Status::failure("step " + std::to_string(step) + ": " + e.what());
  }
}

Status mark_failed(const std::string& root, std::uint64_t step, std::string_view reason,
                   const std::optional<Fence>& fence) {
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Status::failure(root_fd.error());
    return mark_failed_fd(root_fd->get(), step, reason, fence);
  } catch (const std::exception& e) {
    return Status::failure("cannot mark step " + std::to_string(step) + " FAILED: " + e.what());
  }
}

ResumeChoice resolve_resume(const std::string& root, bool mark, const std::optional<Fence>& fence) {
  ResolveOptions options;
  options.mark = mark;
  options.fence = fence;
  return resolve_resume(root, options);
}

ResumeChoice resolve_resume(const std::string& root, const ResolveOptions& options) {
  ResumeChoice choice;
  const bool mark = options.mark;
  const std::optional<Fence>& fence = options.fence;
  try {
    auto root_fd = open_root(root);
    if (!root_fd) {
      choice.log.push_back(root_fd.error());
      return choice;
    }
    if (!options.checksums) return resolve_records(root_fd->get(), root, options);
    auto entries = scan(root);
    if (!entries) {
      choice.log.push_back(entries.error());
      return choice;
    }
    // Newest first: everything newer than the choice gets a line saying why it was passed over.
    std::vector<Entry> newest_first(entries->rbegin(), entries->rend());
    for (const Entry& e : newest_first) {
      if (std::find(options.skip.begin(), options.skip.end(), e.step) != options.skip.end()) continue;
      if (options.deadline && std::chrono::steady_clock::now() >= *options.deadline) {
        choice.timed_out = true;
        choice.log.push_back("gave up before step " + std::to_string(e.step) + ": the time allowed has passed");
        return choice;
      }
      if (e.state != State::Complete) {
        choice.log.push_back("step " + std::to_string(e.step) + ": skipped, " + to_string(e.state) + ": " + e.detail);
        continue;
      }
      VerifyOutcome outcome = verify_fd(root_fd->get(), e.step, /*checksums=*/true);
      if (outcome.status) {
        choice.step = e.step;
        choice.path = step_path(root, e.step);
        choice.log.push_back("resume from step " + std::to_string(e.step) + " (" + choice.path + ")");
        return choice;
      }
      std::string line = outcome.status.error() + "; skipped";
      if (mark && outcome.definite) {
        Status marked = mark_failed_fd(root_fd->get(), e.step, outcome.status.error(), fence);
        line += marked ? ", marked FAILED" : ", not marked: " + marked.error();
      }
      choice.log.push_back(line);
    }
    choice.log.push_back("no complete checkpoint to resume from in " + root);
  } catch (const std::exception& e) {
    choice.step.reset();
    choice.path.clear();
    choice.log.push_back(std::string("cannot resolve a checkpoint: ") + e.what());
  } catch (...) {
    choice.step.reset();
    choice.path.clear();
    choice.log.push_back("cannot resolve a checkpoint: unknown error");
  }
  return choice;
}

Result<Manifest> read_manifest(const std::string& root, std::uint64_t step) {
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    auto dir = open_step_dir(root_fd->get(), step);
    if (!dir.ok()) return Error{dir.error.message};
    auto manifest = load_manifest(dir.value->get(), step);
    if (!manifest.ok()) return Error{"step " + std::to_string(step) + ": " + manifest.error.message};
    return std::move(*manifest.value);
  } catch (const std::exception& e) {
    return Error{"step " + std::to_string(step) + ": " + e.what()};
  }
}

std::optional<std::uint64_t> latest_committed_step(const std::string& root) {
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return std::nullopt;
    auto text = read_small_file(root_fd->get(), std::string(kLatestName), 64);
    if (!text.ok()) return std::nullopt;
    std::string_view name = *text.value;
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.remove_suffix(1);
    const std::optional<std::uint64_t> step = parse_step_dir_name(name);
    if (!step || !read_manifest(root, *step)) return std::nullopt;
    return step;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

Result<std::vector<ShardRecord>> read_records(const std::string& root, std::uint64_t step) {
  auto manifest = read_manifest(root, step);
  if (!manifest) return Error{manifest.error()};
  return std::move(manifest).value().shards;
}

Result<std::vector<ShardRecord>> read_present_records(const std::string& root, std::uint64_t step) {
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    auto dir = open_step_dir(root_fd->get(), step);
    if (!dir.ok()) return Error{dir.error.message};
    auto records = present_records_fd(dir.value->get());
    if (!records.ok()) return Error{"step " + std::to_string(step) + ": " + records.error.message};
    return std::move(*records.value);
  } catch (const std::exception& e) {
    return Error{"step " + std::to_string(step) + ": " + e.what()};
  }
}

}  // namespace ckpt::store
