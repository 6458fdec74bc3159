#pragma once
// The heartbeat mesh: every rank of a job keeps one TCP connection to every other rank, sends a heartbeat every
// `period` and declares a peer dead on a connection reset or EOF (a killed process: the kernel closes its sockets)
// or when nothing came from it for `dead_after` (a frozen or powered-off node: only silence tells). Small fixed
// frames carry the last-words protocol too. Independent of Slurm and PMIx: the only rendezvous is one address file
// per rank in a directory every rank shares (the control dir on CKPT_DIR), read once at startup.
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
};

struct Settings {
  int rank = 0;
  int world_size = 1;
  std::string rendezvous_dir;        // shared by every rank; "rank-<r>.addr" files are created there
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
  // Listens on an ephemeral port, publishes "<host> <port>" in rendezvous_dir, connects to every peer (the lower
  // rank dials the higher one) and exchanges hellos; fails when that does not complete within connect_timeout.
  // Then a thread sends heartbeats and delivers events until the mesh is destroyed.
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
