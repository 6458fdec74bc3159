#include "node_tier.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>

#include "ckpt/memtier.hpp"
#include "log.hpp"

namespace ckpt::hooks {

namespace {

constexpr std::size_t kMaxIndexBytes = 64u << 20;  // a piece per tensor: hundreds of thousands fit
// The pieces of a snapshot outside staging (the optimizer's and the program's pickles) go into the index, as hex,
// up to this much; a snapshot with more is not resumed from (its buffers still serve restore's ranges).
constexpr std::size_t kMaxInlineBytes = 4u << 20;

std::string to_hex(const std::byte* data, std::size_t size) {
  static const char digits[] = "0123456789abcdef";
  std::string out(2 * size, '0');
  for (std::size_t i = 0; i < size; ++i) {
    const auto b = static_cast<unsigned char>(data[i]);
    out[2 * i] = digits[b >> 4];
    out[2 * i + 1] = digits[b & 15];
  }
  return out;
}

std::optional<std::vector<std::byte>> from_hex(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (text.size() % 2 != 0) return std::nullopt;
  std::vector<std::byte> out(text.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = value(text[2 * i]), lo = value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return out;
}

bool is_u64(const nlohmann::json& j, const char* key) { return j.contains(key) && j[key].is_number_unsigned(); }

bool safe_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.';
}

// The files an index names that are its rank's (named by `prefix`, never the index itself) and lie in the job's
// dir (a safe name: no '/', no "..").
std::vector<std::string> files_named(const nlohmann::json& index, const std::string& prefix) {
  std::vector<std::string> files;
  if (!index.is_object() || !index.contains("buffers") || !index["buffers"].is_array()) return files;
  for (const auto& b : index["buffers"]) {
    if (!b.is_object() || !b.contains("file") || !b["file"].is_string()) continue;
    const std::string file = b["file"].get<std::string>();
    if (file.size() > prefix.size() && file.rfind(prefix, 0) == 0 && file != prefix + "json" &&
        std::all_of(file.begin(), file.end(), safe_name_char)) {
      files.push_back(file);
    }
  }
  return files;
}

// A piece of an index entry whose buffer is mapped at `map`: where it lies there, and its checksum where one is
// recorded (`checked`). Null where the entry is malformed or names bytes outside the buffer.
std::optional<NodeTier::SnapshotPiece> piece_in(const nlohmann::json& p, const HostBuffer& map, bool& checked) {
  checked = false;
  if (!p.is_object() || !p.contains("name") || !p["name"].is_string() || !is_u64(p, "offset") || !is_u64(p, "size")) {
    return std::nullopt;
  }
  const auto offset = p["offset"].get<std::uint64_t>();
  const auto size = p["size"].get<std::uint64_t>();
  if (offset > map.size() || size > map.size() - offset) return std::nullopt;  // the checksums would refuse it anyway
  NodeTier::SnapshotPiece piece{p["name"].get<std::string>(), p.contains("meta") ? p["meta"] : nlohmann::json(),
                                map.data() + offset, static_cast<std::size_t>(size), 0};
  if (is_u64(p, "checksum")) {
    piece.checksum = p["checksum"].get<std::uint64_t>();
    checked = true;
  }
  return piece;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return {};
  return buf;
}

}  // namespace

std::string NodeTier::dir_name(uid_t uid, const std::string& job) { return memtier::node_dir_name(uid, job); }

namespace {
std::mutex g_kept_mu;
std::vector<std::unique_ptr<NodeTier>> g_kept;  // keep_until_next_open's tiers
}  // namespace

void NodeTier::keep_until_next_open(std::unique_ptr<NodeTier> tier) {
  std::lock_guard<std::mutex> lock(g_kept_mu);
  g_kept.push_back(std::move(tier));
}

Result<std::unique_ptr<NodeTier>> NodeTier::open(const std::string& node_dir, const Identity& identity) {
  std::vector<std::unique_ptr<NodeTier>> kept;
  {
    std::lock_guard<std::mutex> lock(g_kept_mu);
    kept.swap(g_kept);
  }
  for (auto& earlier : kept) earlier->remove_all();  // before the index of this rank is read: they are not offered
  if (identity.job.empty() || !std::all_of(identity.job.begin(), identity.job.end(), safe_name_char) ||
      identity.job.front() == '.') {
    return Error{"the job id '" + identity.job + "' cannot name a dir"};
  }
  std::unique_ptr<NodeTier> tier(new NodeTier());
  tier->identity_ = identity;
  if (tier->identity_.host.empty()) tier->identity_.host = host_name();
  tier->path_ = posix::join(node_dir, dir_name(::geteuid(), identity.job));
  auto dir = posix::open_private_dir(tier->path_);
  if (!dir) return Error{dir.error()};
  tier->dir_ = std::move(dir).value();
  tier->token_ = posix::random_suffix();
  tier->adopt_earlier();
  tier->remove_left_behind();
  return tier;
}

NodeTier::~NodeTier() = default;

// Named by the checkpoint dir and the rank: two steps of one allocation that train into different dirs never meet.
std::string NodeTier::file_prefix(const std::string& checkpoint_dir, int rank) {
  char dir_hash[17];
  std::snprintf(dir_hash, sizeof dir_hash, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(checkpoint_dir.data(), checkpoint_dir.size())));
  return std::string(dir_hash) + ".rank-" + std::to_string(rank) + ".";
}

std::string NodeTier::index_name() const { return file_prefix(identity_.checkpoint_dir, identity_.rank) + "json"; }

void NodeTier::adopt_earlier() {
  const std::string index = index_name();
  auto text = posix::read_small_file(dir_.get(), index, kMaxIndexBytes);
  if (!text.ok()) {
    if (text.error.err != ENOENT) log::warn(identity_.rank, "node tier: " + path_ + "/" + index + ": " + text.error.message);
    return;
  }
  const std::string prefix = file_prefix(identity_.checkpoint_dir, identity_.rank);
  nlohmann::json j = nlohmann::json::parse(*text.value, nullptr, false);
  const std::vector<std::string> files = files_named(j, prefix);
  if (!of_this_run(j) || !j.contains("rank") || j["rank"] != identity_.rank) {
    // Never used, whatever its bytes: it is another run's (an earlier run of a requeued job, a job id reused, a dir
    // copied, another checkpoint dir).
    auto field = [&](const char* key) {
      return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string("?");
    };
    const std::uint64_t restart = j.is_object() && j.contains("restart") && j["restart"].is_number_unsigned()
                                      ? j["restart"].get<std::uint64_t>()
                                      : ~std::uint64_t{0};
    auto run = [](const std::string& job, std::uint64_t n) {
      return "job " + job + (n == 0 ? std::string() : " (requeued " + std::to_string(n) + " times)");
    };
    log::warn(identity_.rank, "node tier: " + path_ + "/" + index + " was left by " + run(field("job"), restart) +
                                  " on " + field("host") + " for " + field("dir") + ", not this run's (" +
                                  run(identity_.job, identity_.restart) + " on " + identity_.host + " for " +
                                  identity_.checkpoint_dir + "): not used, removed");
    for (const std::string& f : files) (void)::unlinkat(dir_.get(), f.c_str(), 0);
    (void)::unlinkat(dir_.get(), index.c_str(), 0);
    return;
  }
  const std::string steps = take_buffers(j, files, true);
  std::sort(snapshots_.begin(), snapshots_.end(),
            [](const Snapshot& a, const Snapshot& b) { return a.step > b.step; });
  std::sort(ward_copies_.begin(), ward_copies_.end(),
            [](const WardCopy& a, const WardCopy& b) { return a.snapshot.step > b.snapshot.step; });
  if (!steps.empty()) {
    log::info(identity_.rank, "node tier: an earlier process of this job left the snapshots of step(s) " + steps +
                                  " in " + path_ + "; restore takes the ranges that match the checkpoint from them");
  }
  std::string copies;
  for (const WardCopy& c : ward_copies_) {
    copies += (copies.empty() ? "" : ", ") + std::string("rank ") + std::to_string(c.ward) + "'s step " +
              std::to_string(c.snapshot.step);
  }
  if (!copies.empty()) {
    log::info(identity_.rank, "node tier: an earlier process of this job left its partner copies of " + copies +
                                  " here; a relaunched ward that finds nothing on its own node fetches its copy");
  }
}

// Whether an index names this run: this job and restart count (a requeued job's next run is another run), this host
// and this checkpoint dir.
bool NodeTier::of_this_run(const nlohmann::json& index) const {
  auto is = [&](const char* key, const std::string& want) {
    return index.contains(key) && index[key].is_string() && index[key].get<std::string>() == want;
  };
  return index.is_object() && is("job", identity_.job) && index.contains("restart") &&
         index["restart"].is_number_unsigned() && index["restart"].get<std::uint64_t>() == identity_.restart &&
         is("host", identity_.host) && is("dir", identity_.checkpoint_dir);
}

// Every buffer of an earlier process's `index` that names one of `files`, mapped and taken (take_entry; `own`: this
// rank's, also kept listed in this rank's index). Returns the steps of the snapshots whole in them, for the log.
std::string NodeTier::take_buffers(const nlohmann::json& index, const std::vector<std::string>& files, bool own) {
  std::string steps;
  if (!index.contains("buffers") || !index["buffers"].is_array()) return steps;
  for (const auto& b : index["buffers"]) {
    if (std::optional<HostBuffer> map = map_entry(b, files)) {
      if (!b.contains("ward")) {
        take_entry(b, *map, own);
        steps += (steps.empty() ? "" : ", ") + std::to_string(b["step"].get<std::uint64_t>());
      } else if (own) {
        take_ward_copy(b, *map);  // another rank's bytes: served to that rank, never restored here
      }
      if (own) found_entries_.push_back(b);
      found_maps_.push_back(std::move(*map));
    }
  }
  return steps;
}

// An earlier process's index entry, when it names one of `files` (those are removed at release_found()): its
// buffer mapped read-only, where a snapshot is whole in it.
std::optional<HostBuffer> NodeTier::map_entry(const nlohmann::json& entry, const std::vector<std::string>& files) {
  if (!entry.is_object() || !entry.contains("file") || !entry["file"].is_string()) return std::nullopt;
  const std::string file = entry["file"].get<std::string>();
  if (std::find(files.begin(), files.end(), file) == files.end()) return std::nullopt;
  found_files_.push_back(file);
  if (!entry.contains("step") || !entry["step"].is_number_unsigned() || !entry.contains("pieces") ||
      !entry["pieces"].is_array()) {
    return std::nullopt;  // a snapshot was being written into it
  }
  struct stat st {};
  auto fd = posix::open_regular(dir_.get(), file, &st);
  if (!fd.ok() || st.st_uid != ::geteuid() || st.st_size <= 0) return std::nullopt;
  auto map = HostBuffer::map_file(fd.value->get(), static_cast<std::size_t>(st.st_size), false);
  if (!map) {
    log::warn(identity_.rank, "node tier: " + path_ + "/" + file + ": " + map.error());
    return std::nullopt;
  }
  return std::move(map).value();
}

// An earlier process's index entry whose buffer is mapped at `map`: its pieces are offered to restore as ranges, and,
// where they are this rank's own (`own`), as a snapshot to resume from where every piece has its checksum and the
// pieces outside staging are inline.
void NodeTier::take_entry(const nlohmann::json& entry, const HostBuffer& map, bool own) {
  Snapshot snapshot;
  snapshot.step = entry["step"].get<std::uint64_t>();
  if (entry.contains("launch") && entry["launch"].is_string()) snapshot.launch = entry["launch"].get<std::string>();
  if (entry.contains("world") && entry["world"].is_number_integer()) snapshot.world_size = entry["world"].get<int>();
  bool resumable = own && !snapshot.launch.empty() && entry.contains("complete") && entry["complete"] == true;
  for (const auto& p : entry["pieces"]) {
    bool checked = false;
    std::optional<SnapshotPiece> piece = piece_in(p, map, checked);
    if (!piece) {
      resumable = false;
      continue;
    }
    store::LiveRange range{piece->name, piece->data, piece->size, {}};
    if (checked) {
      range.recorded = piece->checksum;
    } else {
      resumable = false;
    }
    found_.push_back(std::move(range));
    if (resumable) snapshot.pieces.push_back(std::move(*piece));
  }
  if (resumable && entry.contains("inline") && entry["inline"].is_array()) {
    for (const auto& p : entry["inline"]) {
      auto bytes = p.is_object() && p.contains("hex") && p["hex"].is_string() ? from_hex(p["hex"].get<std::string>())
                                                                            : std::nullopt;
      if (!bytes || !p.contains("name") || !p["name"].is_string() || !is_u64(p, "checksum")) {
        resumable = false;
        break;
      }
      found_blobs_.push_back(std::move(*bytes));
      const std::vector<std::byte>& held = found_blobs_.back();  // its bytes stay put as the outer vector grows
      found_.push_back({p["name"].get<std::string>(), held.data(), held.size(), p["checksum"].get<std::uint64_t>()});
      snapshot.pieces.push_back({p["name"].get<std::string>(), p.contains("meta") ? p["meta"] : nlohmann::json(),
                                 held.data(), held.size(), p["checksum"].get<std::uint64_t>()});
    }
  }
  if (resumable) {
    // One snapshot may lie in several buffers: the entries of one step and launch are one.
    auto same = std::find_if(snapshots_.begin(), snapshots_.end(), [&](const Snapshot& s) {
      return s.step == snapshot.step && s.launch == snapshot.launch;
    });
    if (same == snapshots_.end()) {
      snapshots_.push_back(std::move(snapshot));
    } else {
      for (SnapshotPiece& p : snapshot.pieces) same->pieces.push_back(std::move(p));
    }
  }
}

// An earlier process's copy of a ward's snapshot, mapped at `map`: kept to serve (with_ward_copy) where it names its
// launch and world size and every piece lies in the buffer with its checksum.
void NodeTier::take_ward_copy(const nlohmann::json& entry, const HostBuffer& map) {
  if (!entry["ward"].is_number_integer() || !entry.contains("launch") || !entry["launch"].is_string() ||
      !entry.contains("world") || !entry["world"].is_number_integer()) {
    return;
  }
  WardCopy copy;
  copy.ward = entry["ward"].get<int>();
  copy.snapshot.step = entry["step"].get<std::uint64_t>();
  copy.snapshot.launch = entry["launch"].get<std::string>();
  copy.snapshot.world_size = entry["world"].get<int>();
  for (const auto& p : entry["pieces"]) {
    bool checked = false;
    std::optional<SnapshotPiece> piece = piece_in(p, map, checked);
    if (!piece || !checked) return;
    copy.snapshot.pieces.push_back(std::move(*piece));
  }
  ward_copies_.push_back(std::move(copy));
}

void NodeTier::remove_left_behind() {
  if (identity_.node_ranks.empty()) return;
  auto entries = posix::list_dir(dir_.get());
  if (!entries.ok()) return;
  const std::string mine = file_prefix(identity_.checkpoint_dir, 0);
  const std::string head = mine.substr(0, mine.size() - 2);  // "<d>.rank-"
  for (const posix::DirEntry& e : *entries.value) {
    const std::string& name = e.name;
    if (!S_ISREG(e.st.st_mode) || name.size() <= head.size() + 5 || name.rfind(head, 0) != 0 ||
        name.compare(name.size() - 5, 5, ".json") != 0) {
      continue;
    }
    const std::string digits = name.substr(head.size(), name.size() - 5 - head.size());
    if (digits.empty() || digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    const int other = std::stoi(digits);
    if (other == identity_.rank || std::find(identity_.node_ranks.begin(), identity_.node_ranks.end(), other) !=
                                       identity_.node_ranks.end()) {
      continue;  // a rank of this launch on this node: its own files, to adopt
    }
    auto text = posix::read_small_file(dir_.get(), name, kMaxIndexBytes);
    if (!text.ok()) continue;
    nlohmann::json j = nlohmann::json::parse(*text.value, nullptr, false);
    if (!j.is_object() || !j.contains("host") || j["host"] != identity_.host || !j.contains("pid") ||
        !j["pid"].is_number_integer()) {
      continue;
    }
    const auto pid = j["pid"].get<long long>();
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // its writer may live
    const std::vector<std::string> files = files_named(j, file_prefix(identity_.checkpoint_dir, other));
    if (offer_departed(j, other, files)) {
      found_files_.push_back(name);
      continue;
    }
    for (const std::string& file : files) (void)::unlinkat(dir_.get(), file.c_str(), 0);
    (void)::unlinkat(dir_.get(), name.c_str(), 0);
    log::info(identity_.rank, "node tier: removed the staging files rank " + std::to_string(other) +
                                  " left on this node, where it no longer runs");
  }
}

// The index of rank `other`, which no longer runs on this node (a relaunch moved it), when it is this run's: its
// snapshots' ranges are offered to restore beside this rank's own, since ranges that data-parallel ranks hold alike
// (the model's weights, a replicated optimizer's state) are the same bytes, and restore takes a range only where its
// bytes hash to this rank's recorded checksum. Never a snapshot to resume from: its other ranges are another rank's.
// Its files go at release_found(). False when it is another run's (the caller removes it).
bool NodeTier::offer_departed(const nlohmann::json& index, int other, const std::vector<std::string>& files) {
  if (!of_this_run(index)) return false;
  const std::string steps = take_buffers(index, files, false);
  log::info(identity_.rank, "node tier: rank " + std::to_string(other) + ", which no longer runs on this node, left" +
                                (steps.empty() ? std::string(" no whole snapshot") : " the snapshots of step(s) " + steps) +
                                " here; restore takes the ranges it holds alike from them");
  return true;
}

Result<HostBuffer> NodeTier::allocate(std::size_t bytes) {
  const std::string prefix = file_prefix(identity_.checkpoint_dir, identity_.rank);
  std::optional<HostBuffer> kept = BufferReserve::process().take_file(bytes, path_ + "/" + prefix);
  std::lock_guard<std::mutex> lock(mu_);
  const std::string file = prefix + token_ + "." + std::to_string(next_file_++);
  if (kept) {
    // The last generation's file, its pages in memory and mapped already: renamed as this tier's.
    const std::string old_name = kept->file().substr(path_.size() + 1);
    if (::renameat(dir_.get(), old_name.c_str(), dir_.get(), file.c_str()) == 0) {
      kept->set_file("");
      buffers_.push_back({file, kept->data(), kept->size(), false, 0, {}, {}, {}, {}, -1, false});
      write_index();
      return std::move(*kept);
    }
    (void)::unlinkat(dir_.get(), old_name.c_str(), 0);
    kept.reset();
  }
  posix::Fd fd(::openat(dir_.get(), file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return Error{"cannot create " + path_ + "/" + file + ": " + posix::errno_text(errno)};
  auto buffer = HostBuffer::map_file(fd.get(), bytes, true);
  if (!buffer) {
    (void)::unlinkat(dir_.get(), file.c_str(), 0);
    return Error{path_ + "/" + file + ": " + buffer.error()};
  }
  buffers_.push_back({file, buffer->data(), buffer->size(), false, 0, {}, {}, {}, {}, -1, false});
  write_index();
  return buffer;
}

void NodeTier::hand_over(HostBuffer& buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(buffers_.begin(), buffers_.end(), [&](const Buffer& b) { return b.data == buffer.data(); });
  if (it == buffers_.end() || buffer.data() == nullptr) return;
  it->handed_over = true;
  buffer.set_file(path_ + "/" + it->file);
}

void NodeTier::drop(const std::byte* data) {
  if (data == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(buffers_.begin(), buffers_.end(), [&](const Buffer& b) { return b.data == data; });
  if (it == buffers_.end()) return;
  (void)::unlinkat(dir_.get(), it->file.c_str(), 0);
  buffers_.erase(it);
  write_index();
}

void NodeTier::overwriting(const std::byte* data) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(buffers_.begin(), buffers_.end(), [&](const Buffer& b) { return b.data == data; });
  if (it == buffers_.end() || !it->whole) return;
  it->whole = false;
  it->ward = -1;
  it->pieces.clear();
  write_index();
}

void NodeTier::held_copy(const std::byte* data, int ward, std::uint64_t step,
                         const std::vector<store::StateRange>& ranges) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(buffers_.begin(), buffers_.end(), [&](const Buffer& b) { return b.data == data; });
  if (it == buffers_.end()) return;
  it->whole = false;
  it->pieces.clear();
  it->sums.clear();
  it->metas.clear();
  for (const store::StateRange& r : ranges) {
    if (!r.checksum || r.offset > it->size || r.length > it->size - r.offset) {
      it->pieces.clear();  // not listed: never served
      write_index();
      return;
    }
    it->pieces.push_back({r.name, data + r.offset, static_cast<std::size_t>(r.length), {}});
    it->sums.push_back(*r.checksum);
    it->metas.push_back(r.meta);
  }
  it->whole = true;
  it->step = step;
  it->ward = ward;
  it->blobs = nlohmann::json::array();  // a copy holds every piece of the ward's snapshot
  write_index();
}

bool NodeTier::with_ward_copy(int ward, int world_size, std::optional<std::uint64_t> step, const std::string& launch,
                              const std::function<void(const Snapshot&)>& use) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const WardCopy& c : ward_copies_) {  // newest first
    if (c.ward != ward || c.snapshot.world_size != world_size) continue;
    if (step && *step != c.snapshot.step) continue;
    if (!launch.empty() && launch != c.snapshot.launch) continue;
    use(c.snapshot);
    return true;
  }
  return false;
}

void NodeTier::adopt_fetched(Snapshot snapshot, HostBuffer bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  found_maps_.push_back(std::move(bytes));  // a mapping: the pieces' addresses stay put
  auto later = std::find_if(snapshots_.begin(), snapshots_.end(),
                            [&](const Snapshot& s) { return s.step < snapshot.step; });
  snapshots_.insert(later, std::move(snapshot));
}

void NodeTier::whole(std::uint64_t step, const std::vector<Piece>& pieces, const std::vector<std::uint64_t>& sums) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<bool> placed(pieces.size(), false);
  Buffer* first = nullptr;
  for (Buffer& b : buffers_) {
    std::vector<store::LiveRange> in;
    std::vector<std::uint64_t> in_sums;
    std::vector<nlohmann::json> in_metas;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      if (p.size > 0 && p.data >= b.data && p.data + p.size <= b.data + b.size) {
        in.push_back({p.name, p.data, p.size, {}});
        in_sums.push_back(i < sums.size() ? sums[i] : 0);
        in_metas.push_back(p.meta);
        placed[i] = true;
      }
    }
    if (in.empty()) continue;
    b.whole = true;
    b.step = step;
    b.pieces = std::move(in);
    b.sums = std::move(in_sums);
    b.metas = std::move(in_metas);
    b.blobs = nlohmann::json::array();
    if (first == nullptr) first = &b;
  }
  if (first == nullptr) return;
  // The rest (blobs; pieces of pinned staging) goes inline with the first buffer, when it is small.
  nlohmann::json blobs = nlohmann::json::array();
  std::size_t inline_bytes = 0;
  for (std::size_t i = 0; i < pieces.size() && sums.size() == pieces.size(); ++i) {
    if (placed[i]) continue;
    inline_bytes += pieces[i].size;
    if (inline_bytes > kMaxInlineBytes) {
      blobs = nlohmann::json();
      break;
    }
    blobs.push_back({{"name", pieces[i].name},
                     {"meta", pieces[i].meta},
                     {"checksum", sums[i]},
                     {"hex", to_hex(pieces[i].data, pieces[i].size)}});
  }
  if (sums.size() != pieces.size()) blobs = nlohmann::json();
  first->blobs = std::move(blobs);
  write_index();
}

void NodeTier::write_index() {
  nlohmann::json buffers = nlohmann::json::array();
  for (const Buffer& b : buffers_) {
    nlohmann::json e = {{"file", b.file}, {"size", b.size}};
    if (b.whole) {
      if (b.ward >= 0) e["ward"] = b.ward;
      e["step"] = b.step;
      e["launch"] = identity_.launch;
      e["world"] = identity_.world_size;
      nlohmann::json pieces = nlohmann::json::array();
      for (std::size_t i = 0; i < b.pieces.size(); ++i) {
        const store::LiveRange& p = b.pieces[i];
        pieces.push_back({{"name", p.name},
                          {"offset", static_cast<const std::byte*>(p.data) - b.data},
                          {"size", p.size},
                          {"checksum", b.sums[i]},
                          {"meta", b.metas[i]}});
      }
      e["pieces"] = std::move(pieces);
      // Complete: every piece outside this buffer is inline here, or in another buffer's entry of the step.
      e["complete"] = !b.blobs.is_null();
      if (b.blobs.is_array() && !b.blobs.empty()) e["inline"] = b.blobs;
    }
    buffers.push_back(std::move(e));
  }
  // An earlier process's buffers stay listed until released: a crash before then must not lose them.
  for (const nlohmann::json& e : found_entries_) buffers.push_back(e);
  nlohmann::json j = {{"job", identity_.job},
                      {"restart", identity_.restart},
                      {"host", identity_.host},
                      {"dir", identity_.checkpoint_dir},
                      {"rank", identity_.rank},
                      {"pid", static_cast<long long>(::getpid())},
                      {"buffers", std::move(buffers)}};
  posix::AtomicWriteOptions options;
  options.durable = false;  // memory: it outlives the process, never the node
  if (Status s = posix::write_file_atomic(dir_.get(), index_name(), j.dump(), path_ + "/" + index_name(), options);
      !s) {
    log::warn(identity_.rank, "node tier: " + s.error());
  }
}

std::vector<store::LiveRange> NodeTier::found() const {
  std::lock_guard<std::mutex> lock(mu_);
  return found_;
}

void NodeTier::remove_all() {
  release_found();
  std::lock_guard<std::mutex> lock(mu_);
  for (const Buffer& b : buffers_) {
    if (!b.handed_over) (void)::unlinkat(dir_.get(), b.file.c_str(), 0);
  }
  buffers_.clear();
  (void)::unlinkat(dir_.get(), index_name().c_str(), 0);
}

void NodeTier::release_found() {
  std::lock_guard<std::mutex> lock(mu_);
  if (found_files_.empty() && found_maps_.empty()) return;
  found_.clear();
  snapshots_.clear();
  found_blobs_.clear();
  ward_copies_.clear();
  found_maps_.clear();
  found_entries_ = nlohmann::json::array();
  for (const std::string& f : found_files_) (void)::unlinkat(dir_.get(), f.c_str(), 0);
  found_files_.clear();
  write_index();
}

}  // namespace ckpt::hooks
