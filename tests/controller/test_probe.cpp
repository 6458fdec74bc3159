// The probes of silent nodes against real sockets: a refusal seen twice is evidence enough to mark a node DOWN,
// a timeout (a slurmd whose backlog is full, as a job flooding it can make it) is not.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "probe.hpp"

namespace {

using ckpt::controller::ProbeTarget;
using ckpt::recovery::ProbeResult;

// A listening socket on 127.0.0.1; `backlog` 0 and no accept: once its queue is full, SYNs are dropped.
int listener(int backlog, int& port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(fd, backlog) == 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

int closed_port() {
  int port = 0;
  int fd = listener(1, port);
  close(fd);  // nothing listens there any more: connections are refused
  return port;
}

}  // namespace

TEST_CASE("probe: refused twice is evidence, alive is not", "[controller][probe]") {
  int alive_port = 0;
  int alive = listener(16, alive_port);
  std::vector<ProbeTarget> targets = {{"up", "127.0.0.1", alive_port}, {"gone", "127.0.0.1", closed_port()}};
  std::string summary;
  auto evidence = ckpt::controller::probe_twice(targets, 0.5, 0.05, summary);
  CHECK(evidence.failed == std::vector<std::string>{"gone"});
  CHECK(evidence.mark_down == std::vector<std::string>{"gone"});
  CHECK(summary == "gone refused then refused");
  close(alive);
}

TEST_CASE("probe: a timed-out node is not marked down", "[controller][probe]") {
  int port = 0;
  int fd = listener(0, port);
  // Fill the accept queue: from then on the kernel drops SYNs to this port and connects time out.
  std::vector<int> fillers;
  for (int i = 0; i < 8; ++i) {
    auto r = ckpt::controller::probe_nodes({{"fill", "127.0.0.1", port}}, 0.2);
    if (!r.empty() && r.front().second == ProbeResult::TimedOut) break;
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
    fillers.push_back(c);
  }
  std::string summary;
  auto evidence = ckpt::controller::probe_twice({{"flooded", "127.0.0.1", port}}, 0.3, 0.05, summary);
  CHECK(summary == "flooded timed out then timed out");
  CHECK(evidence.failed == std::vector<std::string>{"flooded"});
  CHECK(evidence.mark_down.empty());
  for (int c : fillers) close(c);
  close(fd);
}

TEST_CASE("probe: a port that accepts but a slurmd that answers no RPC is hung", "[controller][probe]") {
  // The kernel completes connections to a listening socket nobody serves: a frozen host looks alive to TCP.
  int frozen_port = 0;
  int frozen = listener(16, frozen_port);
  int slow_port = 0;
  int slow = listener(16, slow_port);
  std::mutex mu;
  std::map<std::string, int> asks;
  ckpt::controller::ProbePlan plan;
  plan.tcp_timeout_s = 0.5;
  plan.rpc_timeout_s = 0.1;
  plan.hung_after_s = 0.35;
  plan.ask = [&](const std::string& node, double timeout_s) {
    int n = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      n = ++asks[node];
    }
    if (node == "slow" && n == 3) return true;  // loaded: the third ask is answered
    std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s));
    return false;
  };
  std::vector<ProbeTarget> targets = {{"frozen", "127.0.0.1", frozen_port}, {"slow", "127.0.0.1", slow_port},
                                      {"gone", "127.0.0.1", closed_port()}};
  std::string summary;
  auto evidence = ckpt::controller::probe_silent_nodes(targets, plan, summary);
  CHECK(evidence.failed == std::vector<std::string>{"frozen", "gone"});
  CHECK(evidence.mark_down == std::vector<std::string>{"frozen", "gone"});
  CHECK(evidence.hung == std::vector<std::string>{"frozen"});
  CHECK(asks["frozen"] >= 4);  // the whole window: 0.35 s of 0.1 s asks
  CHECK(asks["slow"] == 3);
  CHECK(asks.count("gone") == 0);  // refused: no RPC
  INFO(summary);
  CHECK(summary.find("frozen hung (port open, 0 of") != std::string::npos);
  CHECK(summary.find("slow alive (port open, 1 of 3 RPCs answered") != std::string::npos);
  CHECK(summary.find("gone refused then refused") != std::string::npos);
  close(frozen);
  close(slow);
}

TEST_CASE("probe: without an RPC check a port that accepts is alive", "[controller][probe]") {
  int port = 0;
  int fd = listener(16, port);
  ckpt::controller::ProbePlan plan;
  plan.tcp_timeout_s = 0.5;
  std::string summary;
  auto evidence = ckpt::controller::probe_silent_nodes({{"n1", "127.0.0.1", port}}, plan, summary);
  CHECK(evidence.failed.empty());
  CHECK(summary == "all alive");
  close(fd);
}

TEST_CASE("ask_slurmd: a child that does not answer in time is killed; its exit status is the answer",
          "[controller][probe]") {
  // Stand-ins for `ckpt-controller --ask-slurmd NODE`: true answers, false does not, a sleeper hangs.
  CHECK(ckpt::controller::ask_slurmd("/bin/true", "n1", 1.0));
  CHECK_FALSE(ckpt::controller::ask_slurmd("/bin/false", "n1", 1.0));
  CHECK_FALSE(ckpt::controller::ask_slurmd("/no/such/program", "n1", 0.3));
  char path[] = "/tmp/ckpt-hung-slurmd-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const std::string script = "#!/bin/sh\nexec sleep 30\n";
  REQUIRE(write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size()));
  close(fd);
  REQUIRE(chmod(path, 0700) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(ckpt::controller::ask_slurmd(path, "n1", 0.3));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took >= 0.3);
  CHECK(took < 2);
  unlink(path);
}
