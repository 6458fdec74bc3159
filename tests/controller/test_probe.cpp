// The probes of silent nodes against real sockets: a refusal seen twice is evidence enough to mark a node DOWN,
// a timeout (a slurmd whose backlog is full, as a job flooding it can make it) is not.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

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
