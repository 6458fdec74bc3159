#include "probe.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace ckpt::controller {

namespace {

// Starts a non-blocking connect; returns the socket, or -1 with `refused` set when it failed at once.
int start_connect(const ProbeTarget& t, bool& refused) {
  refused = false;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(t.port);
  if (getaddrinfo(t.address.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) return -1;
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return -1;
  }
  int rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc == 0 || errno == EINPROGRESS) return fd;
  refused = true;
  close(fd);
  return -1;
}

}  // namespace

std::vector<std::string> probe_dead_nodes(const std::vector<ProbeTarget>& targets, double timeout_s) {
  std::vector<std::string> dead;
  std::vector<pollfd> fds;
  std::vector<const ProbeTarget*> pending;
  for (const auto& t : targets) {
    if (t.address.empty() || t.port <= 0) continue;
    bool refused = false;
    int fd = start_connect(t, refused);
    if (fd < 0) {
      if (refused) dead.push_back(t.node);
      continue;
    }
    fds.push_back(pollfd{fd, POLLOUT, 0});
    pending.push_back(&t);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::vector<bool> done(fds.size(), false);
  std::size_t left = fds.size();
  while (left > 0) {
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (remaining.count() <= 0) break;
    int n = poll(fds.data(), fds.size(), static_cast<int>(remaining.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (done[i] || fds[i].revents == 0) continue;
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fds[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) dead.push_back(pending[i]->node);
      done[i] = true;
      fds[i].events = 0;
      fds[i].fd = -fds[i].fd - 1;  // poll ignores negative descriptors
      --left;
    }
  }
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if (!done[i]) dead.push_back(pending[i]->node);  // no answer in time
    close(fds[i].fd < 0 ? -fds[i].fd - 1 : fds[i].fd);
  }
  return dead;
}

}  // namespace ckpt::controller
