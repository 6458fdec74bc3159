// The coordinator of every job of more than one rank: checkpoint requests and shard completion travel over the
// heartbeat network (heartbeat.hpp, silent where the last words are off) instead of files on the shared checkpoint
// dir. A request is flooded to every
// rank (each forwards it once); completion is counted up the tree: a rank sends its up neighbour one kShardsDone
// per checkpoint, with the number of ranks below it (itself included) whose shards are durable, once its own shard
// and every down link's count are in. The root, rank 0 while the job is healthy, knows every shard is durable when
// its count reaches the world size. A failed shard is passed up on its own (kShardFailed), its reason in the
// control dir (one file, on failure only). Until the network is attached (the checkpointer creates it after
// the coordinator), requests go through the control dir.
//
// Records go up with the counts, so that the root commits without reading one file per rank: a rank with down
// links reads its members' records and its child ranks' gathered files, and writes its own gathered file
// (store::write_gathered) before it sends its count. Retention is shared out the same way: the writer retires
// step dirs (store::retire) and floods kRetired; each rank removes its own two files. Per rank and checkpoint: one
// message up, a constant number of file operations.
//
// Threads: the training thread requests and asks; the persist thread notes its record, publishes, waits (writer)
// and retires; the network's threads deliver frames (on_frame) and must not block, so every file operation of
// this coordinator runs on its own worker thread.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "coordination_frames.hpp"
#include "coordinator.hpp"
#include "heartbeat.hpp"
#include "last_words_runtime.hpp"
#include "log.hpp"

namespace ckpt::hooks {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kKeptCounts = 8;                       // counts kept after they went up, for a recount
constexpr std::chrono::milliseconds kRecountAfter{3000};     // the root asks for a recount after this long

class TreeCoordinator final : public Coordinator {
 public:
  explicit TreeCoordinator(const Config& config)
      : control_(config.dir, config.run_id, config.rank),
        config_(config),
        tree_(overlay::links_of(overlay::Shape{config.world_size}, config.rank,
                                overlay::Gone(static_cast<std::size_t>(config.world_size), 0))) {}

  ~TreeCoordinator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      tasks_.clear();
    }
    work_cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  const char* name() const override { return "tree"; }

  void attach(LastWords& last_words) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      words_ = &last_words;
    }
    // After words_: the frames held until now are handled (and passed on) as they would have been on arrival.
    last_words.set_coordination([this](const heartbeat::Frame& f, int from) { on_frame(f, from); });
  }

  void detach() override {
    std::lock_guard<std::mutex> lock(mu_);
    words_ = nullptr;
    cv_.notify_all();
  }

  // Restore rounds are counted like checkpoints, under keys above every step.
  Result<RestoreTally> restore_tally() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (words_ == nullptr) return Error{"ckpt: the restore needs the heartbeat network, which is not up"};
    }
    RestoreTally tally;
    tally.report = [this](int round) { (void)publish(restore_key(round), Status::success()); };
    tally.wait_all = [this](int round, std::chrono::milliseconds timeout) {
      return static_cast<bool>(wait_all(restore_key(round), timeout));
    };
    tally.announce = [this](int round, RestoreFile file) {
      std::lock_guard<std::mutex> lock(mu_);
      announced_.emplace(round, file);
      if (words_ == nullptr) return;
      words_->network().flood(heartbeat::RestoreFileFrame{round, file}.to_frame());
    };
    tally.await = [this](int round, RestoreFile file, Clock::time_point deadline) {
      std::unique_lock<std::mutex> lock(mu_);
      for (;;) {
        if (announced_.count({round, file}) != 0) return true;
        if (words_ == nullptr || words_->triggered() || cancelled_.load()) {
          // Where a restore that never ends is stuck: this rank's subtrees that have not counted in.
          auto it = counts_.find(restore_key(round));
          if (file == RestoreFile::Verdict && it != counts_.end() && !it->second.sent) {
            log_missing_locked(restore_key(round));
          }
          return false;
        }
        if (Clock::now() >= deadline) return false;
        cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
      }
    };
    tally.broken = [this]() -> std::optional<std::string> {
      LastWords* words = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        words = words_;
      }
      if (words == nullptr) return std::nullopt;
      const std::vector<int> died = words->network().died();  // the network's lock, never under mu_
      if (died.empty()) return std::nullopt;
      return "rank " + std::to_string(died.front()) + " of the job died";
    };
    return tally;
  }

  Status begin(std::uint64_t resume_step) override {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.clear();
    terminal_at_.reset();
    missed_terminal_.reset();
    control_.begin(resume_step);
    return Status::success();
  }

  Status request(std::uint64_t step, store::Kind kind) override {
    LastWords* words = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      words = words_;
      if (words != nullptr && !note_request_locked(step, kind)) return Status::success();
    }
    if (words == nullptr) return control_.request(step, kind);
    words->network().flood(heartbeat::RequestFrame{step, kind}.to_frame());
    return Status::success();
  }

  std::optional<store::Kind> requested(std::uint64_t step) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (words_ != nullptr) {
        passed_ = std::max(passed_, step);
        auto it = requests_.find(step);
        if (it == requests_.end()) return std::nullopt;
        return it->second;
      }
    }
    return control_.requested(step);
  }

  std::optional<std::uint64_t> missed_terminal() override {
    std::lock_guard<std::mutex> lock(mu_);
    return missed_terminal_;
  }

  void request_memory(std::uint64_t step) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (words_ == nullptr || !memory_requests_.insert(step).second) return;
    words_->network().flood(heartbeat::RequestFrame{step, store::Kind::Periodic, true}.to_frame());
  }

  bool memory_requested(std::uint64_t step) override {
    std::lock_guard<std::mutex> lock(mu_);
    memory_passed_ = std::max(memory_passed_, step);
    const bool asked = memory_requests_.count(step) != 0;
    // What is far behind goes; what was just passed stays, so that a late copy of it is known for one.
    memory_requests_.erase(memory_requests_.begin(), memory_requests_.lower_bound(step > 1024 ? step - 1024 : 0));
    return asked;
  }

  void note_record(std::uint64_t step, const store::ShardRecord& record) override {
    std::lock_guard<std::mutex> lock(mu_);
    counts_[step].record = record;
  }

  Status publish(std::uint64_t step, const Status& outcome) override {
    if (!outcome) {
      if (Status s = control_.report_failure(step, outcome.error()); !s) return s;
      std::lock_guard<std::mutex> lock(mu_);
      failed_[step] = config_.rank;
      if (words_ != nullptr) words_->network().send_up(heartbeat::ShardFailedFrame{step, config_.rank}.to_frame());
      cv_.notify_all();
      return Status::success();
    }
    std::lock_guard<std::mutex> lock(mu_);
    counts_[step].own = true;
    count_up_locked(step);
    return Status::success();
  }

  Status wait_all(std::uint64_t step, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (cancelled_.load()) {
      return Status::failure("ckpt: step " + std::to_string(step) + ": training ended before every rank persisted");
    }
    if (words_ == nullptr) return Status::failure("ckpt: step " + std::to_string(step) + ": no heartbeat network");
    const int world = config_.world_size;
    // Polled in slices as well: a peer's death starts the last words, and this checkpoint will not complete.
    const auto deadline = Clock::now() + timeout;
    auto recount_at = Clock::now() + kRecountAfter;
    bool done = false;
    for (;;) {
      done = cv_.wait_for(lock, std::chrono::milliseconds(100), [&] {
        return cancelled_.load() || failed_.count(step) != 0 || counts_[step].total >= static_cast<std::uint64_t>(world) ||
               !died_.empty() || after_terminal_locked(step);
      });
      if (done || Clock::now() >= deadline) break;
      if (Clock::now() >= recount_at) {
        recount_locked(step);
        recount_at = Clock::now() + kRecountAfter;
      }
      if (words_ == nullptr || words_->triggered()) {
        log_missing_locked(step);
        return Status::failure("ckpt: step " + std::to_string(step) + (words_ == nullptr ? ": the network closed" :
                               ": the last words started") + " before every rank persisted");
      }
    }
    // What came in: the job's count, or while it is incomplete this rank's own shard and its subtrees' counts.
    const Count& c = counts_[step];
    std::uint64_t total = c.total;
    if (total == 0) {
      total = c.own ? 1 : 0;
      for (const auto& [down, n] : c.below) total += n;
    }
    if (!done && failed_.count(step) == 0 && !cancelled_.load()) log_missing_locked(step);
    counts_.erase(step);
    if (auto it = failed_.find(step); it != failed_.end()) {
      const int r = it->second;
      lock.unlock();
      auto why = control_.failure(step, r);
      return Status::failure("ckpt: rank " + std::to_string(r) + " could not persist step " + std::to_string(step) +
                             (why ? ": " + *why : ""));
    }
    if (cancelled_.load()) {
      return Status::failure("ckpt: step " + std::to_string(step) + ": training ended before every rank persisted");
    }
    if (total < static_cast<std::uint64_t>(world) && after_terminal_locked(step)) {
      return Status::failure("ckpt: step " + std::to_string(step) + ": the other ranks stopped at the terminal "
                             "checkpoint of step " + std::to_string(*terminal_at_) + ", asked for after this rank "
                             "had passed it; " + lead_too_short());
    }
    if (total < static_cast<std::uint64_t>(world) && !died_.empty()) {
      if (words_ != nullptr && words_->triggered()) {
        return Status::failure("ckpt: step " + std::to_string(step) + ": the last words started before every rank "
                               "persisted");
      }
      // Without last words nothing else ends the run: say what this means for every checkpoint from now on.
      const int gone = *died_.begin();
      return Status::failure(
          "ckpt: step " + std::to_string(step) + ": " +
          (gone == config_.rank ? std::string("the other ranks count this rank as dead")
                                : "rank " + std::to_string(gone) + " is gone from the heartbeat network") +
          " (it died, or was silent past the heartbeat timeout): no checkpoint of this run can complete; restart "
          "the job to be protected again");
    }
    if (!done) {
      return Status::failure("ckpt: step " + std::to_string(step) + ": " + std::to_string(world - static_cast<int>(total)) +
                             " of " + std::to_string(world) + " ranks did not report a durable shard within " +
                             std::to_string(timeout.count() / 1000) + "s");
    }
    return Status::success();
  }

  // The records gathered up the tree; where a subtree could not gather (a record it could not read), the step dir's
  // records are read here instead (as store::commit reads them), a slow path that costs the writer a file per rank.
  Result<std::vector<store::ShardRecord>> records(std::uint64_t step) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = gathered_.find(step);
      if (it != gathered_.end()) {
        std::vector<store::ShardRecord> records = std::move(it->second);
        gathered_.erase(gathered_.begin(), std::next(it));
        return records;
      }
    }
    log::info(config_.rank, "step " + std::to_string(step) + ": the records were not gathered; reading each rank's");
    return store::read_present_records(config_.dir, step);
  }

  void retired(const std::vector<std::uint64_t>& steps) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::uint64_t step : steps) {
      if (!retired_seen_.insert(step).second) continue;
      remove_own_later_locked(step);
      if (words_ != nullptr) {
        words_->network().flood(heartbeat::RetiredFrame{step}.to_frame());
      }
    }
  }

  void cancel() override {
    cancelled_.store(true);
    cv_.notify_all();
  }

  // Before this rank leaves the network: its count of every checkpoint it persisted has gone up (a slower rank
  // below it may still be persisting; the root waits for that count).
  void drain(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (words_ == nullptr) return;
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline && !cancelled_.load() && words_ != nullptr && !words_->triggered()) {
      // A count that can never go up is not waited for: a subtree failed the step, or the job stopped before it.
      bool pending = false;
      for (const auto& [step, c] : counts_) {
        pending = pending || (c.own && !c.sent && failed_.count(step) == 0 && !after_terminal_locked(step));
      }
      if (!pending) return;
      cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }

 private:
  struct Count {
    bool own = false;                          // this rank's shard is durable
    std::optional<store::ShardRecord> record;  // its record (note_record)
    std::map<int, std::uint64_t> below;        // per down link: its subtree's count
    std::set<int> ready;                       // down links whose subtree's records can be read
    bool gathering = false;                    // the worker is gathering records; the count goes up after
    bool sent = false;
    std::uint64_t sent_total = 0;              // what went up, sent again on a recount
    bool sent_records_ready = false;
    std::uint64_t total = 0;                   // at the root: the job's count
  };

  // One subtree below this rank: its top rank and how many ranks it counts.
  struct Below {
    int rank = 0;
    std::uint64_t count = 0;
  };

  static std::uint64_t restore_key(int round) {
    return (std::uint64_t{1} << 62) + static_cast<std::uint64_t>(round);
  }

  // False when the request was known already (it is not passed on again).
  bool note_request_locked(std::uint64_t step, store::Kind kind) {
    if (kind == store::Kind::Terminal && (!terminal_at_ || step < *terminal_at_)) terminal_at_ = step;
    auto [it, fresh] = requests_.emplace(step, kind);
    if (fresh) return true;
    if (kind == store::Kind::Terminal && it->second != store::Kind::Terminal) {
      it->second = kind;  // a terminal request wins over a periodic one for the same step
      return true;
    }
    return false;
  }

  // Sends this rank's count for `step` up once its own shard and every down link's count are in.
  void count_up_locked(std::uint64_t step) {
    Count& c = counts_[step];
    if (!c.own || c.sent || words_ == nullptr) return;
    // The tree of the whole job, not this rank's current view: ranks leave in order once their count went up, and
    // a view without them would wait for their successors, who counted through them. After a death no periodic
    // checkpoint completes anyway: the last words take over.
    const overlay::Links& links = tree_;
    for (int d : links.down) {
      if (c.below.count(d) == 0) return;
    }
    if (c.gathering) return;
    // Every count that came counts, also from a link that has left since (it sent its count, then said goodbye).
    std::uint64_t total = 1;
    for (const auto& [from, n] : c.below) total += n;
    bool records_ready = c.record.has_value();
    for (const auto& [from, n] : c.below) records_ready = records_ready && c.ready.count(from) != 0;
    if (!records_ready) {
      finish_count_locked(step, total, std::nullopt);
      return;
    }
    if (links.down.empty()) {  // a member: its record is its .rec, nothing to gather
      finish_count_locked(step, total, std::vector<store::ShardRecord>{*c.record});
      return;
    }
    c.gathering = true;
    std::vector<Below> below;
    for (const auto& [from, n] : c.below) below.push_back({from, n});
    store::ShardRecord own = *c.record;
    schedule_locked([this, step, total, own = std::move(own), below = std::move(below)] {
      gather(step, total, own, below);
    });
  }

  // The worker: this rank's record, its members' and its child ranks' gathered ones, written for its parent.
  void gather(std::uint64_t step, std::uint64_t total, const store::ShardRecord& own, const std::vector<Below>& below) {
    std::optional<std::vector<store::ShardRecord>> records(std::vector<store::ShardRecord>{own});
    std::string why;
    for (const Below& b : below) {
      if (b.count == 1) {
        auto r = store::read_record(config_.dir, step, b.rank);
        if (!r) {
          why = r.error();
          records.reset();
          break;
        }
        records->push_back(std::move(*r));
      } else {
        auto rs = store::read_gathered(config_.dir, step, b.rank);
        if (!rs) {
          why = rs.error();
          records.reset();
          break;
        }
        records->insert(records->end(), std::make_move_iterator(rs->begin()), std::make_move_iterator(rs->end()));
      }
    }
    if (records && records->size() != total) {
      why = std::to_string(records->size()) + " records for " + std::to_string(total) + " ranks";
      records.reset();
    }
    if (records && !tree_.is_root) {
      if (Status s = store::write_gathered(config_.dir, step, config_.rank, *records); !s) {
        why = s.error();
        records.reset();
      }
    }
    if (!records) {
      log::debug(config_.rank, "step " + std::to_string(step) + ": records not gathered (the writer reads them): " +
                                   why);
    }
    std::lock_guard<std::mutex> lock(mu_);
    finish_count_locked(step, total, std::move(records));
  }

  // The count of `step` goes up (or, at the root, is the job's), with the records when they were gathered.
  void finish_count_locked(std::uint64_t step, std::uint64_t total,
                           std::optional<std::vector<store::ShardRecord>> records) {
    Count& c = counts_[step];
    c.gathering = false;
    c.sent = true;
    c.sent_total = total;
    c.sent_records_ready = records.has_value();
    // Counts this rank passed on are kept a while for a recount; the oldest go (one that failed never completes).
    for (auto it = counts_.begin(); it != counts_.end() && it->first < step && counts_.size() > kKeptCounts;) {
      it = it->second.sent ? counts_.erase(it) : std::next(it);
    }
    if (tree_.is_root) {
      c.total = total;
      if (records) gathered_[step] = std::move(*records);
      cv_.notify_all();
      return;
    }
    cv_.notify_all();  // drain() waits for the count to go up
    send_count_locked(step, c);
  }

  void send_count_locked(std::uint64_t step, const Count& c) {
    if (words_ == nullptr || !tree_.up) return;
    const heartbeat::ShardsDoneFrame done{step, c.sent_total, c.sent_records_ready};
    if (!words_->network().send(*tree_.up, done.to_frame())) {  // its up neighbour died: the last words take over
      log::debug(config_.rank, "the count of " + what(step) + " could not be sent to rank " + std::to_string(*tree_.up) +
                                  " (no link to it)");
    }
  }

  // The root, when a count has not come in for a while: every rank that sent its count of `step` sends it again
  // (a count is an assignment at the receiver, so a duplicate changes nothing). A frame lost anywhere on the way
  // costs a recount, never a wait without end.
  void recount_locked(std::uint64_t step) {
    if (words_ == nullptr) return;
    const heartbeat::RecountFrame recount{step, ++recounts_};
    recount_seen_.emplace(step, recount.recount);
    log::info(config_.rank, what(step) + ": not every count came within " +
                                std::to_string(kRecountAfter.count() / 1000) + " s; asking every rank to send its count again");
    words_->network().flood(recount.to_frame());
  }

  // Which of this rank's subtrees have not counted `step` in: where a wait that never ends is stuck.
  void log_missing_locked(std::uint64_t step) {
    const Count& c = counts_[step];
    std::string below;
    for (int d : tree_.down) {
      auto it = c.below.find(d);
      below += " " + std::to_string(d) + ":" + (it == c.below.end() ? "-" : std::to_string(it->second));
    }
    log::warn(config_.rank, what(step) + ": " + std::to_string(c.total) + " of " + std::to_string(config_.world_size) +
                                " ranks counted; this rank's own " + (c.own ? "in" : "missing") +
                                ", its subtrees (rank:count)" + below);
  }

  static std::string what(std::uint64_t key) {
    if (key >= (std::uint64_t{1} << 62)) return "restore round " + std::to_string(key - (std::uint64_t{1} << 62));
    return "step " + std::to_string(key);
  }

  // This rank's files of a retired step, removed on the worker.
  void remove_own_later_locked(std::uint64_t step) {
    // Steps only grow: the oldest ones seen cannot come again.
    while (retired_seen_.size() > 64) retired_seen_.erase(retired_seen_.begin());
    schedule_locked([this, step] {
      if (Status s = store::remove_retired_own(config_.dir, step, config_.rank); !s) log::warn(config_.rank, s.error());
    });
  }

  // The cure a late request names; where this rank knows how late it came (it was at step `at`), the lead that
  // would have been in time.
  std::string lead_too_short(std::optional<std::uint64_t> step = std::nullopt, std::uint64_t at = 0) const {
    const std::uint64_t lead = config_.agree_lead;
    std::string cure = "CKPT_AGREE_LEAD=" + std::to_string(lead) + " steps is too short for this job's steps";
    if (step && at >= *step) cure += " (" + std::to_string(lead + (at - *step) + 1) + " would have been in time here)";
    return cure;
  }

  // Every rank that took the terminal checkpoint stops at it: none of a later step can complete.
  bool after_terminal_locked(std::uint64_t step) const { return terminal_at_ && *terminal_at_ < step; }

  // A request that came after this rank had passed its step: the rank never takes that checkpoint, so it says so
  // at once, up the tree and with the reason in the control dir, instead of leaving the root to wait out the commit
  // timeout. The cure is a larger lead (or a shorter path: a less loaded host).
  void on_late_request_locked(std::uint64_t step) {
    if (requests_[step] == store::Kind::Terminal && !missed_terminal_) missed_terminal_ = step;
    if (failed_.count(step) != 0) return;
    failed_[step] = config_.rank;
    const std::string why = "the request for step " + std::to_string(step) + " reached this rank at step " +
                            std::to_string(passed_) + ", after it had passed that step; " +
                            lead_too_short(step, passed_);
    log::warn(config_.rank, why);
    words_->network().send_up(heartbeat::ShardFailedFrame{step, config_.rank}.to_frame());
    cv_.notify_all();
    schedule_locked([this, step, why] { (void)control_.report_failure(step, why); });
  }

  // A memory checkpoint asked for: taken at that step by every rank. One that comes after this rank passed the step
  // costs only that memory checkpoint here (the last words then find no step every rank holds until the next one):
  // said once, with the cure.
  void on_memory_request_locked(std::uint64_t step, const heartbeat::Frame& f, int from) {
    if (words_ == nullptr || !memory_requests_.insert(step).second) return;
    words_->network().flood(f, from);
    if (step > memory_passed_ || memory_late_said_) return;
    memory_late_said_ = true;
    log::warn(config_.rank, "the memory checkpoint of step " + std::to_string(step) + " was asked for after this rank "
                            "passed it (at step " + std::to_string(memory_passed_) + "): " +
                            lead_too_short(step, memory_passed_));
  }

  void schedule_locked(std::function<void()> task) {
    if (stopping_) return;
    tasks_.push_back(std::move(task));
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    work_cv_.notify_one();
  }

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (stopping_) return;
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  // The network's threads.
  void on_frame(const heartbeat::Frame& f, int from) {
    std::lock_guard<std::mutex> lock(mu_);
    switch (f.type) {
      case heartbeat::kRequest: {
        const auto request = heartbeat::RequestFrame::from_frame(f);
        if (request.memory) {
          on_memory_request_locked(request.step, f, from);
          break;
        }
        if (!note_request_locked(request.step, request.kind) || words_ == nullptr) break;
        words_->network().flood(f, from);
        if (request.step <= passed_) on_late_request_locked(request.step);
        break;
      }
      case heartbeat::kShardsDone: {
        const auto done = heartbeat::ShardsDoneFrame::from_frame(f);
        counts_[done.step].below[from] = done.ranks;
        if (done.records_ready) counts_[done.step].ready.insert(from);
        count_up_locked(done.step);
        cv_.notify_all();
        break;
      }
      case heartbeat::kShardFailed: {
        const auto failed = heartbeat::ShardFailedFrame::from_frame(f);
        failed_.emplace(failed.step, failed.rank);
        if (words_ != nullptr) words_->network().send_up(f);
        cv_.notify_all();
        break;
      }
      case heartbeat::kRecount: {
        const auto recount = heartbeat::RecountFrame::from_frame(f);
        if (!recount_seen_.emplace(recount.step, recount.recount).second) break;
        while (recount_seen_.size() > 64) recount_seen_.erase(recount_seen_.begin());
        if (words_ != nullptr) words_->network().flood(f, from);
        auto it = counts_.find(recount.step);
        if (it != counts_.end() && it->second.sent) send_count_locked(recount.step, it->second);
        break;
      }
      case heartbeat::kRestoreFile: {
        const auto restore = heartbeat::RestoreFileFrame::from_frame(f);
        if (!restore.valid || !announced_.emplace(restore.round, restore.file).second) break;
        if (words_ != nullptr) words_->network().flood(f, from);
        cv_.notify_all();
        break;
      }
      case heartbeat::kGone: {  // from this rank's own network (from = -1): a rank declared dead
        const auto gone = heartbeat::GoneFrame::from_frame(f);
        if (gone.died && from == -1) {
          died_.insert(gone.rank);
          cv_.notify_all();
        }
        break;
      }
      case heartbeat::kRetired: {
        const auto retired = heartbeat::RetiredFrame::from_frame(f);
        if (!retired_seen_.insert(retired.step).second) break;
        if (words_ != nullptr) words_->network().flood(f, from);
        remove_own_later_locked(retired.step);
        break;
      }
      default:
        break;
    }
  }

  ControlDir control_;
  const Config config_;
  const overlay::Links tree_;  // this rank's links in the job with nobody gone
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable work_cv_;                     // the worker's
  std::deque<std::function<void()>> tasks_;             // guarded by mu_
  bool stopping_ = false;                               // guarded by mu_
  std::thread worker_;                                  // started with the first task
  std::map<std::uint64_t, std::vector<store::ShardRecord>> gathered_;  // guarded by mu_: at the root
  std::set<std::uint64_t> retired_seen_;                // guarded by mu_
  std::set<std::pair<int, RestoreFile>> announced_;     // guarded by mu_: restore files the leader announced
  std::set<std::pair<std::uint64_t, std::uint64_t>> recount_seen_;  // guarded by mu_: (step, recount) passed on
  std::uint64_t recounts_ = 0;                          // guarded by mu_: the root's recounts so far
  LastWords* words_ = nullptr;                          // guarded by mu_
  std::map<std::uint64_t, store::Kind> requests_;       // guarded by mu_
  std::optional<std::uint64_t> terminal_at_;            // guarded by mu_: the lowest terminal step asked for
  std::optional<std::uint64_t> missed_terminal_;        // guarded by mu_: one asked for after this rank passed it
  std::uint64_t passed_ = 0;                            // guarded by mu_: the last step training asked about
  std::set<std::uint64_t> memory_requests_;             // guarded by mu_: memory checkpoints asked for, not passed
  std::uint64_t memory_passed_ = 0;                     // guarded by mu_: the last step memory_requested() saw
  bool memory_late_said_ = false;                       // guarded by mu_
  std::map<std::uint64_t, Count> counts_;               // guarded by mu_
  std::map<std::uint64_t, int> failed_;                 // guarded by mu_: step -> a rank whose shard failed
  std::set<int> died_;                                  // guarded by mu_: ranks the network declared dead
  std::atomic<bool> cancelled_{false};
};

}  // namespace

std::unique_ptr<Coordinator> make_tree_coordinator(const Config& config) {
  return std::make_unique<TreeCoordinator>(config);
}

}  // namespace ckpt::hooks
