#include "probe.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

namespace ckpt::controller {

using ckpt::recovery::ProbeResult;

namespace {

bool is_refusal(int err) { return err == ECONNREFUSED || err == ECONNRESET; }

// Starts a non-blocking connect; returns the socket, or -1 with `result` set when it failed at once.
int start_connect(const ProbeTarget& t, ProbeResult& result) {
  result = ProbeResult::Unreachable;
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
  result = is_refusal(errno) ? ProbeResult::Refused : ProbeResult::Unreachable;
  close(fd);
  return -1;
}

}  // namespace

std::vector<std::pair<std::string, ProbeResult>> probe_nodes(const std::vector<ProbeTarget>& targets,
                                                             double timeout_s) {
  std::vector<std::pair<std::string, ProbeResult>> out;
  std::vector<pollfd> fds;
  std::vector<const ProbeTarget*> pending;
  for (const auto& t : targets) {
    if (t.address.empty() || t.port <= 0) continue;
    ProbeResult result = ProbeResult::Unreachable;
    int fd = start_connect(t, result);
    if (fd < 0) {
      out.emplace_back(t.node, result);
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
      out.emplace_back(pending[i]->node, err == 0 ? ProbeResult::Alive
                                                  : is_refusal(err) ? ProbeResult::Refused : ProbeResult::Unreachable);
      done[i] = true;
      fds[i].events = 0;
      fds[i].fd = -fds[i].fd - 1;  // poll ignores negative descriptors
      --left;
    }
  }
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if (!done[i]) out.emplace_back(pending[i]->node, ProbeResult::TimedOut);  // no answer in time
    close(fds[i].fd < 0 ? -fds[i].fd - 1 : fds[i].fd);
  }
  return out;
}

ckpt::recovery::NodeEvidence probe_twice(const std::vector<ProbeTarget>& targets, double timeout_s, double pause_s,
                                         std::string& summary) {
  const auto first = probe_nodes(targets, timeout_s);
  std::vector<ProbeTarget> again;
  for (const auto& [node, result] : first) {
    if (result == ProbeResult::Alive) continue;
    for (const auto& t : targets) {
      if (t.node == node) again.push_back(t);
    }
  }
  std::map<std::string, ProbeResult> second;
  if (!again.empty()) {
    std::this_thread::sleep_for(std::chrono::duration<double>(pause_s));
    for (auto& [node, result] : probe_nodes(again, timeout_s)) second[node] = result;
  }
  summary.clear();
  for (const auto& [node, result] : first) {
    if (result == ProbeResult::Alive) continue;
    auto it = second.find(node);
    summary += (summary.empty() ? "" : ", ") + node + " " + ckpt::recovery::to_string(result);
    if (it != second.end()) summary += std::string(" then ") + ckpt::recovery::to_string(it->second);
  }
  if (summary.empty()) summary = "all alive";
  return ckpt::recovery::weigh_probes(first, second, {});
}

}  // namespace ckpt::controller
