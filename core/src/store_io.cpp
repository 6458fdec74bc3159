// The store's file-system helpers: fd-relative, no-follow opens, reads with bounds, atomic writes, listings.
// See store_io.hpp.
#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <system_error>

#include "ckpt/store.hpp"
#include "ckpt/trusted_dir.hpp"
#include "store_io.hpp"

namespace ckpt::store {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string join(const std::string& dir, const std::string& name) {
  return (!dir.empty() && dir.back() == '/') ? dir + name : dir + "/" + name;
}

namespace detail {

double to_seconds(const struct timespec& ts) {
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// A suffix that is unique across processes and nodes sharing the directory; O_EXCL catches the rest.
std::string random_suffix() {
  static std::atomic<std::uint64_t> counter{0};
  std::uint64_t bits = 0;
  if (::getrandom(&bits, sizeof bits, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof bits)) {
    bits = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           (static_cast<std::uint64_t>(::getpid()) << 32);
  }
  bits ^= counter.fetch_add(1) * 0x9E3779B97F4A7C15ULL;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(bits));
  return buf;
}

std::string temp_name_for(std::string_view name) { return "." + std::string(name) + "." + random_suffix() + ".tmp"; }

std::string step_path(const std::string& root, std::uint64_t step) {
  return join(root, step_dir_name(step));
}

// Opens the checkpoint dir so that no other user can have redirected it (ckpt/trusted_dir.hpp). Root's tools
// (an admin's `ckpt ls`) open what root names; the plugin and the controller read users' dirs as their owner.
Result<Fd> open_root(const std::string& root) {
  if (::geteuid() != 0) {
    auto fd = fs::open_trusted_dir(root, fs::TrustRules{::geteuid(), fs::trusted_prefixes_from_env()}, false);
    if (!fd) return Error{fd.error()};
    return Fd(*fd);
  }
  int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error{"cannot open checkpoint dir '" + root + "': " + errno_text(errno)};
  return Fd(fd);
}

// Opens <root>/<step> without following a symlink. `err` receives errno on failure.
IoResult<Fd> open_step_dir(int root_fd, std::uint64_t step) {
  std::string name = step_dir_name(step);
  int fd = ::openat(root_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) return {Fd(fd), {}};
  int err = errno;
  if (err == ENOENT) return {std::nullopt, {"step " + std::to_string(step) + " does not exist", err}};
  if (err == ELOOP || err == ENOTDIR) {
    return {std::nullopt, {"step dir " + name + " is a symlink or not a directory", 0}};
  }
  return {std::nullopt, {"cannot open step dir " + name + ": " + errno_text(err), err}};
}

IoResult<Fd> open_control_dir(int root_fd, bool create) {
  if (create && ::mkdirat(root_fd, kControlDir, 0700) != 0 && errno != EEXIST) {
    int err = errno;
    return {std::nullopt, {std::string("cannot create ") + kControlDir + ": " + errno_text(err), err}};
  }
  int fd = ::openat(root_fd, kControlDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return {std::nullopt, {std::string("cannot open ") + kControlDir + ": " + errno_text(err), err}};
  }
  return {Fd(fd), {}};
}

// lstat relative to a dir; nullopt when the name does not exist.
IoResult<struct stat> stat_at(int dir_fd, const std::string& name) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return {st, {}};
  int err = errno;
  return {std::nullopt, {name + ": " + errno_text(err), err}};
}

bool exists_at(int dir_fd, const std::string& name) {
  struct stat st {};
  return ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

// Opens a regular file for reading; a symlink, FIFO or directory is refused.
IoResult<Fd> open_regular(int dir_fd, const std::string& name, struct stat* st_out) {
  int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    int err = errno;
    if (err == ELOOP) return {std::nullopt, {name + " is a symlink", 0}};
    if (err == ENOENT) return {std::nullopt, {name + " is missing", ENOENT}};
    return {std::nullopt, {"cannot open " + name + ": " + errno_text(err), err}};
  }
  Fd file(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {std::nullopt, {"cannot stat " + name + ": " + errno_text(errno), errno}};
  if (!S_ISREG(st.st_mode)) return {std::nullopt, {name + " is not a regular file", 0}};
  if (st_out != nullptr) *st_out = st;
  return {std::move(file), {}};
}

IoResult<std::string> read_small_file(int dir_fd, const std::string& name, std::size_t max_bytes) {
  struct stat st {};
  auto file = open_regular(dir_fd, name, &st);
  if (!file.ok()) return {std::nullopt, file.error};
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    return {std::nullopt, {name + " is larger than " + std::to_string(max_bytes) + " bytes", 0}};
  }
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(file.value->get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return {std::nullopt, {"cannot read " + name + ": " + errno_text(errno), errno}};
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > max_bytes) return {std::nullopt, {name + " grew past " + std::to_string(max_bytes), 0}};
  }
  return {std::move(text), {}};
}

Status write_all(int fd, const void* data, std::size_t length, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (length > 0) {
    // Linux writes at most ~2 GiB per call; ask for no more.
    std::size_t chunk = std::min<std::size_t>(length, std::size_t{1} << 30);
    ssize_t n = ::write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::failure("cannot write " + what + ": " + errno_text(errno));
    }
    p += n;
    length -= static_cast<std::size_t>(n);
  }
  return Status::success();
}

Status fsync_fd(int fd, const std::string& what) {
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    // Some file systems cannot fsync a directory; the rename is still atomic there.
    if (errno == EINVAL) return Status::success();
    return Status::failure("cannot fsync " + what + ": " + errno_text(errno));
  }
  return Status::success();
}

void notify(const PhaseObserver& observer, SavePhase phase) {
  if (observer) observer(phase);
}

// Writes `name` in dir_fd atomically: exclusive temp file, fsync, rename over, fsync the dir.
Status write_file_atomic(int dir_fd, std::string_view name, std::string_view content, const std::string& what,
                         const AtomicWriteHooks& hooks) {
  std::string temp;
  Fd file;
  for (int attempt = 0; attempt < 8 && !file.valid(); ++attempt) {
    temp = temp_name_for(name);
    int fd = ::openat(dir_fd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      file.reset(fd);
    } else if (errno != EEXIST) {
      return Status::failure("cannot create a temp file for " + what + ": " + errno_text(errno));
    }
  }
  if (!file.valid()) return Status::failure("cannot create a temp file for " + what + ": names exhausted");
  auto abandon = [&](Status status) {
    ::unlinkat(dir_fd, temp.c_str(), 0);
    return status;
  };
  std::size_t half = content.size() / 2;
  if (Status s = write_all(file.get(), content.data(), half, what); !s) return abandon(s);
  if (hooks.half_written) hooks.half_written();
  if (Status s = write_all(file.get(), content.data() + half, content.size() - half, what); !s) return abandon(s);
  if (Status s = fsync_fd(file.get(), what); !s) return abandon(s);
  file.reset();
  if (hooks.temp_written) hooks.temp_written();
  if (hooks.before_rename) {
    if (Status s = hooks.before_rename(); !s) return abandon(s);
  }
  std::string final_name(name);
  if (::renameat(dir_fd, temp.c_str(), dir_fd, final_name.c_str()) != 0) {
    return abandon(Status::failure("cannot rename " + what + " into place: " + errno_text(errno)));
  }
  if (hooks.renamed) hooks.renamed();
  return fsync_fd(dir_fd, "the directory of " + what);
}

// Every entry of a directory with its lstat; entries that vanish while listing are skipped.
IoResult<std::vector<DirEntry>> list_dir(int dir_fd) {
  int dup_fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup_fd < 0) return {std::nullopt, {"cannot list directory: " + errno_text(errno), errno}};
  DIR* dir = ::fdopendir(dup_fd);
  if (dir == nullptr) {
    int err = errno;
    ::close(dup_fd);
    return {std::nullopt, {"cannot list directory: " + errno_text(err), err}};
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(dir, ::closedir);
  std::vector<DirEntry> entries;
  for (;;) {
    errno = 0;
    struct dirent* ent = ::readdir(dir);
    if (ent == nullptr) {
      if (errno != 0) return {std::nullopt, {"cannot list directory: " + errno_text(errno), errno}};
      break;
    }
    std::string name = ent->d_name;
    if (name == "." || name == "..") continue;
    DirEntry entry{name, {}};
    if (::fstatat(dir_fd, name.c_str(), &entry.st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return {std::move(entries), {}};
}

// The rank a record file name stands for: "rank-00003.rec" -> 3.
std::optional<int> parse_record_file_name(std::string_view name) {
  constexpr std::string_view prefix = "rank-", suffix = ".rec";
  if (name.size() <= prefix.size() + suffix.size() || name.substr(0, prefix.size()) != prefix ||
      name.substr(name.size() - suffix.size()) != suffix) {
    return std::nullopt;
  }
  std::string_view digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 9) return std::nullopt;
  int rank = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    rank = rank * 10 + (c - '0');
  }
  if (record_file_name(rank) != name) return std::nullopt;  // one spelling per rank
  return rank;
}

std::string first_symlink(const std::vector<DirEntry>& entries) {
  for (const DirEntry& e : entries) {
    if (S_ISLNK(e.st.st_mode)) return e.name;
  }
  return {};
}

std::string shard_label(const ShardRecord& r) { return "shard " + r.file + " (rank " + std::to_string(r.rank) + ")"; }

std::string one_line(std::string_view text, std::size_t max) {
  std::string out;
  for (char c : text) {
    if (c == '\n' || c == '\r') break;
    out += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
    if (out.size() >= max) break;
  }
  return out;
}


}  // namespace detail
}  // namespace ckpt::store
