#pragma once
// The heartbeat mesh's state (Mesh::Impl), shared by its two files: heartbeat_handshake.cpp joins the mesh (the
// rendezvous dir, the job's secret, the HMAC handshake, on the thread that calls Mesh::start) and heartbeat.cpp runs
// it (heartbeats, frames in and out, deaths). After start, the mesh thread alone reads the sockets and owns `seen`
// and `inbox`; send() and kill() come from any thread and take `mu` for `fds` and `alive`.
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "heartbeat.hpp"

namespace ckpt::hooks::heartbeat {

using Clock = std::chrono::steady_clock;

inline constexpr std::uint32_t kMagic = 0x636b7074;  // "ckpt", in the pad field of every frame
inline constexpr std::size_t kSecretBytes = 32;
using Secret = std::array<std::uint8_t, kSecretBytes>;

// Refused connections, logged at most once per peer address per 10 s (heartbeat_handshake.cpp).
class RefusalLog;

struct Mesh::Impl {
  Settings settings;
  Handler handler;
  std::vector<int> fds;                 // per rank; -1 for itself and for dead peers (guarded by mu)
  std::vector<bool> alive;              // guarded by mu
  std::vector<std::uint64_t> hellos;    // written before the thread starts, read-only after
  std::vector<Clock::time_point> seen;  // mesh thread only
  std::vector<std::string> inbox;       // mesh thread only: partial frames per peer
  Secret secret{};                      // the job's, read at start
  mutable std::mutex mu;
  std::atomic<bool> stopping{false};
  std::atomic<bool> quiet{false};  // this rank said goodbye: peers closing on it are no news
  std::thread thread;

  ~Impl();

  // ---- running the mesh (heartbeat.cpp) -----------------------------------------------------------------------

  Frame frame(std::uint32_t type) const;
  // Marks a peer dead (once) and tells the handler; any thread.
  void kill(int peer, const std::string& why, Event::Kind kind = Event::Kind::PeerDead);
  bool send(int peer, Frame f);
  // The mesh thread: heartbeats out, silence checks, frames in.
  void loop();
  void receive(int peer, int fd);

  // ---- joining the mesh, on the thread that calls start() (heartbeat_handshake.cpp) ---------------------------

  Handshake handshake(std::uint32_t type) const;
  // Publishes "<address> <port>" as rank-<me>.addr (a temporary file renamed over it).
  Status publish(int dirfd, const std::string& text);
  // "<address> <port>" of a peer, or nothing while it has not published.
  static std::optional<std::pair<std::string, std::string>> read_address(int dirfd, int peer);
  // The dialer's side of the handshake on a connected socket; the peer's hello value, or why it failed.
  Result<std::uint64_t> dial_handshake(int fd, int peer, const std::string& address);
  // Connects to every higher rank.
  Status dial_higher(int dirfd, Clock::time_point deadline, RefusalLog& refusals);

  // One accepted connection in its handshake.
  struct Pending {
    int fd = -1;
    std::string peer;
    Clock::time_point until;
    std::string in;
    bool replied = false;
    Handshake hello;
    Handshake reply;
  };

  // Moves a pending connection's handshake on with what arrived; false when it is over.
  bool advance(Pending& c, const std::string& address, RefusalLog& refusals, int& accepted);
  // Accepts every lower rank, each connection within kHandshakeLimit.
  Status accept_lower(int listener, const std::string& address, Clock::time_point deadline, RefusalLog& refusals);
  // The rendezvous dir, the secret, the listener, every link; fds and hellos filled in.
  Status connect_all();
};

}  // namespace ckpt::hooks::heartbeat
