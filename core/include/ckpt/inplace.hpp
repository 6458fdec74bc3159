#pragma once
// Restart in place (slurm_ckpt.torch.run under `ckpt-run --spares N`): every decision a process makes, generation
// by generation, as pure functions and one public state machine; and the records of a run in its control dir,
// written and read here only. slurm_ckpt.restart keeps the effects (stores, gloo, sockets) and reaches this
// through _native; ckpt-run reads the same records with the same parsers.
//
// The records live in `.control/inplace-<CKPT_INPLACE_ID>/` of the checkpoint dir (mode 0700):
//   spare-<node>.<local>   a ready spare and the address and token of its claim mailbox
//   claim-<node>.<local>   the rank and generation that spare takes over (written before the plan)
//   gen-<G>.plan           generation G: its world, the address of its rendezvous store, who replaced whom
//   gen-<G>.phases         when each phase of recovery G ended, written at its first step
//   mailbox-<rank>         where that rank, as a recovery's root, posts the plan (not durable: needed while it lives)
//   secret                 32 random bytes, 0600: the keys of the job's TCP stores derive from it
//   finished | abandoned   training ended, or was handed over to a requeue (the idle spares leave)
// Every file is written whole and renamed into place (posix::write_file_atomic); a reader sees all of it or nothing,
// and a file that does not parse as its record is treated as absent.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/overlay.hpp"
#include "ckpt/posix.hpp"
#include "ckpt/recovery.hpp"
#include "ckpt/result.hpp"
#include "ckpt/store.hpp"

namespace ckpt::inplace {

// A survivor that cannot go on in place exits so: the requeue path takes over.
inline constexpr int kExitPeerLost = recovery::kExitPeerLost;
inline constexpr int kMaxWorld = 1 << 24;  // the most ranks a record may name

// Where the records of in-place run `id` live: $CKPT_DIR/.control/inplace-<id>.
std::string records_dir(const std::string& ckpt_dir, const std::string& id);

// ---- one process's life: a public state machine -------------------------------------------------------------------

enum class State {
  Waiting,     // a spare, warm, waiting for a claim
  Forming,     // joining generation G's group
  Training,    // train() runs
  Recovering,  // a peer was lost: waiting for (or writing) generation G+1's plan
  Finished,    // train() returned: the caller gets its result
  Left,        // the process leaves (exit 0 for an unneeded spare, 75 for a hand-over) or raises
};

enum class Event {
  Claimed,     // Waiting -> Forming: the spare takes a lost rank over
  Unneeded,    // Waiting -> Left: training ended without this spare
  Formed,      // Forming -> Training
  JoinFailed,  // Forming -> Recovering: the roll call found ranks missing
  Returned,    // Training -> Finished
  PeerLost,    // Training -> Recovering
  Planned,     // Recovering -> Forming: the next generation's plan came
  Failed,      // Forming | Training -> Left: an error that is no peer's loss, raised to the caller
  HandedOver,  // Forming | Training | Recovering -> Left: no way on in place; a requeue takes over
};

const char* to_string(State state);
const char* to_string(Event event);

// The transition table; nullopt for a pair that is not in it.
std::optional<State> next_state(State from, Event event);

// A process's state and generation. JoinFailed and PeerLost start the next generation; Claimed enters the one the
// claim names.
class Machine {
 public:
  explicit Machine(State start, std::uint32_t generation = 0) : state_(start), generation_(generation) {}
  State state() const { return state_; }
  std::uint32_t generation() const { return generation_; }
  // Applies `event`; an error naming both when the table has no such transition (nothing changes then).
  Status on(Event event, std::optional<std::uint32_t> claimed_generation = std::nullopt);

 private:
  State state_;
  std::uint32_t generation_;
};

// ---- what a failed generation tells the next ----------------------------------------------------------------------

// What the survivors agreed on when a generation failed.
struct Failure {
  std::vector<int> lost;              // the lost ranks, ascending
  int root = -1;                      // the rank that decided the last words; -1 when none did
  std::optional<std::uint64_t> step;  // the terminal checkpoint's step; none: resume from the newest complete one
  double detect_unix = 0, decided_unix = 0, done_unix = 0;
  // The last words' stand-ins (CKPT_MEMORY): dead rank -> the survivor that wrote its terminal shard from the
  // partner copy it holds, and holds still.
  std::map<int, int> stand_ins;
  // Survivors the last words found holding no state of `step` (a step behind, or caught mid-update without a
  // snapshot of it), ascending; only the deciding root knows them (last_words::behind).
  std::vector<int> behind;
};

// The plan of one generation, or its abandonment (`abandon` non-empty: the fields but generation are unset).
struct Plan {
  std::uint32_t generation = 0;
  int world = 0;
  std::string addr;                   // the generation's rendezvous store
  int port = 0;
  int root = 0;                       // who wrote it (generation 0: rank 0)
  std::vector<int> lost;              // the ranks the spares replace
  std::optional<std::uint64_t> step;  // the checkpoint every rank resumes from; none: the newest complete one
  std::map<int, std::string> takeover;  // lost rank -> the spare slot ("<node>.<local id>") that takes it over
  double detect_unix = 0;
  double written_unix = 0;            // set by Records::write_plan
  std::string abandon;                // why the run cannot go on in place
  // A plan that shrinks (--ckpt-shrink): the failed generation's world. The lost ranks are dropped rather than
  // replaced, and the survivors renumbered in order (rank_after); `world` is the new one. 0: nothing dropped.
  int world_before = 0;
  // Lost rank -> the survivor holding its partner copy of `step` in memory (the memory tier): the copy the last
  // words wrote its terminal shard from, which the replacement can take over the network instead.
  std::map<int, int> copies;
  // Survivors that hold no state of `step` (Failure::behind), ascending, numbered as `lost` is: a live replica
  // sends them its state, as it does a replacement (state_donors), in a plan that shrinks too.
  std::vector<int> behind;

  bool abandons() const { return !abandon.empty(); }
  bool shrinks() const { return world_before > 0; }
};

// --ckpt-shrink: whether a generation that has too few spares goes on in place with fewer data-parallel replicas,
// and with how few at least. Off by default: it changes the training's arithmetic (the global batch).
struct Shrink {
  int min_dp = 0;  // the fewest data-parallel replicas to go on with; 0: never shrink
  bool on() const { return min_dp > 0; }
};
// "off", "on" (down to one replica) or N >= 1 (down to N replicas).
Result<Shrink> parse_shrink(std::string_view text);
std::string format_shrink(const Shrink& shrink);

// A survivor's rank in the generation `plan` forms: its own, or under a shrinking plan its place among the
// survivors in order; -1 for a lost rank.
int rank_after(const Plan& plan, int rank);

// How train() of a generation ended, as run() sees it.
struct TrainOutcome {
  bool raised = false;        // train() raised
  bool mesh_failed = false;   // the error is the Checkpointer's "not every rank joined the mesh"
  bool lost_peer = false;     // the last words report a lost peer
  bool counted_dead = false;  // the other ranks count this one as dead
  bool finished = false;      // rank 0 marked the job's training finished (its train() returned)
};

enum class AfterTrain {
  Return,    // training is over: return train()'s result
  Raise,     // an error of the program's own: raise it
  RollCall,  // a replacement died before the heartbeat mesh formed: count the ranks still there
  Recover,   // a peer was lost: plan the next generation
  Leave,     // the others went on without this rank: leave (75)
};
const char* to_string(AfterTrain next);
AfterTrain after_train(std::uint32_t generation, const TrainOutcome& outcome);
// Whether `finished` can change what after_train decides: the marker is a file on the shared dir, read per rank
// only where it matters (train() returned, and a peer was lost or this rank counted dead).
bool finished_matters(const TrainOutcome& outcome);

// A training thread that cannot unwind. Once a peer is lost the failed group's connections are shut and every
// collective blocked on them fails at once, but one: gloo never fails an unbound-buffer send that was partly
// written when its pair closed (a large broadcast, as ZeRO-1's parameter sync, to a peer that stopped reading),
// and the send waits out the group's collective timeout (30 minutes by default). Seen from outside: the last words
// are done, train() has not returned, and the thread that runs it has used no CPU for kStuckIdleS. The process
// cannot go on in place; it hands over to a requeue at once (the terminal checkpoint holds its state), rather than
// leave the other survivors waiting for it until they give up.
constexpr double kStuckIdleS = 5.0;
struct TrainingThread {
  bool last_words_done = false;  // this rank's last words for the lost peer ended (written, committed or given up)
  bool returned = false;         // train() returned or raised
  double cpu_idle_s = 0;         // since the thread's CPU time last advanced
};
bool training_stuck(const TrainingThread& thread);

enum class AfterJoinFailure {
  Raise,     // generation 0 did not form: the launch failed, nothing to recover
  HandOver,  // the store is gone, or nobody is missing: no way on in place
  Recover,   // the missing ranks are lost: plan the next generation without them
};
const char* to_string(AfterJoinFailure next);
// After generation `generation` failed to form, or lost a rank before its mesh formed (the roll call's result:
// nullopt when the store could not be reached).
AfterJoinFailure after_join_failure(std::uint32_t generation, const std::optional<std::vector<int>>& missing);

// While a generation forms, and in the roll call after it did not: a rank that has not checked in is gone for
// good once a connection to the mailbox it published is refused (the listener went with its process; a slow
// rank's, or one behind a cut link, is accepted or times out instead). The join then fails at once, not at its
// timeout, and the roll call ends once every rank still absent is gone for good; one that may only be slow is
// waited for, so that every live rank ends with the same missing ranks.
// How often a forming generation dials the mailboxes of the ranks it waits for (each dial waits 200 ms at most).
constexpr int kWatchPeriodMs = 500;
std::vector<int> gone_for_good(const std::vector<int>& absent, const std::vector<int>& refused);
bool roll_call_settled(const std::vector<int>& absent, const std::vector<int>& refused);

// The failure a generation that did not form (or lost ranks before its first step) hands on: its missing ranks
// are lost, and it resumes from the same checkpoint.
Failure join_failure(const Plan& plan, std::vector<int> missing, double now_unix);

// ---- recovery: who writes the plan, who hands it to whom ------------------------------------------------------

// The recovery's root: the last words' decider when it survived, else the lowest surviving rank.
int recovery_root(int world, const Failure& failure);

// A rank's part in handing generation G's plan out. The plan travels down the heartbeat network's tree
// (overlay.hpp, with the lost ranks gone), so no mailbox serves more than a constant number of survivors.
struct Role {
  int root = 0;               // the recovery's root
  bool writes_plan = false;   // the root, when no plan of G exists yet
  bool lost = false;          // this rank is among the lost
  std::vector<int> sources;   // whose mailboxes to wait on for the plan, in order (tree parent, then the root)
  std::vector<int> children;  // who waits on this rank's mailbox
};
Role recovery_role(int world, const Failure& failure, int rank, bool plan_exists,
                   int group_size = overlay::kGroupSize);

// The root's plan for generation `generation`: a free spare per lost rank (in the order given), or an abandonment
// when there are too few. The rendezvous address is the caller's to fill in.
// With too few spares and `shrink` on, a job whose `layout` is pure data parallelism (no tensor or pipeline split,
// no ZeRO-1: every rank holds a whole replica) goes on with the survivors alone, down to shrink.min_dp replicas.
Plan plan_generation(std::uint32_t generation, int world, int root, const Failure& failure,
                     const std::vector<std::string>& free_spares, const Shrink& shrink = {},
                     const std::optional<store::Layout>& layout = std::nullopt);

// Where a replacement's state, or a survivor's that is behind (Plan::behind), comes from at the start of the
// generation `plan` forms, so that it reads nothing from the checkpoint dir.
struct Donor {
  int rank = -1;              // the survivor that sends it
  bool partner_copy = false;  // false: the donor's own live state (the same replica); true: the copy of the lost
                              // rank's whole shard the donor holds in memory (plan.copies)
  bool operator==(const Donor& o) const { return rank == o.rank && partner_copy == o.partner_copy; }
};
// Recipient (a replacement, or a survivor that is behind) -> its donor, both numbered in the generation the plan
// forms (under a plan that shrinks, rank_after of the failed generation's). Only where the plan resumes from a named
// step (a terminal checkpoint: the survivors hold that step's state). A live donor is a survivor that is not
// behind and holds the same replica: the same tensor-parallel and pipeline coordinates (`layout`'s default
// placement), and no ZeRO-1 (each rank's optimizer partition is its own); live donors take the recipients in turn
// (lost ranks first, then those behind), so none serves more than ceil(recipients / replicas) of them. Where no
// live donor holds a lost rank's replica (ZeRO-1, or a split without replicas), the survivor holding its partner
// copy sends that. A recipient left out reads its shard; what a donor sends is checked against the checkpoint's
// checksums before it is used, and a range that does not match is read from the dir. A live donor is never a
// recipient, so no donor waits on another: a survivor that is behind may still send the partner copy it holds.
std::map<int, Donor> state_donors(const Plan& plan, const store::Layout& layout);

// The ready spares no claim names, sorted, from a listing of the run's dir.
std::vector<std::string> free_spares(std::vector<std::string> names);

enum class Verdict {
  Go,           // form the next generation
  NoPlan,       // none came in time: hand over
  Abandoned,    // the root found no way on in place: hand over
  CountedLost,  // the plan counts this rank as lost: leave
};
const char* to_string(Verdict verdict);
Verdict verdict(const std::optional<Plan>& plan, int rank);

// ---- records --------------------------------------------------------------------------------------------------

// When each phase of recovery `generation` ended (unix seconds; 0 where the root did not get there).
struct Phases {
  std::uint32_t generation = 0;
  double detect = 0, decided = 0, last_words_done = 0, plan = 0, group = 0, restored = 0, first_step = 0;
  std::optional<std::uint64_t> step;
  std::vector<int> lost;

  recovery::InPlacePhases as_report() const;
};

struct Claim {
  std::uint32_t generation = 0;
  int rank = 0;
};

// What the `abandoned` marker says: why the survivors handed over, and the ranks they had lost then (ckpt-run
// leaves those ranks' nodes out when it relaunches the node steps inside the allocation).
struct Abandoned {
  std::string why;
  std::vector<int> lost;
};

// Where a spare's claim mailbox listens, and the token a claim must carry.
struct SpareMailbox {
  std::string addr;
  int port = 0;
  std::string token;
};

struct Spare {
  std::string node;
  int local = 0;
  std::int64_t pid = 0;
  double ready_unix = 0;
  std::optional<SpareMailbox> mailbox;

  std::string slot() const { return node + "." + std::to_string(local); }
};

// Where rank `rank` (as it was in generation `generation`) posts the plans it roots or relays.
struct Mailbox {
  int rank = 0;
  std::uint32_t generation = 0;
  std::string addr;
  int port = 0;
  std::int64_t pid = 0;
};

// The records as JSON: parse_* never throws and refuses a record with a missing, mistyped or out-of-range field
// (ranks outside [0, world), a slot that is no "<host>.<local id>", a negative or non-finite time).
std::string to_json(const Plan& plan);
Result<Plan> parse_plan(std::string_view text);
std::string to_json(const Phases& phases);
Result<Phases> parse_phases(std::string_view text);
std::string to_json(const Claim& claim);
Result<Claim> parse_claim(std::string_view text);
std::string to_json(const Spare& spare);
Result<Spare> parse_spare(std::string_view text);
std::string to_json(const Mailbox& mailbox);
Result<Mailbox> parse_mailbox(std::string_view text);

// A slot's node and local id ("n3.0" -> n3, 0); nullopt when it is not a host name, a dot and a number.
std::optional<std::pair<std::string, int>> parse_slot(std::string_view slot);

// The run's dir: every record's write and read.
class Records {
 public:
  // Opens the run's dir, creating it (0700) and its parents as needed unless `create` is false (a reader that
  // must not make it: the launcher, before the first process started).
  static Result<Records> open(const std::string& dir, bool create = true);

  const std::string& dir() const { return path_; }

  // Writes each claim ({generation, rank}, to claim-<slot>), then the plan, stamped with the time; returns it.
  Result<Plan> write_plan(Plan plan, const std::vector<std::pair<std::string, int>>& claims = {});
  std::optional<Plan> read_plan(std::uint32_t generation) const;
  bool has_plan(std::uint32_t generation) const;
  Status write_phases(const Phases& phases);
  std::optional<Phases> read_phases(std::uint32_t generation) const;
  Status write_spare(const Spare& spare);
  std::optional<Spare> read_spare(const std::string& slot) const;
  std::optional<Claim> read_claim(const std::string& slot) const;
  std::vector<std::string> free_spares() const;
  Status publish_mailbox(const Mailbox& mailbox);
  std::optional<Mailbox> read_mailbox(int rank) const;
  // `finished` or `abandoned` (why, when, and the ranks lost); the idle spares leave once either exists.
  Status mark(std::string_view marker, std::string_view why, const std::vector<int>& lost = {});
  bool marked(std::string_view marker) const;
  // The `abandoned` marker of a run of `world` ranks; nullopt when there is none or it cannot be read.
  std::optional<Abandoned> read_abandoned(int world) const;
  // The run's secret (posix::private_secret): made by the first process that needs it.
  Result<posix::Secret> secret() const;

 private:
  Records(posix::Fd dir, std::string path) : dir_(std::move(dir)), path_(std::move(path)) {}
  std::optional<std::string> read(const std::string& name) const;
  Status write(const std::string& name, const std::string& content, bool durable = true);

  posix::Fd dir_;
  std::string path_;
};

}  // namespace ckpt::inplace
