#include "memory_tier.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "ckpt/format.hpp"
#include "ckpt/memtier.hpp"
#include "ckpt/posix.hpp"
#include "heartbeat.hpp"
#include "log.hpp"
#include "node_tier.hpp"

namespace ckpt::hooks {

namespace {

using Clock = std::chrono::steady_clock;

// The messages of a partner link, each a Wire header and its payload (see memory_tier.hpp).
enum WireType : std::uint32_t {
  kBegin = 1,      // a = step, b = total bytes, c = pieces
  kPieceHead = 2,  // a = the piece's bytes, b = the length of its JSON ({"name", "meta"}) that follows
  kChunk = 3,      // a = bytes that follow, b = their XXH3-64
  kEnd = 4,        // a = step, b = the length of the JSON array of the ranges' XXH3-64 that follows
  kAck = 5,        // holder to ward, after kBegin (go on) and after kEnd (kept): a = step, b = 1 yes / 0 refused,
                   // c = the length of the reason that follows
  kFull = 6,       // holder to ward, instead of the first kAck: the copy does not fit here; a = step, b = the bytes
                   // staging and the copies would need
  kFetch = 7,      // ward to holder, a link's only message: a = the ward's world size, b = the step it asks for (0:
                   // the newest), c = the length of the launch that follows (0: any); asks for that copy of the
                   // ward's snapshots among those an earlier process of the holder kept in its node tier
  kHave = 8,       // holder to ward, the answer: a = step, b = world size, c = the length of the launch that follows;
                   // then the copy, kBegin to kEnd as a ward sends one. A kAck with b = 0 instead: none here
};
constexpr std::uint32_t kWireMagic = 0x544d454d;  // "MEMT"
struct Wire {
  std::uint32_t type = 0;
  std::uint32_t magic = kWireMagic;
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  std::uint64_t c = 0;
};
static_assert(sizeof(Wire) == 32);

constexpr std::uint64_t kChunkBytes = 4u << 20;
// Why a copy ended that no one refused: its ward died or its link failed in the middle of it.
constexpr const char* kLinkEnded = "the link ended inside the copy";
constexpr const char* kFrozen = "the last words started: the copies held stay";
constexpr std::uint64_t kMaxPieces = 1u << 20;
constexpr std::uint64_t kMaxJson = 1u << 20;

// Reads exactly `size` bytes, first from `early` (what came with the handshake), then from the socket.
bool read_exact(int fd, std::string& early, void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  const std::size_t from_early = std::min(size, early.size());
  std::memcpy(p, early.data(), from_early);
  early.erase(0, from_early);
  p += from_early;
  size -= from_early;
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool send_wire(int fd, WireType type, std::uint64_t a, std::uint64_t b, std::uint64_t c = 0) {
  Wire w;
  w.type = type;
  w.a = a;
  w.b = b;
  w.c = c;
  return posix::send_all(fd, &w, sizeof w);
}

bool send_ack(int fd, std::uint64_t step, bool yes, const std::string& why) {
  return send_wire(fd, kAck, step, yes ? 1 : 0, why.size()) && posix::send_all(fd, why.data(), why.size());
}

// A link's socket options: the transfer's time limit, and no Nagle delay (a copy's small headers and the answers
// would otherwise wait out the peer's delayed acknowledgement, 40 ms each).
void set_io_timeout(int fd, std::chrono::milliseconds timeout) {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

std::string mib_text(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

struct MemoryTier::Impl {
  // One ward's copy: whole once every check passed.
  struct Slot {
    HostBuffer buffer;
    std::uint64_t step = 0;
    std::uint64_t size = 0;
    std::vector<store::StateRange> ranges;
    bool whole = false;
  };
  struct Ward {
    Slot held;
    // The copy before `held`, whole until the next copy begins into it (the receiver's buffer, swapped with `held`
    // once a copy is whole). With several ranks of a dead node, one ward's copy of step N may have arrived and
    // another's not: the older copy of the first lets the last words write step N - 1 for all of them.
    Slot older;
    std::optional<std::uint64_t> ended;  // the newest step whose copy ended here, kept or refused
    bool linked = false;                 // it sends copies here: its link came at least once
    bool lagging = false;                // a snapshot went on without its copy: not waited for until one is kept
  };
  struct Link {
    int fd = -1;
    int ward = -1;
    std::thread thread;
    std::vector<std::unique_ptr<Link>> before;  // the ward's earlier links, shut: joined before this one reads
  };

  Settings settings;
  heartbeat::Mesh* mesh = nullptr;

  std::mutex mu;
  std::condition_variable changed;  // a copy ended, a link closed, or the tier froze or stopped
  std::map<int, Ward> wards;        // guarded by mu (older: its receiver's alone while it is not whole)
  std::vector<std::unique_ptr<Link>> links;  // guarded by mu
  bool frozen = false;              // guarded by mu
  bool stopping = false;            // guarded by mu
  std::uint64_t staging_bytes = 0;  // guarded by mu

  std::mutex send_mu;
  int send_fd = -1;  // guarded by send_mu
  // The send link's socket from before its connect on, for stop() to shut while a dial or a copy holds send_mu
  // (a partner that froze would otherwise hold stop() for a whole io_timeout). Set and cleared before the socket is
  // closed, under shadow_mu, so stop() never shuts a number the process reused.
  std::mutex shadow_mu;
  int send_shadow = -1;        // guarded by shadow_mu
  bool sends_stopped = false;  // guarded by shadow_mu: a socket made after stop() is shut at once

  void watch_send_socket(int fd) {
    std::lock_guard<std::mutex> lock(shadow_mu);
    send_shadow = fd;
    if (fd >= 0 && sends_stopped) ::shutdown(fd, SHUT_RDWR);
  }
  bool refused_logged = false;
  std::atomic<bool> node_full_logged{false};
  std::atomic<std::uint64_t> partner_needs{0};  // what the partner said a copy would need, where it did not fit

  // A held copy's buffer: a file of the node tier where there is one, so that it outlives this process; else
  // anonymous memory (a buffer the last generation left, where it did: BufferReserve).
  Result<HostBuffer> allocate(std::uint64_t bytes) {
    if (settings.node != nullptr) {
      auto file = settings.node->allocate(bytes);
      if (file) return file;
      if (!node_full_logged.exchange(true)) {
        log::warn(settings.rank, "memory tier: " + file.error() + "; held copies stay in this process's memory");
      }
    }
    return BufferReserve::process().take_or_allocate(bytes);
  }

  bool is_ward(int r) const {
    return std::find(settings.wards.begin(), settings.wards.end(), r) != settings.wards.end();
  }

  // The first range of a whole copy whose bytes no longer match its checksum; nothing when all match.
  static std::optional<std::string> mismatch(const Slot& slot) {
    for (const store::StateRange& r : slot.ranges) {
      if (XXH3_64bits(slot.buffer.data() + r.offset, r.length) != *r.checksum) return r.name;
    }
    return std::nullopt;
  }

  // The whole copy of `ward` at `step` held here, the newer one first; null when there is none. Under mu.
  const Slot* whole_copy(int ward, std::uint64_t step) const {
    auto it = wards.find(ward);
    if (it == wards.end()) return nullptr;
    for (const Slot* slot : {&it->second.held, &it->second.older}) {
      if (slot->whole && slot->step == step) return slot;
    }
    return nullptr;
  }

  // Mesh thread: a ward's new link.
  void on_accept(int fd, int from, std::string early) {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping || !is_ward(from)) {
      if (!stopping) {
        log::warn(settings.rank, "memory tier: refused a partner link from rank " + std::to_string(from) +
                                     ", whose copies this rank does not keep");
      }
      ::close(fd);
      return;
    }
    // A ward dials again after a failure: its old link is over, and its receiver must have left the ward's
    // older slot before the new one writes there.
    auto link = std::make_unique<Link>();
    for (auto it = links.begin(); it != links.end();) {
      if ((*it)->ward != from) {
        ++it;
        continue;
      }
      if ((*it)->fd >= 0) ::shutdown((*it)->fd, SHUT_RDWR);
      link->before.push_back(std::move(*it));
      it = links.erase(it);
    }
    set_io_timeout(fd, settings.io_timeout);
    link->fd = fd;
    link->ward = from;
    wards[from].linked = true;
    Link* raw = link.get();
    link->thread = std::thread([this, raw, early = std::move(early)]() mutable {
      for (auto& old : raw->before) {
        if (old->thread.joinable()) old->thread.join();
      }
      raw->before.clear();
      receive(*raw, std::move(early));
    });
    links.push_back(std::move(link));
  }

  // Receiver thread: copies from one ward until the link ends.
  void receive(Link& link, std::string early) {
    for (;;) {
      std::string why;
      std::uint64_t step = 0;
      std::uint64_t full = 0;
      const int got = receive_one(link, early, step, why, full);
      if (got == 0) break;  // the link ended between copies
      const bool kept = got > 0;
      bool stopped = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        stopped = stopping;
        Ward& ward = wards[link.ward];
        if (why != kLinkEnded) ward.ended = std::max(ward.ended.value_or(0), step);  // kept, or refused
        if (kept) ward.lagging = false;
      }
      changed.notify_all();
      if (full > 0) {  // the ward turns the job's tier off, and rank 0 says so
        log::info(settings.rank, "memory tier: refused the copy of rank " + std::to_string(link.ward) + "'s step " +
                                     std::to_string(step) + ": " + why);
        (void)send_wire(link.fd, kFull, step, full);
        break;
      }
      if (!kept && !stopped) {  // stop() cuts a copy in flight: that is no fault of the ward's
        log::warn(settings.rank, "memory tier: refused the copy of rank " + std::to_string(link.ward) + "'s step " +
                                     std::to_string(step) + ": " + why);
      }
      if (!send_ack(link.fd, step, kept, why) || !kept) break;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      ::close(link.fd);
      link.fd = -1;
    }
    changed.notify_all();
  }

  // The wards that still owe this rank their copy of `step`: each sends copies here, is not lagging, and no copy
  // of that step or a later one ended here (`ended` counts the kept ones too). A link that broke does not settle
  // it: the ward died (the last words freeze this tier) or dials again for its next copy. Under mu.
  std::vector<int> owing(std::uint64_t step) const {
    std::vector<int> out;
    for (int ward : settings.wards) {
      auto it = wards.find(ward);
      if (it == wards.end() || !it->second.linked || it->second.lagging) continue;
      if (!it->second.ended || *it->second.ended < step) out.push_back(ward);
    }
    return out;
  }

  // One copy into the ward's older slot, checked; swapped in as held when whole. 1: kept; -1: refused (`why`;
  // `full`: the bytes it would need, where it does not fit); 0: the link ended before a copy began, or it carried a
  // fetch (served here).
  int receive_one(Link& link, std::string& early, std::uint64_t& step, std::string& why, std::uint64_t& full) {
    Wire w;
    if (!read_exact(link.fd, early, &w, sizeof w)) return 0;
    if (w.magic == kWireMagic && w.type == kFetch) {
      std::string launch(std::min<std::uint64_t>(w.c, 1024), '\0');
      if (w.c <= 1024 && read_exact(link.fd, early, launch.data(), launch.size())) serve_fetch(link, w.a, w.b, launch);
      return 0;
    }
    if (w.magic != kWireMagic || w.type != kBegin) return why = "not the start of a copy", -1;
    step = w.a;
    const std::uint64_t total = w.b;
    const std::uint64_t pieces = w.c;
    Slot* slot = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      const std::uint64_t need = memtier::tier_bytes(staging_bytes, total, settings.wards.size());
      if (need > settings.max_bytes) {
        full = need;
        return why = "it needs " + mib_text(need) + " here (staging and two copies per ward), over CKPT_MEMORY's " +
                     mib_text(settings.max_bytes), -1;
      }
      if (pieces > kMaxPieces) return why = std::to_string(pieces) + " pieces", -1;
      // Frozen: the last words may use either copy held; nothing is written over them.
      if (frozen) return why = kFrozen, -1;
      slot = &wards[link.ward].older;
      slot->whole = false;  // under mu: the last words see it whole, or not at all
    }
    if (settings.node != nullptr) settings.node->overwriting(slot->buffer.data());
    slot->ranges.clear();
    if (slot->buffer.size() < total) {
      if (settings.node != nullptr) settings.node->drop(slot->buffer.data());
      slot->buffer = HostBuffer();
      auto grown = allocate(total);
      if (!grown) return why = grown.error(), -1;
      slot->buffer = std::move(grown).value();
    }
    // The ward sends the bytes only once told to: a refusal above reaches it before it has sent them.
    if (!send_ack(link.fd, step, true, "")) return 0;
    if (!read_copy(link.fd, early, *slot, step, total, pieces, why)) return -1;
    std::lock_guard<std::mutex> lock(mu);
    if (frozen) return why = kFrozen, -1;
    Ward& ward = wards[link.ward];
    std::swap(ward.held, ward.older);
    if (settings.node != nullptr) {
      settings.node->held_copy(ward.held.buffer.data(), link.ward, ward.held.step, ward.held.ranges);
    }
    return 1;
  }

  // The rest of a copy whose start (`step`, `total` bytes in `pieces` pieces) was answered with "go on": into `slot`
  // (at least `total` bytes), every chunk and every range checked as it arrives. False: refused (`why`).
  bool read_copy(int fd, std::string& early, Slot& slot, std::uint64_t step, std::uint64_t total,
                 std::uint64_t pieces, std::string& why) {
    Wire w;
    std::uint64_t offset = 0;
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> range_hash(XXH3_createState(), &XXH3_freeState);
    if (!range_hash) return why = "out of memory", false;
    for (std::uint64_t i = 0; i < pieces; ++i) {
      if (!read_exact(fd, early, &w, sizeof w)) return why = kLinkEnded, false;
      if (w.magic != kWireMagic || w.type != kPieceHead || w.b > kMaxJson || w.a > total - offset) {
        return why = "a piece header out of bounds", false;
      }
      const std::uint64_t length = w.a;
      std::string head(w.b, '\0');
      if (!read_exact(fd, early, head.data(), head.size())) return why = kLinkEnded, false;
      store::StateRange range;
      try {
        auto j = nlohmann::json::parse(head);
        range.name = j.at("name").get<std::string>();
        range.meta = j.at("meta");
      } catch (const std::exception&) {
        return why = "a piece header that is not its JSON", false;
      }
      range.offset = offset;
      range.length = length;
      XXH3_64bits_reset(range_hash.get());
      for (std::uint64_t left = length; left > 0;) {
        if (!read_exact(fd, early, &w, sizeof w)) return why = kLinkEnded, false;
        if (w.magic != kWireMagic || w.type != kChunk || w.a == 0 || w.a > kChunkBytes || w.a > left) {
          return why = "a chunk out of bounds", false;
        }
        std::byte* at = slot.buffer.data() + offset + (length - left);
        if (!read_exact(fd, early, at, w.a)) return why = kLinkEnded, false;
        if (XXH3_64bits(at, w.a) != w.b) return why = "a chunk of '" + range.name + "' does not match its checksum", false;
        XXH3_64bits_update(range_hash.get(), at, w.a);
        left -= w.a;
      }
      range.checksum = XXH3_64bits_digest(range_hash.get());
      offset += length;
      slot.ranges.push_back(std::move(range));
    }
    if (!read_exact(fd, early, &w, sizeof w)) return why = kLinkEnded, false;
    if (w.magic != kWireMagic || w.type != kEnd || w.a != step || w.b > kMaxJson || offset != total) {
      return why = "the copy's end does not match its start", false;
    }
    std::string sums(w.b, '\0');
    if (!read_exact(fd, early, sums.data(), sums.size())) return why = kLinkEnded, false;
    try {
      auto j = nlohmann::json::parse(sums);
      if (!j.is_array() || j.size() != slot.ranges.size()) return why = "the ranges' checksums do not match", false;
      for (std::size_t i = 0; i < slot.ranges.size(); ++i) {
        if (j[i].get<std::uint64_t>() != *slot.ranges[i].checksum) {
          return why = "range '" + slot.ranges[i].name + "' does not match its checksum", false;
        }
      }
    } catch (const std::exception&) {
      return why = "the ranges' checksums are not their JSON", false;
    }
    slot.step = step;
    slot.size = total;
    slot.whole = true;
    return true;
  }

  // Receiver thread: a relaunched ward asks for a copy of its snapshots that an earlier process of this rank kept
  // in the node tier (of the ward's world size; `step` of `launch`, or the newest). Sent as the ward would send it,
  // or refused; the ward checks every chunk, and every range against the checksum the snapshot recorded.
  void serve_fetch(const Link& link, std::uint64_t world, std::uint64_t want, const std::string& launch) {
    const std::string of = "rank " + std::to_string(link.ward) + "'s ";
    Status sent = Status::success();
    std::uint64_t step = 0, bytes = 0;
    const std::optional<std::uint64_t> wanted = want == 0 ? std::nullopt : std::optional<std::uint64_t>(want);
    const bool held = settings.node != nullptr && world <= (1u << 24) &&
                      settings.node->with_ward_copy(link.ward, static_cast<int>(world), wanted, launch,
                                                    [&](const NodeTier::Snapshot& c) {
      step = c.step;
      std::vector<Piece> pieces;
      std::vector<std::uint64_t> sums;
      for (const NodeTier::SnapshotPiece& p : c.pieces) {
        pieces.push_back({p.name, p.data, p.size, p.meta});
        sums.push_back(p.checksum);
        bytes += p.size;
      }
      if (!send_wire(link.fd, kHave, c.step, static_cast<std::uint64_t>(c.world_size), c.launch.size()) ||
          !posix::send_all(link.fd, c.launch.data(), c.launch.size())) {
        sent = Status::failure("the link closed");
        return;
      }
      sent = send_copy(link.fd, link.ward, c.step, pieces, sums);
    });
    if (!held) {
      (void)send_ack(link.fd, 0, false, "this node keeps no copy of " + of +
                                            (wanted ? "step " + std::to_string(want) + " of launch " + printable(launch)
                                                    : std::string("snapshots")) +
                                            " of " + std::to_string(world) + " ranks");
      return;
    }
    if (sent) {
      log::info(settings.rank, "memory tier: sent " + of + "relaunch its step " + std::to_string(step) + " (" +
                                   mib_text(bytes) + "), from the copy this node kept");
    } else {
      log::warn(settings.rank, "memory tier: " + of + "fetch of its step " + std::to_string(step) + " ended: " +
                                   sent.error());
    }
  }

  // Training thread, on a new link to the partner: fetch_own's exchange.
  Result<std::optional<Fetched>> fetch_on(int fd, std::uint64_t want, const std::string& launch) {
    const std::string from = "rank " + std::to_string(settings.partner);
    std::string early;
    Wire w;
    if (!send_wire(fd, kFetch, static_cast<std::uint64_t>(settings.world_size), want, launch.size()) ||
        !posix::send_all(fd, launch.data(), launch.size()) || !read_exact(fd, early, &w, sizeof w) ||
        w.magic != kWireMagic) {
      return Error{"no answer from " + from};
    }
    if (w.type == kAck && w.b == 0 && w.c <= 4096) {
      std::string why(w.c, '\0');
      if (!read_exact(fd, early, why.data(), why.size())) return Error{"no answer from " + from};
      log::debug(settings.rank, "memory tier: " + from + ": " + printable(why));
      return std::optional<Fetched>{};
    }
    if (w.type != kHave || w.b != static_cast<std::uint64_t>(settings.world_size) || w.c > 1024) {
      return Error{from + " answered with something else than a copy"};
    }
    if (want != 0 && w.a != want) return Error{from + " answered with another step than " + std::to_string(want)};
    Fetched f;
    f.step = w.a;
    f.world_size = settings.world_size;
    f.launch.assign(w.c, '\0');
    if (!read_exact(fd, early, f.launch.data(), f.launch.size()) || !read_exact(fd, early, &w, sizeof w)) {
      return Error{"the link to " + from + " ended inside the copy"};
    }
    const std::string what = from + "'s copy of this rank's step " + std::to_string(f.step);
    if (w.magic != kWireMagic || w.type != kBegin || w.a != f.step) return Error{what + " does not start as a copy"};
    const std::uint64_t total = w.b, pieces = w.c;
    std::string why;
    if (total > settings.max_bytes) {
      why = mib_text(total) + ", over CKPT_MEMORY's " + mib_text(settings.max_bytes);
    } else if (pieces > kMaxPieces) {
      why = std::to_string(pieces) + " pieces";
    }
    Slot slot;
    if (why.empty()) {
      auto buffer = HostBuffer::allocate(total);
      if (buffer) {
        slot.buffer = std::move(buffer).value();
      } else {
        why = buffer.error();
      }
    }
    if (!why.empty()) {
      (void)send_ack(fd, f.step, false, why);
      return Error{what + ": " + why};
    }
    if (!send_ack(fd, f.step, true, "")) return Error{"the link to " + from + " closed"};
    if (!read_copy(fd, early, slot, f.step, total, pieces, why)) {
      (void)send_ack(fd, f.step, false, why);
      return Error{what + ": " + why};
    }
    (void)send_ack(fd, f.step, true, "");
    f.ranges = std::move(slot.ranges);
    f.buffer = std::move(slot.buffer);
    return std::optional<Fetched>{std::move(f)};
  }

  void drop_send_link() {
    watch_send_socket(-1);
    if (send_fd >= 0) ::close(send_fd);
    send_fd = -1;
  }

  // A copy of `pieces` of `step` over `fd` to rank `to` (the partner, or a relaunched ward that fetches it back).
  Status send_copy(int fd, int to, std::uint64_t step, const std::vector<Piece>& pieces,
                   const std::vector<std::uint64_t>& known) {
    std::uint64_t total = 0;
    for (const Piece& p : pieces) total += p.size;
    if (!send_wire(fd, kBegin, step, total, pieces.size())) return Status::failure("the link closed");
    if (Status go = read_ack(fd, to, step); !go) return go;
    nlohmann::json sums = nlohmann::json::array();
    for (const Piece& p : pieces) {
      const std::string head = nlohmann::json{{"name", p.name}, {"meta", p.meta}}.dump();
      if (!send_wire(fd, kPieceHead, p.size, head.size()) || !posix::send_all(fd, head.data(), head.size())) {
        return Status::failure("the link closed");
      }
      for (std::uint64_t off = 0; off < p.size; off += kChunkBytes) {
        const std::uint64_t n = std::min<std::uint64_t>(kChunkBytes, p.size - off);
        if (!send_wire(fd, kChunk, n, XXH3_64bits(p.data + off, n)) || !posix::send_all(fd, p.data + off, n)) {
          return Status::failure("the link closed");
        }
      }
      const std::size_t i = static_cast<std::size_t>(&p - pieces.data());
      sums.push_back(known.size() == pieces.size() ? known[i] : XXH3_64bits(p.data, p.size));
    }
    const std::string tail = sums.dump();
    if (!send_wire(fd, kEnd, step, tail.size()) || !posix::send_all(fd, tail.data(), tail.size())) {
      return Status::failure("the link closed");
    }
    return read_ack(fd, to, step);
  }

  // The answer of rank `to` (the partner, or a relaunched ward) about `step`: go on, or kept; a refusal with its
  // reason.
  Status read_ack(int fd, int to, std::uint64_t step) {
    const Status silent = Status::failure("no answer from rank " + std::to_string(to));
    Wire ack;
    std::string none;
    if (!read_exact(fd, none, &ack, sizeof ack) || ack.magic != kWireMagic || ack.a != step) return silent;
    if (ack.type == kFull && ack.b > 0 && to == settings.partner) {  // only a holder says it is full
      partner_needs = ack.b;
      return Status::failure("rank " + std::to_string(to) + " cannot keep it within its CKPT_MEMORY: " +
                             "it would need " + mib_text(ack.b) + " for its staging and copies");
    }
    if (ack.type != kAck || ack.c > 4096) return silent;
    std::string why(ack.c, '\0');
    if (!read_exact(fd, none, why.data(), why.size())) return silent;
    if (ack.b != 1) return Status::failure("rank " + std::to_string(to) + " refused it: " + printable(why));
    return Status::success();
  }
};

std::unique_ptr<MemoryTier> MemoryTier::start(const Settings& settings, heartbeat::Mesh& mesh) {
  auto impl = std::make_unique<Impl>();
  impl->settings = settings;
  impl->mesh = &mesh;
  Impl* p = impl.get();
  if (settings.wards.empty()) {
    mesh.set_partner_acceptor(nullptr);
  } else {
    mesh.set_partner_acceptor([p](int fd, int from, std::string early) { p->on_accept(fd, from, std::move(early)); });
  }
  return std::unique_ptr<MemoryTier>(new MemoryTier(std::move(impl)));
}

MemoryTier::MemoryTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MemoryTier::~MemoryTier() { stop(); }

void MemoryTier::stop() {
  Impl& m = *impl_;
  std::vector<std::unique_ptr<Impl::Link>> links;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.stopping) return;
    m.stopping = true;
    for (auto& l : m.links) {
      if (l->fd >= 0) ::shutdown(l->fd, SHUT_RDWR);
    }
  }
  m.changed.notify_all();
  {
    std::lock_guard<std::mutex> lock(m.shadow_mu);  // a dial or a copy in flight ends now
    m.sends_stopped = true;
    if (m.send_shadow >= 0) ::shutdown(m.send_shadow, SHUT_RDWR);
  }
  m.mesh->set_partner_acceptor(nullptr);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    links.swap(m.links);
  }
  for (auto& l : links) {
    if (l->thread.joinable()) l->thread.join();
  }
  std::lock_guard<std::mutex> lock(m.send_mu);
  m.drop_send_link();
}

const MemoryTier::Settings& MemoryTier::settings() const { return impl_->settings; }

void MemoryTier::set_staging_bytes(std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->staging_bytes = bytes;
}

std::optional<std::uint64_t> MemoryTier::partner_needs() const {
  const std::uint64_t need = impl_->partner_needs.load();
  if (need == 0) return std::nullopt;
  return need;
}

Status MemoryTier::send(std::uint64_t step, const std::vector<Piece>& pieces, const std::vector<std::uint64_t>& sums) {
  Impl& m = *impl_;
  if (m.settings.partner < 0) return Status::failure("no partner on another node");
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.stopping) return Status::failure("the memory tier is stopped");
  }
  std::lock_guard<std::mutex> lock(m.send_mu);
  if (m.send_fd < 0) {
    auto fd = m.mesh->dial_partner(m.settings.partner, m.settings.io_timeout,
                                   [&m](int socket) { m.watch_send_socket(socket); });
    if (!fd) return Status::failure("cannot reach rank " + std::to_string(m.settings.partner) + ": " + fd.error());
    m.send_fd = *fd;
    set_io_timeout(m.send_fd, m.settings.io_timeout);
  }
  Status s = m.send_copy(m.send_fd, m.settings.partner, step, pieces, sums);
  if (!s) m.drop_send_link();
  return s;
}

Result<std::optional<MemoryTier::Fetched>> MemoryTier::fetch_own(std::optional<std::uint64_t> step,
                                                                  const std::string& launch) {
  Impl& m = *impl_;
  if (m.settings.partner < 0) return std::optional<Fetched>{};
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.stopping) return Error{"the memory tier is stopped"};
  }
  std::lock_guard<std::mutex> lock(m.send_mu);
  auto fd = m.mesh->dial_partner(m.settings.partner, m.settings.io_timeout,
                                 [&m](int socket) { m.watch_send_socket(socket); });
  if (!fd) {
    m.watch_send_socket(-1);
    return Error{"cannot reach rank " + std::to_string(m.settings.partner) + ": " + fd.error()};
  }
  set_io_timeout(*fd, m.settings.io_timeout);
  auto fetched = m.fetch_on(*fd, step.value_or(0), launch);
  m.watch_send_socket(-1);
  ::close(*fd);
  return fetched;
}

void MemoryTier::freeze() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->frozen = true;
  }
  impl_->changed.notify_all();
}

std::vector<int> MemoryTier::wait_for_wards(std::uint64_t step, std::chrono::milliseconds limit,
                                            const std::function<bool()>& give_up) {
  Impl& m = *impl_;
  const auto deadline = Clock::now() + limit;
  std::unique_lock<std::mutex> lock(m.mu);
  for (;;) {
    std::vector<int> owing = m.owing(step);
    if (owing.empty() || m.frozen || m.stopping) return owing;
    // A ward that left in order sends nothing more. Asked of the mesh outside mu: the mesh's own lock.
    lock.unlock();
    owing.erase(std::remove_if(owing.begin(), owing.end(), [&m](int ward) { return m.mesh->left(ward); }),
                owing.end());
    lock.lock();
    if (owing.empty()) return owing;
    if (Clock::now() >= deadline) {
      for (int ward : owing) m.wards[ward].lagging = true;  // one wait per ward, not one per snapshot
      return owing;
    }
    // Polled: the last words freeze training, and the mesh learns who left, elsewhere than in this tier.
    m.changed.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
    lock.unlock();
    const bool stop = give_up && give_up();
    lock.lock();
    if (stop) return owing;
  }
}

bool MemoryTier::frozen() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->frozen;
}

std::vector<std::pair<int, std::uint64_t>> MemoryTier::verified_copies() {
  Impl& m = *impl_;
  std::vector<std::pair<int, std::uint64_t>> out;
  std::lock_guard<std::mutex> lock(m.mu);
  for (auto& [ward, w] : m.wards) {
    for (Impl::Slot* slot : {&w.held, &w.older}) {
      if (!slot->whole) continue;
      if (auto bad = m.mismatch(*slot)) {
        log::warn(m.settings.rank, "memory tier: the copy of rank " + std::to_string(ward) + "'s step " +
                                       std::to_string(slot->step) + " no longer matches the checksum of '" + *bad +
                                       "': not used");
        slot->whole = false;
        continue;
      }
      out.emplace_back(ward, slot->step);
    }
  }
  return out;
}

Status MemoryTier::with_copy(int ward, std::uint64_t step, const std::function<Status(const Copy&)>& use) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  const Impl::Slot* slot = m.whole_copy(ward, step);
  if (slot == nullptr) {
    return Status::failure("no whole copy of rank " + std::to_string(ward) + "'s step " + std::to_string(step) +
                           " is held here");
  }
  if (auto bad = m.mismatch(*slot)) {
    return Status::failure("the copy of rank " + std::to_string(ward) + "'s '" + *bad +
                           "' no longer matches its checksum");
  }
  return use(Copy{ward, slot->step, slot->ranges, slot->buffer.data(), slot->size});
}

std::vector<MemoryTier::Kept> MemoryTier::release() {
  Impl& m = *impl_;
  std::vector<Kept> out;
  std::lock_guard<std::mutex> lock(m.mu);
  if (!m.frozen) return out;
  for (auto& [ward, w] : m.wards) {
    for (Impl::Slot* slot : {&w.held, &w.older}) {
      if (!slot->whole) continue;
      slot->whole = false;
      if (m.mismatch(*slot)) {
        log::warn(m.settings.rank, "memory tier: the copy of rank " + std::to_string(ward) + "'s step " +
                                       std::to_string(slot->step) + " no longer matches its checksums: not kept");
        continue;
      }
      out.push_back(Kept{ward, slot->step, std::move(slot->ranges), std::move(slot->buffer), slot->size});
      slot->ranges.clear();
    }
  }
  return out;
}

bool MemoryTier::corrupt_for_testing(int ward) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->wards.find(ward);
  if (it == impl_->wards.end() || !it->second.held.whole || it->second.held.size == 0) return false;
  it->second.held.buffer.data()[it->second.held.size / 2] ^= std::byte{0x01};
  return true;
}

}  // namespace ckpt::hooks
