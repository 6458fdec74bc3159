#include "heartbeat.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>

#include "ckpt/store.hpp"

namespace ckpt::hooks::heartbeat {

namespace {

using store::errno_text;
using Clock = std::chrono::steady_clock;

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

constexpr std::uint32_t kMagic = 0x636b7074;  // "ckpt", in the pad field of every frame

std::string addr_file(const std::string& dir, int rank) { return dir + "/rank-" + std::to_string(rank) + ".addr"; }

Status make_dirs(const std::string& path) {
  std::string partial;
  std::stringstream in(path);
  std::string part;
  while (std::getline(in, part, '/')) {
    if (part.empty()) continue;
    partial += "/" + part;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      return Status::failure("ckpt: cannot create " + partial + ": " + errno_text(errno));
    }
  }
  return Status::success();
}

// Writes the whole buffer or fails; blocking sockets only (the setup phase).
bool write_all(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// Reads exactly one frame with a deadline; blocking socket with SO_RCVTIMEO set.
bool read_frame(int fd, Frame& frame) {
  char* p = reinterpret_cast<char*>(&frame);
  std::size_t got = 0;
  while (got < sizeof frame) {
    ssize_t n = ::recv(fd, p + got, sizeof frame - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return frame.pad == kMagic;
}

void set_timeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

int dial(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  return fd;
}

}  // namespace

struct Mesh::Impl {
  Settings settings;
  Handler handler;
  std::vector<int> fds;                 // per rank; -1 for itself and for dead peers (guarded by mu)
  std::vector<bool> alive;              // guarded by mu
  std::vector<std::uint64_t> hellos;    // written before the thread starts, read-only after
  std::vector<Clock::time_point> seen;  // mesh thread only
  std::vector<std::string> inbox;       // mesh thread only: partial frames per peer
  mutable std::mutex mu;
  std::atomic<bool> stopping{false};
  std::atomic<bool> quiet{false};  // this rank said goodbye: peers closing on it are no news
  std::thread thread;

  ~Impl() {
    stopping = true;
    if (thread.joinable()) thread.join();
    unlist_mesh_sockets(&fds);
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }

  Frame frame(std::uint32_t type) const {
    Frame f;
    f.type = type;
    f.from = settings.rank;
    f.pad = kMagic;
    return f;
  }

  // Marks a peer dead (once) and tells the handler; any thread.
  void kill(int peer, const std::string& why, Event::Kind kind = Event::Kind::PeerDead) {
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

  bool send(int peer, Frame f) {
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

  void loop() {
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

  void receive(int peer, int fd) {
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

  Status connect_all() {
    const int world = settings.world_size;
    const int me = settings.rank;
    fds.assign(static_cast<std::size_t>(world), -1);
    alive.assign(static_cast<std::size_t>(world), true);
    hellos.assign(static_cast<std::size_t>(world), 0);
    hellos[static_cast<std::size_t>(me)] = settings.hello;
    const auto deadline = Clock::now() + settings.connect_timeout;

    int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return Status::failure("ckpt: heartbeat: socket: " + errno_text(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, SOMAXCONN) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      int err = errno;
      ::close(listener);
      return Status::failure("ckpt: heartbeat: cannot listen: " + errno_text(err));
    }
    char host[256] = {};
    (void)::gethostname(host, sizeof host - 1);
    if (Status s = make_dirs(settings.rendezvous_dir); !s) {
      ::close(listener);
      return s;
    }
    {
      const std::string path = addr_file(settings.rendezvous_dir, me);
      const std::string tmp = path + ".tmp";
      {
        std::ofstream out(tmp, std::ios::trunc);
        out << host << ' ' << ntohs(addr.sin_port) << '\n';
        if (!out.flush()) {
          ::close(listener);
          return Status::failure("ckpt: heartbeat: cannot write " + tmp);
        }
      }
      if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::close(listener);
        return Status::failure("ckpt: heartbeat: cannot publish " + path + ": " + errno_text(err));
      }
    }
    auto fail = [&](const std::string& why) {
      ::close(listener);
      return Status::failure("ckpt: heartbeat: " + why);
    };
    auto left = [&] {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      return std::max(ms, std::chrono::milliseconds(1));
    };
    // Dial every higher rank: its listener exists before its address file, and the backlog completes the connect
    // before it accepts, so dialling first and accepting after cannot deadlock.
    for (int p = me + 1; p < world; ++p) {
      int fd = -1;
      while (fd < 0) {
        std::ifstream in(addr_file(settings.rendezvous_dir, p));
        std::string peer_host, port;
        if (in >> peer_host >> port) fd = dial(peer_host, port);
        if (fd >= 0) break;
        if (Clock::now() >= deadline) return fail("rank " + std::to_string(p) + " did not join the mesh in time");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      set_timeout(fd, left());
      Frame hello = frame(kHello);
      hello.a = settings.hello;
      Frame back;
      if (!write_all(fd, &hello, sizeof hello) || !read_frame(fd, back) || back.type != kHello || back.from != p) {
        ::close(fd);
        return fail("no hello from rank " + std::to_string(p));
      }
      hellos[static_cast<std::size_t>(p)] = back.a;
      fds[static_cast<std::size_t>(p)] = fd;
    }
    for (int accepted = 0; accepted < me;) {
      pollfd pfd{listener, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left().count())) <= 0) return fail("lower ranks did not join the mesh in time");
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      set_timeout(fd, left());
      Frame hello;
      if (!read_frame(fd, hello) || hello.type != kHello || hello.from < 0 || hello.from >= me ||
          fds[static_cast<std::size_t>(hello.from)] >= 0) {
        ::close(fd);  // a stray connection (another run's leftover address): ignore it
        continue;
      }
      Frame back = frame(kHello);
      back.a = settings.hello;
      if (!write_all(fd, &back, sizeof back)) {
        ::close(fd);
        continue;
      }
      hellos[static_cast<std::size_t>(hello.from)] = hello.a;
      fds[static_cast<std::size_t>(hello.from)] = fd;
      ++accepted;
    }
    ::close(listener);
    int one = 1;
    for (int fd : fds) {
      if (fd < 0) continue;
      (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    alive[static_cast<std::size_t>(me)] = true;
    seen.assign(static_cast<std::size_t>(world), Clock::now());
    inbox.assign(static_cast<std::size_t>(world), std::string());
    return Status::success();
  }
};

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
