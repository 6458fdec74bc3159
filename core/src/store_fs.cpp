// The store's file-system side: scan, verify, mark FAILED, resolve, write shards, commit, gc.
//
// Every path below the checkpoint root is reached relative to an opened directory fd, and every open, stat and
// create inside it uses O_NOFOLLOW / AT_SYMLINK_NOFOLLOW, so a planted symlink is seen, reported, never followed.
// Reads use O_NONBLOCK so that a planted FIFO cannot hang a job at start.
#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "ckpt/store.hpp"
#include "ckpt/trusted_dir.hpp"

namespace ckpt::store {

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string join(const std::string& dir, const std::string& name) {
  return (!dir.empty() && dir.back() == '/') ? dir + name : dir + "/" + name;
}

namespace {

constexpr std::size_t kReadBuffer = 4u << 20;        // streaming checksum buffer
constexpr std::size_t kMaxManifestFile = 256u << 20;  // matches the parser's bound
constexpr std::size_t kMaxControlFile = 1u << 20;
constexpr const char* kControlDir = ".control";
constexpr std::size_t kMaxRecordFile = 64u << 20;
constexpr std::size_t kMaxMarkerFile = 64u << 10;
constexpr int kMaxTreeDepth = 8;  // step dirs are flat; deeper trees are not ours to remove
// O_DIRECT shard writes: offsets, lengths and buffers aligned to 4 KiB satisfy every block size in use (512 B to
// 4 KiB logical blocks); the bounce buffer is large enough that one write keeps the device's queue busy.
constexpr std::size_t kDirectAlign = 4096;
constexpr std::size_t kBounceBuffer = 16u << 20;
// With O_DIRECT the device moves the bytes and the CPU waits: a region this large is hashed on a second thread
// while it is written, so the checksum does not add to the persist time.
constexpr std::size_t kParallelHash = 8u << 20;

// Joins a thread at scope exit, also when an exception or an early return leaves the scope.
struct Joiner {
  std::thread thread;
  Joiner() = default;
  Joiner(const Joiner&) = delete;
  Joiner& operator=(const Joiner&) = delete;
  ~Joiner() { join(); }
  void join() {
    if (thread.joinable()) thread.join();
  }
};


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

double to_seconds(const struct timespec& ts) {
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
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

// Callbacks at the steps of an atomic file write, for fault injection.
struct AtomicWriteHooks {
  std::function<void()> half_written, temp_written, renamed;
};

// Writes `name` in dir_fd atomically: exclusive temp file, fsync, rename over, fsync the dir.
Status write_file_atomic(int dir_fd, std::string_view name, std::string_view content, const std::string& what,
                         const AtomicWriteHooks& hooks = {}) {
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
  std::string final_name(name);
  if (::renameat(dir_fd, temp.c_str(), dir_fd, final_name.c_str()) != 0) {
    return abandon(Status::failure("cannot rename " + what + " into place: " + errno_text(errno)));
  }
  if (hooks.renamed) hooks.renamed();
  return fsync_fd(dir_fd, "the directory of " + what);
}

struct DirEntry {
  std::string name;
  struct stat st {};
};

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

// The FAILED marker's reason; empty when there is no marker.
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

// A verification failure and whether it is about the checkpoint itself (definite) or about this process's
// circumstances (permissions, descriptors, memory), which must not get a checkpoint marked FAILED.
struct VerifyOutcome {
  Status status;
  bool definite = false;
};

bool is_circumstantial(int err) {
  switch (err) {
    case EACCES: case EPERM: case EMFILE: case ENFILE: case ENOMEM: case EAGAIN: case EINTR: case ESTALE:
    case ETIMEDOUT: case ENOENT:
      return true;
    default:
      return false;
  }
}

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

  std::unique_ptr<char[]> buffer;
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(nullptr, XXH3_freeState);
  if (checksums) {
    buffer.reset(new (std::nothrow) char[kReadBuffer]);
    state.reset(XXH3_createState());
    if (!buffer || !state) return bad("out of memory", false);
  }
  for (const ShardRecord& r : m.shards) {
    const std::string label = shard_label(r) + ": ";
    struct stat st {};
    auto file = open_regular(fd, r.file, &st);
    if (!file.ok()) {
      if (file.error.err == ENOENT) return bad(label + "missing", true);
      return bad(label + file.error.message, file.error.err == 0 || !is_circumstantial(file.error.err));
    }
    auto size = static_cast<std::uint64_t>(st.st_size);
    if (size != r.size) {
      return bad(label + std::to_string(size) + " bytes, manifest says " + std::to_string(r.size), true);
    }
    if (!checksums) continue;
    int shard_fd = file.value->get();
    ::posix_fadvise(shard_fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    XXH3_64bits_reset(state.get());
    std::uint64_t total = 0;
    for (;;) {
      ssize_t n = ::read(shard_fd, buffer.get(), kReadBuffer);
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        return bad(label + "read failed: " + errno_text(err), !is_circumstantial(err));
      }
      if (n == 0) break;
      XXH3_64bits_update(state.get(), buffer.get(), static_cast<std::size_t>(n));
      total += static_cast<std::uint64_t>(n);
    }
    if (total != r.size) {
      return bad(label + "read " + std::to_string(total) + " bytes, manifest says " + std::to_string(r.size), true);
    }
    std::uint64_t sum = XXH3_64bits_digest(state.get());
    if (sum != r.checksum) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "checksum mismatch (manifest %016llx, file %016llx)",
                    static_cast<unsigned long long>(r.checksum), static_cast<unsigned long long>(sum));
      return bad(label + buf, true);
    }
  }
  return {Status::success(), false};
}

Status mark_failed_fd(int root_fd, std::uint64_t step, std::string_view reason) {
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
  std::string temp;
  Fd file;
  for (int attempt = 0; attempt < 8 && !file.valid(); ++attempt) {
    temp = temp_name_for(marker);
    int f = ::openat(fd, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (f >= 0) {
      file.reset(f);
    } else if (errno != EEXIST) {
      return Status::failure(at + "cannot create a temp file: " + errno_text(errno));
    }
  }
  if (!file.valid()) return Status::failure(at + "cannot create a temp file");
  Status written = write_all(file.get(), content.data(), content.size(), "the FAILED marker");
  if (written) written = fsync_fd(file.get(), "the FAILED marker");
  file.reset();
  if (!written) {
    ::unlinkat(fd, temp.c_str(), 0);
    return Status::failure(at + written.error());
  }
  // link() fails with EEXIST when another node got there first, so racing markers never replace each other.
  if (::linkat(fd, temp.c_str(), fd, marker.c_str(), 0) == 0 || errno == EEXIST) {
    ::unlinkat(fd, temp.c_str(), 0);
  } else if (errno == EPERM || errno == ENOTSUP || errno == ENOSYS || errno == EMLINK || errno == EXDEV) {
    // No hard links here: rename is still atomic, and any racer's reason is as good as ours.
    if (::renameat(fd, temp.c_str(), fd, marker.c_str()) != 0) {
      int err = errno;
      ::unlinkat(fd, temp.c_str(), 0);
      return Status::failure(at + errno_text(err));
    }
  } else {
    int err = errno;
    ::unlinkat(fd, temp.c_str(), 0);
    return Status::failure(at + errno_text(err));
  }
  if (Status s = fsync_fd(fd, "the step dir"); !s) return Status::failure(at + s.error());
  if (auto done = is_marked()) return *done;
  return Status::failure(at + "the marker vanished");
}

// Removes a tree without following symlinks: links are unlinked, never entered.
Status remove_tree(int parent_fd, const std::string& name, int depth) {
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

constexpr std::string_view kTrashPrefix = ".gc-";

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

bool valid_utf8_json(const nlohmann::json& value) {
  try {
    (void)value.dump();
    return true;
  } catch (const std::exception&) {
    return false;
  }
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

Status verify(const std::string& root, std::uint64_t step, bool checksums) {
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Status::failure(root_fd.error());
    return verify_fd(root_fd->get(), step, checksums).status;
  } catch (const std::exception& e) {
    return Status::failure("step " + std::to_string(step) + ": " + e.what());
  }
}

Status mark_failed(const std::string& root, std::uint64_t step, std::string_view reason) {
  try {
    auto root_fd = open_root(root);
    if (!root_fd) return Status::failure(root_fd.error());
    return mark_failed_fd(root_fd->get(), step, reason);
  } catch (const std::exception& e) {
    return Status::failure("cannot mark step " + std::to_string(step) + " FAILED: " + e.what());
  }
}

ResumeChoice resolve_resume(const std::string& root, bool mark) {
  ResumeChoice choice;
  try {
    auto root_fd = open_root(root);
    if (!root_fd) {
      choice.log.push_back(root_fd.error());
      return choice;
    }
    auto entries = scan(root);
    if (!entries) {
      choice.log.push_back(entries.error());
      return choice;
    }
    // Newest first: everything newer than the choice gets a line saying why it was passed over.
    std::vector<Entry> newest_first(entries->rbegin(), entries->rend());
    for (const Entry& e : newest_first) {
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
        Status marked = mark_failed_fd(root_fd->get(), e.step, outcome.status.error());
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

// ---- writing ----------------------------------------------------------------------------------------------------

struct ShardWriter::Impl {
  Fd root;
  Fd dir;
  Fd file;
  std::uint64_t step = 0;
  std::string temp_name;
  PhaseObserver observer;
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> hash{nullptr, XXH3_freeState};
  // With O_DIRECT, bytes go through an aligned bounce buffer (or straight from an aligned source); `pending`
  // bytes wait in it. The file holds whole blocks until finish() writes the padded tail and truncates.
  bool direct = false;
  std::unique_ptr<char, void (*)(void*)> bounce{nullptr, std::free};
  std::size_t pending = 0;
  ShardRecord record;
  std::set<std::string> names;
  std::set<std::string> covers;
  bool half_reported = false;
  bool finished = false;
  bool broken = false;

  // Switches the temp file to O_DIRECT where the file system takes it (fcntl fails with EINVAL where it does not,
  // e.g. an older tmpfs); buffered writes stay otherwise. Set on the open fd, so the exclusive, no-follow create
  // is unchanged.
  void enable_direct() {
    int flags = ::fcntl(file.get(), F_GETFL);
    if (flags < 0 || ::fcntl(file.get(), F_SETFL, flags | O_DIRECT) != 0) return;
    void* p = nullptr;
    if (::posix_memalign(&p, kDirectAlign, kBounceBuffer) != 0) {
      (void)drop_direct();
      return;
    }
    bounce.reset(static_cast<char*>(p));
    direct = true;
  }

  // Back to buffered writes for the rest of the file.
  bool drop_direct() {
    int flags = ::fcntl(file.get(), F_GETFL);
    if (flags < 0 || ::fcntl(file.get(), F_SETFL, flags & ~O_DIRECT) != 0) return false;
    direct = false;
    return true;
  }

  // Writes whole blocks from an aligned buffer. Where the file system refuses a direct write after all (EINVAL) or
  // a short write leaves the offset unaligned, the rest goes buffered: every byte is written either way.
  Status write_aligned(const char* p, std::size_t n) {
    while (n > 0) {
      if (!direct) return write_all(file.get(), p, n, record.file);
      std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 30);  // a multiple of kDirectAlign
      ssize_t k = ::write(file.get(), p, chunk);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && drop_direct()) continue;
        return Status::failure("cannot write " + record.file + ": " + errno_text(errno));
      }
      p += k;
      n -= static_cast<std::size_t>(k);
      if (n > 0 && static_cast<std::size_t>(k) % kDirectAlign != 0 && !drop_direct()) {
        return Status::failure("cannot write " + record.file + ": short direct write");
      }
    }
    return Status::success();
  }

  // Writes the whole blocks waiting in the bounce buffer and keeps the partial last one (all of it once buffered).
  Status flush_blocks() {
    std::size_t whole = pending - pending % kDirectAlign;
    if (Status s = write_aligned(bounce.get(), whole); !s) return s;
    std::memmove(bounce.get(), bounce.get() + whole, pending - whole);
    pending -= whole;
    if (!direct && pending > 0) {
      if (Status s = write_all(file.get(), bounce.get(), pending, record.file); !s) return s;
      pending = 0;
    }
    return Status::success();
  }

  // Appends bytes to the file: buffered, or with O_DIRECT straight from an aligned source or through the bounce
  // buffer.
  Status put(const char* p, std::size_t n) {
    while (n > 0) {
      if (!direct) return write_all(file.get(), p, n, record.file);
      if (pending == 0 && n >= kDirectAlign && reinterpret_cast<std::uintptr_t>(p) % kDirectAlign == 0) {
        std::size_t whole = n - n % kDirectAlign;
        if (Status s = write_aligned(p, whole); !s) return s;
        p += whole;
        n -= whole;
        continue;
      }
      std::size_t take = std::min(n, kBounceBuffer - pending);
      std::memcpy(bounce.get() + pending, p, take);
      pending += take;
      p += take;
      n -= take;
      if (pending == kBounceBuffer) {
        if (Status s = flush_blocks(); !s) return s;
      }
    }
    return Status::success();
  }

  // Writes the tail waiting in the bounce buffer, its last block padded with zeros, then cuts the file to its
  // true size.
  Status flush_tail() {
    if (pending == 0) return Status::success();
    std::size_t padded = (pending + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    std::memset(bounce.get() + pending, 0, padded - pending);
    if (Status s = write_aligned(bounce.get(), padded); !s) return s;
    pending = 0;
    while (::ftruncate(file.get(), static_cast<off_t>(record.size)) != 0) {
      if (errno == EINTR) continue;
      return Status::failure("cannot truncate " + record.file + ": " + errno_text(errno));
    }
    return Status::success();
  }

  ~Impl() {
    // An abandoned writer leaves no temp file behind; a killed one leaves a hidden one that gc removes.
    if (file.valid() && !finished) ::unlinkat(dir.get(), temp_name.c_str(), 0);
  }
};

Result<ShardWriter> ShardWriter::open(const std::string& root, std::uint64_t step, int rank, PhaseObserver observer) {
  try {
    if (step > kMaxStep) return Error{"step " + std::to_string(step) + " is larger than " + std::to_string(kMaxStep)};
    if (rank < 0) return Error{"rank " + std::to_string(rank) + " is negative"};
    auto impl = std::make_unique<Impl>();
    impl->step = step;
    impl->observer = std::move(observer);
    impl->record.rank = rank;
    impl->record.file = shard_file_name(rank);

    auto root_fd = open_root(root);
    if (!root_fd) {
      // The root itself may be created here (one level, like mkdir without -p).
      if (::mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
        return Error{"cannot create checkpoint dir '" + root + "': " + errno_text(errno)};
      }
      root_fd = open_root(root);
      if (!root_fd) return Error{root_fd.error()};
    }
    impl->root = std::move(root_fd).value();
    const std::string name = step_dir_name(step);
    if (::mkdirat(impl->root.get(), name.c_str(), 0700) == 0) {
      if (Status s = fsync_fd(impl->root.get(), "the checkpoint dir"); !s) return Error{s.error()};
    } else if (errno != EEXIST) {
      return Error{"cannot create step dir " + name + ": " + errno_text(errno)};
    }
    auto dir = open_step_dir(impl->root.get(), step);
    if (!dir.ok()) return Error{dir.error.message + "; not writing there"};
    impl->dir = std::move(*dir.value);
    if (exists_at(impl->dir.get(), std::string(kManifestName))) {
      return Error{"step " + std::to_string(step) + " is already committed; not writing over it"};
    }
    if (exists_at(impl->dir.get(), std::string(kFailedName))) {
      return Error{"step " + std::to_string(step) + " is marked FAILED; not writing over it"};
    }
    for (int attempt = 0; attempt < 8 && !impl->file.valid(); ++attempt) {
      impl->temp_name = temp_name_for(impl->record.file);
      int fd = ::openat(impl->dir.get(), impl->temp_name.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd >= 0) {
        impl->file.reset(fd);
      } else if (errno != EEXIST) {
        return Error{"cannot create " + impl->record.file + " in " + name + ": " + errno_text(errno)};
      }
    }
    if (!impl->file.valid()) return Error{"cannot create " + impl->record.file + ": temp names exhausted"};
    impl->enable_direct();
    impl->hash.reset(XXH3_createState());
    if (!impl->hash) return Error{"out of memory"};
    XXH3_64bits_reset(impl->hash.get());
    notify(impl->observer, SavePhase::ShardOpened);
    ShardWriter writer;
    writer.impl_ = impl.release();
    return writer;
  } catch (const std::exception& e) {
    return Error{std::string("cannot open a shard writer: ") + e.what()};
  }
}

ShardWriter::ShardWriter(ShardWriter&& other) noexcept : impl_(std::exchange(other.impl_, nullptr)) {}

ShardWriter& ShardWriter::operator=(ShardWriter&& other) noexcept {
  if (this != &other) {
    delete impl_;
    impl_ = std::exchange(other.impl_, nullptr);
  }
  return *this;
}

ShardWriter::~ShardWriter() { delete impl_; }

Status ShardWriter::append(std::string_view name, const void* data, std::uint64_t length, nlohmann::json meta) {
  try {
    if (impl_ == nullptr) return Status::failure("shard writer is empty");
    Impl& w = *impl_;
    if (w.finished) return Status::failure("shard " + w.record.file + " is already finished");
    if (w.broken) return Status::failure("shard " + w.record.file + ": an earlier write failed");
    std::string key(name);
    if (key.empty()) return Status::failure("state name is empty");
    if (!valid_utf8_json(nlohmann::json(key))) return Status::failure("state name is not valid UTF-8");
    if (!valid_utf8_json(meta)) return Status::failure("metadata of '" + key + "' is not valid UTF-8");
    if (w.names.count(key) != 0) return Status::failure("state '" + key + "' appended twice");
    if (length > 0 && data == nullptr) return Status::failure("state '" + key + "': no data");
    if (length > std::numeric_limits<std::uint64_t>::max() - w.record.size) {
      return Status::failure("state '" + key + "': shard too large");
    }
    if (length > std::numeric_limits<std::size_t>::max()) return Status::failure("state '" + key + "': too large");
    const char* bytes = static_cast<const char*>(data);
    auto total = static_cast<std::size_t>(length);
    std::size_t first = w.half_reported ? total : total / 2;
    Joiner hasher;
    if (w.direct && total >= kParallelHash) {
      try {
        hasher.thread = std::thread([state = w.hash.get(), bytes, total] { XXH3_64bits_update(state, bytes, total); });
      } catch (const std::system_error&) {
        // no thread to spare: hashed below, after the writes
      }
    }
    const bool hashing = hasher.thread.joinable();
    Status s = w.put(bytes, first);
    if (s && first < total) {
      // Half of the first region reaches the file before the observer hears of it, bounce buffer or not.
      if (w.direct) s = w.flush_blocks();
      if (s) {
        w.half_reported = true;
        notify(w.observer, SavePhase::ShardHalfWritten);
        s = w.put(bytes + first, total - first);
      }
    }
    hasher.join();
    if (!s) {
      w.broken = true;
      return s;
    }
    if (total > 0 && !hashing) XXH3_64bits_update(w.hash.get(), bytes, total);
    w.names.insert(key);
    w.record.states.push_back(StateRange{key, w.record.size, length, std::move(meta)});
    w.record.size += length;
    return Status::success();
  } catch (const std::exception& e) {
    if (impl_ != nullptr) impl_->broken = true;
    return Status::failure(std::string("append failed: ") + e.what());
  }
}

bool ShardWriter::direct() const { return impl_ != nullptr && impl_->direct; }

void ShardWriter::add_covers(const std::vector<std::string>& keys) {
  if (impl_ == nullptr) return;
  for (const std::string& key : keys) {
    if (impl_->covers.insert(key).second) impl_->record.covers.push_back(key);
  }
}

Result<ShardRecord> ShardWriter::finish() {
  try {
    if (impl_ == nullptr) return Error{"shard writer is empty"};
    Impl& w = *impl_;
    if (w.finished) return Error{"shard " + w.record.file + " is already finished"};
    if (w.broken) return Error{"shard " + w.record.file + ": an earlier write failed"};
    w.broken = true;  // until this function succeeds
    if (Status s = w.flush_tail(); !s) return Error{s.error()};
    if (Status s = fsync_fd(w.file.get(), w.record.file); !s) return Error{s.error()};
    w.file.reset();
    if (exists_at(w.dir.get(), std::string(kManifestName))) {
      ::unlinkat(w.dir.get(), w.temp_name.c_str(), 0);
      return Error{"step " + std::to_string(w.step) + " was committed meanwhile; shard not written"};
    }
    if (::renameat(w.dir.get(), w.temp_name.c_str(), w.dir.get(), w.record.file.c_str()) != 0) {
      int err = errno;
      ::unlinkat(w.dir.get(), w.temp_name.c_str(), 0);
      return Error{"cannot rename " + w.record.file + " into place: " + errno_text(err)};
    }
    // The shard's name must be durable before its record can claim it.
    if (Status s = fsync_fd(w.dir.get(), "the step dir"); !s) return Error{s.error()};
    w.record.checksum = XXH3_64bits_digest(w.hash.get());
    const std::string rec_name = record_file_name(w.record.rank);
    if (Status s = write_file_atomic(w.dir.get(), rec_name, to_json(w.record), rec_name); !s) return Error{s.error()};
    w.finished = true;
    w.broken = false;
    notify(w.observer, SavePhase::ShardsDurable);
    return w.record;
  } catch (const std::exception& e) {
    return Error{std::string("finishing the shard failed: ") + e.what()};
  }
}

Status commit(const std::string& root, const Manifest& manifest_without_shards, PhaseObserver observer) {
  const Manifest& m0 = manifest_without_shards;
  const std::string at = "cannot commit step " + std::to_string(m0.step) + ": ";
  try {
    if (m0.step > kMaxStep) return Status::failure(at + "step larger than " + std::to_string(kMaxStep));
    auto root_fd = open_root(root);
    if (!root_fd) return Status::failure(at + root_fd.error());
    auto dir = open_step_dir(root_fd->get(), m0.step);
    if (!dir.ok()) return Status::failure(at + dir.error.message);
    int fd = dir.value->get();
    if (exists_at(fd, std::string(kManifestName))) return Status::failure(at + "it is already committed");
    if (exists_at(fd, std::string(kFailedName))) return Status::failure(at + "it is marked FAILED");
    auto entries = list_dir(fd);
    if (!entries.ok()) return Status::failure(at + entries.error.message);
    if (std::string link = first_symlink(*entries.value); !link.empty()) {
      return Status::failure(at + "symlink planted: " + link);
    }
    auto records = present_records_fd(fd);
    if (!records.ok()) return Status::failure(at + records.error.message);
    CommitDecision decision = decide_commit(m0.kind, m0.layout, m0.world_size, *records.value);
    if (!decision.complete) return Status::failure(at + "not complete: " + decision.reason);

    Manifest m = m0;
    m.shards = std::move(*records.value);
    if (!(m.wall_time > 0) || !std::isfinite(m.wall_time)) m.wall_time = now_seconds();
    std::string text = to_json(m);
    // Never write a manifest that would not read back (e.g. rank coordinates outside the layout).
    if (auto back = parse_manifest(text); !back) return Status::failure(at + back.error());

    AtomicWriteHooks hooks;
    hooks.half_written = [&] { notify(observer, SavePhase::ManifestHalfWritten); };
    hooks.temp_written = [&] { notify(observer, SavePhase::ManifestTempWritten); };
    hooks.renamed = [&] { notify(observer, SavePhase::ManifestRenamed); };
    if (Status s = write_file_atomic(fd, kManifestName, text, std::string(kManifestName), hooks); !s) {
      return Status::failure(at + s.error());
    }
    if (Status s = write_file_atomic(root_fd->get(), kLatestName, step_dir_name(m.step) + "\n", "latest"); !s) {
      return Status::failure("step " + std::to_string(m.step) + " is committed, but updating latest failed: " +
                             s.error());
    }
    notify(observer, SavePhase::Committed);
    return Status::success();
  } catch (const std::exception& e) {
    return Status::failure(at + e.what());
  }
}

// ---- deleting ---------------------------------------------------------------------------------------------------

Status discard_incomplete(const std::string& root, std::uint64_t step) {
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
    if (Status s = remove_step_dir(root_fd->get(), step); !s) return Status::failure(at + s.error());
    return Status::success();
  } catch (const std::exception& e) {
    return Status::failure(at + e.what());
  }
}

Result<std::vector<std::uint64_t>> gc(const std::string& root, std::uint64_t keep, bool dry_run) {
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
    // Leftovers of an earlier gc that was killed mid-removal.
    if (auto names = list_dir(root_fd->get()); names.ok()) {
      for (const DirEntry& e : *names.value) {
        if (e.name.rfind(kTrashPrefix, 0) == 0 && S_ISDIR(e.st.st_mode)) (void)remove_tree(root_fd->get(), e.name, 0);
      }
    }
    std::vector<std::uint64_t> deleted;
    for (std::uint64_t step : plan) {
      if (Status s = remove_step_dir(root_fd->get(), step); !s) {
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

Status write_control_file(const std::string& root, std::string_view name, std::string_view content) {
  try {
    if (!is_safe_name(name)) return Status::failure("not a safe control file name: '" + std::string(name) + "'");
    auto root_fd = open_root(root);
    if (!root_fd) return Status::failure(root_fd.error());
    if (::mkdirat(root_fd->get(), kControlDir, 0700) != 0 && errno != EEXIST) {
      return Status::failure("cannot create " + join(root, kControlDir) + ": " + errno_text(errno));
    }
    int fd = ::openat(root_fd->get(), kControlDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return Status::failure("cannot open " + join(root, kControlDir) + ": " + errno_text(errno));
    Fd control(fd);
    return write_file_atomic(control.get(), name, content, join(kControlDir, std::string(name)));
  } catch (const std::exception& e) {
    return Status::failure(std::string("cannot write a control file: ") + e.what());
  }
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

}  // namespace ckpt::store
