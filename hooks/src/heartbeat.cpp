// The heartbeat mesh at run time: the mesh thread's loop (a heartbeat to every peer each period, a peer that is
// silent for dead_after or whose connection closes declared dead), the frames it receives and delivers to the
// handler, and send() from any thread. Joining the mesh (the handshake) is in heartbeat_handshake.cpp.
#include "heartbeat.hpp"

#include <poll.h>
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

#include "ckpt/store.hpp"
#include "heartbeat_impl.hpp"
#include "log.hpp"

namespace ckpt::hooks::heartbeat {

namespace {

using store::errno_text;

// A process forked from a rank (a data loader's workers) inherits the mesh's sockets. Were they left open there, a
// rank that dies would look frozen (no EOF reaches its peers until the workers exit) instead of closed. So the
// sockets of every running mesh are listed here, and a fork handler closes them in the child, where the mesh
// does not run. The child reads the list without locks: it is a copy of memory, and only close() is called.
constexpr int kMaxMeshes = 16;
std::atomic<const std::vector<int>*> mesh_sockets[kMaxMeshes];

void close_mesh_sockets_in_child() {
  for (auto& slot : mesh_sockets) {
    const std::vector<int>* fds = slot.load(std::memory_order_relaxed);
    if (fds == nullptr) continue;
    for (int fd : *fds) {
      if (fd >= 0) ::close(fd);
    }
  }
}

void list_mesh_sockets(const std::vector<int>* fds) {
  static std::once_flag handler;
  std::call_once(handler, [] { (void)::pthread_atfork(nullptr, nullptr, close_mesh_sockets_in_child); });
  for (auto& slot : mesh_sockets) {
    const std::vector<int>* empty = nullptr;
    if (slot.compare_exchange_strong(empty, fds)) return;
  }
  // More meshes than slots in one process (not a real job): their sockets stay open in forked children.
}

void unlist_mesh_sockets(const std::vector<int>* fds) {
  for (auto& slot : mesh_sockets) {
    const std::vector<int>* mine = fds;
    if (slot.compare_exchange_strong(mine, nullptr)) return;
  }
}

}  // namespace

Mesh::Impl::~Impl() {
  stopping = true;
  if (thread.joinable()) thread.join();
  unlist_mesh_sockets(&fds);
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
}

Frame Mesh::Impl::frame(std::uint32_t type) const {
  Frame f;
  f.type = type;
  f.from = settings.rank;
  f.pad = kMagic;
  return f;
}

// Marks a peer dead (once) and tells the handler; any thread.
void Mesh::Impl::kill(int peer, const std::string& why, Event::Kind kind) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!alive[static_cast<std::size_t>(peer)]) return;
    alive[static_cast<std::size_t>(peer)] = false;
    int& fd = fds[static_cast<std::size_t>(peer)];
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);  // closed by the mesh thread or the destructor, never reused here
  }
  if (quiet) return;
  Event e;
  e.kind = kind;
  e.peer = peer;
  e.why = why;
  handler(e);
}

bool Mesh::Impl::send(int peer, Frame f) {
  f.from = settings.rank;
  f.pad = kMagic;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (peer < 0 || peer >= settings.world_size || !alive[static_cast<std::size_t>(peer)]) return false;
    int fd = fds[static_cast<std::size_t>(peer)];
    if (fd < 0) return false;
    ssize_t n = ::send(fd, &f, sizeof f, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(sizeof f)) return true;
    // A partial frame would break the stream; a full send buffer means the peer stopped reading long ago.
    why = n < 0 ? (errno == EAGAIN ? "its receive buffer is full" : errno_text(errno)) : "a partial send";
  }
  kill(peer, why);
  return false;
}

void Mesh::Impl::loop() {
  const int world = settings.world_size;
  auto next_beat = Clock::now();
  std::vector<pollfd> pfds;
  std::vector<int> who;
  while (!stopping) {
    auto now = Clock::now();
    if (now >= next_beat) {
      for (int p = 0; p < world; ++p) {
        if (p != settings.rank) send(p, frame(kHeartbeat));
      }
      next_beat = now + settings.period;
    }
    for (int p = 0; p < world; ++p) {
      bool live = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        live = p != settings.rank && alive[static_cast<std::size_t>(p)];
      }
      if (live && now - seen[static_cast<std::size_t>(p)] > settings.dead_after) {
        char why[64];
        std::snprintf(why, sizeof why, "no heartbeat for %.2f s",
                      std::chrono::duration<double>(now - seen[static_cast<std::size_t>(p)]).count());
        kill(p, why);
      }
    }
    pfds.clear();
    who.clear();
    {
      std::lock_guard<std::mutex> lock(mu);
      for (int p = 0; p < world; ++p) {
        if (p == settings.rank || !alive[static_cast<std::size_t>(p)]) continue;
        pfds.push_back({fds[static_cast<std::size_t>(p)], POLLIN, 0});
        who.push_back(p);
      }
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_beat - Clock::now()).count();
    int ready = ::poll(pfds.data(), pfds.size(), static_cast<int>(std::clamp<long long>(wait, 0, 100)));
    if (ready <= 0) continue;
    for (std::size_t i = 0; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      receive(who[i], pfds[i].fd);
    }
  }
}

void Mesh::Impl::receive(int peer, int fd) {
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      kill(peer, n == 0 ? "EOF" : errno_text(errno));
      return;
    }
    seen[static_cast<std::size_t>(peer)] = Clock::now();
    std::string& in = inbox[static_cast<std::size_t>(peer)];
    in.append(buf, static_cast<std::size_t>(n));
    std::size_t used = 0;
    while (in.size() - used >= sizeof(Frame)) {
      Event e;
      std::memcpy(&e.frame, in.data() + used, sizeof(Frame));
      used += sizeof(Frame);
      if (e.frame.pad != kMagic || e.frame.from != peer) {
        kill(peer, "a malformed frame");
        return;
      }
      if (e.frame.type == kHeartbeat) continue;
      if (e.frame.type == kBye) {
        kill(peer, "left", Event::Kind::PeerLeft);
        return;
      }
      e.kind = Event::Kind::Frame;
      e.peer = peer;
      handler(e);
    }
    in.erase(0, used);
  }
}

Mesh::Mesh(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Mesh::~Mesh() = default;

Result<std::unique_ptr<Mesh>> Mesh::start(const Settings& settings, Handler handler) {
  if (settings.world_size < 1 || settings.rank < 0 || settings.rank >= settings.world_size) {
    return Error{"ckpt: heartbeat: bad rank " + std::to_string(settings.rank) + " of " +
                 std::to_string(settings.world_size)};
  }
  auto impl = std::make_unique<Impl>();
  impl->settings = settings;
  impl->handler = std::move(handler);
  if (Status s = impl->connect_all(); !s) return Error{s.error()};
  list_mesh_sockets(&impl->fds);
  Impl* p = impl.get();
  impl->thread = std::thread([p] { p->loop(); });
  return std::unique_ptr<Mesh>(new Mesh(std::move(impl)));
}

bool Mesh::send(int peer, Frame frame) { return impl_->send(peer, frame); }

void Mesh::broadcast(Frame frame) {
  for (int p = 0; p < impl_->settings.world_size; ++p) {
    if (p != impl_->settings.rank) impl_->send(p, frame);
  }
}

void Mesh::say_bye() {
  impl_->quiet = true;  // peers answer a goodbye by closing: that must not read as their death
  Frame bye = impl_->frame(kBye);
  broadcast(bye);
}

const std::vector<std::uint64_t>& Mesh::hellos() const { return impl_->hellos; }

std::vector<bool> Mesh::alive() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->alive;
}

}  // namespace ckpt::hooks::heartbeat
