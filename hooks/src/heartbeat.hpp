#pragma once
// The heartbeat network of a job's ranks: failure detection and the links its agreements travel on, with a
// constant number of links per rank at any world size (ckpt/overlay.hpp gives the shape: members of a group of 8
// link to their leader, leaders form a tree). Every link carries a heartbeat each `period`; a peer is declared
// dead on a connection reset or EOF (a killed process: the kernel closes its sockets, so its leader sees it at
// once) or after `dead_after` of silence (a frozen node: only silence tells). Silence is counted only over time
// this rank's own mesh thread ran: a starved rank (an overloaded host) does not take its own stall for its peers'
// deaths. A death is flooded over every link, so every survivor learns it within O(log N) hops, and the ranks
// whose links it cut dial their new neighbours (the next rank of the group, or the nearest live ancestor group).
// The rendezvous (rendezvous.hpp) is PMIx under srun --mpi=pmix (one fence at start, then local lookups), else one
// address file per rank in a directory every rank shares (the control dir on CKPT_DIR); either way a rank looks up
// only the ranks it dials, a constant number.
//
// Only ranks of the job join. The rendezvous dir must be the job user's own, mode 0700; it holds `secret`, 32
// random bytes created once per run (exclusively, mode 0600) by whichever rank comes first and read by every rank.
// A link starts with a handshake that proves knowledge of it both ways:
//   dialer   -> acceptor  Handshake{kHello, dialer's rank and hello, nonce_d}
//   acceptor -> dialer    Handshake{kHello, acceptor's rank and hello, nonce_a, mac = HMAC-SHA256(secret,
//                           "slurm-ckpt mesh accept v2" || hello[0..72) || reply[0..72) || "<addr> <port>")}
//   dialer   -> acceptor  Handshake{kProof, mac = HMAC-SHA256(secret, "slurm-ckpt mesh dial v2" || the same)}
// where "<addr> <port>" is the acceptor's published address (the dialer uses what it dialed). A connection that
// fails it is closed and logged (at most one line per peer address per 10 s); it never becomes a peer, so it can
// neither claim a rank nor die. The listener binds the one address it publishes; it stays open for the links a
// failure makes necessary.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/overlay.hpp"
#include "ckpt/hooks.hpp"
#include "ckpt/result.hpp"

namespace ckpt::hooks::heartbeat {

// One frame on the wire (40 bytes, little endian on every machine the project runs on).
struct Frame {
  std::uint32_t type = 0;   // see FrameType
  std::int32_t from = -1;   // the sender's rank (the link's other end)
  std::uint32_t flags = 0;
  std::uint32_t pad = 0;    // kMagic
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  std::int32_t subject = -1;  // the rank the frame is about (a report's, a death's), when not the sender
  std::uint32_t spare = 0;
};
static_assert(sizeof(Frame) == 40);

enum FrameType : std::uint32_t {
  // The network's own.
  kHello = 1,      // first frame on a connection: a = the sender's hello value (its packed coordinate)
  kHeartbeat = 2,
  kBye = 5,        // an orderly close: the sender leaves, and that is no failure
  kProof = 6,      // handshake: the dialer's answer to the acceptor's nonce
  kGone = 7,       // subject is gone: flags = kGoneDied or kGoneLeft; flooded
  kJoined = 8,     // start: a = ranks joined in the sender's subtree, sent up
  kGo = 9,         // start: every rank joined; flooded from the root
  // Last words (last_words_runtime.cpp); the network delivers them to the handler.
  kReport = 3,     // subject's report, sent up: a = step, b = packed coordinate (ReportFrame, last_words_frames.hpp)
  kWrote = 4,      // subject's terminal shard, sent up: a = step, flags = 1 when durable
  kAlarm = 10,     // last words started somewhere: flooded; subject = the rank that started them
  kDecision = 11,  // the root's decision, flooded: subject = root, a = step, b = pipeline stages, flags = 1: write
  kStage = 12,     // one stage of the decision, flooded: subject = stage, a = its writing dp index, b = step
  kOutcome = 13,   // the root's end of the last words, flooded: a = step, flags = 1: committed
  // Periodic coordination (coordinator_tree.cpp); delivered to the handler too.
  kRequest = 20,      // a checkpoint at step a, flooded: flags = 1: terminal
  kShardsDone = 21,   // sent up: b ranks of the sender's subtree have a durable shard of step a; flags =
                      // kRecordsReady when their records can be read (b = 1: its .rec, else its gathered file)
  kShardFailed = 22,  // sent up: subject could not persist step a
  kRetired = 23,      // the writer retired step a (store::retire), flooded: each rank removes its own files of it
  kRestoreFile = 24,  // the leader wrote a restore round's file, flooded: a = round, flags = 1: plan, 2: verdict
  kRecount = 25,      // the root's count of step a is late, flooded (b: the root's recount number): send it again
  // Stragglers (pace.cpp); delivered to the handler too.
  kPace = 30,         // a subtree's pace of one window, sent up (PaceFrame, pace.hpp)
  kSwap = 31,         // the root's word that a node's ranks hand over to a spare, flooded (SwapFrame, pace.hpp)
  // Last words with the memory tier (last_words_frames.hpp).
  kHeld = 14,         // subject's memory: a = its whole snapshot's step, b = a ward's copy step, spare = the ward
  kStandIn = 15,      // one stand-in of the decision, flooded: subject = the ward, a = its holder, b = step
  kTierOff = 16,      // the memory tier is off for the whole job, flooded: subject = the rank it does not fit,
                      // a = the bytes it needs, b = CKPT_MEMORY (TierOffFrame)
  // A partner link's hello (memory_tier.hpp): authenticated like a link of the network, carries copies instead.
  kHelloPartner = 40,
  // A probe's hello (Mesh::probe): answered like a link's, then closed; it proves the rank's mesh thread runs.
  kHelloProbe = 41,
};

inline constexpr std::uint32_t kRecordsReady = 1;
inline constexpr std::uint32_t kGoneDied = 1;
inline constexpr std::uint32_t kGoneLeft = 2;

// The network's own frames with a payload, typed like the last words' (last_words_frames.hpp); kHeartbeat, kBye
// and kGo carry nothing but their type. The network sets `from` and the magic on every send.

// Flooded: `rank` is gone; subject = rank, flags = kGoneDied (it died) or kGoneLeft (an orderly leave).
struct GoneFrame {
  int rank = -1;
  bool died = false;

  Frame to_frame() const {
    Frame f;
    f.type = kGone;
    f.subject = rank;
    f.flags = died ? kGoneDied : kGoneLeft;
    return f;
  }
  static GoneFrame from_frame(const Frame& f) { return {f.subject, f.flags == kGoneDied}; }
};

// Start barrier, sent up: `ranks` of the sender's subtree (itself included) joined; a = ranks.
struct JoinedFrame {
  std::uint64_t ranks = 0;

  Frame to_frame() const {
    Frame f;
    f.type = kJoined;
    f.a = ranks;
    return f;
  }
  static JoinedFrame from_frame(const Frame& f) { return {f.a}; }
};

// The three handshake messages (104 bytes each); `head` is a Frame with the magic in `pad`.
struct Handshake {
  Frame head;
  std::uint8_t nonce[32] = {};
  std::uint8_t mac[32] = {};
};
static_assert(sizeof(Handshake) == 104);

struct Settings {
  int rank = 0;
  int world_size = 1;
  int group_size = overlay::kGroupSize;
  std::string rendezvous_dir;        // shared by every rank, the user's own (0700); holds "secret" (and with files,
                                     // "rank-<r>.addr")
  RendezvousKind rendezvous = RendezvousKind::Files;  // how addresses are found (rendezvous.hpp)
  std::string address;               // IPv4 address to listen on and publish; empty: this host's (see below)
  std::uint64_t hello = 0;           // sent in this rank's hello frame (the packed coordinate)
  std::chrono::milliseconds period{100};
  std::chrono::milliseconds dead_after{1500};
  std::chrono::milliseconds connect_timeout{120000};  // how long start() waits for every rank to join
  // A partner link (memory_tier.hpp) may come as soon as a peer has joined, before this rank's tier is up: held
  // until set_partner_acceptor() says who takes it (or that nobody does) instead of refused.
  bool hold_partner_links = false;
  // (host, port) of processes new to the job (a restart in place's replacements, their mailboxes): start() gives
  // up at once once one refuses a connection (it is gone), instead of waiting out connect_timeout for it.
  std::vector<std::pair<std::string, std::string>> watched;
};

// What the mesh reports. Called on the mesh's threads: handlers must be quick and may call send(), send_up() and
// flood(), nothing else of the mesh that blocks.
struct Event {
  enum class Kind { PeerDead, PeerLeft, Frame, LinkUp } kind = Kind::Frame;
  int peer = -1;    // PeerDead/PeerLeft: the rank gone; Frame: the link it came on; LinkUp: the new neighbour
  std::string why;  // PeerDead: "connection reset", "EOF", "no heartbeat for 1.52 s", "rank 12 says it died"
  Frame frame;      // Frame: what came in
};
using Handler = std::function<void(const Event&)>;

class Mesh {
 public:
  // Reads (or creates) the job's secret, listens on an ephemeral port of `address` (empty: the one rule of
  // ckpt/address.hpp: CKPT_ADDR, CKPT_IFNAME / GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, never a host name on
  // loopback), publishes "<address> <port> <node>" in the rendezvous, dials its up neighbour, accepts its down ones, and
  // returns once every rank of the job joined (counted up the tree, announced down it); fails when that does not
  // happen within connect_timeout, or when the rendezvous dir or the secret is not the user's own and private.
  static Result<std::unique_ptr<Mesh>> start(const Settings& settings, Handler handler);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  // Any thread. Frames to a rank with no link, or a gone one, are dropped: false.
  bool send(int peer, Frame frame);
  // To the current up neighbour; false for the root or while the link to a new one is being made.
  bool send_up(Frame frame);
  // To every linked neighbour but `except`.
  void flood(Frame frame, int except = -1);
  // Tells every neighbour this rank leaves in order (they will not count it as a failure); no event is
  // delivered after it.
  void say_bye();
  // This rank's view: its links as the shape gives them now, and who is gone.
  overlay::Links links() const;
  overlay::Gone gone() const;
  // The ranks that died (not left in order), ascending.
  std::vector<int> died() const;
  // Dials each of `ranks` that a death cut off (its link in the whole network goes up to a rank now gone, or
  // through others of `ranks` to one: a dead leader's members and child leaders, and theirs) and is not gone
  // itself, at most 1,024 (and a quarter of this process's descriptors), all at once, and asks for a
  // handshake's answer within `limit`. A refused connect (no listener: its process is gone) and no answer within
  // `limit` (a frozen process, whose kernel still accepts the connection, or a host that drops it) count the rank
  // dead, flooded to the others, as a dead link or dead_after of silence does; anything else (an answer, a close,
  // another error) tells nothing. Returns the ranks found dead. For ranks nobody may be linked with any more: a
  // dead node's members were linked to their dead leader alone.
  std::vector<int> probe(const std::vector<int>& ranks, std::chrono::milliseconds limit);
  // Whether `rank` left the network in order (said bye): it sends nothing more, and it did not fail.
  bool left(int rank) const;
  // How many ranks this rank has a link with now.
  std::size_t link_count() const;
  // The node a peer runs on, as it published it (SLURMD_NODENAME, else its host name); empty when not known.
  // Looks the peer up in the rendezvous: for the few ranks a failure names, not for the whole job.
  std::string node_of(int peer) const;

  // Partner links of the memory tier (memory_tier.hpp): connections made and authenticated like the network's own
  // links (the job's secret, the peer's rank) that carry checkpoint copies instead of heartbeats. dial_partner
  // blocks (at most `limit` per phase: the connect, each read and write of the handshake) and returns the socket,
  // blocking, once the acceptor proved it knows the secret. `on_socket` (may be empty) is told the socket before
  // the connect and -1 before it is closed on a failure, so that another thread can shut it to end the dial early.
  // The acceptor gets each accepted one on the mesh thread (the socket, blocking, the dialer's rank and what it
  // sent after its proof) and owns it from then on; without an acceptor they are refused.
  using PartnerAcceptor = std::function<void(int fd, int from, std::string early)>;
  using SocketWatch = std::function<void(int fd)>;
  Result<int> dial_partner(int peer, std::chrono::milliseconds limit, const SocketWatch& on_socket = {});
  // Who takes partner links from now on (null: nobody); the links held until now go to it, or are closed.
  void set_partner_acceptor(PartnerAcceptor acceptor);

 private:
  struct Impl;
  explicit Mesh(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::hooks::heartbeat
