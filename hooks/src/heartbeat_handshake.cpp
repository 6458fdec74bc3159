// Making the heartbeat network's links: the private rendezvous dir and the job's secret in it, this rank's published
// address, and the HMAC-SHA256 handshake each link starts with (heartbeat.hpp states the protocol), on the dialer's
// side (the dialer thread, which links a rank to its up neighbour) and the acceptor's (the mesh thread).
// Connections that fail it are refused and logged.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "ckpt/address.hpp"
#include "ckpt/recovery.hpp"
#include "ckpt/posix.hpp"
#include "ckpt/store.hpp"
#include "heartbeat_impl.hpp"
#include "log.hpp"

namespace ckpt::hooks::heartbeat {

namespace {

using posix::errno_text;
using posix::Fd;
using posix::random_bytes;

constexpr const char* kSecretName = "secret";
// How long an accepted connection may take to complete its handshake (how many may be in it at once:
// Impl::kMaxPending): a stranger that connects and says nothing holds one slot for this long, never the mesh.
constexpr auto kHandshakeLimit = std::chrono::seconds(5);
// With PMIx, how long a refused dial waits for the news that the peer left in order before it counts as a death.
constexpr auto kLeaveNews = std::chrono::milliseconds(500);

std::string numeric(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {};
  (void)::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return buf;
}

// HMAC-SHA256(secret, label || hello[0..64) || reply[0..64) || address).
std::array<std::uint8_t, 32> handshake_mac(const Secret& secret, std::string_view label, const Handshake& hello,
                                           const Handshake& reply, std::string_view address) {
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(&hello), offsetof(Handshake, mac));
  msg.append(reinterpret_cast<const char*>(&reply), offsetof(Handshake, mac));
  msg.append(address);
  std::array<std::uint8_t, 32> out{};
  unsigned int len = 0;
  (void)::HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
               reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len);
  return out;
}

constexpr std::string_view kAcceptLabel = "slurm-ckpt mesh accept v2";
constexpr std::string_view kDialLabel = "slurm-ckpt mesh dial v2";

bool mac_matches(const std::array<std::uint8_t, 32>& expected, const std::uint8_t* got) {
  return CRYPTO_memcmp(expected.data(), got, expected.size()) == 0;
}

}  // namespace

// Refused connections, logged at most once per peer address per 10 s with a count of what was left out.
class RefusalLog {
 public:
  explicit RefusalLog(int rank) : rank_(rank) {}
  void refused(const std::string& peer, const std::string& why) {
    const auto now = Clock::now();
    std::string key = peer.substr(0, peer.rfind(':'));
    if (seen_.size() >= 64 && !seen_.count(key)) key = "other";
    Entry& e = seen_[key];
    if (e.logged && now - e.last < std::chrono::seconds(10)) {
      ++e.left_out;
      return;
    }
    std::string line = "heartbeat: refused a connection from " + peer + ": " + why;
    if (e.left_out > 0) line += " (and " + std::to_string(e.left_out) + " more from there since the last line)";
    log::warn(rank_, line);
    e = Entry{true, now, 0};
  }

 private:
  struct Entry {
    bool logged = false;
    Clock::time_point last;
    std::uint64_t left_out = 0;
  };
  int rank_;
  std::map<std::string, Entry> seen_;
};

void RefusalLogDelete::operator()(RefusalLog* log) const { delete log; }

namespace {

std::string peer_text(const sockaddr_in& a) { return numeric(a) + ":" + std::to_string(ntohs(a.sin_port)); }

// Reads exactly one handshake message with a deadline; blocking socket with SO_RCVTIMEO set.
bool read_handshake(int fd, Handshake& msg) {
  char* p = reinterpret_cast<char*>(&msg);
  std::size_t got = 0;
  while (got < sizeof msg) {
    ssize_t n = ::recv(fd, p + got, sizeof msg - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return msg.head.pad == kMagic;
}

void set_timeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Connects within `limit` (SO_SNDTIMEO bounds a blocking connect: a host that drops the SYN fails it in `limit`,
// not after the kernel's two minutes of retries).
int dial(const std::string& host, const std::string& port, std::chrono::milliseconds limit,
         const Mesh::SocketWatch& on_socket) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    set_timeout(fd, limit);
    if (on_socket) on_socket(fd);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    const int err = errno;
    if (on_socket) on_socket(-1);
    ::close(fd);
    errno = err;
    fd = -1;
  }
  const int err = errno;
  ::freeaddrinfo(res);
  errno = err;
  return fd;
}

}  // namespace

Handshake Mesh::Impl::handshake(std::uint32_t type) const {
  Handshake h;
  h.head = frame(type);
  h.head.a = settings.hello;
  h.head.b = static_cast<std::uint64_t>(::getpid());
  h.head.spare = host_tag;
  return h;
}

namespace {

// This kernel's boot id, this pid namespace and this network namespace, hashed (FNV-1a): two ranks with the same
// tag see each other's processes in /proc and are on one host. Ranks in other network namespaces count as other
// hosts even where /proc is shared (containers, the test cluster's nodes): a link between them can be cut while
// both processes run, so a peer's live process there says nothing about whether it can still be reached.
std::uint32_t this_host_tag() {
  std::string id;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f) != nullptr) id = buf;
    std::fclose(f);
  }
  for (const char* link : {"/proc/self/ns/pid", "/proc/self/ns/net"}) {
    char ns[64] = {};
    ssize_t n = ::readlink(link, ns, sizeof ns - 1);
    if (n > 0) id.append(ns, static_cast<std::size_t>(n));
  }
  if (id.empty()) return 0;
  std::uint32_t h = 2166136261u;
  for (unsigned char c : id) h = (h ^ c) * 16777619u;
  return h == 0 ? 1 : h;
}

// The node this rank runs on, as Slurm names it (SLURMD_NODENAME), else the host name; "" when neither is a safe
// node name (it is only information for the controller).
std::string this_node_name() {
  std::string name;
  if (const char* v = std::getenv("SLURMD_NODENAME"); v != nullptr) name = v;
  if (name.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) name = host;
  }
  return ckpt::recovery::safe_node_name(name) ? name : "";
}

}  // namespace

// The rendezvous dir, the secret, the listener, and "<address> <port> <node>" published in the rendezvous (files or
// PMIx, rendezvous.hpp).
Status Mesh::Impl::prepare() {
  auto dir = posix::open_private_dir(settings.rendezvous_dir);
  if (!dir) return Status::failure("ckpt: heartbeat: " + dir.error());
  dirfd = dir->release();
  auto key = posix::private_secret(dirfd, kSecretName, posix::join(settings.rendezvous_dir, kSecretName));
  if (!key) return Status::failure("ckpt: heartbeat: " + key.error());
  secret = *key;
  refusals.reset(new RefusalLog(settings.rank));
  host_tag = this_host_tag();

  std::string host = settings.address;
  if (host.empty()) {  // the one rule for every address a rank publishes (ckpt/address.hpp)
    auto chosen = ckpt::net::publish_address();
    if (!chosen) return Status::failure(chosen.error());
    if (!chosen->warning.empty()) log::warn(settings.rank, chosen->warning);
    host = chosen->address;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return Status::failure("ckpt: heartbeat: '" + host + "' is not an IPv4 address");
  }
  listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listener < 0) return Status::failure("ckpt: heartbeat: socket: " + errno_text(errno));
  list_socket(listener);
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, SOMAXCONN) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::failure("ckpt: heartbeat: cannot listen on " + host + ": " + errno_text(errno));
  }
  address = host + " " + std::to_string(ntohs(addr.sin_port));
  const std::string node = this_node_name();

  auto chosen = make_rendezvous(settings.rendezvous, dirfd, settings.rendezvous_dir, settings.rank,
                                settings.world_size);
  if (!chosen) return Status::failure(chosen.error());
  rendezvous = std::move(chosen).value();
  std::string line = address;
  if (!node.empty()) line.append(" ").append(node);
  const auto t0 = Clock::now();
  if (Status s = rendezvous->publish(line, settings.connect_timeout); !s) {
    return Status::failure("ckpt: heartbeat: cannot publish its address (" + std::string(rendezvous->name()) +
                           "): " + s.error());
  }
  if (settings.rank == 0) {
    char line_out[128];
    std::snprintf(line_out, sizeof line_out, "heartbeat: rendezvous %s: addresses published in %.3f s",
                  rendezvous->name(), std::chrono::duration<double>(Clock::now() - t0).count());
    // PMIx is worth a line at info: the job's start depends on its fence.
    if (rendezvous->tells_leaves()) log::debug(0, line_out); else log::info(0, line_out);
  }
  return Status::success();
}

std::optional<std::pair<std::string, std::string>> Mesh::Impl::read_address(int peer) const {
  auto fields = rendezvous->lookup(peer);
  if (!fields) return std::nullopt;
  return std::pair{(*fields)[0], (*fields)[1]};
}

std::string Mesh::Impl::read_node(int peer) const {
  auto fields = rendezvous->lookup(peer);
  if (!fields || fields->size() < 3 || !ckpt::recovery::safe_node_name((*fields)[2])) return "";
  return (*fields)[2];
}

Result<PeerId> Mesh::Impl::dial_handshake(int fd, int peer, const std::string& dialed, std::uint32_t type) {
  Handshake hello = handshake(type);
  if (!random_bytes(hello.nonce, sizeof hello.nonce)) return Error{"getrandom: " + errno_text(errno)};
  Handshake reply;
  if (!posix::send_all(fd, &hello, sizeof hello) || !read_handshake(fd, reply)) return Error{"no handshake"};
  if (reply.head.type != type || reply.head.from != peer) {
    return Error{"it answered as rank " + std::to_string(reply.head.from) + ", not " + std::to_string(peer)};
  }
  if (!mac_matches(handshake_mac(secret, kAcceptLabel, hello, reply, dialed), reply.mac)) {
    return Error{"it does not know the job's secret"};
  }
  Handshake proof;
  proof.head = frame(kProof);
  auto mac = handshake_mac(secret, kDialLabel, hello, reply, dialed);
  std::memcpy(proof.mac, mac.data(), mac.size());
  if (!posix::send_all(fd, &proof, sizeof proof)) return Error{"the connection closed during the handshake"};
  return PeerId{reply.head.a, static_cast<int>(reply.head.b), reply.head.spare};
}

Result<std::pair<int, PeerId>> Mesh::Impl::dial_once(int peer, std::chrono::milliseconds limit,
                                                    std::uint32_t type, const Mesh::SocketWatch& on_socket) {
  auto addr = read_address(peer);
  if (!addr) return Error{"it has published no address yet"};
  const std::string dialed = addr->first + " " + addr->second;
  int fd = dial(addr->first, addr->second, limit, on_socket);
  if (fd < 0) {
    last_dial_refused = errno == ECONNREFUSED;
    return Error{dialed + ": " + errno_text(errno)};
  }
  last_dial_refused = false;
  auto back = dial_handshake(fd, peer, dialed, type);
  if (!back) {
    if (on_socket) on_socket(-1);
    ::close(fd);
    return Error{dialed + ": " + back.error()};
  }
  return std::pair{fd, *back};
}

// Keeps this rank linked to the up neighbour of its current view, and probes the down neighbours that have not
// linked in within kProbeAfter of a change (a group whose leader died, with nobody left to dial: a dead node).
// Before every rank joined, a peer that has not published yet is waited for (start's own deadline bounds it).
// After, a failed dial is news about the peer only when it is certain: no address file (it left in order; say_bye
// removes the file first) or a refused connect (no listener: its process is gone). A dial that times out may be a
// starved peer: the up neighbour is declared dead only after kSlowFactor silence limits of that, a down one never
// (its silence on other links tells).
void Mesh::Impl::dial_loop() {
  DialState d;
  while (!stopping) {
    std::optional<DialChoice> next = choose_dial(d);
    if (stopping) return;
    if (!next) continue;
    const auto limit = std::max(settings.dead_after, std::chrono::milliseconds(1000));
    auto fd = dial_once(d.target, limit);
    d.hurry = false;
    if (fd) {
      adopt(d.target, fd->first, std::string(), fd->second);
      continue;
    }
    if (!on_dial_failed(d, *next, fd.error())) continue;
    // Back off while a peer has not started yet: a constant number of file lookups per second.
    std::this_thread::sleep_for(d.pause);
    d.pause = std::min(d.pause * 3 / 2, std::chrono::milliseconds(250));
  }
}

std::optional<Mesh::Impl::DialChoice> Mesh::Impl::choose_dial(DialState& d) {
  constexpr auto kProbeAfter = std::chrono::milliseconds(300);
  std::unique_lock<std::mutex> lock(mu);
  auto wanted = [&]() -> int {
    if (quiet) return -1;
    if (view.up && links.count(*view.up) == 0 && !gone[static_cast<std::size_t>(*view.up)]) return *view.up;
    if (!go || (!d.hurry && Clock::now() - view_since < kProbeAfter)) return -1;
    for (int down : view.down) {
      if (links.count(down) == 0 && d.given_up.count(down) == 0) return down;
    }
    return -1;
  };
  cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping.load() || wanted() >= 0; });
  if (stopping) return std::nullopt;
  if (view_version != d.seen_version) {
    d.seen_version = view_version;
    d.given_up.clear();
  }
  const int next = wanted();
  if (next < 0) return std::nullopt;
  if (next != d.target) {
    d.target = next;
    d.since = Clock::now();
    d.pause = std::chrono::milliseconds(20);
  }
  return DialChoice{go, !(view.up && *view.up == next)};
}

bool Mesh::Impl::on_dial_failed(DialState& d, const DialChoice& choice, const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu);
    dial_error = "rank " + std::to_string(d.target) + " at " + error;
  }
  if (!choice.started) return true;
  if (rendezvous->tells_leaves() && !read_address(d.target)) {
    mark_gone(d.target, "left", false, -1);
    return false;
  }
  if (last_dial_refused && !rendezvous->tells_leaves()) {
    // PMIx keeps no trace of an orderly leave: a peer that said goodbye is announced by its neighbours' kGone,
    // which floods in within a few hops. Give that news the time before taking the refusal for a death.
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, kLeaveNews, [&] { return stopping.load() || gone[static_cast<std::size_t>(d.target)] != 0; })) {
      return false;
    }
  }
  if (last_dial_refused) {
    mark_gone(d.target, "its connection is refused: " + error, true, -1);
    d.hurry = choice.probe;
    return false;
  }
  if (choice.probe) {
    d.given_up.insert(d.target);
    return false;
  }
  if (Clock::now() - d.since > kSlowFactor * settings.dead_after) {
    mark_gone(d.target, "cannot reach it: " + error, true, -1);
    return false;
  }
  return true;
}

std::vector<int> Mesh::probe(const std::vector<int>& ranks, std::chrono::milliseconds limit) {
  // The sockets one probe holds open at once: a failure of up to 1,024 ranks at once (128 nodes of 8) is found in
  // one limit, with a quarter of this process's descriptors at most (the last words open files meanwhile); the rest
  // are left to the mesh's repair.
  rlimit files{};
  const std::size_t max_probes =
      ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
          ? std::clamp<std::size_t>(static_cast<std::size_t>(files.rlim_cur / 4), 16, 1024)
          : 1024;
  Impl& m = *impl_;
  struct Probe {
    int peer = -1;
    posix::Fd fd;
    std::string host, port;  // as the rank published them
    std::string dialed() const { return host + " " + port; }
    Handshake hello;
    bool sent = false;
    int redials = 0;
  };
  std::vector<Probe> open;
  std::vector<std::pair<int, std::string>> dead;  // rank, why
  // Only a rank a death cut off: its link in the whole network goes up to a rank now gone, or to one of `ranks`
  // (unheard as well) whose own does, and so on (a frozen group below a frozen group: several nodes at once). Any
  // other is linked to a live rank, whose link tells of its death. The walk is the tree's depth at most.
  const std::set<int> asked(ranks.begin(), ranks.end());
  auto cut_off = [&](int rank) {  // mu held
    for (std::optional<int> up = overlay::up_when_whole(m.shape, rank); up; up = overlay::up_when_whole(m.shape, *up)) {
      if (m.gone[static_cast<std::size_t>(*up)]) return true;
      if (asked.count(*up) == 0) return false;
    }
    return false;
  };
  auto refused = [&](const Probe& p) {
    dead.emplace_back(p.peer, "its connection is refused: " + p.dialed() + ": " + errno_text(ECONNREFUSED));
  };
  // Opens (or opens again) a probe's connection; false when it cannot be open: refused (its process is gone, and
  // `dead` says so) or another error (nothing known).
  auto dial = [&](Probe& p) {
    const int fd = posix::connect_start(p.host, p.port);
    if (fd < 0) {
      if (errno == ECONNREFUSED) refused(p);
      return false;
    }
    p.fd = posix::Fd(fd);
    p.sent = false;
    return true;
  };
  // A connection that closes before the answer came was accepted by a process on its way out (a killed rank's
  // kernel holds its listener until its memory is torn down) or, rarely, turned away by a live one: dialed again,
  // the first is refused and the second answers. A few times at most within the limit.
  constexpr int kRedials = 3;
  auto closed_unanswered = [&](Probe& p) {  // true when the probe stays open
    return p.redials++ < kRedials && dial(p);
  };
  for (int peer : ranks) {
    if (open.size() >= max_probes) break;
    if (peer < 0 || peer >= m.settings.world_size || peer == m.settings.rank) continue;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      if (m.quiet || m.gone[static_cast<std::size_t>(peer)] || !cut_off(peer)) continue;
    }
    auto addr = m.read_address(peer);
    if (!addr) continue;  // not published, or (files) left in order
    Probe p;
    p.peer = peer;
    p.host = addr->first;
    p.port = addr->second;
    p.hello = m.handshake(kHelloProbe);
    if (!random_bytes(p.hello.nonce, sizeof p.hello.nonce)) continue;
    if (!dial(p)) {
      if (errno == EMFILE || errno == ENFILE) break;  // no descriptor left: probe those open
      continue;
    }
    open.push_back(std::move(p));
  }
  // Each probe: connected (POLLOUT) -> hello sent -> the answer read (POLLIN). Done ones leave `open`.
  const auto until = Clock::now() + limit;
  for (bool last = false; !open.empty() && !last;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    last = left.count() <= 0;  // one more look at what came, however late this thread ran
    std::vector<pollfd> pfds;
    for (const Probe& p : open) pfds.push_back(pollfd{p.fd.get(), static_cast<short>(p.sent ? POLLIN : POLLOUT), 0});
    const int n = ::poll(pfds.data(), pfds.size(), last ? 0 : static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) {
      open.clear();  // this rank cannot tell: nobody counts as silent
      break;
    }
    std::vector<Probe> still;
    for (std::size_t i = 0; i < open.size(); ++i) {
      Probe& p = open[i];
      bool done = false;
      if (n > 0 && pfds[i].revents != 0 && !p.sent) {
        int err = 0;
        socklen_t len = sizeof err;
        (void)::getsockopt(p.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == ECONNREFUSED) {
          refused(p);
          done = true;
        } else if (err == ECONNRESET) {
          done = !closed_unanswered(p);
        } else if (err != 0 || ::send(p.fd.get(), &p.hello, sizeof p.hello, MSG_NOSIGNAL | MSG_DONTWAIT) !=
                                   static_cast<ssize_t>(sizeof p.hello)) {
          done = true;  // 104 bytes into a new connection's empty buffer are never partial
        } else {
          p.sent = true;
        }
      } else if (n > 0 && pfds[i].revents != 0) {
        // Its mesh thread answered: not a silent rank. Closed without an answer: asked again.
        char buf[sizeof(Handshake)];
        const ssize_t got = ::recv(p.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
        if (got > 0) {
          done = true;
        } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
          done = !closed_unanswered(p);
        }
      }
      if (!done) still.push_back(std::move(p));
    }
    open = std::move(still);
  }
  for (const Probe& p : open) {
    dead.emplace_back(p.peer, "no answer to a probe within " + std::to_string(limit.count()) + " ms (" + p.dialed() +
                                  (p.sent ? ": connected" : ": not connected") + ")");
  }
  std::vector<int> found;
  for (const auto& [peer, why] : dead) {
    m.mark_gone(peer, why, true, -1);
    found.push_back(peer);
  }
  return found;
}

void Mesh::Impl::unpublish() {
  if (rendezvous) rendezvous->withdraw();
}

void Mesh::Impl::accept_new() {
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (pending.size() >= kMaxPending) {
      refusals->refused(peer_text(from), "too many connections in their handshake");
      ::close(fd);
      continue;
    }
    Pending c;
    c.fd = fd;
    c.peer = peer_text(from);
    c.until = Clock::now() + kHandshakeLimit;
    pending.push_back(std::move(c));
  }
}

bool Mesh::Impl::advance(Pending& c) {
  auto refuse = [&](const std::string& why) {
    // Two ranks that dial each other at once (a repair: the new leader dials up while its parent probes it) race
    // to one link: the loser is closed without a line.
    if (why.find("linked already") == std::string::npos) refusals->refused(c.peer, why);
    ::close(c.fd);
    return false;
  };
  auto known = [&](int rank) {
    std::lock_guard<std::mutex> lock(mu);
    if (gone[static_cast<std::size_t>(rank)]) return std::string(", which is gone");
    if (links.count(rank) != 0) return std::string(", which is linked already");
    return std::string();
  };
  if (!c.replied) {
    if (c.in.size() < sizeof(Handshake)) return true;
    if (c.in.size() > sizeof(Handshake)) return refuse("it sent more than a hello before the reply");
    std::memcpy(&c.hello, c.in.data(), sizeof(Handshake));
    c.in.clear();
    const Frame& h = c.hello.head;
    if (h.pad != kMagic || (h.type != kHello && h.type != kHelloPartner && h.type != kHelloProbe)) {
      return refuse("not a mesh hello");
    }
    if (h.from < 0 || h.from >= settings.world_size || h.from == settings.rank) {
      return refuse("it claims rank " + std::to_string(h.from) + ", not another rank of this job");
    }
    if (h.type == kHello) {
      if (std::string why = known(h.from); !why.empty()) return refuse("it claims rank " + std::to_string(h.from) + why);
    }
    c.reply = handshake(h.type);
    if (!random_bytes(c.reply.nonce, sizeof c.reply.nonce)) return refuse("getrandom: " + errno_text(errno));
    auto mac = handshake_mac(secret, kAcceptLabel, c.hello, c.reply, address);
    std::memcpy(c.reply.mac, mac.data(), mac.size());
    // 104 bytes into the empty send buffer of a new connection: never partial.
    if (::send(c.fd, &c.reply, sizeof c.reply, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof c.reply)) {
      return refuse("cannot answer its hello: " + errno_text(errno));
    }
    if (h.type == kHelloProbe) {  // answered: the prober knows this rank's mesh thread runs, and wants no link
      ::close(c.fd);
      return false;
    }
    c.replied = true;
    return true;
  }
  if (c.in.size() < sizeof(Handshake)) return true;
  Handshake proof;
  std::memcpy(&proof, c.in.data(), sizeof proof);
  const int from = c.hello.head.from;
  if (proof.head.pad != kMagic || proof.head.type != kProof || proof.head.from != from ||
      !mac_matches(handshake_mac(secret, kDialLabel, c.hello, c.reply, address), proof.mac)) {
    return refuse("it claims rank " + std::to_string(from) + " without knowing the job's secret");
  }
  if (c.hello.head.type == kHelloPartner) {
    const int flags = ::fcntl(c.fd, F_GETFL);  // a partner link is read by a thread of its own: blocking
    if (flags >= 0) (void)::fcntl(c.fd, F_SETFL, flags & ~O_NONBLOCK);
    Mesh::PartnerAcceptor to;
    {
      std::lock_guard<std::mutex> lock(mu);
      to = partner_acceptor;
      if (!to && settings.hold_partner_links && !partner_decided) {  // this rank's tier is not up yet
        held_partners.push_back({c.fd, from, c.in.substr(sizeof(Handshake))});
        return false;
      }
    }
    if (!to) return refuse("rank " + std::to_string(from) + " offers a partner copy, and this rank keeps none");
    to(c.fd, from, c.in.substr(sizeof(Handshake)));
    return false;
  }
  if (std::string why = known(from); !why.empty()) return refuse("it claims rank " + std::to_string(from) + why);
  // The dialer may have sent frames right after its proof: they are the link's first.
  adopt(from, c.fd, c.in.substr(sizeof(Handshake)),
        PeerId{c.hello.head.a, static_cast<int>(c.hello.head.b), c.hello.head.spare});
  return false;
}

void Mesh::Impl::service_pending(const std::vector<char>& readable) {
  const auto now = Clock::now();
  std::vector<Pending> next;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    Pending& c = pending[i];
    bool open = true;
    if (i < readable.size() && readable[i]) {
      char buf[256];
      ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        open = advance(c);
      } else if (n == 0 && !c.replied && c.in.empty()) {
        // Connected and closed without a byte: a peer's probe (Mesh::probe), or a port check. Nothing to refuse.
        ::close(c.fd);
        open = false;
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        refusals->refused(c.peer, "it closed the connection during the handshake");
        ::close(c.fd);
        open = false;
      }
    }
    if (open && now >= c.until) {
      refusals->refused(c.peer, "no handshake within " + std::to_string(kHandshakeLimit.count()) + " s");
      ::close(c.fd);
      open = false;
    }
    if (open) next.push_back(std::move(c));
  }
  pending = std::move(next);
}

}  // namespace ckpt::hooks::heartbeat
