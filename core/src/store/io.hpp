#pragma once
// Internal to the store: the file-system helpers its parts share (io.cpp; the generic ones are the POSIX
// layer's, ckpt/posix.hpp), and the operations one part needs from another. Not installed, not part of
// ckpt/store.hpp.
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
#include "ckpt/posix.hpp"
#include "ckpt/store.hpp"

// Never exported from a shared object that links the core (libckpt exports the store's API, not this).
#pragma GCC visibility push(hidden)

namespace ckpt::store {
using posix::errno_text;
using posix::join;
}  // namespace ckpt::store

namespace ckpt::store::detail {

inline constexpr std::size_t kMaxManifestFile = 256u << 20;  // matches the parser's bound
inline constexpr std::size_t kMaxControlFile = 1u << 20;
inline constexpr const char* kControlDir = ".control";
inline constexpr std::size_t kMaxRecordFile = 64u << 20;
inline constexpr std::size_t kMaxMarkerFile = 64u << 10;
// Step dirs on their way out: gc's trash (".gc-<step dir>-<random>") and retired ones (".gc-<step dir>").
inline constexpr std::string_view kTrashPrefix = ".gc-";
inline constexpr int kMaxTreeDepth = 8;  // step dirs are flat; deeper trees are not ours to remove

// The POSIX layer's names, unqualified in the store's parts.
using posix::AtomicWriteHooks;
using posix::AtomicWriteOptions;
using posix::Fd;
using posix::fsync_fd;
using posix::IoError;
using posix::IoResult;
using posix::open_regular;
using posix::random_suffix;
using posix::read_small_file;
using posix::temp_name_for;
using posix::write_all;
using posix::write_file_atomic;

double to_seconds(const struct timespec& ts);
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
void notify(const PhaseObserver& observer, SavePhase phase);


using posix::DirEntry;
using posix::list_dir;
// Removes the tree `name` under parent_fd without following symlinks: links are unlinked, never entered; a
// missing one is success.
Status remove_tree(int parent_fd, const std::string& name, int depth = 0);
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
// check_records on an opened root (resume.cpp).
VerifyOutcome check_records_fd(int root_fd, std::uint64_t step, Manifest* out);
// resolve_resume with checksums off (resume.cpp).
ResumeChoice resolve_records(int root_fd, const std::string& root, const ResolveOptions& options);
// The records of the shards written so far in a step dir, sorted by rank.
IoResult<std::vector<ShardRecord>> present_records_fd(int step_fd);

// Fencing (control.cpp). Success when `fence` is absent, or when the dir's epoch record does not name a
// newer run than `fence`; otherwise the refusal line of fence_refusal. An unreadable record refuses too: a run
// that cannot tell whether it is stale must not change the dir.
Status check_fence_fd(int root_fd, const std::optional<Fence>& fence);
// check_fence_fd for a run that is committing, which also writes its own epoch when the record is missing or
// names an older epoch of its job (see the comment in control.cpp).
Status reassert_epoch_fd(int root_fd, const Fence& fence);

}  // namespace ckpt::store::detail

#pragma GCC visibility pop
