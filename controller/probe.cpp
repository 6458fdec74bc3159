#include "probe.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <system_error>
#include <thread>

#include "ckpt/posix.hpp"

extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
}

extern char** environ;

namespace ckpt::controller {

using ckpt::recovery::ProbeResult;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool is_refusal(int err) { return err == ECONNREFUSED || err == ECONNRESET; }

// Starts a non-blocking connect; returns the socket, or -1 with `result` set when it failed at once.
int start_connect(const ProbeTarget& t, ProbeResult& result) {
  result = ProbeResult::Unreachable;
  const int fd = ckpt::posix::connect_start(t.address, std::to_string(t.port));
  if (fd < 0 && is_refusal(errno)) result = ProbeResult::Refused;
  return fd;
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
  ProbePlan plan;
  plan.tcp_timeout_s = timeout_s;
  plan.pause_s = pause_s;  // no ask: TCP only
  return probe_silent_nodes(targets, plan, summary);
}

namespace {

struct RpcCheck {
  std::vector<bool> answered;
  double silent_s = 0;
};

// Asks until slurmd answers or the window is over: an ask that fails at once (a refusal) is repeated after a pause,
// so that the verdict always rests on the whole window.
RpcCheck check_rpc(const SlurmdAsk& ask, const std::string& node, double timeout_s, double hung_after_s) {
  RpcCheck c;
  const int rounds = ckpt::recovery::rpc_rounds(timeout_s, hung_after_s);
  const auto t0 = Clock::now();
  while (c.answered.size() < 100) {
    const auto asked = Clock::now();
    const bool answered = ask(node, timeout_s);
    c.answered.push_back(answered);
    if (answered) break;
    if (static_cast<int>(c.answered.size()) >= rounds && seconds_since(t0) >= hung_after_s) break;
    const double took = seconds_since(asked);
    if (took < timeout_s) std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.25, timeout_s - took)));
  }
  c.silent_s = seconds_since(t0);
  return c;
}

// The RPC check of every node in `nodes`, at most 32 at a time.
std::map<std::string, RpcCheck> check_rpcs(const std::vector<std::string>& nodes, const ProbePlan& plan) {
  std::vector<RpcCheck> results(nodes.size());
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> workers;
  auto work = [&] {
    for (std::size_t i = next++; i < nodes.size(); i = next++) {
      results[i] = check_rpc(plan.ask, nodes[i], plan.rpc_timeout_s, plan.hung_after_s);
    }
  };
  const std::size_t n = std::min<std::size_t>(nodes.size(), 32);
  for (std::size_t w = 1; w < n; ++w) {
    try {
      workers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // out of threads: the ones made so far and this one share the nodes
    }
  }
  work();
  for (auto& t : workers) t.join();
  std::map<std::string, RpcCheck> out;
  for (std::size_t i = 0; i < nodes.size(); ++i) out[nodes[i]] = results[i];
  return out;
}

std::string describe_rpc(const RpcCheck& c) {
  const auto answered = std::count(c.answered.begin(), c.answered.end(), true);
  char line[160];
  std::snprintf(line, sizeof line, "port open, %ld of %zu RPCs answered in %.1f s", static_cast<long>(answered),
                c.answered.size(), c.silent_s);
  return line;
}

}  // namespace

ckpt::recovery::NodeEvidence probe_silent_nodes(const std::vector<ProbeTarget>& targets, const ProbePlan& plan,
                                                std::string& summary) {
  auto first = probe_nodes(targets, plan.tcp_timeout_s);
  std::vector<std::string> accepted;
  if (plan.ask && plan.hung_after_s > 0) {
    for (const auto& [node, result] : first) {
      if (result == ProbeResult::Alive) accepted.push_back(node);
    }
  }
  // The RPC checks run while the refused and timed-out nodes get their second TCP probe.
  std::map<std::string, RpcCheck> rpc;
  std::thread rpc_thread;
  try {
    rpc_thread = std::thread([&] { rpc = check_rpcs(accepted, plan); });
  } catch (const std::system_error&) {
    rpc = check_rpcs(accepted, plan);  // out of threads: one after the other
  }
  std::vector<ProbeTarget> again;
  for (const auto& [node, result] : first) {
    if (result == ProbeResult::Alive) continue;
    for (const auto& t : targets) {
      if (t.node == node) again.push_back(t);
    }
  }
  std::map<std::string, ProbeResult> second;
  if (!again.empty()) {
    std::this_thread::sleep_for(std::chrono::duration<double>(plan.pause_s));
    for (auto& [node, result] : probe_nodes(again, plan.tcp_timeout_s)) second[node] = result;
  }
  if (rpc_thread.joinable()) rpc_thread.join();
  summary.clear();
  for (auto& [node, result] : first) {
    if (auto it = rpc.find(node); it != rpc.end()) {
      result = ckpt::recovery::judge_rpc(it->second.answered, it->second.silent_s, plan.hung_after_s);
      summary += (summary.empty() ? "" : ", ") + node + " " + ckpt::recovery::to_string(result) + " (" +
                 describe_rpc(it->second) + ")";
      continue;
    }
    if (result == ProbeResult::Alive) continue;
    auto it = second.find(node);
    summary += (summary.empty() ? "" : ", ") + node + " " + ckpt::recovery::to_string(result);
    if (it != second.end()) summary += std::string(" then ") + ckpt::recovery::to_string(it->second);
  }
  if (summary.empty()) summary = "all alive";
  return ckpt::recovery::weigh_probes(first, second, {});
}

bool ask_slurmd(const std::string& exe, const std::string& node, double timeout_s) {
  posix_spawn_file_actions_t files;
  if (posix_spawn_file_actions_init(&files) != 0) return false;
  posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&files, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::string flag = "--ask-slurmd";
  std::string path = exe;
  std::string name = node;
  char* argv[] = {path.data(), flag.data(), name.data(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, path.c_str(), &files, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&files);
  if (rc != 0) return false;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  for (;;) {
    pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (got < 0 && errno != EINTR) return false;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(pid, SIGKILL);  // waiting on a socket: dies at once
  waitpid(pid, &status, 0);
  return false;
}

int ask_slurmd_main(const std::string& node) {
  slurm_init(nullptr);
  std::uint16_t sensors = 0;
  acct_gather_energy_t* energy = nullptr;
  std::string host = node;
  const int rc = slurm_get_node_energy(host.data(), NO_VAL16, 0, &sensors, &energy);
  const int err = rc == SLURM_SUCCESS ? 0 : slurm_get_errno();
  // Only an authenticated reply from slurmd sets these; a connection that fails or times out sets others.
  const bool answered = rc == SLURM_SUCCESS || err == SLURM_PROTOCOL_VERSION_ERROR || err == ESLURM_USER_ID_MISSING ||
                        err == SLURM_UNEXPECTED_MSG_ERROR;
  std::printf("%s %s: %s\n", node.c_str(), answered ? "answered" : "did not answer",
              rc == SLURM_SUCCESS ? "ok" : slurm_strerror(err));
  return answered ? 0 : 1;
}

}  // namespace ckpt::controller
