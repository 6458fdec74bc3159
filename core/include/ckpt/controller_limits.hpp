#pragma once
// The controller's defences, as pure logic: what a bounded HTTP/1.1 request head may hold, how often one kind of
// complaint is logged, how often Slurm is asked about a job id it did not know, which probe results are evidence
// enough to mark a node DOWN, and who may read which job. No sockets, no Slurm: the daemon in controller/ calls
// these and carries out what they decide.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckpt::recovery {

// ---- HTTP request heads ---------------------------------------------------------------------------------------

struct HttpLimits {
  std::size_t max_head = 16 * 1024;   // request line and headers together
  std::size_t max_body = 64 * 1024;   // a MUNGE credential holding a 16 KiB event is about 22 KiB
  std::size_t max_headers = 64;
};

struct HttpHead {
  std::string method;
  std::string target;                 // path only; a query string is cut off
  std::map<std::string, std::string> headers;  // names lower-cased; a repeated name is refused
  std::size_t content_length = 0;
};

// A parsed head, or the HTTP status and one line saying what was wrong with it.
struct HttpHeadResult {
  int status = 0;                     // 0: ok; else 400, 405, 411, 413, 431, 501, 505
  std::string error;
  HttpHead head;
  bool ok() const { return status == 0; }
};

// Where the head ends in `buffer` (the offset of the first body byte), or nullopt when the blank line has not
// arrived yet. Accepts CRLF and bare LF line ends.
std::optional<std::size_t> http_head_end(std::string_view buffer);
// Parses the bytes before the blank line. Refuses chunked or any other transfer coding (the body's length must be
// known before it is read), a body over the limit, a POST without Content-Length, and malformed lines.
HttpHeadResult parse_http_head(std::string_view head, const HttpLimits& limits);

// ---- rate-limited complaints ------------------------------------------------------------------------------------

// At most `burst` lines per `window_s` for each kind of complaint; the rest are counted and reported with the
// first line let through after the window.
class LogLimiter {
 public:
  LogLimiter(std::size_t burst, double window_s) : burst_(burst), window_s_(window_s) {}
  // Whether a line of `kind` may be logged at `now`; `suppressed` is set to how many were held back before it.
  bool allow(const std::string& kind, double now, std::uint64_t& suppressed);

 private:
  struct Window {
    double start = 0;
    std::size_t used = 0;
    std::uint64_t suppressed = 0;
  };
  std::size_t burst_;
  double window_s_;
  std::map<std::string, Window> windows_;
};

// ---- job ids Slurm did not know ---------------------------------------------------------------------------------

// Remembers what Slurm answered about job ids the controller does not track: "unknown", or the job's owner. A flood
// of events for made-up ids, or for another user's untracked job, then costs at most one lookup per id per
// `ttl_s`. Holds at most `capacity` ids; the oldest is forgotten first.
class NegativeCache {
 public:
  NegativeCache(std::size_t capacity, double ttl_s) : capacity_(capacity), ttl_s_(ttl_s) {}
  // True when `job_id` was found unknown less than ttl ago: do not ask Slurm again.
  bool known_unknown(std::uint32_t job_id, double now) const;
  // The owner Slurm named for `job_id` less than ttl ago; nullopt when none is cached (or it was unknown).
  std::optional<std::uint32_t> known_owner(std::uint32_t job_id, double now) const;
  void remember(std::uint32_t job_id, double now);                        // unknown to Slurm
  void remember_owner(std::uint32_t job_id, std::uint32_t owner, double now);
  void forget(std::uint32_t job_id);
  std::size_t size() const { return when_.size(); }

 private:
  struct Entry {
    double when = 0;
    std::optional<std::uint32_t> owner;  // nullopt: unknown to Slurm
  };
  void put(std::uint32_t job_id, Entry entry);
  std::size_t capacity_;
  double ttl_s_;
  std::map<std::uint32_t, Entry> when_;
  std::multimap<double, std::uint32_t> by_time_;
};

// ---- fair intake ----------------------------------------------------------------------------------------------------

// Which of the queued requests (each with the user it is for, in arrival order) one engine cycle takes: in arrival
// order, at most `batch` in all and at most a fair share of them per user: batch / the users waiting, and never
// less than `min_share`. One user alone gets the whole batch (plain FIFO); under one user's flood every other
// user's requests are in the next cycle.
std::vector<std::size_t> fair_batch(const std::vector<std::uint32_t>& users, std::size_t batch, std::size_t min_share);

// ---- probes of silent nodes ---------------------------------------------------------------------------------------

// Alive: slurmd accepted the connection (and, where asked, answered an RPC). Hung: its port accepted (the kernel
// runs) but slurmd answered none of the RPCs of judge_rpc's window: a frozen host or a hung daemon.
enum class ProbeResult { Alive, Refused, TimedOut, Unreachable, Hung };
const char* to_string(ProbeResult result);

struct NodeEvidence {
  std::vector<std::string> failed;     // the job's run treats these as lost (excluded from its next runs)
  std::vector<std::string> mark_down;  // evidence nobody but the node can give: may be marked DOWN in Slurm
  std::vector<std::string> hung;       // those of mark_down whose evidence is RPC silence (site policy may differ)
};

// The RPC check of a node whose slurmd port accepted a connection. Each ask is a Slurm RPC on a new connection,
// answered by slurmd itself (MUNGE-signed, so nobody else can answer for it), with `timeout_s`; the asks follow
// one another. A slurmd that is merely slow (a loaded host, a busy daemon) answers one of them: it handles each RPC
// in a thread of its own and this one touches no file system. Hung needs every ask of a window of at least
// `hung_after_s` unanswered.
int rpc_rounds(double timeout_s, double hung_after_s);  // asks that span the window: at least 2
ProbeResult judge_rpc(const std::vector<bool>& answered, double silent_s, double hung_after_s);

// Decides from two rounds of probes (the second only of nodes the first found not alive) and the nodes Slurm
// itself has down. A refused connection confirmed by the second probe, Hung (its window is its confirmation), or
// Slurm's own state is evidence; a timeout is not (a loaded or flooded slurmd's backlog times out too), so such a
// node is only left out of the job's next run. Order of `failed`: as in `first`.
NodeEvidence weigh_probes(const std::vector<std::pair<std::string, ProbeResult>>& first,
                          const std::map<std::string, ProbeResult>& second,
                          const std::vector<std::string>& slurm_down);

// ---- who may read what ----------------------------------------------------------------------------------------------

// Like Slurm's PrivateData=jobs: root, SlurmUser and admin_users see every job; anyone else their own jobs only.
struct ReadAccess {
  std::optional<std::uint32_t> uid;    // nullopt: no credential came with the request
  bool all = false;
  bool may_see(std::uint32_t owner_uid, bool owner_known) const {
    return all || (uid && owner_known && *uid == owner_uid);
  }
};
ReadAccess read_access(std::optional<std::uint32_t> uid, const std::set<std::uint32_t>& privileged);

// ---- job ids Slurm reuses ---------------------------------------------------------------------------------------

enum class JobIdentity {
  Same,      // the record is of this job
  Requeued,  // the same job, requeued: Slurm gave it a new submit time and a higher restart count; adopt both
  Reused,    // another job under the same id (MaxJobId wrapped, or Slurm lost its state): start a fresh record
};
// Compares a record's submit time and restart count (0 submit time: not known yet) with Slurm's. A requeue sets a
// new submit time and raises the restart count; a restart count never goes down for the same job.
JobIdentity job_identity(double record_submit, std::uint32_t record_restarts, double slurm_submit,
                         std::uint32_t slurm_restarts);

// ---- numbers from events ------------------------------------------------------------------------------------------

// Slurm's restart count never exceeds this in practice; an event claiming more is refused, so a counter made from
// it can never wrap.
inline constexpr std::uint32_t kMaxRestartCount = 1000000;
// The most restarts a job may ask for (--ckpt-max-restarts).
inline constexpr std::uint64_t kMaxRestartBudget = 1000000;
// a + 1, but never past `limit`.
std::uint64_t saturating_increment(std::uint64_t a, std::uint64_t limit);

}  // namespace ckpt::recovery
