// The POSIX file layer (ckpt/posix.hpp).
#include "ckpt/posix.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <system_error>

namespace ckpt::posix {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string join(const std::string& dir, const std::string& name) {
  return (!dir.empty() && dir.back() == '/') ? dir + name : dir + "/" + name;
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

bool send_all(int fd, const void* data, std::size_t length) {
  const char* p = static_cast<const char*>(data);
  while (length > 0) {
    ssize_t n = ::send(fd, p, length, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    length -= static_cast<std::size_t>(n);
  }
  return true;
}

int connect_start(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    errno = EHOSTUNREACH;
    return -1;
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    ::close(fd);
    fd = -1;
    errno = err;
  }
  const int err = errno;
  ::freeaddrinfo(res);
  errno = err;
  return fd;
}

bool connect_refused(const std::string& host, const std::string& port, int timeout_ms) {
  const int fd = connect_start(host, port);
  if (fd < 0) return errno == ECONNREFUSED;
  pollfd p{fd, POLLOUT, 0};
  int err = ETIMEDOUT;
  socklen_t len = sizeof err;
  if (::poll(&p, 1, timeout_ms) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  ::close(fd);
  return err == ECONNREFUSED;
}

std::string first_refused(const std::vector<std::pair<std::string, std::string>>& addresses, int timeout_ms) {
  for (const auto& [host, port] : addresses) {
    if (connect_refused(host, port, timeout_ms)) return host + ":" + port;
  }
  return {};
}

Status read_exactly(int fd, void* data, std::size_t size, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::failure("cannot read " + what + ": " + errno_text(errno));
    }
    if (n == 0) return Status::failure(what + " ended early");
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return Status::success();
}

Status fsync_fd(int fd, const std::string& what) {
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    // Some file systems cannot fsync a directory; a rename is still atomic there.
    if (errno == EINVAL) return Status::success();
    return Status::failure("cannot fsync " + what + ": " + errno_text(errno));
  }
  return Status::success();
}

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

namespace {

// A temp file of dir_fd holding `content`, written and (when durable) fsynced, closed; removed by its destructor
// unless it was published.
class TempFile {
 public:
  TempFile(int dir_fd, std::string_view name) : dir_fd_(dir_fd), name_(name) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (!temp_.empty() && !kept_) ::unlinkat(dir_fd_, temp_.c_str(), 0);
  }
  const std::string& name() const { return temp_; }
  // After a rename: the temp name is gone.
  void keep() { kept_ = true; }

  Status write(std::string_view content, const std::string& what, const AtomicWriteOptions& options) {
    Fd file;
    for (int attempt = 0; attempt < 8 && !file.valid(); ++attempt) {
      temp_ = temp_name_for(name_);
      int fd = ::openat(dir_fd_, temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd >= 0) {
        file.reset(fd);
      } else if (errno != EEXIST) {
        temp_.clear();
        return Status::failure("cannot create a temp file for " + what + ": " + errno_text(errno));
      }
    }
    if (!file.valid()) {
      temp_.clear();
      return Status::failure("cannot create a temp file for " + what + ": names exhausted");
    }
    if (options.mode != 0600 && ::fchmod(file.get(), options.mode) != 0) {
      return Status::failure("cannot set the mode of " + what + ": " + errno_text(errno));
    }
    std::size_t half = content.size() / 2;
    if (Status s = write_all(file.get(), content.data(), half, what); !s) return s;
    if (options.hooks.half_written) options.hooks.half_written();
    if (Status s = write_all(file.get(), content.data() + half, content.size() - half, what); !s) return s;
    if (options.durable) {
      if (Status s = fsync_fd(file.get(), what); !s) return s;
    }
    file.reset();
    if (options.hooks.temp_written) options.hooks.temp_written();
    if (options.hooks.before_publish) return options.hooks.before_publish();
    return Status::success();
  }

 private:
  int dir_fd_;
  std::string name_;
  std::string temp_;
  bool kept_ = false;
};

Status published(int dir_fd, const std::string& what, const AtomicWriteOptions& options) {
  if (options.hooks.published) options.hooks.published();
  return options.durable ? fsync_fd(dir_fd, "the directory of " + what) : Status::success();
}

}  // namespace

Status write_file_atomic(int dir_fd, std::string_view name, std::string_view content, const std::string& what,
                         const AtomicWriteOptions& options) {
  TempFile temp(dir_fd, name);
  if (Status s = temp.write(content, what, options); !s) return s;
  const std::string final_name(name);
  if (::renameat(dir_fd, temp.name().c_str(), dir_fd, final_name.c_str()) != 0) {
    return Status::failure("cannot rename " + what + " into place: " + errno_text(errno));
  }
  temp.keep();
  return published(dir_fd, what, options);
}

Status create_file_exclusive(int dir_fd, std::string_view name, std::string_view content, const std::string& what,
                             const ExclusiveOptions& options, bool* existed) {
  if (existed != nullptr) *existed = false;
  TempFile temp(dir_fd, name);
  if (Status s = temp.write(content, what, options.write); !s) return s;
  const std::string final_name(name);
  // link() publishes the file whole, and fails on a name that exists: the first creator wins.
  if (::linkat(dir_fd, temp.name().c_str(), dir_fd, final_name.c_str(), 0) != 0) {
    int err = errno;
    if (err == EEXIST) {
      if (existed != nullptr) *existed = true;
    } else if (options.rename_without_links &&
               (err == EPERM || err == ENOTSUP || err == ENOSYS || err == EMLINK || err == EXDEV)) {
      if (::renameat(dir_fd, temp.name().c_str(), dir_fd, final_name.c_str()) != 0) {
        return Status::failure("cannot rename " + what + " into place: " + errno_text(errno));
      }
      temp.keep();
    } else {
      return Status::failure("cannot link " + what + " into place: " + errno_text(err));
    }
  }
  return published(dir_fd, what, options.write);
}

bool read_within(int fd, double timeout_s, std::size_t max_bytes, std::string& text) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (n < 0 && errno != EINTR) return true;  // nothing more can come
    if (n <= 0) continue;
    const ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return true;
    if (text.size() < max_bytes) text.append(buf, std::min(static_cast<std::size_t>(got), max_bytes - text.size()));
  }
}

bool drop_privileges(uid_t uid, gid_t gid, const gid_t* groups, std::size_t group_count) {
  if (::geteuid() != 0 && ::getuid() == 0 && ::seteuid(0) != 0) return false;  // privileges were only set aside
  if (::geteuid() == 0) {
    if (::setgroups(group_count, groups) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) return false;
  }
  if (uid != 0 && ::setuid(0) == 0) return false;
  return ::getuid() == uid && ::geteuid() == uid && ::getgid() == gid && ::getegid() == gid;
}

bool random_bytes(void* out, std::size_t size) {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    ssize_t n = ::getrandom(p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

namespace {
std::string mode_text(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}
}  // namespace

Status make_private_dirs(const std::string& path) {
  std::string partial;
  std::stringstream in(path);
  std::string part;
  if (!path.empty() && path[0] != '/') partial = ".";
  while (std::getline(in, part, '/')) {
    if (part.empty()) continue;
    partial += "/" + part;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      return Status::failure("cannot create " + partial + ": " + errno_text(errno));
    }
  }
  return Status::success();
}

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

Result<Fd> open_private_dir(const std::string& path) {
  if (Status s = make_private_dirs(path); !s) return Error{s.error()};
  Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return Error{"cannot open " + path + ": " + errno_text(errno)};
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return Error{path + " is owned by uid " + std::to_string(st.st_uid) + " with mode " + mode_text(st.st_mode) +
                 "; it must be uid " + std::to_string(::geteuid()) + "'s own with mode 0700"};
  }
  return fd;
}

Result<Secret> private_secret(int dir_fd, const std::string& name, const std::string& path) {
  Fd in(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!in.valid() && errno == ENOENT) {
    Secret fresh{};
    if (!random_bytes(fresh.data(), fresh.size())) return Error{"getrandom: " + errno_text(errno)};
    const std::string_view bytes(reinterpret_cast<const char*>(fresh.data()), fresh.size());
    if (Status s = create_file_exclusive(dir_fd, name, bytes, path); !s) return Error{s.error()};
    in.reset(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  }
  if (!in.valid()) return Error{"cannot open " + path + ": " + errno_text(errno)};
  struct stat st {};
  Secret secret{};
  if (::fstat(in.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0 ||
      st.st_size != static_cast<off_t>(secret.size())) {
    return Error{path + " is not a private 32-byte file of uid " + std::to_string(::geteuid()) + " (uid " +
                 std::to_string(st.st_uid) + ", mode " + mode_text(st.st_mode) + ", " + std::to_string(st.st_size) +
                 " bytes)"};
  }
  if (Status s = read_exactly(in.get(), secret.data(), secret.size(), path); !s) return Error{s.error()};
  return secret;
}

}  // namespace ckpt::posix
