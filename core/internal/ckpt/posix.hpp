#pragma once
// The one POSIX file layer of the tree (posix.cpp): owned descriptors, whole writes and reads, checked fsyncs, and
// small files written atomically (a temp file with a random name opened with O_EXCL, written, fsynced, then renamed
// over the name or linked to it, then the directory fsynced). The store, the hooks and the plugin use it; it is not
// installed, and neither libckpt (hooks/exports.map) nor the plugin (spank/exports.map) exports it.
//
// Names are relative to an opened directory fd, and the opens here use O_NOFOLLOW, so a planted symlink is refused,
// never followed. Failures are Status/IoResult values with a one-line message; nothing here throws but bad_alloc.
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt::posix {

// The message of an errno value (thread-safe, unlike strerror).
std::string errno_text(int err);
// "dir/name", without doubling a trailing '/'.
std::string join(const std::string& dir, const std::string& name);

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership: the caller closes it.
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// An I/O failure: the message, and the errno behind it (0 when the content, not the system, is at fault).
struct IoError {
  std::string message;
  int err = 0;
};

template <class T>
struct IoResult {
  std::optional<T> value;
  IoError error;
  bool ok() const { return value.has_value(); }
};

// Writes all of `data`, retrying on EINTR and short writes. The error names `what`.
Status write_all(int fd, const void* data, std::size_t length, const std::string& what);
// A socket's write_all: send() with MSG_NOSIGNAL (a peer that is gone is an error, never a SIGPIPE), retried on
// EINTR and short sends; false when the connection failed (errno says why).
bool send_all(int fd, const void* data, std::size_t length);
// Starts a non-blocking TCP connect to host:port (a numeric address or a name, and a port number): the socket
// (non-blocking, close-on-exec) while it connects or once connected, for poll(POLLOUT) and SO_ERROR to finish; -1
// with errno set when it failed at once (ECONNREFUSED: nothing listens there).
int connect_start(const std::string& host, const std::string& port);
// Whether a TCP connect to host:port is refused within `timeout_ms`: nothing listens there any more. False when it
// connects, times out (a host behind a cut link) or fails otherwise.
bool connect_refused(const std::string& host, const std::string& port, int timeout_ms);
// The first of `addresses` (host, port) whose connect is refused (connect_refused, timeout_ms each), as
// "host:port"; empty when none is.
std::string first_refused(const std::vector<std::pair<std::string, std::string>>& addresses, int timeout_ms);
// Reads exactly `size` bytes; an error when the file ends first ("<what> ended early") or a read fails.
Status read_exactly(int fd, void* data, std::size_t size, const std::string& what);
// fsync, retried on EINTR; success where the file system cannot fsync (EINVAL: some cannot sync a directory).
Status fsync_fd(int fd, const std::string& what);

// Opens a regular file of dir_fd for reading, without following a symlink and without blocking on a FIFO; a
// symlink, FIFO or directory is refused. The error's err is ENOENT when the name does not exist.
IoResult<Fd> open_regular(int dir_fd, const std::string& name, struct stat* st_out);
// The whole of a regular file of at most `max_bytes` bytes (open_regular's rules).
IoResult<std::string> read_small_file(int dir_fd, const std::string& name, std::size_t max_bytes);

// A suffix that is unique across processes and nodes sharing a directory; O_EXCL catches the rest.
std::string random_suffix();
// ".<name>.<random>.tmp": hidden, and never a name a reader of the directory takes for a finished file.
std::string temp_name_for(std::string_view name);

// Callbacks at the steps of an atomic file write: fault injection, and the last check before the file is published
// (`before_publish` failing abandons the write and leaves the directory as it was).
struct AtomicWriteHooks {
  std::function<void()> half_written, temp_written, published;
  std::function<Status()> before_publish;
};

struct AtomicWriteOptions {
  mode_t mode = 0600;    // set with fchmod, whatever the umask
  bool durable = true;   // fsync the file before and the directory after publishing it; off for a file that
                         // matters only while the processes that read it live (a rendezvous address)
  AtomicWriteHooks hooks;
};

// Writes `name` in dir_fd atomically: readers see the old file or the new one, whole. The temp file is removed on
// every failure. Errors: "cannot create a temp file for <what>: ...", "cannot write <what>: ...", "cannot fsync
// <what>: ...", "cannot rename <what> into place: ...".
Status write_file_atomic(int dir_fd, std::string_view name, std::string_view content, const std::string& what,
                         const AtomicWriteOptions& options = {});

// Creates `name` in dir_fd whole, and only when it does not exist: the temp file is linked to the name, which fails
// for every creator but the first, so racing creators never replace each other. `existed` (may be null) tells
// whether another creator had won; that is a success. With `rename_without_links`, a file system without hard links
// gets the temp file renamed over the name instead (atomic still, but a racer may replace it).
struct ExclusiveOptions {
  AtomicWriteOptions write;
  bool rename_without_links = false;
};
Status create_file_exclusive(int dir_fd, std::string_view name, std::string_view content, const std::string& what,
                             const ExclusiveOptions& options = {}, bool* existed = nullptr);

// Fills `out` from the kernel's random source (getrandom); false with errno set when it cannot.
bool random_bytes(void* out, std::size_t size);

struct DirEntry {
  std::string name;
  struct stat st {};
};
// Every entry of a directory with its lstat, sorted by name; entries that vanish while listing are skipped.
IoResult<std::vector<DirEntry>> list_dir(int dir_fd);

// Creates the directories of `path` that are missing, each with mode 0700. The error names the one that failed.
Status make_private_dirs(const std::string& path);
// `path`, created 0700 where missing, opened without following a symlink; refused unless it is this uid's own and
// closed to everyone else (it holds a job's secret). The error says whose it is and with what mode.
Result<Fd> open_private_dir(const std::string& path);

// Reads `fd` (a child's pipe) to its end into `text`, keeping at most `max_bytes`, for at most `timeout_s` of the
// steady clock; false when the time ran out first.
bool read_within(int fd, double timeout_s, std::size_t max_bytes, std::string& text);

// Drops every privilege for good, for a child that works as a job's owner: supplementary groups (given: the caller
// resolves them before a fork, as NSS may not be called after one), gid, uid; root set aside with seteuid is taken
// back first. False when any step failed or root could be regained. Async-signal-safe.
bool drop_privileges(uid_t uid, gid_t gid, const gid_t* groups, std::size_t group_count);

// A job's secret: 32 random bytes in `name` of dir_fd, made whole by the first process that needs it (created
// exclusively and linked into place, so racers never replace each other and a reader never sees part of it) and
// read by every other. Refused unless it is a regular file of this uid, closed to everyone else, of exactly 32
// bytes. The errors name `path`.
using Secret = std::array<std::uint8_t, 32>;
Result<Secret> private_secret(int dir_fd, const std::string& name, const std::string& path);

}  // namespace ckpt::posix
