// The store's writing side: ShardWriter (one rank's shard, O_DIRECT where the file system takes it) and commit.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "ckpt/store.hpp"
#include "io.hpp"

namespace ckpt::store {

using namespace detail;

namespace {

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


bool valid_utf8_json(const nlohmann::json& value) {
  try {
    (void)value.dump();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Opens the checkpoint dir, creating it first where it is missing (one level, like mkdir without -p).
Result<Fd> open_or_create_root(const std::string& root) {
  auto root_fd = open_root(root);
  if (root_fd) return root_fd;
  if (::mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
    return Error{"cannot create checkpoint dir '" + root + "': " + errno_text(errno)};
  }
  root_fd = open_root(root);
  if (!root_fd) return Error{root_fd.error()};
  return root_fd;
}

}  // namespace

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
  std::optional<Fence> fence;  // the run this shard is written for; checked before each rename
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

  // Refuses an append once the shard is finished, or once a write to it failed.
  Status check_writable() const {
    if (finished) return Status::failure("shard " + record.file + " is already finished");
    if (broken) return Status::failure("shard " + record.file + ": an earlier write failed");
    return Status::success();
  }

  // Refuses a region the record could not name or hold: a bad or repeated name, bad metadata, a size past the
  // shard's offsets.
  Status check_region(const std::string& key, const void* data, std::uint64_t length,
                      const nlohmann::json& meta) const {
    if (key.empty()) return Status::failure("state name is empty");
    if (!valid_utf8_json(nlohmann::json(key))) return Status::failure("state name is not valid UTF-8");
    if (!valid_utf8_json(meta)) return Status::failure("metadata of '" + key + "' is not valid UTF-8");
    if (names.count(key) != 0) return Status::failure("state '" + key + "' appended twice");
    if (length > 0 && data == nullptr) return Status::failure("state '" + key + "': no data");
    if (length > std::numeric_limits<std::uint64_t>::max() - record.size) {
      return Status::failure("state '" + key + "': shard too large");
    }
    if (length > std::numeric_limits<std::size_t>::max()) return Status::failure("state '" + key + "': too large");
    return Status::success();
  }

  // Writes one region's bytes. The observer hears ShardHalfWritten once, when half of the first region is in the
  // file, bounce buffer or not.
  Status write_region(const char* bytes, std::size_t total) {
    std::size_t first = half_reported ? total : total / 2;
    Status s = put(bytes, first);
    if (s && first < total) {
      if (direct) s = flush_blocks();
      if (s) {
        half_reported = true;
        notify(observer, SavePhase::ShardHalfWritten);
        s = put(bytes + first, total - first);
      }
    }
    return s;
  }

  // Creates the step dir where it is missing (and syncs the checkpoint dir, so that the new entry lasts) and opens
  // it. A step already committed or marked FAILED is not written over.
  Status open_step_dir_to_write() {
    const std::string name = step_dir_name(step);
    if (::mkdirat(root.get(), name.c_str(), 0700) == 0) {
      if (Status s = fsync_fd(root.get(), "the checkpoint dir"); !s) return s;
    } else if (errno != EEXIST) {
      return Status::failure("cannot create step dir " + name + ": " + errno_text(errno));
    }
    auto opened = open_step_dir(root.get(), step);
    if (!opened.ok()) return Status::failure(opened.error.message + "; not writing there");
    dir = std::move(*opened.value);
    if (exists_at(dir.get(), std::string(kManifestName))) {
      return Status::failure("step " + std::to_string(step) + " is already committed; not writing over it");
    }
    if (exists_at(dir.get(), std::string(kFailedName))) {
      return Status::failure("step " + std::to_string(step) + " is marked FAILED; not writing over it");
    }
    return Status::success();
  }

  // Creates the temp file under a fresh random name, exclusively and without following a link; a name that is
  // taken already gets another try.
  Status create_temp_file() {
    const std::string dir_name = step_dir_name(step);
    for (int attempt = 0; attempt < 8 && !file.valid(); ++attempt) {
      temp_name = temp_name_for(record.file);
      int fd = ::openat(dir.get(), temp_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd >= 0) {
        file.reset(fd);
      } else if (errno != EEXIST) {
        return Status::failure("cannot create " + record.file + " in " + dir_name + ": " + errno_text(errno));
      }
    }
    if (!file.valid()) return Status::failure("cannot create " + record.file + ": temp names exhausted");
    return Status::success();
  }

  ~Impl() {
    // An abandoned writer leaves no temp file behind; a killed one leaves a hidden one that gc removes.
    if (file.valid() && !finished) ::unlinkat(dir.get(), temp_name.c_str(), 0);
  }
};

Result<ShardWriter> ShardWriter::open(const std::string& root, std::uint64_t step, int rank, PhaseObserver observer,
                                      std::optional<Fence> fence) {
  try {
    if (step > kMaxStep) return Error{"step " + std::to_string(step) + " is larger than " + std::to_string(kMaxStep)};
    if (rank < 0) return Error{"rank " + std::to_string(rank) + " is negative"};
    auto impl = std::make_unique<Impl>();
    impl->step = step;
    impl->observer = std::move(observer);
    impl->fence = std::move(fence);
    impl->record.rank = rank;
    impl->record.file = shard_file_name(rank);

    auto root_fd = open_or_create_root(root);
    if (!root_fd) return Error{root_fd.error()};
    impl->root = std::move(root_fd).value();
    // Early, so that a stale run does not even create a step dir; finish() checks again before publishing.
    if (Status s = check_fence_fd(impl->root.get(), impl->fence); !s) return Error{s.error()};
    if (Status s = impl->open_step_dir_to_write(); !s) return Error{s.error()};
    if (Status s = impl->create_temp_file(); !s) return Error{s.error()};
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
    if (Status s = w.check_writable(); !s) return s;
    std::string key(name);
    if (Status s = w.check_region(key, data, length, meta); !s) return s;
    const char* bytes = static_cast<const char*>(data);
    auto total = static_cast<std::size_t>(length);
    // The shard's running checksum and the range's own (for readers of some ranges only, read_range), hashed in a
    // thread beside the writes for a large region.
    std::uint64_t range_sum = 0;
    Joiner hasher;
    if (w.direct && total >= kParallelHash) {
      try {
        hasher.thread = std::thread([state = w.hash.get(), bytes, total, &range_sum] {
          XXH3_64bits_update(state, bytes, total);
          range_sum = XXH3_64bits(bytes, total);
        });
      } catch (const std::system_error&) {
        // no thread to spare: hashed below, after the writes
      }
    }
    const bool hashing = hasher.thread.joinable();
    Status s = w.write_region(bytes, total);
    hasher.join();
    if (!s) {
      w.broken = true;
      return s;
    }
    if (!hashing) {
      if (total > 0) XXH3_64bits_update(w.hash.get(), bytes, total);
      range_sum = XXH3_64bits(bytes, total);
    }
    w.names.insert(key);
    w.record.states.push_back(StateRange{key, w.record.size, length, std::move(meta), range_sum});
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
    // After the fsync, right before the rename: a fenced run's bytes stay in a hidden temp file, which is removed.
    // (Renaming the shard of a newer run's step over would break that step's checksum, so the check comes before
    // the shard's rename and not only before its record's.)
    if (Status s = check_fence_fd(w.root.get(), w.fence); !s) {
      ::unlinkat(w.dir.get(), w.temp_name.c_str(), 0);
      return Error{s.error() + "; shard not written"};
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
    AtomicWriteOptions record_write;
    record_write.hooks.before_publish = [&] { return check_fence_fd(w.root.get(), w.fence); };
    if (Status s = write_file_atomic(w.dir.get(), rec_name, to_json(w.record), rec_name, record_write); !s) {
      return Error{s.error()};
    }
    w.finished = true;
    w.broken = false;
    notify(w.observer, SavePhase::ShardsDurable);
    return w.record;
  } catch (const std::exception& e) {
    return Error{std::string("finishing the shard failed: ") + e.what()};
  }
}

namespace {

// Writes the manifest of `m` (shards included) atomically into the step dir `fd`, then `latest`.
Status write_manifest_and_latest(int root_fd, int fd, Manifest m, const PhaseObserver& observer,
                                 const std::optional<Fence>& fence, const std::string& at) {
  if (!(m.wall_time > 0) || !std::isfinite(m.wall_time)) m.wall_time = unix_seconds();
  std::string text = to_json(m);
  // Never write a manifest that would not read back (e.g. rank coordinates outside the layout).
  if (auto back = parse_manifest(text); !back) return Status::failure(at + back.error());

  AtomicWriteOptions manifest_write;
  AtomicWriteHooks& hooks = manifest_write.hooks;
  hooks.half_written = [&] { notify(observer, SavePhase::ManifestHalfWritten); };
  hooks.temp_written = [&] { notify(observer, SavePhase::ManifestTempWritten); };
  hooks.published = [&] { notify(observer, SavePhase::ManifestRenamed); };
  // The manifest is durable in its temp file; the last check before it becomes visible. A run that commits
  // also writes its own epoch back when the record names an older one (control.cpp says when).
  hooks.before_publish = [&] { return fence ? reassert_epoch_fd(root_fd, *fence) : Status::success(); };
  if (Status s = write_file_atomic(fd, kManifestName, text, std::string(kManifestName), manifest_write); !s) {
    return Status::failure(at + s.error());
  }
  AtomicWriteOptions latest_write;
  latest_write.hooks.before_publish = [&] { return check_fence_fd(root_fd, fence); };
  if (Status s = write_file_atomic(root_fd, kLatestName, step_dir_name(m.step) + "\n", "latest", latest_write); !s) {
    return Status::failure("step " + std::to_string(m.step) + " is committed, but updating latest failed: " +
                           s.error());
  }
  notify(observer, SavePhase::Committed);
  return Status::success();
}

// The checks both commits make before anything else: the step dir, neither committed nor FAILED, not fenced.
struct CommitTarget {
  Fd root, dir;
};
Result<CommitTarget> open_commit_target(const std::string& root, std::uint64_t step,
                                        const std::optional<Fence>& fence) {
  if (step > kMaxStep) return Error{"step larger than " + std::to_string(kMaxStep)};
  auto root_fd = open_root(root);
  if (!root_fd) return Error{root_fd.error()};
  auto dir = open_step_dir(root_fd->get(), step);
  if (!dir.ok()) return Error{dir.error.message};
  int fd = dir.value->get();
  if (exists_at(fd, std::string(kManifestName))) return Error{"it is already committed"};
  if (exists_at(fd, std::string(kFailedName))) return Error{"it is marked FAILED"};
  if (Status s = check_fence_fd(root_fd->get(), fence); !s) return Error{s.error()};
  return CommitTarget{std::move(root_fd.value()), std::move(*dir.value)};
}

}  // namespace

Status commit(const std::string& root, const Manifest& manifest_without_shards, PhaseObserver observer,
              const std::optional<Fence>& fence, const std::optional<std::vector<int>>& writers) {
  const Manifest& m0 = manifest_without_shards;
  const std::string at = "cannot commit step " + std::to_string(m0.step) + ": ";
  try {
    auto target = open_commit_target(root, m0.step, fence);
    if (!target) return Status::failure(at + target.error());
    int fd = target->dir.get();
    auto entries = list_dir(fd);
    if (!entries.ok()) return Status::failure(at + entries.error.message);
    if (std::string link = first_symlink(*entries.value); !link.empty()) {
      return Status::failure(at + "symlink planted: " + link);
    }
    auto records = present_records_fd(fd);
    if (!records.ok()) return Status::failure(at + records.error.message);
    if (writers) {
      std::vector<ShardRecord>& all = *records.value;
      all.erase(std::remove_if(all.begin(), all.end(),
                               [&](const ShardRecord& r) {
                                 return std::find(writers->begin(), writers->end(), r.rank) == writers->end();
                               }),
                all.end());
    }
    CommitDecision decision = decide_commit(m0.kind, m0.layout, m0.world_size, *records.value);
    if (!decision.complete) return Status::failure(at + "not complete: " + decision.reason);
    Manifest m = m0;
    m.shards = std::move(*records.value);
    return write_manifest_and_latest(target->root.get(), fd, std::move(m), observer, fence, at);
  } catch (const std::exception& e) {
    return Status::failure(at + e.what());
  }
}

Status commit_gathered(const std::string& root, const Manifest& manifest, PhaseObserver observer,
                       const std::optional<Fence>& fence) {
  const std::string at = "cannot commit step " + std::to_string(manifest.step) + ": ";
  try {
    auto target = open_commit_target(root, manifest.step, fence);
    if (!target) return Status::failure(at + target.error());
    Manifest m = manifest;
    std::sort(m.shards.begin(), m.shards.end(), [](const ShardRecord& a, const ShardRecord& b) {
      return a.rank < b.rank;
    });
    CommitDecision decision = decide_commit(m.kind, m.layout, m.world_size, m.shards);
    if (!decision.complete) return Status::failure(at + "not complete: " + decision.reason);
    return write_manifest_and_latest(target->root.get(), target->dir.get(), std::move(m), observer, fence, at);
  } catch (const std::exception& e) {
    return Status::failure(at + e.what());
  }
}

}  // namespace ckpt::store
