// The store's resume side: the cheap check of manifests at job start (check_records, resolve with checksums off)
// and each rank's read of the one shard it restores, checked while it is read (read_shard).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <thread>

#include "ckpt/store.hpp"
#include "store_io.hpp"

namespace ckpt::store {

namespace detail {

namespace {

constexpr std::uint64_t kReadChunk = 8u << 20;  // hashed right after it is read, while it is in cache

// Errors a shared file system gives for a while and then not: worth another try before anything is concluded.
bool is_transient(int err) {
  switch (err) {
    case EACCES: case EPERM: case ESTALE: case ETIMEDOUT: case EIO: case EAGAIN: case EINTR: case ENOMEM:
    case EMFILE: case ENFILE: case ENOLCK:
      return true;
    default:
      return false;
  }
}

}  // namespace

VerifyOutcome check_records_fd(int root_fd, std::uint64_t step, Manifest* out) {
  const std::string at = "step " + std::to_string(step) + ": ";
  auto bad = [&](std::string why, bool definite) { return VerifyOutcome{Status::failure(at + why), definite}; };
  auto dir = open_step_dir(root_fd, step);
  if (!dir.ok()) return {Status::failure(dir.error.message), dir.error.err == 0};
  int fd = dir.value->get();
  if (auto reason = failed_reason(fd)) return bad("marked FAILED: " + *reason, false);
  auto manifest = load_manifest(fd, step);
  if (!manifest.ok()) {
    // No manifest is an incomplete save, not a bad checkpoint.
    bool definite = manifest.error.err == 0 || manifest.error.err == EIO;
    return bad(manifest.error.message, definite);
  }
  const Manifest& m = *manifest.value;
  CommitDecision decision = decide_commit(m.kind, m.layout, m.world_size, m.shards);
  if (!decision.complete) return bad("manifest lists an incomplete checkpoint: " + decision.reason, true);
  if (out != nullptr) *out = std::move(*manifest.value);
  return {Status::success(), false};
}

ResumeChoice resolve_records(int root_fd, const std::string& root, const ResolveOptions& options) {
  ResumeChoice choice;
  auto entries = list_dir(root_fd);
  if (!entries.ok()) {
    choice.log.push_back("cannot read checkpoint dir '" + root + "': " + errno_text(entries.error.err));
    return choice;
  }
  std::vector<std::uint64_t> steps;
  for (const DirEntry& e : *entries.value) {
    auto step = parse_step_dir_name(e.name);
    if (!step) continue;
    if (!S_ISDIR(e.st.st_mode)) {
      choice.log.push_back("step " + std::to_string(*step) + ": skipped, corrupt: step dir is " +
                           (S_ISLNK(e.st.st_mode) ? "a symlink" : "not a directory"));
      continue;
    }
    if (std::find(options.skip.begin(), options.skip.end(), *step) == options.skip.end()) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  for (std::uint64_t step : steps) {
    if (options.deadline && std::chrono::steady_clock::now() >= *options.deadline) {
      choice.timed_out = true;
      choice.log.push_back("gave up before step " + std::to_string(step) + ": the time allowed has passed");
      return choice;
    }
    Manifest manifest;
    VerifyOutcome outcome = check_records_fd(root_fd, step, &manifest);
    // A manifest that cannot be read for a moment is read again before an older checkpoint is taken instead.
    auto pause = std::chrono::milliseconds(50);
    for (int retry = 0; retry < 3 && !outcome.status && !outcome.definite; ++retry) {
      if (outcome.status.error().find("no manifest") != std::string::npos ||
          outcome.status.error().find("marked FAILED") != std::string::npos) {
        break;
      }
      std::this_thread::sleep_for(pause);
      pause *= 2;
      outcome = check_records_fd(root_fd, step, &manifest);
    }
    if (outcome.status) {
      choice.step = step;
      choice.path = step_path(root, step);
      choice.manifest = std::move(manifest);
      choice.log.push_back("resume from step " + std::to_string(step) + " (" + choice.path + ")");
      return choice;
    }
    const std::string& why = outcome.status.error();
    std::string line;
    if (why.find("no manifest") != std::string::npos) {
      line = "step " + std::to_string(step) + ": skipped, incomplete: no manifest";
    } else if (auto at = why.find("marked FAILED: "); at != std::string::npos) {
      line = "step " + std::to_string(step) + ": skipped, failed: " + why.substr(at + 15);
    } else {
      line = why + "; skipped";
      if (options.mark && outcome.definite) {
        Status marked = mark_failed(root, step, why, options.fence);
        line += marked ? ", marked FAILED" : ", not marked: " + marked.error();
      }
    }
    choice.log.push_back(line);
  }
  choice.log.push_back("no complete checkpoint to resume from in " + root);
  return choice;
}

}  // namespace detail

using namespace detail;

Result<Manifest> check_records(const std::string& root, std::uint64_t step, bool* definite) {
  if (definite != nullptr) *definite = false;
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    Manifest manifest;
    VerifyOutcome outcome = check_records_fd(root_fd->get(), step, &manifest);
    if (!outcome.status) {
      if (definite != nullptr) *definite = outcome.definite;
      return Error{outcome.status.error()};
    }
    return manifest;
  } catch (const std::exception& e) {
    return Error{"step " + std::to_string(step) + ": " + e.what()};
  }
}

Result<ShardRecord> read_record(const std::string& root, std::uint64_t step, int rank, bool* definite) {
  const std::string at = "step " + std::to_string(step) + ": ";
  auto wrong = [&](std::string why, bool is_definite) {
    if (definite != nullptr) *definite = is_definite;
    return Error{std::move(why)};
  };
  if (definite != nullptr) *definite = false;
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Error{root_fd.error()};
    auto dir = open_step_dir(root_fd->get(), step);
    if (!dir.ok()) return wrong(dir.error.message, dir.error.err == 0 || dir.error.err == ENOENT);
    const std::string name = record_file_name(rank);
    auto text = read_small_file(dir.value->get(), name, kMaxRecordFile);
    if (!text.ok()) return wrong(at + text.error.message, text.error.err == 0 || text.error.err == ENOENT);
    auto record = parse_shard_record(*text.value);
    if (!record) return wrong(at + name + ": " + record.error(), true);
    if (record->rank != rank || record->file != shard_file_name(rank)) {
      return wrong(at + name + ": names rank " + std::to_string(record->rank) + " and file " + record->file, true);
    }
    return record;
  } catch (const std::exception& e) {
    return Error{at + e.what()};
  }
}

ShardRead read_shard(const std::string& root, std::uint64_t step, const ShardRecord& record, void* dest,
                     const ShardReadOptions& options) {
  ShardRead out;
  const std::string at = "step " + std::to_string(step) + ": " + shard_label(record) + ": ";
  auto fail = [&](std::string why, bool definite) {
    out.status = Status::failure(at + why);
    out.definite = definite;
    return out;
  };
  auto inject = [&](std::string_view op) { return options.inject ? options.inject(op) : 0; };
  try {
    auto root_fd = open_root(root);
    if (!root_fd) {
      out.status = Status::failure(root_fd.error());
      return out;
    }
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), XXH3_freeState);
    if (!state) return fail("out of memory", false);
    XXH3_64bits_reset(state.get());
    auto* bytes = static_cast<char*>(dest);
    Fd file;
    std::uint64_t done = 0;
    auto pause = options.backoff;
    for (;;) {
      int err = 0;
      const char* doing = "cannot open: ";
      if (!file.valid()) {
        err = inject("open");
        if (err == 0) {
          auto dir = open_step_dir(root_fd->get(), step);
          if (!dir.ok() && dir.error.err == 0) return fail(dir.error.message, true);
          if (!dir.ok() && dir.error.err == ENOENT) return fail("the step dir is missing", true);
          if (!dir.ok()) err = dir.error.err;
          if (dir.ok()) {
            struct stat st {};
            auto opened = open_regular(dir.value->get(), record.file, &st);
            if (!opened.ok() && (opened.error.err == 0 || opened.error.err == ENOENT)) {
              return fail(opened.error.err == ENOENT ? std::string("missing") : opened.error.message, true);
            }
            if (!opened.ok()) err = opened.error.err;
            if (opened.ok()) {
              if (static_cast<std::uint64_t>(st.st_size) != record.size) {
                return fail(std::to_string(st.st_size) + " bytes, manifest says " + std::to_string(record.size), true);
              }
              file = std::move(*opened.value);
              ::posix_fadvise(file.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
            }
          }
        }
      }
      if (err == 0) {
        doing = "read failed: ";
        while (done < record.size) {
          if ((err = inject("read")) != 0) break;
          std::uint64_t want = std::min(record.size - done, kReadChunk);
          ssize_t n = ::pread(file.get(), bytes + done, static_cast<std::size_t>(want), static_cast<off_t>(done));
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) {
            err = errno;
            break;
          }
          if (n == 0) {
            return fail("read " + std::to_string(done) + " bytes, manifest says " + std::to_string(record.size), true);
          }
          XXH3_64bits_update(state.get(), bytes + done, static_cast<std::size_t>(n));
          done += static_cast<std::uint64_t>(n);
          out.bytes += static_cast<std::uint64_t>(n);
        }
      }
      if (err == 0) break;
      if (!is_transient(err) || out.retries >= options.retries) {
        std::string why = doing + errno_text(err);
        if (out.retries > 0) why += " (tried " + std::to_string(out.retries + 1) + " times)";
        return fail(why, !is_circumstantial(err));
      }
      // Opened again after a pause: a stale handle needs a new one; the read goes on at `done`.
      file.reset();
      ++out.retries;
      std::this_thread::sleep_for(pause);
      pause *= 2;
    }
    std::uint64_t sum = XXH3_64bits_digest(state.get());
    if (sum != record.checksum) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "checksum mismatch (manifest %016llx, file %016llx)",
                    static_cast<unsigned long long>(record.checksum), static_cast<unsigned long long>(sum));
      return fail(buf, true);
    }
    out.status = Status::success();
    return out;
  } catch (const std::exception& e) {
    return fail(e.what(), false);
  }
}

}  // namespace ckpt::store
