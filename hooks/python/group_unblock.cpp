// slurm_ckpt._native.GroupUnblock: shuts the sockets a process group opened when it has not formed in time.
//
// gloo's ProcessGroupGloo constructor holds the GIL while it connects; a peer that died after checking in leaves
// it retrying for its whole collective timeout (30 minutes by default), and no Python thread can run meanwhile.
// A native thread can: past the deadline it shuts every socket opened since the snapshot it was given (gloo's
// listener and pairs, the store client) but the store server's, gloo's connect fails, and restart.py treats the
// generation as not formed.
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

namespace py = pybind11;

namespace {

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

// The local port of a TCP socket; -1 for anything else.
int local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

class GroupUnblock {
 public:
  // After `seconds` unless cancelled, shuts the sockets not in `before` (fd -> "socket:[inode]", a snapshot
  // taken before the group's store connection was made: gloo waits on the store too).
  // The store's server side (its local port is `store_port`) is kept: the roll call after a failure uses it.
  GroupUnblock(double seconds, std::map<int, std::string> before, int store_port)
      : before_(std::move(before)), store_port_(store_port) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    thread_ = std::thread([this, deadline] {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_until(lock, deadline, [this] { return cancelled_; })) return;
      // Until cancelled: gloo's connect retries a refused peer with new sockets.
      do {
        for (const auto& [fd, target] : socket_fds()) {
          auto it = before_.find(fd);
          if ((it == before_.end() || it->second != target) && local_port(fd) != store_port_ &&
              shut_fds_.insert(target).second) {
            shutdown(fd, SHUT_RDWR);
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
  py::class_<GroupUnblock>(m, "GroupUnblock",
                           "Shuts the sockets opened after it was made, `seconds` later, unless cancel() came first.")
      .def(py::init<double, std::map<int, std::string>, int>(), py::arg("seconds"), py::arg("before"),
           py::arg("store_port"))
      .def("cancel", [](GroupUnblock& self) {
             py::gil_scoped_release release;
             return self.cancel();
           }, "Stops the timer; returns how many sockets it shut.");
}
