// Restart in place: the state machine and the decisions of each generation (inplace.hpp).
#include "ckpt/inplace.hpp"

#include <algorithm>
#include <set>

#include "ckpt/overlay.hpp"
#include "ckpt/parse.hpp"

namespace ckpt::inplace {

const char* to_string(State state) {
  switch (state) {
    case State::Waiting: return "waiting";
    case State::Forming: return "forming";
    case State::Training: return "training";
    case State::Recovering: return "recovering";
    case State::Finished: return "finished";
    case State::Left: return "left";
  }
  return "unknown";
}

const char* to_string(Event event) {
  switch (event) {
    case Event::Claimed: return "claimed";
    case Event::Unneeded: return "unneeded";
    case Event::Formed: return "formed";
    case Event::JoinFailed: return "join-failed";
    case Event::Returned: return "returned";
    case Event::PeerLost: return "peer-lost";
    case Event::Planned: return "planned";
    case Event::Failed: return "failed";
    case Event::HandedOver: return "handed-over";
  }
  return "unknown";
}

namespace {

struct Transition {
  State from;
  Event event;
  State to;
};

// The whole table: what is not here is an error.
constexpr Transition kTransitions[] = {
    {State::Waiting, Event::Claimed, State::Forming},
    {State::Waiting, Event::Unneeded, State::Left},
    {State::Waiting, Event::HandedOver, State::Left},
    {State::Forming, Event::Formed, State::Training},
    {State::Forming, Event::JoinFailed, State::Recovering},
    {State::Forming, Event::Failed, State::Left},
    {State::Forming, Event::HandedOver, State::Left},
    {State::Training, Event::Returned, State::Finished},
    {State::Training, Event::PeerLost, State::Recovering},
    {State::Training, Event::JoinFailed, State::Recovering},  // the roll call after a mesh that never formed
    {State::Training, Event::Failed, State::Left},
    {State::Training, Event::HandedOver, State::Left},
    {State::Recovering, Event::Planned, State::Forming},
    {State::Recovering, Event::HandedOver, State::Left},
};

}  // namespace

std::optional<State> next_state(State from, Event event) {
  for (const Transition& t : kTransitions) {
    if (t.from == from && t.event == event) return t.to;
  }
  return std::nullopt;
}

Status Machine::on(Event event, std::optional<std::uint32_t> claimed_generation) {
  auto to = next_state(state_, event);
  if (!to) {
    return Status::failure(std::string("ckpt: restart in place: no transition from ") + to_string(state_) + " on " +
                           to_string(event));
  }
  if (event == Event::Claimed) {
    if (!claimed_generation) return Status::failure("ckpt: restart in place: a claim names no generation");
    generation_ = *claimed_generation;
  }
  if (*to == State::Recovering) ++generation_;
  state_ = *to;
  return Status::success();
}

const char* to_string(AfterTrain next) {
  switch (next) {
    case AfterTrain::Return: return "return";
    case AfterTrain::Raise: return "raise";
    case AfterTrain::RollCall: return "roll-call";
    case AfterTrain::Recover: return "recover";
    case AfterTrain::Leave: return "leave";
  }
  return "unknown";
}

bool finished_matters(const TrainOutcome& outcome) {
  return !outcome.raised && (outcome.lost_peer || outcome.counted_dead);
}

AfterTrain after_train(std::uint32_t generation, const TrainOutcome& outcome) {
  // This rank's train() returned, and so did rank 0's: a peer lost after the last step costs nothing (a rank that
  // left as training ended can read as a death to a rank still closing).
  if (finished_matters(outcome) && outcome.finished) return AfterTrain::Return;
  // A replacement that died after the group formed, before the heartbeat mesh did: every live rank fails alike,
  // with no loss reported, and only a roll call tells who is gone. Generation 0 has no replacement to lose.
  if (generation > 0 && outcome.raised && outcome.mesh_failed && !outcome.lost_peer) return AfterTrain::RollCall;
  if (outcome.counted_dead) return AfterTrain::Leave;
  if (outcome.lost_peer) return AfterTrain::Recover;
  return outcome.raised ? AfterTrain::Raise : AfterTrain::Return;
}

bool training_stuck(const TrainingThread& thread) {
  // A thread still computing uses CPU, and one that waits on the last words waits until they are done.
  return thread.last_words_done && !thread.returned && thread.cpu_idle_s >= kStuckIdleS;
}

const char* to_string(AfterJoinFailure next) {
  switch (next) {
    case AfterJoinFailure::Raise: return "raise";
    case AfterJoinFailure::HandOver: return "hand-over";
    case AfterJoinFailure::Recover: return "recover";
  }
  return "unknown";
}

AfterJoinFailure after_join_failure(std::uint32_t generation, const std::optional<std::vector<int>>& missing) {
  if (generation == 0) return AfterJoinFailure::Raise;
  if (!missing || missing->empty()) return AfterJoinFailure::HandOver;
  return AfterJoinFailure::Recover;
}

std::vector<int> gone_for_good(const std::vector<int>& absent, const std::vector<int>& refused) {
  std::vector<int> gone;
  for (int r : absent) {
    if (std::find(refused.begin(), refused.end(), r) != refused.end()) gone.push_back(r);
  }
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  return gone;
}

bool roll_call_settled(const std::vector<int>& absent, const std::vector<int>& refused) {
  return std::all_of(absent.begin(), absent.end(),
                     [&](int r) { return std::find(refused.begin(), refused.end(), r) != refused.end(); });
}

Failure join_failure(const Plan& plan, std::vector<int> missing, double now_unix) {
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  Failure f;
  f.root = std::binary_search(missing.begin(), missing.end(), plan.root) ? -1 : plan.root;
  f.lost = std::move(missing);
  f.step = plan.step;
  f.detect_unix = f.decided_unix = f.done_unix = now_unix;
  return f;
}

namespace {

overlay::Gone gone_of(int world, const std::vector<int>& lost) {
  overlay::Gone gone(static_cast<std::size_t>(std::max(world, 0)), 0);
  for (int r : lost) {
    if (r >= 0 && r < world) gone[static_cast<std::size_t>(r)] = 1;
  }
  return gone;
}

bool is_lost(const Failure& failure, int rank) {
  return std::find(failure.lost.begin(), failure.lost.end(), rank) != failure.lost.end();
}

}  // namespace

int recovery_root(int world, const Failure& failure) {
  if (failure.root >= 0 && failure.root < world && !is_lost(failure, failure.root)) return failure.root;
  for (int r = 0; r < world; ++r) {
    if (!is_lost(failure, r)) return r;
  }
  return 0;
}

Role recovery_role(int world, const Failure& failure, int rank, bool plan_exists, int group_size) {
  Role role;
  role.root = recovery_root(world, failure);
  role.lost = is_lost(failure, rank);
  role.writes_plan = rank == role.root && !plan_exists;
  if (role.lost) {  // a rank counted as lost that is still here asks the root, and relays to nobody
    role.sources = {role.root};
    return role;
  }
  const overlay::Shape shape{world, std::max(group_size, 1)};
  const overlay::Links links = overlay::links_of(shape, rank, gone_of(world, failure.lost));
  if (links.up && *links.up != rank) role.sources.push_back(*links.up);
  if (rank != role.root && std::find(role.sources.begin(), role.sources.end(), role.root) == role.sources.end()) {
    role.sources.push_back(role.root);
  }
  role.children = links.down;
  return role;
}

namespace {

// `ranks` that lie in a world of `world` ranks and are not in `except` (sorted), sorted and distinct.
std::vector<int> ranks_within(const std::vector<int>& ranks, int world, const std::vector<int>& except = {}) {
  std::vector<int> out;
  for (int r : ranks) {
    if (r >= 0 && r < world && !std::binary_search(except.begin(), except.end(), r)) out.push_back(r);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Why the survivors of `world` ranks cannot go on without `lost` of them; empty when they can.
std::string cannot_shrink(int world, std::size_t lost, const Shrink& shrink,
                          const std::optional<store::Layout>& layout) {
  if (!shrink.on()) return {};
  if (!layout) return "shrinking needs the job's layout, and no checkpointer said it";
  if (layout->tp != 1 || layout->pp != 1 || layout->zero1 || layout->world_size() != world) {
    return "shrinking needs pure data parallelism (layout dp=" + std::to_string(layout->dp) + ",tp=" +
           std::to_string(layout->tp) + ",pp=" + std::to_string(layout->pp) + (layout->zero1 ? ",zero1=on" : "") + ")";
  }
  const int left = world - static_cast<int>(lost);
  if (left < shrink.min_dp || left < 1) {
    return "shrinking to " + std::to_string(left) + " replicas is below the floor of " +
           std::to_string(shrink.min_dp) + " (--ckpt-shrink)";
  }
  return {};
}

}  // namespace

Plan plan_generation(std::uint32_t generation, int world, int root, const Failure& failure,
                     const std::vector<std::string>& free_spares, const Shrink& shrink,
                     const std::optional<store::Layout>& layout) {
  Plan plan;
  plan.generation = generation;
  const bool replace = free_spares.size() >= failure.lost.size();
  if (!replace) {
    std::string why = cannot_shrink(world, failure.lost.size(), shrink, layout);
    if (!shrink.on() || !why.empty()) {
      plan.abandon = std::to_string(failure.lost.size()) + " ranks lost, " + std::to_string(free_spares.size()) +
                     " spares ready" + (why.empty() ? "" : "; " + why);
      return plan;
    }
  }
  plan.world = replace ? world : world - static_cast<int>(failure.lost.size());
  plan.world_before = replace ? 0 : world;
  plan.root = root;
  plan.lost = failure.lost;
  plan.step = failure.step;
  plan.detect_unix = failure.detect_unix;
  for (std::size_t i = 0; replace && i < failure.lost.size(); ++i) plan.takeover[failure.lost[i]] = free_spares[i];
  if (replace && plan.step) {
    for (const auto& [ward, holder] : failure.stand_ins) {
      const bool ward_lost = std::find(plan.lost.begin(), plan.lost.end(), ward) != plan.lost.end();
      const bool holder_lost = std::find(plan.lost.begin(), plan.lost.end(), holder) != plan.lost.end();
      if (ward_lost && !holder_lost && holder >= 0 && holder < world) plan.copies[ward] = holder;
    }
  }
  // In the failed generation's numbering, as `lost` is.
  if (plan.step) plan.behind = ranks_within(failure.behind, world, ranks_within(plan.lost, world));
  if (!replace) plan.root = rank_after(plan, root);
  return plan;
}

int rank_after(const Plan& plan, int rank) {
  if (std::find(plan.lost.begin(), plan.lost.end(), rank) != plan.lost.end()) return plan.shrinks() ? -1 : rank;
  if (!plan.shrinks()) return rank;
  return rank - static_cast<int>(std::count_if(plan.lost.begin(), plan.lost.end(), [&](int l) { return l < rank; }));
}

Result<Shrink> parse_shrink(std::string_view text) {
  if (text == "off") return Shrink{};
  if (text == "on") return Shrink{1};
  auto n = parse_uint(text);
  if (!n || *n < 1 || *n > static_cast<std::uint64_t>(kMaxWorld)) {
    return Error{"expected off, on, or the fewest data-parallel replicas to go on with (a whole number >= 1)"};
  }
  return Shrink{static_cast<int>(*n)};
}

std::string format_shrink(const Shrink& shrink) {
  if (!shrink.on()) return "off";
  return shrink.min_dp == 1 ? "on" : std::to_string(shrink.min_dp);
}

std::vector<std::string> free_spares(std::vector<std::string> names) {
  static constexpr std::string_view kSpare = "spare-", kClaim = "claim-";
  std::set<std::string> claimed;
  std::vector<std::string> spares;
  for (const std::string& n : names) {
    if (n.compare(0, kClaim.size(), kClaim) == 0) claimed.insert(n.substr(kClaim.size()));
    if (n.compare(0, kSpare.size(), kSpare) == 0 && parse_slot(n.substr(kSpare.size()))) {
      spares.push_back(n.substr(kSpare.size()));
    }
  }
  std::sort(spares.begin(), spares.end());
  spares.erase(std::remove_if(spares.begin(), spares.end(), [&](const std::string& s) { return claimed.count(s); }),
               spares.end());
  return spares;
}

const char* to_string(Verdict verdict) {
  switch (verdict) {
    case Verdict::Go: return "go";
    case Verdict::NoPlan: return "no-plan";
    case Verdict::Abandoned: return "abandoned";
    case Verdict::CountedLost: return "counted-lost";
  }
  return "unknown";
}

Verdict verdict(const std::optional<Plan>& plan, int rank) {
  if (!plan) return Verdict::NoPlan;
  if (plan->abandons()) return Verdict::Abandoned;
  if (std::find(plan->lost.begin(), plan->lost.end(), rank) != plan->lost.end()) return Verdict::CountedLost;
  return Verdict::Go;
}

std::map<int, Donor> state_donors(const Plan& plan, const store::Layout& layout) {
  std::map<int, Donor> donors;
  if (!plan.step || plan.abandons() || plan.world != layout.world_size()) return donors;
  const auto world = static_cast<std::size_t>(plan.world);
  // The plan names ranks of the failed generation; donors and recipients are ranks of the one it forms. A plan that
  // shrinks drops its lost ranks (no replacement to send to) and renumbers the survivors (rank_after).
  const int before = plan.shrinks() ? plan.world_before : plan.world;
  const std::vector<int> gone = ranks_within(plan.lost, before);
  const std::vector<int> lost = plan.shrinks() ? std::vector<int>{} : gone;  // the recipients among them
  std::vector<int> behind;
  for (int r : ranks_within(plan.behind, before, gone)) {
    behind.push_back(rank_after(plan, r));
  }
  std::vector<bool> recipient(world, false);
  for (int r : lost) recipient[static_cast<std::size_t>(r)] = true;
  for (int r : behind) recipient[static_cast<std::size_t>(r)] = true;
  // Per (pp, tp): the survivors holding it live, and how many recipients each has taken so far (a turn each).
  std::map<std::pair<int, int>, std::vector<int>> holders;
  for (int r = 0; r < plan.world && !layout.zero1; ++r) {
    if (recipient[static_cast<std::size_t>(r)]) continue;
    store::RankCoord c = layout.coord_of(r);
    holders[{c.pp, c.tp}].push_back(r);
  }
  std::map<std::pair<int, int>, std::size_t> turn;
  auto live_donor = [&](int r) -> std::optional<int> {
    store::RankCoord c = layout.coord_of(r);
    auto it = holders.find({c.pp, c.tp});
    if (it == holders.end() || it->second.empty()) return std::nullopt;
    std::size_t& next = turn[{c.pp, c.tp}];
    return it->second[next++ % it->second.size()];
  };
  for (int r : lost) {
    if (auto donor = live_donor(r)) {
      donors[r] = Donor{*donor, false};
    } else if (auto copy = plan.copies.find(r);
               copy != plan.copies.end() && copy->second >= 0 && copy->second < plan.world &&
               !std::binary_search(lost.begin(), lost.end(), copy->second)) {
      donors[r] = Donor{copy->second, true};
    }
  }
  for (int r : behind) {
    if (auto donor = live_donor(r)) donors[r] = Donor{*donor, false};
  }
  return donors;
}

}  // namespace ckpt::inplace
