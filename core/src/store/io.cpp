// The store's file-system helpers: the checkpoint dir's opens, listings and names (the generic ones are the POSIX
// layer's, ckpt/posix.hpp). See io.hpp.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>

#include "ckpt/store.hpp"
#include "ckpt/trusted_dir.hpp"
#include "io.hpp"

namespace ckpt::store {

namespace detail {

double to_seconds(const struct timespec& ts) {
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string step_path(const std::string& root, std::uint64_t step) {
  return join(root, step_dir_name(step));
}

// Opens the checkpoint dir so that no other user can have redirected it (ckpt/trusted_dir.hpp). A user opens it
// under their own uid. Root (an admin's `ckpt ls` or `ckpt gc`) opens it under the rules of whoever owns the named
// dir: a user's dir, or a user's symlink to another user's dir, is walked as that user would be, so that root never
// gcs or reads through a user's redirection what that user could not.
Result<Fd> open_root(const std::string& root) {
  std::string path = root;
  if (!path.empty() && path[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) == nullptr) return Error{"cannot open checkpoint dir '" + root + "': " + errno_text(errno)};
    path = join(cwd, path);
  }
  uid_t uid = ::geteuid();
  if (uid == 0) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return Error{"cannot open checkpoint dir '" + root + "': " + errno_text(errno)};
    if (!S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode)) {
      return Error{"cannot open checkpoint dir '" + root + "': " + errno_text(ENOTDIR)};
    }
    uid = st.st_uid;
  }
  auto fd = fs::open_trusted_dir(path, fs::TrustRules{uid, fs::trusted_prefixes_from_env()}, false);
  if (!fd) return Error{fd.error()};
  return Fd(*fd);
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

void notify(const PhaseObserver& observer, SavePhase phase) {
  if (observer) observer(phase);
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
