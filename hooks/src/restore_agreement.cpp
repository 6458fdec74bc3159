// The restore agreement over the control dir (restore_agreement.hpp).
#include "restore_agreement.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckpt::hooks {

namespace {

using posix::errno_text;
using posix::join;
using Clock = std::chrono::steady_clock;

std::string numbered(const char* what, int round) { return std::string(what) + "-" + std::to_string(round); }

// "walk-back REASON", "stop REASON" or "ok".
std::string verdict_text(const RoundOutcome& o) {
  switch (o.verdict) {
    case RestoreVerdict::Ok: return "ok\n";
    case RestoreVerdict::WalkBack: return "walk-back " + o.reason + "\n";
    case RestoreVerdict::Stop: return "stop " + o.reason + "\n";
  }
  return "stop unknown verdict\n";
}

std::optional<RoundOutcome> parse_verdict(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  auto split = [&](std::string_view word) -> std::optional<std::string> {
    if (text.rfind(std::string(word) + " ", 0) != 0) return std::nullopt;
    return text.substr(word.size() + 1);
  };
  if (text == "ok") return RoundOutcome{};
  if (auto r = split("walk-back")) return RoundOutcome{RestoreVerdict::WalkBack, *r};
  if (auto r = split("stop")) return RoundOutcome{RestoreVerdict::Stop, *r};
  return std::nullopt;
}

std::string first_line(std::string text) {
  if (auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  return text;
}

// "rank 3: step 300: ...": the failure as a verdict and the FAILED marker give it.
std::string rank_says(int rank, const std::string& error) {
  return "rank " + std::to_string(rank) + ": " + first_line(error);
}

}  // namespace

std::string to_json(const RestorePlan& plan) {
  nlohmann::json j;
  j["step"] = plan.step ? nlohmann::json(*plan.step) : nlohmann::json(nullptr);
  j["root"] = plan.root;
  j["kind"] = store::to_string(plan.kind);
  j["world_size"] = plan.world_size;
  if (!plan.node_launch.empty()) j["node_launch"] = plan.node_launch;
  if (plan.probe) j["probe"] = true;
  return j.dump();
}

Result<RestorePlan> parse_restore_plan(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error{"not a JSON object"};
  RestorePlan plan;
  auto step = j.find("step");
  auto root = j.find("root");
  auto kind = j.find("kind");
  auto world = j.find("world_size");
  if (step == j.end() || root == j.end() || kind == j.end() || world == j.end() || !root->is_string() ||
      !kind->is_string() || !world->is_number_integer()) {
    return Error{"missing or mistyped fields"};
  }
  if (step->is_number_unsigned()) {
    plan.step = step->get<std::uint64_t>();
  } else if (!step->is_null()) {
    return Error{"step is not a whole number"};
  }
  plan.root = root->get<std::string>();
  std::string k = kind->get<std::string>();
  if (k != "periodic" && k != "terminal") return Error{"unknown kind '" + k + "'"};
  plan.kind = k == "terminal" ? store::Kind::Terminal : store::Kind::Periodic;
  plan.world_size = world->get<int>();
  if (auto launch = j.find("node_launch"); launch != j.end()) {
    if (!launch->is_string()) return Error{"node_launch is not a string"};
    plan.node_launch = launch->get<std::string>();
  }
  if (auto probe = j.find("probe"); probe != j.end()) {
    if (!probe->is_boolean()) return Error{"probe is not a boolean"};
    plan.probe = probe->get<bool>();
  }
  if (plan.probe && plan.node_launch.empty()) return Error{"probe without node_launch"};
  return plan;
}

RoundOutcome solo_outcome(const Status& loaded, bool definite, int rank) {
  if (loaded) return {};
  return {definite ? RestoreVerdict::WalkBack : RestoreVerdict::Stop, rank_says(rank, loaded.error())};
}

RestoreAgreement::RestoreAgreement(std::string root, std::string run_id, int rank, int world_size,
                                   std::chrono::milliseconds timeout, RestoreTally tally)
    : root_(std::move(root)),
      dir_(join(join(root_, ".control"), run_id + "-restore")),
      rank_(rank),
      world_(world_size),
      timeout_(timeout),
      tally_(std::move(tally)) {}

RestoreAgreement::~RestoreAgreement() {
  if (fd_ >= 0) ::close(fd_);
}

Status RestoreAgreement::open_dir(bool create) {
  if (fd_ >= 0) return Status::success();
  if (create) {
    for (const std::string& d : {root_, join(root_, ".control"), dir_}) {
      if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
        return Status::failure("ckpt: cannot create " + d + ": " + errno_text(errno));
      }
    }
  }
  fd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd_ < 0) return Status::failure("ckpt: cannot open " + dir_ + ": " + errno_text(errno));
  return Status::success();
}

Status RestoreAgreement::create_exclusive(const std::string& name, const std::string& content, bool* existed) {
  if (existed != nullptr) *existed = false;
  if (Status s = open_dir(true); !s) return s;
  // The link of a temp file publishes it whole and fails on a name that exists: the first creator wins.
  if (Status s = posix::create_file_exclusive(fd_, name, content, join(dir_, name), {}, existed); !s) {
    return Status::failure("ckpt: " + s.error());
  }
  return Status::success();
}

std::optional<std::string> RestoreAgreement::read(const std::string& name) {
  if (!open_dir(false)) return std::nullopt;
  int fd = ::openat(fd_, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || text.size() > (64u << 10)) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

bool RestoreAgreement::job_broke() {
  if (!broken_.empty()) return true;
  if (!tally_.broken) return false;
  if (auto why = tally_.broken()) broken_ = *why;
  return !broken_.empty();
}

// The error of a wait that ended without `what`: the job broke, or `limit` passed.
std::string RestoreAgreement::waited_for(const std::string& what, std::chrono::milliseconds limit) const {
  if (!broken_.empty()) return "ckpt: the restore cannot complete: " + broken_ + " (waiting for " + what + ")";
  return "ckpt: " + what + " did not come within " + std::to_string(limit.count() / 1000) + " s";
}

template <class Ready>
bool RestoreAgreement::wait(Ready ready, Clock::time_point deadline) {
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (ready()) return true;
    if (Clock::now() >= deadline || job_broke()) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

template <class Ready>
bool RestoreAgreement::wait_announced(int round, RestoreFile file, Ready ready, Clock::time_point deadline) {
  // The announcement wakes this rank at once; the file is also looked at once a second, so that an announcement
  // that never comes (the network went, or the frame was lost) costs a second, not the whole timeout.
  for (;;) {
    const auto slice_end = std::min(deadline, Clock::now() + std::chrono::seconds(1));
    const bool announced = tally_.await(round, file, slice_end);
    if (ready()) return true;
    if (announced) return wait(ready, deadline);  // announced but not visible yet: a shared file system's lag
    if (Clock::now() >= deadline || job_broke()) return false;
    if (Clock::now() < slice_end) return wait(ready, deadline);  // the network is gone: poll for the file
  }
}

Status RestoreAgreement::propose(int round, const RestorePlan& plan) {
  bool existed = false;
  if (Status s = create_exclusive(numbered("plan", round), to_json(plan) + "\n", &existed); !s) return s;
  if (existed) {
    return Status::failure("ckpt: " + join(dir_, numbered("plan", round)) +
                           " exists: a launch with the same run id restored from this dir before; give each launch "
                           "its own CKPT_RUN_ID");
  }
  tally_.announce(round, RestoreFile::Plan);
  return Status::success();
}

Result<RestorePlan> RestoreAgreement::proposal(int round) {
  const std::string name = numbered("plan", round);
  std::optional<std::string> text;
  if (!wait_announced(round, RestoreFile::Plan, [&] { return (text = read(name)).has_value() && !text->empty(); },
                      Clock::now() + timeout_)) {
    return Error{waited_for("rank 0's proposal of a checkpoint to restore (" + join(dir_, name) + ")", timeout_)};
  }
  auto plan = parse_restore_plan(*text);
  if (!plan) return Error{"ckpt: " + join(dir_, name) + ": " + plan.error()};
  return plan;
}

Result<RoundOutcome> RestoreAgreement::agree(int round, const Status& loaded, bool definite) {
  if (!loaded) {
    // One marker per kind of failure, whoever comes first: a walk back must not depend on how many ranks failed.
    const char* marker = definite ? "bad" : "stop";
    if (Status s = create_exclusive(numbered(marker, round), rank_says(rank_, loaded.error()) + "\n", nullptr); !s) {
      return Error{s.error()};
    }
  }
  tally_.report(round);
  return rank_ == 0 ? decide_round(round) : await_verdict(round);
}

Result<RoundOutcome> RestoreAgreement::await_verdict(int round) {
  const std::string verdict_name = numbered("verdict", round);
  std::optional<std::string> text;
  auto deadline = Clock::now() + timeout_ + std::chrono::seconds(30);
  if (!wait_announced(round, RestoreFile::Verdict,
                      [&] { return (text = read(verdict_name)).has_value() && !text->empty(); }, deadline)) {
    return Error{waited_for("rank 0's verdict on the restore (" + join(dir_, verdict_name) + ")",
                            timeout_ + std::chrono::seconds(30))};
  }
  auto verdict = parse_verdict(*text);
  if (!verdict) return Error{"ckpt: " + join(dir_, verdict_name) + ": not a verdict"};
  return *verdict;
}

Result<RoundOutcome> RestoreAgreement::decide_round(int round) {
  // Every rank's report, counted up the tree, then one verdict for all.
  const bool all = tally_.wait_all(round, timeout_);
  RoundOutcome outcome = round_outcome(round, all);
  if (Status s = create_exclusive(numbered("verdict", round), verdict_text(outcome), nullptr); !s) {
    return Error{s.error()};
  }
  tally_.announce(round, RestoreFile::Verdict);
  return outcome;
}

RoundOutcome RestoreAgreement::round_outcome(int round, bool all) {
  if (auto bad = read(numbered("bad", round))) return {RestoreVerdict::WalkBack, first_line(*bad)};
  if (auto stop = read(numbered("stop", round))) return {RestoreVerdict::Stop, first_line(*stop)};
  if (all) return {};
  return {RestoreVerdict::Stop, "not every rank reported its restore within " +
                                    std::to_string(timeout_.count() / 1000) + " s"};
}

}  // namespace ckpt::hooks
