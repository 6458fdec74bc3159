// The sockets of a process group, for slurm_ckpt.torch.run: it shuts them to leave a group whose peer died
// (shut_group_sockets, from its watchdog: a collective blocked on a frozen peer then fails at once) and, through
// GroupUnblock, when a group has not formed in time.
//
// gloo's ProcessGroupGloo constructor holds the GIL while it connects; a peer that died after checking in leaves
// it retrying for its whole collective timeout (30 minutes by default), and no Python thread can run meanwhile.
// A native thread can: past the deadline it shuts every socket opened since the snapshot it was given (gloo's
// listener and pairs, the store client) but the store server's, gloo's connect fails, and restart.py treats the
// generation as not formed. It does so at once when a process it watches (a rank new to the generation: a
// replacement) is gone: a connection to the mailbox it published is refused (posix::connect_refused).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/inplace.hpp"
#include "ckpt/posix.hpp"

namespace py = pybind11;

namespace {

using Address = std::pair<std::string, int>;
using Dialed = std::vector<std::pair<std::string, std::string>>;  // (host, port) as posix::first_refused takes them

// fd -> "socket:[inode]" for this process's sockets.
std::map<int, std::string> socket_fds() {
  std::map<int, std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), link_ec).string();
    if (link_ec || target.rfind("socket:", 0) != 0) continue;
    try {
      out.emplace(std::stoi(entry.path().filename().string()), target);
    } catch (const std::exception&) {
    }
  }
  return out;
}

// The port of a TCP socket's local (or, with `peer`, remote) end; -1 when there is none (unconnected, not TCP).
int port_of(int fd, bool peer) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  auto* a = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? getpeername(fd, a, &len) : getsockname(fd, a, &len)) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

bool is_listening(int fd) {
  int accepting = 0;
  socklen_t len = sizeof accepting;
  return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting != 0;
}

// Shuts socket `fd` if it still is `target` ("socket:[inode]": the number may have been reused). Never the store
// server's side (local port `store_port`): the roll call after a failed generation uses it. With `keep_store`,
// not the store's clients, the listeners, or sockets that are not connected either: only the group's connections.
bool shut_socket(int fd, const std::string& target, int store_port, bool keep_store) {
  std::error_code ec;
  if (std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec).string() != target || ec) return false;
  if (port_of(fd, false) == store_port) return false;
  if (keep_store) {
    const int peer = port_of(fd, true);
    if (peer < 0 || peer == store_port || is_listening(fd)) return false;
  }
  return shutdown(fd, SHUT_RDWR) == 0;
}

class GroupUnblock {
 public:
  // After `seconds` unless cancelled, or as soon as one of `watched` refuses a connection (looked at every
  // inplace::kWatchPeriodMs: a dead replacement costs a period, not the join timeout), shuts the sockets not in
  // `before` (fd -> "socket:[inode]", a snapshot taken before the group's store connection was made: gloo waits
  // on the store too).
  // The store's server side (its local port is `store_port`) is kept: the roll call after a failure uses it.
  GroupUnblock(double seconds, std::map<int, std::string> before, int store_port, std::vector<Address> watched)
      : before_(std::move(before)), store_port_(store_port) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(seconds));
    Dialed dialed;
    for (const auto& [addr, port] : watched) dialed.emplace_back(addr, std::to_string(port));
    thread_ = std::thread([this, deadline, dialed = std::move(dialed)] {
      const auto period = std::chrono::milliseconds(ckpt::inplace::kWatchPeriodMs);
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        const auto next = std::min(deadline, std::chrono::steady_clock::now() + period);
        if (cv_.wait_until(lock, next, [this] { return cancelled_; })) return;
        if (std::chrono::steady_clock::now() >= deadline) break;
        lock.unlock();
        const bool gone = !ckpt::posix::first_refused(dialed, 200).empty();
        lock.lock();
        if (gone) break;
      }
      // Until cancelled: gloo's connect retries a refused peer with new sockets.
      do {
        for (const auto& [fd, target] : socket_fds()) {
          auto it = before_.find(fd);
          if ((it == before_.end() || it->second != target) && shut_fds_.count(target) == 0 &&
              shut_socket(fd, target, store_port_, false)) {
            shut_fds_.insert(target);
          }
        }
      } while (!cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return cancelled_; }));
    });
  }
  ~GroupUnblock() { cancel(); }
  GroupUnblock(const GroupUnblock&) = delete;
  GroupUnblock& operator=(const GroupUnblock&) = delete;

  // Stops the timer; returns how many sockets it shut (0 when it was cancelled in time).
  int cancel() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return static_cast<int>(shut_fds_.size());
  }

 private:
  std::map<int, std::string> before_;
  int store_port_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
  std::set<std::string> shut_fds_;  // "socket:[inode]" of the sockets shut
  std::thread thread_;
};

}  // namespace

void bind_group_unblock(py::module& m) {
  m.def("socket_fds", &socket_fds, "This process's sockets: fd -> 'socket:[inode]'.");
  m.def("refuses", [](const std::string& addr, int port, double timeout_s) {
         py::gil_scoped_release release;
         return ckpt::posix::connect_refused(addr, std::to_string(port), static_cast<int>(timeout_s * 1000));
       }, py::arg("addr"), py::arg("port"), py::arg("timeout_s"),
       "Whether a connection to addr:port is refused within timeout_s: nothing listens there any more.");
  m.def("local_port", [](int fd) { return port_of(fd, false); }, py::arg("fd"),
        "The local port of TCP socket `fd`; -1 when it has none (not TCP, or gone).");
  m.def("shut_group_sockets", [](const std::map<int, std::string>& sockets, int store_port) {
         int shut = 0;
         for (const auto& [fd, target] : sockets) shut += shut_socket(fd, target, store_port, true) ? 1 : 0;
         return shut;
       }, py::arg("sockets"), py::arg("store_port"),
       "Shuts a group's connections (fd -> 'socket:[inode]' as socket_fds() gave them), not its store's: "
       "blocked collectives fail at once. Returns how many it shut.");
  py::class_<GroupUnblock>(m, "GroupUnblock",
                           "Shuts the sockets opened after it was made, `seconds` later or once one of `watched` "
                           "(addr, port) refuses a connection, unless cancel() came first.")
      .def(py::init<double, std::map<int, std::string>, int, std::vector<Address>>(), py::arg("seconds"),
           py::arg("before"), py::arg("store_port"), py::arg("watched") = std::vector<Address>{})
      .def("cancel", [](GroupUnblock& self) {
             py::gil_scoped_release release;
             return self.cancel();
           }, "Stops the timer; returns how many sockets it shut.");
}
