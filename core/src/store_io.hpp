#pragma once
// Internal to the store: the file-system helpers its parts share (store_io.cpp), and the operations one part
// needs from another. Not installed, not part of ckpt/store.hpp.
//
// Every path below the checkpoint root is reached relative to an opened directory fd, and every open, stat and
// create inside it uses O_NOFOLLOW / AT_SYMLINK_NOFOLLOW, so a planted symlink is seen, reported, never followed.
// Reads use O_NONBLOCK so that a planted FIFO cannot hang a job at start.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/clock.hpp"
#include "ckpt/store.hpp"

namespace ckpt::store::detail {

inline constexpr std::size_t kMaxManifestFile = 256u << 20;  // matches the parser's bound
inline constexpr std::size_t kMaxControlFile = 1u << 20;
inline constexpr const char* kControlDir = ".control";
inline constexpr std::size_t kMaxRecordFile = 64u << 20;
inline constexpr std::size_t kMaxMarkerFile = 64u << 10;

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

double to_seconds(const struct timespec& ts);
// A suffix that is unique across processes and nodes sharing the directory; O_EXCL catches the rest.
std::string random_suffix();
// ".<name>.<random>.tmp": hidden, and never a name the store reads.
std::string temp_name_for(std::string_view name);
std::string step_path(const std::string& root, std::uint64_t step);

// Opens the checkpoint dir so that no other user can have redirected it (ckpt/trusted_dir.hpp).
Result<Fd> open_root(const std::string& root);
// Opens <root>/<step> without following a symlink; the error's err is errno (0: not a directory).
IoResult<Fd> open_step_dir(int root_fd, std::uint64_t step);
// Opens <root>/.control without following a symlink, creating it (0700) when `create`.
IoResult<Fd> open_control_dir(int root_fd, bool create);
// lstat relative to a dir; the error's err is ENOENT when the name does not exist.
IoResult<struct stat> stat_at(int dir_fd, const std::string& name);
bool exists_at(int dir_fd, const std::string& name);
// Opens a regular file for reading; a symlink, FIFO or directory is refused.
IoResult<Fd> open_regular(int dir_fd, const std::string& name, struct stat* st_out);
IoResult<std::string> read_small_file(int dir_fd, const std::string& name, std::size_t max_bytes);
Status write_all(int fd, const void* data, std::size_t length, const std::string& what);
// fsync; success where the file system cannot fsync a directory (EINVAL).
Status fsync_fd(int fd, const std::string& what);
void notify(const PhaseObserver& observer, SavePhase phase);

// Callbacks at the steps of an atomic file write: fault injection, and the last check before the rename
// (`before_rename` failing abandons the write and leaves the old file in place).
struct AtomicWriteHooks {
  std::function<void()> half_written, temp_written, renamed;
  std::function<Status()> before_rename;
};

// Writes `name` in dir_fd atomically: exclusive temp file, fsync, rename over, fsync the dir.
Status write_file_atomic(int dir_fd, std::string_view name, std::string_view content, const std::string& what,
                         const AtomicWriteHooks& hooks = {});

struct DirEntry {
  std::string name;
  struct stat st {};
};
// Every entry of a directory with its lstat, sorted by name; entries that vanish while listing are skipped.
IoResult<std::vector<DirEntry>> list_dir(int dir_fd);
// The rank a record file name stands for: "rank-00003.rec" -> 3.
std::optional<int> parse_record_file_name(std::string_view name);
// The first symlink among the entries; empty when none.
std::string first_symlink(const std::vector<DirEntry>& entries);
std::string shard_label(const ShardRecord& r);
// The first line of `text`, control characters blanked, at most `max` characters.
std::string one_line(std::string_view text, std::size_t max);

// A verification failure and whether it is about the checkpoint itself (definite) or about this process's
// circumstances (permissions, descriptors, memory), which must not get a checkpoint marked FAILED.
struct VerifyOutcome {
  Status status;
  bool definite = false;
};
VerifyOutcome verify_fd(int root_fd, std::uint64_t step, bool checksums);
// Errors of this process's circumstances (permissions, descriptors, memory, a stale handle), not the checkpoint's.
bool is_circumstantial(int err);
// The FAILED marker's reason; nullopt when there is no marker.
std::optional<std::string> failed_reason(int step_fd);
// The manifest of a step dir, checked against its step; err ENOENT when there is none.
IoResult<Manifest> load_manifest(int step_fd, std::uint64_t step);
// check_records on an opened root (store_resume.cpp).
VerifyOutcome check_records_fd(int root_fd, std::uint64_t step, Manifest* out);
// resolve_resume with checksums off (store_resume.cpp).
ResumeChoice resolve_records(int root_fd, const std::string& root, const ResolveOptions& options);
// The records of the shards written so far in a step dir, sorted by rank.
IoResult<std::vector<ShardRecord>> present_records_fd(int step_fd);

// Fencing (store_control.cpp). Success when `fence` is absent, or when the dir's epoch record does not name a
// newer run than `fence`; otherwise the refusal line of fence_refusal. An unreadable record refuses too: a run
// that cannot tell whether it is stale must not change the dir.
Status check_fence_fd(int root_fd, const std::optional<Fence>& fence);
// check_fence_fd for a run that is committing, which also writes its own epoch when the record is missing or
// names an older epoch of its job (see the comment in store_control.cpp).
Status reassert_epoch_fd(int root_fd, const Fence& fence);

}  // namespace ckpt::store::detail
