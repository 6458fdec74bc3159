// The store's resume side: the cheap check of manifests at job start (check_records, resolve with checksums off)
// and each rank's read of the one shard it restores, checked while it is read (read_shard).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ckpt/store.hpp"
#include "io.hpp"

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

// One rank's read of its shard into memory, each chunk hashed right after it is read. Each phase returns the text
// of a definite failure (the shard is wrong: missing, another size, short), or nothing with `err` left 0 (done) or
// set to an errno for read_shard to retry or report.
class ShardReader {
 public:
  // Reads bytes [begin, end) of the shard into `dest`, or through `sink` in chunks when dest is null.
  ShardReader(int root_fd, std::uint64_t step, const ShardRecord& record, void* dest, const ShardSink* sink,
              const ShardReadOptions& options, XXH3_state_t* state, std::uint64_t begin, std::uint64_t end)
      : root_fd_(root_fd), step_(step), record_(record), dest_(static_cast<char*>(dest)), sink_(sink),
        options_(options), state_(state), begin_(begin), end_(end), done_(begin) {
    if (dest_ == nullptr) chunk_.resize(static_cast<std::size_t>(std::min(end_ - begin_, kReadChunk)));
  }

  // Opens the shard unless it is open, and checks its size against the record.
  std::optional<std::string> open(int& err) {
    if (file_.valid()) return std::nullopt;
    if ((err = inject("open")) != 0) return std::nullopt;
    auto dir = open_step_dir(root_fd_, step_);
    if (!dir.ok() && dir.error.err == 0) return dir.error.message;
    if (!dir.ok() && dir.error.err == ENOENT) return std::string("the step dir is missing");
    if (!dir.ok()) {
      err = dir.error.err;
      return std::nullopt;
    }
    struct stat st {};
    auto opened = open_regular(dir.value->get(), record_.file, &st);
    if (!opened.ok() && (opened.error.err == 0 || opened.error.err == ENOENT)) {
      return opened.error.err == ENOENT ? std::string("missing") : opened.error.message;
    }
    if (!opened.ok()) {
      err = opened.error.err;
      return std::nullopt;
    }
    if (static_cast<std::uint64_t>(st.st_size) != record_.size) {
      return std::to_string(st.st_size) + " bytes, manifest says " + std::to_string(record_.size);
    }
    file_ = std::move(*opened.value);
    ::posix_fadvise(file_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    return std::nullopt;
  }

  // Reads and hashes from where the last read stopped to the end; adds the bytes it read to `bytes`.
  std::optional<std::string> read_rest(int& err, std::uint64_t& bytes) {
    while (done_ < end_) {
      if ((err = inject("read")) != 0) return std::nullopt;
      std::uint64_t want = std::min(end_ - done_, kReadChunk);
      char* to = dest_ != nullptr ? dest_ + (done_ - begin_) : chunk_.data();
      ssize_t n = ::pread(file_.get(), to, static_cast<std::size_t>(want), static_cast<off_t>(done_));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        err = errno;
        return std::nullopt;
      }
      if (n == 0) return "read " + std::to_string(done_) + " bytes, manifest says " + std::to_string(record_.size);
      XXH3_64bits_update(state_, to, static_cast<std::size_t>(n));
      if (sink_ != nullptr && !(*sink_)(done_, to, static_cast<std::size_t>(n))) {
        stopped_ = true;
        return std::string("stopped by its reader");
      }
      done_ += static_cast<std::uint64_t>(n);
      bytes += static_cast<std::uint64_t>(n);
    }
    return std::nullopt;
  }

  // Drops the file; the next open() opens it again and the read goes on at the same offset.
  void close() { file_.reset(); }
  // The sink refused a chunk: the read ended there, the shard is not at fault.
  bool stopped() const { return stopped_; }

 private:
  int inject(std::string_view op) const { return options_.inject ? options_.inject(op) : 0; }

  const int root_fd_;
  const std::uint64_t step_;
  const ShardRecord& record_;
  char* const dest_;
  const ShardSink* const sink_;
  const ShardReadOptions& options_;
  XXH3_state_t* const state_;
  const std::uint64_t begin_, end_;
  std::vector<char> chunk_;  // the sink's bounce buffer
  Fd file_;
  std::uint64_t done_;
  bool stopped_ = false;
};

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

namespace {

// The step dirs worth checking, newest first, leaving out those the caller skips. An entry named like a step dir
// that is not a directory is logged instead.
std::vector<std::uint64_t> candidate_steps(const std::vector<DirEntry>& entries, const ResolveOptions& options,
                                           std::vector<std::string>& log) {
  std::vector<std::uint64_t> steps;
  for (const DirEntry& e : entries) {
    auto step = parse_step_dir_name(e.name);
    if (!step) continue;
    if (!S_ISDIR(e.st.st_mode)) {
      log.push_back("step " + std::to_string(*step) + ": skipped, corrupt: step dir is " +
                    (S_ISLNK(e.st.st_mode) ? "a symlink" : "not a directory"));
      continue;
    }
    if (std::find(options.skip.begin(), options.skip.end(), *step) == options.skip.end()) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// check_records_fd, again after a pause while the failure may be passing: a manifest that cannot be read for a
// moment is read again before an older checkpoint is taken instead.
VerifyOutcome check_records_with_retries(int root_fd, std::uint64_t step, Manifest* manifest) {
  VerifyOutcome outcome = check_records_fd(root_fd, step, manifest);
  auto pause = std::chrono::milliseconds(50);
  for (int retry = 0; retry < 3 && !outcome.status && !outcome.definite; ++retry) {
    if (outcome.status.error().find("no manifest") != std::string::npos ||
        outcome.status.error().find("marked FAILED") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(pause);
    pause *= 2;
    outcome = check_records_fd(root_fd, step, manifest);
  }
  return outcome;
}

// The log line for a step passed over; a definite fault gets the step marked FAILED first when `options` ask.
std::string skip_step(const std::string& root, std::uint64_t step, const VerifyOutcome& outcome,
                      const ResolveOptions& options) {
  const std::string& why = outcome.status.error();
  if (why.find("no manifest") != std::string::npos) {
    return "step " + std::to_string(step) + ": skipped, incomplete: no manifest";
  }
  if (auto at = why.find("marked FAILED: "); at != std::string::npos) {
    return "step " + std::to_string(step) + ": skipped, failed: " + why.substr(at + 15);
  }
  std::string line = why + "; skipped";
  if (options.mark && outcome.definite) {
    Status marked = mark_failed(root, step, why, options.fence);
    line += marked ? ", marked FAILED" : ", not marked: " + marked.error();
  }
  return line;
}

}  // namespace

ResumeChoice resolve_records(int root_fd, const std::string& root, const ResolveOptions& options) {
  ResumeChoice choice;
  auto entries = list_dir(root_fd);
  if (!entries.ok()) {
    choice.log.push_back("cannot read checkpoint dir '" + root + "': " + errno_text(entries.error.err));
    return choice;
  }
  for (std::uint64_t step : candidate_steps(*entries.value, options, choice.log)) {
    if (options.deadline && std::chrono::steady_clock::now() >= *options.deadline) {
      choice.timed_out = true;
      choice.log.push_back("gave up before step " + std::to_string(step) + ": the time allowed has passed");
      return choice;
    }
    Manifest manifest;
    VerifyOutcome outcome = check_records_with_retries(root_fd, step, &manifest);
    if (outcome.status) {
      choice.step = step;
      choice.path = step_path(root, step);
      choice.manifest = std::move(manifest);
      choice.log.push_back("resume from step " + std::to_string(step) + " (" + choice.path + ")");
      return choice;
    }
    choice.log.push_back(skip_step(root, step, outcome, options));
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

namespace {

// Why a read failed, and whether the shard is at fault, before the caller says which shard it was.
struct ReadFailure {
  std::string why;
  bool definite;
};

// Opens and reads to the end through `reader`; after a transient error it opens again after a pause (a stale
// handle needs a new one) and the read goes on where it stopped. Adds the bytes read and the retries to `out`.
std::optional<ReadFailure> read_with_retries(ShardReader& reader, const ShardReadOptions& options, ShardRead& out) {
  auto pause = options.backoff;
  for (;;) {
    int err = 0;
    const char* doing = "cannot open: ";
    if (auto why = reader.open(err)) return ReadFailure{*why, true};
    if (err == 0) {
      doing = "read failed: ";
      if (auto why = reader.read_rest(err, out.bytes)) return ReadFailure{*why, !reader.stopped()};
    }
    if (err == 0) return std::nullopt;
    if (!is_transient(err) || out.retries >= options.retries) {
      std::string why = doing + errno_text(err);
      if (out.retries > 0) why += " (tried " + std::to_string(out.retries + 1) + " times)";
      return ReadFailure{why, !is_circumstantial(err)};
    }
    reader.close();
    ++out.retries;
    std::this_thread::sleep_for(pause);
    pause *= 2;
  }
}

// The failure text for bytes that hash to `sum` where the manifest says `expected`.
std::string checksum_mismatch_text(std::uint64_t expected, std::uint64_t sum) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "checksum mismatch (manifest %016llx, file %016llx)",
                static_cast<unsigned long long>(expected), static_cast<unsigned long long>(sum));
  return buf;
}

// The whole shard, or one of its ranges (checked against the range's own checksum).
ShardRead read_shard_to(const std::string& root, std::uint64_t step, const ShardRecord& record, void* dest,
                        const ShardSink* sink, const ShardReadOptions& options, const StateRange* range = nullptr) {
  ShardRead out;
  const std::string at = "step " + std::to_string(step) + ": " + shard_label(record) +
                         (range != nullptr ? ", range '" + range->name + "'" : std::string()) + ": ";
  auto fail = [&](std::string why, bool definite) {
    out.status = Status::failure(at + why);
    out.definite = definite;
    return out;
  };
  try {
    auto root_fd = open_root(root);
    if (!root_fd) {
      out.status = Status::failure(root_fd.error());
      return out;
    }
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(), XXH3_freeState);
    if (!state) return fail("out of memory", false);
    XXH3_64bits_reset(state.get());
    if (range != nullptr && !range->checksum) return fail("no checksum of its own (an older checkpoint)", false);
    if (range != nullptr && (range->offset > record.size || range->length > record.size - range->offset)) {
      return fail("lies past the end of the shard", true);
    }
    const std::uint64_t begin = range != nullptr ? range->offset : 0;
    const std::uint64_t end = range != nullptr ? range->offset + range->length : record.size;
    const std::uint64_t expected = range != nullptr ? *range->checksum : record.checksum;
    ShardReader reader(root_fd->get(), step, record, dest, sink, options, state.get(), begin, end);
    if (auto failure = read_with_retries(reader, options, out)) return fail(failure->why, failure->definite);
    std::uint64_t sum = XXH3_64bits_digest(state.get());
    if (sum != expected) return fail(checksum_mismatch_text(expected, sum), true);
    out.status = Status::success();
    return out;
  } catch (const std::exception& e) {
    return fail(e.what(), false);
  }
}

}  // namespace

ShardRead read_shard(const std::string& root, std::uint64_t step, const ShardRecord& record, void* dest,
                     const ShardReadOptions& options) {
  return read_shard_to(root, step, record, dest, nullptr, options);
}

ShardRead stream_shard(const std::string& root, std::uint64_t step, const ShardRecord& record, const ShardSink& sink,
                       const ShardReadOptions& options) {
  return read_shard_to(root, step, record, nullptr, &sink, options);
}

ShardRead stream_range(const std::string& root, std::uint64_t step, const ShardRecord& record, const StateRange& range,
                       const ShardSink& sink, const ShardReadOptions& options) {
  return read_shard_to(root, step, record, nullptr, &sink, options, &range);
}

ShardRead read_range(const std::string& root, std::uint64_t step, const ShardRecord& record, const StateRange& range,
                     void* dest, const ShardReadOptions& options) {
  return read_shard_to(root, step, record, dest, nullptr, options, &range);
}

ShardRead read_block(const std::string& root, const Manifest& manifest, const std::vector<BlockRead>& reads,
                     const std::optional<TensorChunk>& want, std::uint64_t element_size, std::byte* into,
                     std::vector<std::byte>& scratch) {
  ShardRead total;
  for (const BlockRead& r : reads) {
    const bool whole = !want || (r.saved.offset == want->offset && r.saved.shape == want->shape);
    if (!whole) scratch.resize(static_cast<std::size_t>(r.range.length));
    ShardRead read = read_range(root, manifest.step, manifest.shards[r.shard], r.range, whole ? into : scratch.data());
    total.bytes += read.bytes;
    total.retries += read.retries;
    if (!read.status) {
      total.status = read.status;
      total.definite = read.definite;
      return total;
    }
    if (!whole) copy_box(r, scratch.data(), *want, into, element_size);
  }
  return total;
}

std::vector<std::optional<std::size_t>> match_live_ranges(const ShardRecord& record,
                                                          const std::vector<LiveRange>& live) {
  std::map<std::string_view, std::vector<std::size_t>> by_name;  // in the order given: the first that matches wins
  for (std::size_t i = 0; i < live.size(); ++i) by_name[live[i].name].push_back(i);
  std::vector<std::optional<std::size_t>> matches(record.states.size());
  for (std::size_t r = 0; r < record.states.size(); ++r) {
    const StateRange& range = record.states[r];
    auto it = by_name.find(range.name);
    if (!range.checksum || it == by_name.end()) continue;
    for (const bool recorded_pass : {true, false}) {
      for (std::size_t i : it->second) {
        const LiveRange& mine = live[i];
        if (mine.recorded.has_value() != recorded_pass || (mine.recorded && *mine.recorded != *range.checksum)) continue;
        if (mine.size != range.length || (mine.size > 0 && mine.data == nullptr)) continue;
        if (XXH3_64bits(mine.data, mine.size) == *range.checksum) {
          matches[r] = i;
          break;
        }
      }
      if (matches[r]) break;
    }
  }
  return matches;
}

}  // namespace ckpt::store
