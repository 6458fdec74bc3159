#pragma once
// The heartbeat network's state (Mesh::Impl), shared by its two files: heartbeat_handshake.cpp makes links (the
// rendezvous dir, the job's secret, the HMAC handshake on both sides) and heartbeat.cpp runs them (heartbeats,
// frames in and out, deaths and their flooding, the start barrier).
//
// Threads: the mesh thread reads every socket, accepts and admits connections, sends heartbeats and judges
// silence; the dialer thread makes the one outgoing link a rank needs (to its up neighbour, again after a
// failure); any thread may send. `mu` guards the links, the view and the barrier; handlers run without it.
#include <poll.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/posix.hpp"
#include "heartbeat.hpp"
#include "rendezvous.hpp"

namespace ckpt::hooks::heartbeat {

using Clock = std::chrono::steady_clock;

inline constexpr std::uint32_t kMagic = 0x636b7074;  // "ckpt", in the pad field of every frame
// A peer that is slow rather than dead (starved of CPU, or a dial that times out) gets this many silence limits.
inline constexpr int kSlowFactor = 10;
using Secret = posix::Secret;

// Refused connections, logged at most once per peer address per 10 s (heartbeat_handshake.cpp).
class RefusalLog;
struct RefusalLogDelete {
  void operator()(RefusalLog* log) const;  // heartbeat_handshake.cpp, where the class is complete
};

// The sockets of a running mesh, for the fork handler that closes them in a child (heartbeat.cpp).
inline constexpr std::size_t kSocketSlots = 64;
using SocketSlots = std::array<std::atomic<int>, kSocketSlots>;

struct Link {
  int fd = -1;
  std::string inbox;              // mesh thread only: a partial frame
  std::string outbox;             // guarded by mu: what the socket's send buffer could not take yet
  Clock::time_point seen;         // mesh thread only: when something last came in
  std::string broken;             // guarded by mu: why this rank gave up on the link, for the death line
  // The peer's process when it runs on this host (same kernel and pid namespace); 0 otherwise.
  int local_pid = 0;
  bool slow_logged = false;       // mesh thread only: "silent but running" was said once
};

// Who a rank is, as its handshake tells: its hello value, its pid and the host it runs on.
struct PeerId {
  std::uint64_t hello = 0;
  int pid = 0;
  std::uint32_t host = 0;
};

struct Mesh::Impl {
  Settings settings;
  Handler handler;
  Mesh::PartnerAcceptor partner_acceptor;  // guarded by mu
  // Partner links that came before set_partner_acceptor() (Settings::hold_partner_links): guarded by mu.
  struct HeldPartner {
    int fd = -1;
    int from = -1;
    std::string early;
  };
  std::vector<HeldPartner> held_partners;
  bool partner_decided = false;  // guarded by mu: set_partner_acceptor() was called
  overlay::Shape shape;
  Secret secret{};           // the job's, read at start
  std::string address;       // "<host> <port>" as published
  int listener = -1;
  int dirfd = -1;            // the rendezvous dir, kept open for the dials a failure needs
  std::unique_ptr<Rendezvous> rendezvous;  // set by prepare(); lookups from the dialer and any thread

  mutable std::mutex mu;
  std::condition_variable cv;            // the barrier and the dialer wait on it
  std::map<int, Link> links;             // guarded by mu
  overlay::Gone gone;                    // guarded by mu
  std::vector<char> died;                // guarded by mu: gone by a failure, not an orderly leave
  overlay::Links view;                   // guarded by mu
  Clock::time_point view_since;          // guarded by mu: when the view last changed
  std::uint64_t view_version = 0;        // guarded by mu
  bool last_dial_refused = false;        // dialer thread only: the last dial found no listener
  std::map<int, std::uint64_t> joined;   // guarded by mu: start barrier, ranks joined below each down link
  bool joined_sent = false;              // guarded by mu
  bool go = false;                       // guarded by mu: every rank joined
  std::string dial_error;                // guarded by mu: the dialer's last failure, for start's error line
  std::atomic<bool> stopping{false};
  std::atomic<bool> quiet{false};        // this rank said goodbye: peers closing on it are no news
  std::vector<int> answered;             // guarded by mu: links that completed after the goodbye and were given it
  std::unique_ptr<RefusalLog, RefusalLogDelete> refusals;  // mesh thread only
  SocketSlots sockets{};
  std::thread thread;
  std::thread dialer;

  ~Impl();

  // ---- running the links (heartbeat.cpp) ----------------------------------------------------------------------

  Frame frame(std::uint32_t type) const;
  // Marks a rank gone (once), floods the news, recomputes the view and tells the handler; any thread.
  void mark_gone(int peer, const std::string& why, bool died_here, int told_by);
  // Queues a frame to a linked peer under `mu` held; false when there is no link.
  bool send_locked(int peer, const Frame& f);
  bool send(int peer, Frame f);
  void flood(Frame f, int except);
  // Adds a link made by the handshake (either side); tells the peer what this rank knows is gone.
  void adopt(int peer, int fd, std::string first_bytes, const PeerId& who);
  // The view after a change of the gone set; wakes the dialer when the up neighbour changed. mu held.
  void refresh_view_locked();
  // Start barrier: sends kJoined up (or kGo down, at the root) once every down link joined. mu held.
  void advance_barrier_locked();
  void loop();
  // One turn's pollfds: the listener, the handshakes in progress, each live link (a gone peer's closed first).
  void gather_pollfds(std::vector<pollfd>& pfds, std::vector<int>& who);
  // What poll() found: handshakes advanced, a new connection accepted, links read, outboxes flushed.
  void on_poll_ready(const std::vector<pollfd>& pfds, const std::vector<int>& who);
  void judge_silence();
  void receive(int peer, Link& link);
  void deliver(int peer, const Frame& f);
  void flush_outboxes();
  // After the goodbye, at the end: each of `fds` (the goodbye sent on it) closes once its peer has read what was
  // sent. A socket closed with bytes unread sends a reset, and a reset can overtake the goodbye: the peer would
  // read this rank's orderly leave as a death. The peer closes its end when the goodbye reaches it, so each is read
  // to its end, for kByeLinger at most.
  static void close_after_bye(const std::vector<int>& fds);
  void list_socket(int fd);
  void unlist_socket(int fd);

  // ---- making links (heartbeat_handshake.cpp) -----------------------------------------------------------------

  Handshake handshake(std::uint32_t type) const;
  // The rendezvous dir, the secret, the listener and this rank's published address.
  Status prepare();
  // Withdraws this rank's address (files: a rank that dials it after learns that it left, not died).
  void unpublish();
  // "<address> <port>" of a peer, or nothing while it has not published (or, with files, once it left).
  std::optional<std::pair<std::string, std::string>> read_address(int peer) const;
  // The third field of a peer's published line: its node; empty when absent.
  std::string read_node(int peer) const;
  // The dialer's side of the handshake on a connected socket; the peer's hello value, or why it failed.
  Result<PeerId> dial_handshake(int fd, int peer, const std::string& address, std::uint32_t type = kHello);
  // This host and pid namespace, as a 32-bit tag (heartbeat_handshake.cpp).
  std::uint32_t host_tag = 0;
  // The dialer thread: keeps a link to the up neighbour of the current view.
  void dial_loop();
  // What the dialing thread remembers from one dial to the next.
  struct DialState {
    int target = -1;               // the rank dialed, and since when
    Clock::time_point since;
    std::set<int> given_up;        // probes that timed out since the last change of the view
    std::uint64_t seen_version = 0;
    bool hurry = false;  // a probe found a dead rank: its group's next one is probed at once, not after a pause
    std::chrono::milliseconds pause{20};
  };
  struct DialChoice {
    bool started = false;  // every rank had joined when the dial was chosen
    bool probe = false;    // a down neighbour probed, not the up one
  };
  // Waits (briefly) for a rank to dial and makes it d.target; nullopt when there is none now, or on stopping.
  std::optional<DialChoice> choose_dial(DialState& d);
  // What a failed dial of d.target says about it (see dial_loop); true when the loop backs off before the next.
  bool on_dial_failed(DialState& d, const DialChoice& choice, const std::string& error);
  // One attempt to link with `peer`; the socket, or why not.
  Result<std::pair<int, PeerId>> dial_once(int peer, std::chrono::milliseconds limit, std::uint32_t type = kHello,
                                           const Mesh::SocketWatch& on_socket = {});

  // Accepted connections in their handshake at once; links answered with the goodbye, kept until the close.
  static constexpr std::size_t kMaxPending = 64;
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
  std::vector<Pending> pending;  // mesh thread only

  // Accepts what waits on the listener (at most a few dozen handshakes at once).
  void accept_new();
  // Moves a pending connection's handshake on with what arrived; false when it is over (adopted or refused).
  bool advance(Pending& c);
  // Reads from pending connections and drops those past their limit.
  void service_pending(const std::vector<char>& readable);
};

}  // namespace ckpt::hooks::heartbeat
