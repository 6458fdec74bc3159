// ckpt-test-job: a stand-in for a data-parallel training job, for the controller's integration tests. Each rank
// (srun task) takes steps, writes its shard of a checkpoint every K steps through the real store, and rank 0
// commits it. Ranks are linked by TCP like a collective library: when a peer dies, the survivors see the
// connection drop and exit 1 within milliseconds, as ranks of a real collective do; the plugin reports those exits.
//
//   ckpt-test-job [--steps N] [--step-ms MS] [--every K] [--fail-rank R --fail-step S [--fail-code C]
//                 [--fail-runs all|LIST]]
//
// Reads SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_ID, SLURM_STEP_ID, SLURM_RESTART_COUNT, CKPT_DIR and
// CKPT_RESUME_STEP. Prints one line at start ("test-job: start rank=R ... resume=S") and one at the end.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/address.hpp"
#include "ckpt/clock.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/store.hpp"

namespace {

namespace store = ckpt::store;

std::string env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  auto v = ckpt::parse_uint(env(name));
  return v ? *v : fallback;
}

[[noreturn]] void die(int rank, const std::string& why, int code = 1) {
  std::fprintf(stderr, "test-job: rank %d: %s\n", rank, why.c_str());
  std::fflush(nullptr);
  std::_Exit(code);
}

struct Options {
  std::uint64_t steps = 1000;
  std::uint64_t step_ms = 100;
  std::uint64_t every = 10;
  int fail_rank = -1;
  std::uint64_t fail_step = 0;
  int fail_code = 1;
  std::string fail_runs = "all";
};

// Rank 0 publishes its address and port in a file under the checkpoint dir, unique to this job, run and step.
std::string rendezvous_file(const std::string& dir) {
  return dir + "/.test-job-rdv-" + env("SLURM_JOB_ID", "0") + "-" + env("SLURM_RESTART_COUNT", "0") + "-" +
         env("SLURM_STEP_ID", "0");
}

// The address rank 0 publishes and binds (ckpt/address.hpp: its node's, not a loopback).
std::string own_address(int rank) {
  auto chosen = ckpt::net::publish_address();
  if (!chosen) die(rank, chosen.error());
  return chosen->address;
}

sockaddr_in ipv4(const std::string& address, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) addr.sin_addr.s_addr = htonl(INADDR_NONE);
  return addr;
}

int listen_on(const std::string& address, int& port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = ipv4(address, 0);
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 256) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return -1;
  }
  port = ntohs(addr.sin_port);
  return fd;
}

int connect_to(const std::string& address, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = ipv4(address, port);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

struct Peers {
  int rank = 0;
  std::vector<int> fds;          // rank 0: one per other rank; others: one to rank 0
  std::vector<bool> finished;    // rank 0: that peer said it is done
  bool sent_done = false;

  // Waits up to `ms`, watching the peers. Exits 1 when a peer is lost (like a collective that fails).
  void watch(int ms) {
    std::vector<pollfd> p;
    for (int fd : fds) p.push_back(pollfd{fd, POLLIN, 0});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return;
      int n = poll(p.data(), p.size(), static_cast<int>(left.count()));
      if (n <= 0) continue;
      for (std::size_t i = 0; i < p.size(); ++i) {
        if (p[i].revents == 0) continue;
        char c = 0;
        ssize_t got = recv(p[i].fd, &c, 1, MSG_DONTWAIT);
        if (got == 1 && c == 'D' && rank == 0) {
          finished[i] = true;
          continue;
        }
        if (got > 0) continue;
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (rank == 0 && finished[i]) {
          p[i].fd = -1;
          continue;
        }
        if (rank != 0 && sent_done) std::_Exit(0);
        die(rank, "lost a peer (connection closed): exiting like a failed collective");
      }
    }
  }
};

Peers rendezvous(int rank, int world, const std::string& dir) {
  Peers peers;
  peers.rank = rank;
  if (world == 1) return peers;
  const std::string file = rendezvous_file(dir);
  if (rank == 0) {
    int port = 0;
    const std::string address = own_address(rank);
    int lfd = listen_on(address, port);
    if (lfd < 0) die(rank, "cannot listen on " + address);
    const std::string tmp = file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) die(rank, "cannot write " + tmp);
    std::fprintf(f, "%s %d\n", address.c_str(), port);
    std::fclose(f);
    std::rename(tmp.c_str(), file.c_str());
    const double deadline = ckpt::unix_seconds() + 60;
    while (static_cast<int>(peers.fds.size()) < world - 1) {
      pollfd p{lfd, POLLIN, 0};
      if (ckpt::unix_seconds() > deadline) die(rank, "peers did not connect");
      if (poll(&p, 1, 200) <= 0) continue;
      int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) peers.fds.push_back(fd);
    }
    close(lfd);
    peers.finished.assign(peers.fds.size(), false);
  } else {
    const double deadline = ckpt::unix_seconds() + 60;
    int fd = -1;
    while (fd < 0) {
      if (ckpt::unix_seconds() > deadline) die(rank, "rank 0 did not publish its port");
      FILE* f = std::fopen(file.c_str(), "r");
      char address[64] = {0};
      int port = 0;
      if (f != nullptr) {
        if (std::fscanf(f, "%63s %d", address, &port) != 2) port = 0;
        std::fclose(f);
      }
      if (port > 0) fd = connect_to(address, port);
      if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    peers.fds.push_back(fd);
  }
  return peers;
}

bool fails_in_run(const Options& o, std::uint64_t run) {
  if (o.fail_runs == "all") return true;
  std::stringstream ss(o.fail_runs);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto n = ckpt::parse_uint(item);
    if (n && *n == run) return true;
  }
  return false;
}

void save(int rank, int world, std::uint64_t step, const std::string& dir, Peers& peers) {
  auto writer = store::ShardWriter::open(dir, step, rank);
  if (!writer) die(rank, "checkpoint: " + writer.error());
  std::vector<char> data(4096, static_cast<char>(step + static_cast<std::uint64_t>(rank)));
  if (auto s = writer->append("model", data.data(), data.size()); !s) die(rank, "checkpoint: " + s.error());
  if (auto r = writer->finish(); !r) die(rank, "checkpoint: " + r.error());
  if (rank != 0) return;
  // Rank 0 commits once every rank's shard is durable.
  const double deadline = ckpt::unix_seconds() + 30;
  for (;;) {
    auto present = store::read_present_records(dir, step);
    if (present && static_cast<int>(present->size()) >= world) break;
    if (ckpt::unix_seconds() > deadline) die(rank, "checkpoint " + std::to_string(step) + ": shards missing");
    peers.watch(20);
  }
  store::Manifest m;
  m.step = step;
  m.kind = store::Kind::Periodic;
  m.wall_time = ckpt::unix_seconds();
  m.world_size = world;
  m.layout.dp = world;
  for (int r = 0; r < world; ++r) m.ranks.push_back(store::RankCoord{r, r, 0, 0});
  if (auto s = store::commit(dir, m); !s) die(rank, "commit " + std::to_string(step) + ": " + s.error());
  std::printf("test-job: committed step %llu at %.3f\n", static_cast<unsigned long long>(step), ckpt::unix_seconds());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(-1, "missing value for " + a, 2);
      return argv[++i];
    };
    auto number = [&]() -> std::uint64_t {
      auto v = ckpt::parse_uint(value());
      if (!v) die(-1, "bad number for " + a, 2);
      return *v;
    };
    if (a == "--steps") o.steps = number();
    else if (a == "--step-ms") o.step_ms = number();
    else if (a == "--every") o.every = number();
    else if (a == "--fail-rank") o.fail_rank = static_cast<int>(number());
    else if (a == "--fail-step") o.fail_step = number();
    else if (a == "--fail-code") o.fail_code = static_cast<int>(number());
    else if (a == "--fail-runs") o.fail_runs = value();
    else die(-1, "unknown option " + a, 2);
  }
  const int rank = static_cast<int>(env_u64("SLURM_PROCID", 0));
  const int world = static_cast<int>(env_u64("SLURM_NTASKS", 1));
  const std::uint64_t run = env_u64("SLURM_RESTART_COUNT", 0);
  const std::string dir = env("CKPT_DIR");
  if (dir.empty()) die(rank, "CKPT_DIR is not set (run with --ckpt-* options)", 2);
  const std::uint64_t resume = env_u64("CKPT_RESUME_STEP", 0);
  if (rank == 0) {
    // Leftovers of a save that died with the last run would mix with this run's shards.
    if (auto entries = store::scan(dir); entries) {
      for (const auto& e : *entries) {
        if (e.step > resume && e.state == store::State::Incomplete) store::discard_incomplete(dir, e.step);
      }
    }
  }
  std::printf("test-job: start rank=%d world=%d node=%s run=%llu step_id=%s resume=%llu time=%.3f\n", rank, world,
              env("SLURMD_NODENAME").c_str(), static_cast<unsigned long long>(run), env("SLURM_STEP_ID").c_str(),
              static_cast<unsigned long long>(resume), ckpt::unix_seconds());
  std::fflush(stdout);
  Peers peers = rendezvous(rank, world, dir);
  for (std::uint64_t step = resume + 1; step <= o.steps; ++step) {
    peers.watch(static_cast<int>(o.step_ms));
    if (rank == o.fail_rank && step == o.fail_step && fails_in_run(o, run)) {
      std::printf("test-job: rank %d fails on purpose at step %llu with code %d\n", rank,
                  static_cast<unsigned long long>(step), o.fail_code);
      std::fflush(nullptr);
      std::_Exit(o.fail_code);
    }
    if (o.every > 0 && step % o.every == 0) save(rank, world, step, dir, peers);
  }
  // A clean end: tell rank 0, which waits for everybody before closing.
  if (rank != 0) {
    char d = 'D';
    if (send(peers.fds[0], &d, 1, MSG_NOSIGNAL) != 1) die(rank, "lost rank 0 at the end");
    peers.sent_done = true;
    for (;;) peers.watch(1000);
  }
  const double deadline = ckpt::unix_seconds() + 60;
  while (true) {
    bool all = true;
    for (bool f : peers.finished) all = all && f;
    if (all) break;
    if (ckpt::unix_seconds() > deadline) die(rank, "peers did not finish");
    peers.watch(50);
  }
  std::printf("test-job: rank 0 done at step %llu\n", static_cast<unsigned long long>(o.steps));
  return 0;
}
