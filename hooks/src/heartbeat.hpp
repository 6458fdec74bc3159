#pragma once
// The heartbeat mesh: every rank of a job keeps one TCP connection to every other rank, sends a heartbeat every
// `period` and declares a peer dead on a connection reset or EOF (a killed process: the kernel closes its sockets)
// or when nothing came from it for `dead_after` (a frozen or powered-off node: only silence tells). Small fixed
// frames carry the last-words protocol too. Independent of Slurm and PMIx: the only rendezvous is one address file
// per rank in a directory every rank shares (the control dir on CKPT_DIR), read once at startup.
//
// Only ranks of the job join. The rendezvous dir must be the job user's own, mode 0700; it holds `secret`, 32
// random bytes created once per run (exclusively, mode 0600) by whichever rank comes first and read by every rank.
// A link starts with a handshake that proves knowledge of it both ways:
//   dialer   -> acceptor  Handshake{kHello, dialer's rank and hello, nonce_d}
//   acceptor -> dialer    Handshake{kHello, acceptor's rank and hello, nonce_a, mac = HMAC-SHA256(secret,
//                           "slurm-ckpt mesh accept v1" || hello[0..64) || reply[0..64) || "<addr> <port>")}
//   dialer   -> acceptor  Handshake{kProof, mac = HMAC-SHA256(secret, "slurm-ckpt mesh dial v1" || the same)}
// where "<addr> <port>" is the acceptor's published address (the dialer uses what it dialed). A connection that
// fails it is closed and logged (at most one line per peer address per 10 s); it never becomes a peer, so it can
// neither claim a rank nor die. The listener binds the one address it publishes and closes once every peer joined.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt::hooks::heartbeat {

// One frame on the wire (32 bytes, little endian on every machine the project runs on).
struct Frame {
  std::uint32_t type = 0;   // see FrameType
  std::int32_t from = -1;   // the sender's rank
  std::uint32_t flags = 0;
  std::uint32_t pad = 0;
  std::uint64_t a = 0;
  std::uint64_t b = 0;
};
static_assert(sizeof(Frame) == 32);

enum FrameType : std::uint32_t {
  kHello = 1,      // first frame on a connection: a = the sender's packed coordinate
  kHeartbeat = 2,
  kReport = 3,     // last words: a = step, flags = kReport* bits
  kWrote = 4,      // last words: a = step, flags = 1 when the shard is durable
  kBye = 5,        // an orderly close: the peer is gone, and that is no failure
  kProof = 6,      // handshake: the dialer's answer to the acceptor's nonce
};

// The three handshake messages (96 bytes each); `head` is a Frame with the magic in `pad`.
struct Handshake {
  Frame head;
  std::uint8_t nonce[32] = {};
  std::uint8_t mac[32] = {};
};
static_assert(sizeof(Handshake) == 96);

struct Settings {
  int rank = 0;
  int world_size = 1;
  std::string rendezvous_dir;        // shared by every rank, the user's own (0700); holds "secret", "rank-<r>.addr"
  std::string address;               // IPv4 address to listen on and publish; empty: this host's (see below)
  std::uint64_t hello = 0;           // sent in this rank's hello frame (the packed coordinate)
  std::chrono::milliseconds period{100};
  std::chrono::milliseconds dead_after{1500};
  std::chrono::milliseconds connect_timeout{120000};  // how long start() waits for every peer's address and link
};

// What the mesh thread reports. Called on the mesh thread: handlers must be quick and must not call back into
// the mesh except send()/broadcast().
struct Event {
  enum class Kind { PeerDead, PeerLeft, Frame } kind = Kind::Frame;
  int peer = -1;
  std::string why;  // PeerDead: "connection reset", "EOF", "no heartbeat for 1.52 s"
  Frame frame;      // Frame: what came in
};
using Handler = std::function<void(const Event&)>;

class Mesh {
 public:
  // Reads (or creates) the job's secret, listens on an ephemeral port of `address` (empty: the first
  // non-loopback address the host name resolves to, else the address of the default route's interface, else
  // 127.0.0.1), publishes "<address> <port>" in rendezvous_dir, connects to every peer (the lower rank dials the
  // higher one) and runs the handshake; fails when that does not complete within connect_timeout, or when the
  // rendezvous dir or the secret is not the user's own and private. Then a thread sends heartbeats and delivers
  // events until the mesh is destroyed.
  static Result<std::unique_ptr<Mesh>> start(const Settings& settings, Handler handler);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  // Any thread. Frames to a dead peer are dropped; false when the peer is dead.
  bool send(int peer, Frame frame);
  void broadcast(Frame frame);
  // Tells every live peer this rank leaves in order (they will not count it as a failure); no event is
  // delivered after it.
  void say_bye();
  // The hello value every rank sent (index = rank).
  const std::vector<std::uint64_t>& hellos() const;
  // Whether each rank is alive as far as this rank knows (its own entry is true).
  std::vector<bool> alive() const;

 private:
  struct Impl;
  explicit Mesh(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::hooks::heartbeat
