// The heartbeat network at run time: the mesh thread's loop (a heartbeat on every link each period, frames in and
// out, silence judged over the time this thread ran), deaths and orderly leaves flooded over every link, the start
// barrier, and send() from any thread. Making links (the handshake, the dialer) is in heartbeat_handshake.cpp.
#include "heartbeat.hpp"

#include <poll.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "ckpt/inplace.hpp"
#include "ckpt/posix.hpp"
#include "ckpt/store.hpp"
#include "heartbeat_impl.hpp"
#include "log.hpp"

namespace ckpt::hooks::heartbeat {

namespace {

using posix::errno_text;

// A process forked from a rank (a data loader's workers) inherits the mesh's sockets. Were they left open there, a
// rank that dies would look frozen (no EOF reaches its peers until the workers exit) instead of closed. So the
// sockets of every running mesh are listed in slots, and a fork handler closes them in the child, where the mesh
// does not run. The child reads the slots without locks: they are a copy of memory, and only close() is called.
constexpr int kMaxMeshes = 16;
std::atomic<SocketSlots*> mesh_sockets[kMaxMeshes];

void close_mesh_sockets_in_child() {
  for (auto& mesh : mesh_sockets) {
    SocketSlots* slots = mesh.load(std::memory_order_relaxed);
    if (slots == nullptr) continue;
    for (auto& slot : *slots) {
      int fd = slot.load(std::memory_order_relaxed);
      if (fd >= 0) ::close(fd);
    }
  }
}

void register_mesh(SocketSlots* slots) {
  static std::once_flag handler;
  std::call_once(handler, [] { (void)::pthread_atfork(nullptr, nullptr, close_mesh_sockets_in_child); });
  for (auto& slot : *slots) slot.store(-1);
  for (auto& mesh : mesh_sockets) {
    SocketSlots* empty = nullptr;
    if (mesh.compare_exchange_strong(empty, slots)) return;
  }
  // More meshes than slots in one process (not a real job): their sockets stay open in forked children.
}

void unregister_mesh(SocketSlots* slots) {
  for (auto& mesh : mesh_sockets) {
    SocketSlots* mine = slots;
    if (mesh.compare_exchange_strong(mine, nullptr)) return;
  }
}

// The scheduler state of a process on this host ('R', 'S', 'D', 'T' stopped, ...), or 0 when it is gone.
char process_state(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 0;
  char buf[512] = {};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* close = static_cast<const char*>(std::memchr(buf, ')', n));  // after the command name
  return close != nullptr && close + 2 < buf + n ? close[2] : 0;
}

// A link whose peer stopped reading: more than this waiting in its outbox and it is taken for dead.
constexpr std::size_t kMaxOutbox = std::size_t{16} << 20;

std::string seconds_text(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace

Mesh::Impl::~Impl() {
  stopping = true;
  cv.notify_all();
  if (thread.joinable()) thread.join();
  if (dialer.joinable()) dialer.join();
  unregister_mesh(&sockets);
  // After a goodbye, a close must not read as a death: what a link still had to send goes first (the goodbye may
  // be in it), a dialer that sent its proof has adopted the link already though this end never read it, and no
  // link closes before its peer read the goodbye.
  std::vector<int> after_bye = std::move(answered);
  const Frame bye = frame(kBye);
  for (auto& [peer, link] : links) {
    if (link.fd < 0) continue;
    if (!quiet) {
      ::close(link.fd);
      continue;
    }
    if (!link.outbox.empty()) {
      (void)::send(link.fd, link.outbox.data(), link.outbox.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    after_bye.push_back(link.fd);
  }
  for (Pending& c : pending) {
    if (quiet && c.replied && ::send(c.fd, &bye, sizeof bye, MSG_NOSIGNAL | MSG_DONTWAIT) == sizeof bye) {
      after_bye.push_back(c.fd);
    } else {
      ::close(c.fd);
    }
  }
  close_after_bye(after_bye);
  for (HeldPartner& h : held_partners) ::close(h.fd);
  if (listener >= 0) ::close(listener);
  if (dirfd >= 0) ::close(dirfd);
}

void Mesh::Impl::close_after_bye(const std::vector<int>& fds) {
  constexpr auto kByeLinger = std::chrono::milliseconds(250);
  std::vector<pollfd> open;
  for (int fd : fds) {
    (void)::shutdown(fd, SHUT_WR);  // the goodbye, then the end of what this rank sends
    open.push_back({fd, POLLIN, 0});
  }
  const auto deadline = Clock::now() + kByeLinger;
  char buf[4096];
  while (!open.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || ::poll(open.data(), open.size(), static_cast<int>(left)) < 0) break;
    for (pollfd& p : open) {
      if (p.revents == 0) continue;
      ssize_t n = 0;
      while ((n = ::recv(p.fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
      }
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        ::close(p.fd);  // the peer closed: it read the goodbye (or is gone)
        p.fd = -1;
      }
    }
    open.erase(std::remove_if(open.begin(), open.end(), [](const pollfd& p) { return p.fd < 0; }), open.end());
  }
  for (const pollfd& p : open) ::close(p.fd);
}

void Mesh::Impl::list_socket(int fd) {
  for (auto& slot : sockets) {
    int empty = -1;
    if (slot.compare_exchange_strong(empty, fd)) return;
  }
}

void Mesh::Impl::unlist_socket(int fd) {
  for (auto& slot : sockets) {
    int mine = fd;
    if (slot.compare_exchange_strong(mine, -1)) return;
  }
}

Frame Mesh::Impl::frame(std::uint32_t type) const {
  Frame f;
  f.type = type;
  f.from = settings.rank;
  f.pad = kMagic;
  return f;
}

void Mesh::Impl::refresh_view_locked() {
  view = overlay::links_of(shape, settings.rank, gone);
  view_since = Clock::now();
  ++view_version;
  cv.notify_all();  // the dialer links to a new up neighbour, or probes new down ones
}

void Mesh::Impl::mark_gone(int peer, const std::string& why, bool died_now, int told_by) {
  if (peer < 0 || peer >= settings.world_size) return;
  if (peer == settings.rank) {
    // The others count this rank out (they judged it silent): it takes no part any more, and says so once.
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      first = !died[static_cast<std::size_t>(peer)];
      died[static_cast<std::size_t>(peer)] = 1;
    }
    if (!first || quiet) return;
    Event e;
    e.kind = Event::Kind::PeerDead;
    e.peer = peer;
    e.why = why;
    handler(e);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (gone[static_cast<std::size_t>(peer)]) return;
    gone[static_cast<std::size_t>(peer)] = 1;
    died[static_cast<std::size_t>(peer)] = died_now ? 1 : 0;
    auto it = links.find(peer);
    if (it != links.end() && it->second.fd >= 0) ::shutdown(it->second.fd, SHUT_RDWR);  // closed by the mesh thread
    refresh_view_locked();
    if (!quiet) {
      const Frame news = GoneFrame{peer, died_now}.to_frame();
      for (auto& [other, link] : links) {
        if (other != told_by && other != peer) send_locked(other, news);
      }
    }
  }
  cv.notify_all();
  if (quiet) return;
  Event e;
  e.kind = died_now ? Event::Kind::PeerDead : Event::Kind::PeerLeft;
  e.peer = peer;
  e.why = why;
  handler(e);
}

bool Mesh::Impl::send_locked(int peer, const Frame& frame_in) {
  auto it = links.find(peer);
  if (it == links.end() || it->second.fd < 0 || gone[static_cast<std::size_t>(peer)]) return false;
  Link& link = it->second;
  Frame f = frame_in;
  f.from = settings.rank;
  f.pad = kMagic;
  const char* data = reinterpret_cast<const char*>(&f);
  if (!link.outbox.empty()) {
    link.outbox.append(data, sizeof f);
  } else {
    ssize_t n = ::send(link.fd, data, sizeof f, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) n = 0;
    if (n < 0) return false;  // the mesh thread sees the error on its next read
    if (static_cast<std::size_t>(n) < sizeof f) link.outbox.append(data + n, sizeof f - static_cast<std::size_t>(n));
  }
  if (link.outbox.size() > kMaxOutbox) {
    link.broken = "it has not read " + std::to_string(link.outbox.size()) + " bytes sent to it";
    ::shutdown(link.fd, SHUT_RDWR);
  }
  return true;
}

bool Mesh::Impl::send(int peer, Frame f) {
  std::lock_guard<std::mutex> lock(mu);
  return send_locked(peer, f);
}

void Mesh::Impl::flood(Frame f, int except) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [peer, link] : links) {
    if (peer != except) send_locked(peer, f);
  }
}

void Mesh::Impl::adopt(int peer, int fd, std::string first_bytes, const PeerId& who) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (quiet) {
      // A link that completes after this rank said goodbye gets the goodbye too: closing it bare reads as a death.
      // Asked under mu: say_bye() floods under it, so a link is either among those it reached or answered here.
      const Frame bye = frame(kBye);
      // Kept to close with the links, once the peer read it; a few dozen at most (a peer that keeps dialing a rank
      // that left gets a bare close).
      if (answered.size() < kMaxPending &&
          ::send(fd, &bye, sizeof bye, MSG_NOSIGNAL | MSG_DONTWAIT) == sizeof bye) {
        answered.push_back(fd);
      } else {
        ::close(fd);
      }
      return;
    }
    if (gone[static_cast<std::size_t>(peer)] || links.count(peer) != 0 || stopping) {
      ::close(fd);
      return;
    }
    Link& link = links[peer];
    link.fd = fd;
    link.inbox = std::move(first_bytes);
    link.seen = Clock::now();
    if (who.host != 0 && who.host == host_tag && who.pid > 0) link.local_pid = who.pid;
    list_socket(fd);
    // What this rank knows is gone, so that a neighbour made by a failure shares the view.
    for (int r = 0; r < settings.world_size; ++r) {
      if (!gone[static_cast<std::size_t>(r)]) continue;
      send_locked(peer, GoneFrame{r, died[static_cast<std::size_t>(r)] != 0}.to_frame());
    }
    advance_barrier_locked();
  }
  cv.notify_all();
  if (quiet) return;
  Event e;
  e.kind = Event::Kind::LinkUp;
  e.peer = peer;
  handler(e);
}

void Mesh::Impl::advance_barrier_locked() {
  if (go || joined_sent) return;
  if (!view.is_root && !(view.up && links.count(*view.up) != 0)) return;
  std::uint64_t total = 1;
  for (int d : view.down) {
    auto it = joined.find(d);
    if (it == joined.end()) return;
    total += it->second;
  }
  if (!view.is_root) {
    joined_sent = send_locked(*view.up, JoinedFrame{total}.to_frame());
    return;
  }
  if (total < static_cast<std::uint64_t>(settings.world_size)) return;
  go = true;
  for (auto& [peer, link] : links) send_locked(peer, frame(kGo));
  cv.notify_all();
}

void Mesh::Impl::deliver(int peer, const Frame& f) {
  switch (f.type) {
    case kHeartbeat:
      return;
    case kBye:
      mark_gone(peer, "left", false, peer);
      return;
    case kGone: {
      const GoneFrame news = GoneFrame::from_frame(f);
      if (news.rank < 0 || news.rank >= settings.world_size) return;
      std::string why = news.rank == settings.rank
                            ? "rank " + std::to_string(peer) + " says the job counts this rank as dead"
                            : (news.died ? "rank " + std::to_string(peer) + " says it died" : "left");
      mark_gone(news.rank, why, news.died, peer);
      return;
    }
    case kJoined: {
      std::lock_guard<std::mutex> lock(mu);
      joined[peer] = JoinedFrame::from_frame(f).ranks;
      advance_barrier_locked();
      return;
    }
    case kGo: {
      std::lock_guard<std::mutex> lock(mu);
      if (go) return;
      go = true;
      for (auto& [other, link] : links) {
        if (other != peer) send_locked(other, frame(kGo));
      }
      cv.notify_all();
      return;
    }
    default:
      break;
  }
  if (quiet) return;
  Event e;
  e.kind = Event::Kind::Frame;
  e.peer = peer;
  e.frame = f;
  handler(e);
}

void Mesh::Impl::receive(int peer, Link& link) {
  char buf[8192];
  for (;;) {
    // Frames first, then more bytes: a link can be adopted with frames already in (a goodbye right after the
    // handshake), and those must be read before its close.
    std::size_t used = 0;
    while (link.inbox.size() - used >= sizeof(Frame)) {
      Frame f;
      std::memcpy(&f, link.inbox.data() + used, sizeof f);
      used += sizeof f;
      if (f.pad != kMagic || f.from != peer) {
        mark_gone(peer, "a malformed frame", true, -1);
        return;
      }
      deliver(peer, f);
    }
    link.inbox.erase(0, used);
    ssize_t n = ::recv(link.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      std::string why;
      {
        std::lock_guard<std::mutex> lock(mu);
        why = link.broken;
      }
      if (why.empty()) why = n == 0 ? "EOF" : errno_text(errno);
      mark_gone(peer, why, true, -1);
      return;
    }
    link.seen = Clock::now();
    link.inbox.append(buf, static_cast<std::size_t>(n));
  }
}

void Mesh::Impl::flush_outboxes() {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [peer, link] : links) {
    if (link.outbox.empty() || link.fd < 0) continue;
    ssize_t n = ::send(link.fd, link.outbox.data(), link.outbox.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) link.outbox.erase(0, static_cast<std::size_t>(n));
  }
}

void Mesh::Impl::loop() {
  auto next_beat = Clock::now();
  auto last_turn = Clock::now();
  std::vector<pollfd> pfds;
  std::vector<int> who;  // the peer of each link's pollfd
  while (!stopping) {
    auto now = Clock::now();
    // A turn that comes much later than this loop asked for means this thread did not run (an overloaded host):
    // that time is this rank's stall, not its peers' silence.
    const auto lag = now - last_turn;
    last_turn = now;
    if (lag > 3 * settings.period) {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& [peer, link] : links) link.seen += lag;
    }
    if (now >= next_beat) {
      std::lock_guard<std::mutex> lock(mu);
      const Frame beat = frame(kHeartbeat);
      for (auto& [peer, link] : links) send_locked(peer, beat);
      next_beat = now + settings.period;
    }
    gather_pollfds(pfds, who);
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_beat - Clock::now()).count();
    int ready = ::poll(pfds.data(), pfds.size(), static_cast<int>(std::clamp<long long>(wait, 0, 100)));
    if (ready > 0) {
      on_poll_ready(pfds, who);
    } else {
      std::vector<char> none(pending.size(), 0);
      service_pending(none);  // handshakes past their limit
    }
    judge_silence();
  }
}

void Mesh::Impl::gather_pollfds(std::vector<pollfd>& pfds, std::vector<int>& who) {
  pfds.clear();
  who.clear();
  pfds.push_back({listener, POLLIN, 0});
  for (const Pending& c : pending) pfds.push_back({c.fd, POLLIN, 0});
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = links.begin(); it != links.end();) {
    if (gone[static_cast<std::size_t>(it->first)]) {
      unlist_socket(it->second.fd);
      ::close(it->second.fd);
      it = links.erase(it);
      continue;
    }
    short events = POLLIN;
    if (!it->second.outbox.empty()) events |= POLLOUT;
    pfds.push_back({it->second.fd, events, 0});
    who.push_back(it->first);
    ++it;
  }
}

void Mesh::Impl::on_poll_ready(const std::vector<pollfd>& pfds, const std::vector<int>& who) {
  const std::size_t first_link = 1 + pending.size();
  std::vector<char> readable(pending.size());
  for (std::size_t i = 0; i < pending.size(); ++i) readable[i] = pfds[1 + i].revents != 0;
  service_pending(readable);
  if ((pfds[0].revents & POLLIN) != 0) accept_new();
  bool flush = false;
  for (std::size_t i = first_link; i < pfds.size(); ++i) {
    if (pfds[i].revents == 0) continue;
    const int peer = who[i - first_link];
    if ((pfds[i].revents & POLLOUT) != 0) flush = true;
    if ((pfds[i].revents & ~POLLOUT) == 0) continue;
    Link* link = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = links.find(peer);
      if (it != links.end()) link = &it->second;  // erased only by this thread
    }
    if (link != nullptr) receive(peer, *link);
  }
  if (flush) flush_outboxes();
}

// Silence, judged after a turn's reads: a peer silent for dead_after is dead, unless its process runs on this
// host (slow, not dead, up to kSlowFactor limits).
void Mesh::Impl::judge_silence() {
  const auto now = Clock::now();
  struct Silent {
    int peer;
    Clock::duration quiet_for;
    int local_pid;
  };
  std::vector<Silent> silent;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [peer, link] : links) {
      if (!gone[static_cast<std::size_t>(peer)] && now - link.seen > settings.dead_after) {
        silent.push_back({peer, now - link.seen, link.local_pid});
      }
    }
  }
  for (const Silent& s : silent) {
    std::string why = "no heartbeat for " + seconds_text(s.quiet_for);
    if (s.local_pid > 0) {
      // On this host the peer's process tells: stopped or gone is dead; runnable is slow, up to a limit.
      const char state = process_state(s.local_pid);
      // Stopped (SIGSTOP: 'T'), a zombie or gone is dead. Anything else (running, sleeping, in the disk, a
      // tracing stop between two syscalls of strace or a debugger) is slow.
      const bool ended = state == 0 || state == 'T' || state == 'Z' || state == 'X' || state == 'x';
      if (!ended && s.quiet_for < kSlowFactor * settings.dead_after) {
        Link* link = nullptr;
        {
          std::lock_guard<std::mutex> lock(mu);
          auto it = links.find(s.peer);
          if (it != links.end()) link = &it->second;
        }
        if (link != nullptr && !link->slow_logged) {
          link->slow_logged = true;
          log::info(settings.rank, "heartbeat: rank " + std::to_string(s.peer) + " is silent for " +
                                       seconds_text(s.quiet_for) + " but its process runs on this host: slow, not "
                                       "dead (dead after " +
                                       seconds_text(kSlowFactor * settings.dead_after) + ")");
        }
        continue;
      }
      why += state == 0     ? std::string(" (its process is gone)")
             : state == 'T' ? std::string(" (its process is stopped)")
                            : std::string(" (its process is in state ") + state + ")";
    }
    mark_gone(s.peer, why, true, -1);
  }
}

Mesh::Mesh(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Mesh::~Mesh() = default;

Result<std::unique_ptr<Mesh>> Mesh::start(const Settings& settings, Handler handler) {
  if (settings.world_size < 1 || settings.rank < 0 || settings.rank >= settings.world_size || settings.group_size < 1) {
    return Error{"ckpt: heartbeat: bad rank " + std::to_string(settings.rank) + " of " +
                 std::to_string(settings.world_size)};
  }
  auto impl = std::make_unique<Impl>();
  impl->settings = settings;
  impl->handler = std::move(handler);
  impl->shape = overlay::Shape{settings.world_size, settings.group_size};
  impl->gone.assign(static_cast<std::size_t>(settings.world_size), 0);
  impl->died.assign(static_cast<std::size_t>(settings.world_size), 0);
  impl->view = overlay::links_of(impl->shape, settings.rank, impl->gone);
  impl->view_since = Clock::now();
  register_mesh(&impl->sockets);
  if (Status s = impl->prepare(); !s) return Error{s.error()};
  const auto deadline = Clock::now() + settings.connect_timeout;
  Impl* p = impl.get();
  impl->thread = std::thread([p] { p->loop(); });
  impl->dialer = std::thread([p] { p->dial_loop(); });
  {
    std::unique_lock<std::mutex> lock(impl->mu);
    impl->advance_barrier_locked();  // a lone rank is the whole job
    // The watched processes are dialed every watch period meanwhile: one that refuses is gone, and with it the join.
    const auto period = std::chrono::milliseconds(ckpt::inplace::kWatchPeriodMs);
    bool joined = false;
    for (;;) {
      const auto next = settings.watched.empty() ? deadline : std::min(deadline, Clock::now() + period);
      joined = impl->cv.wait_until(lock, next, [p] { return p->go; });
      if (joined || Clock::now() >= deadline) break;
      lock.unlock();
      const std::string gone = posix::first_refused(settings.watched, 200);
      lock.lock();
      if (!gone.empty()) {
        return Error{"ckpt: heartbeat: not every rank joined the mesh: a new rank is gone (its mailbox at " + gone +
                     " refuses connections)"};
      }
    }
    if (!joined) {
      std::string missing;
      if (impl->view.up && impl->links.count(*impl->view.up) == 0) {
        missing = "no link to rank " + std::to_string(*impl->view.up) +
                  (impl->dial_error.empty() ? "" : " (last try: " + impl->dial_error + ")");
      } else {
        for (int d : impl->view.down) {
          if (impl->joined.count(d) == 0) missing += (missing.empty() ? "waiting for rank " : ", ") + std::to_string(d);
        }
        if (missing.empty()) missing = "the root has not said every rank joined";
      }
      return Error{"ckpt: heartbeat: not every rank joined the mesh within " +
                   std::to_string(settings.connect_timeout.count() / 1000) + " s: " + missing};
    }
  }
  return std::unique_ptr<Mesh>(new Mesh(std::move(impl)));
}

bool Mesh::send(int peer, Frame frame) { return impl_->send(peer, frame); }

bool Mesh::send_up(Frame frame) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->view.up) return false;
  return impl_->send_locked(*impl_->view.up, frame);
}

void Mesh::flood(Frame frame, int except) { impl_->flood(frame, except); }

void Mesh::say_bye() {
  impl_->quiet = true;  // neighbours answer a goodbye by closing: that must not read as their death
  impl_->unpublish();
  impl_->flood(impl_->frame(kBye), -1);
}

overlay::Links Mesh::links() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->view;
}

overlay::Gone Mesh::gone() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->gone;
}

Result<int> Mesh::dial_partner(int peer, std::chrono::milliseconds limit, const SocketWatch& on_socket) {
  if (peer < 0 || peer >= impl_->settings.world_size || peer == impl_->settings.rank) {
    return Error{"rank " + std::to_string(peer) + " is not another rank of this job"};
  }
  auto linked = impl_->dial_once(peer, limit, kHelloPartner, on_socket);
  if (!linked) return Error{linked.error()};
  return linked->first;
}

void Mesh::set_partner_acceptor(PartnerAcceptor acceptor) {
  std::vector<Impl::HeldPartner> held;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->partner_acceptor = acceptor;
    impl_->partner_decided = true;
    held.swap(impl_->held_partners);
  }
  for (Impl::HeldPartner& h : held) {
    if (acceptor) {
      acceptor(h.fd, h.from, std::move(h.early));
    } else {
      ::close(h.fd);  // this rank keeps no copies: the dialer sees its link end
    }
  }
}

std::string Mesh::node_of(int peer) const {
  if (peer < 0 || peer >= impl_->settings.world_size) return "";
  return impl_->read_node(peer);
}

std::vector<int> Mesh::died() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<int> out;
  for (int r = 0; r < impl_->settings.world_size; ++r) {
    if (impl_->gone[static_cast<std::size_t>(r)] && impl_->died[static_cast<std::size_t>(r)]) out.push_back(r);
  }
  return out;
}

bool Mesh::left(int rank) const {
  if (rank < 0 || rank >= impl_->settings.world_size) return false;
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto r = static_cast<std::size_t>(rank);
  return impl_->gone[r] && !impl_->died[r];
}

std::size_t Mesh::link_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->links.size();
}

}  // namespace ckpt::hooks::heartbeat
