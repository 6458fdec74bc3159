// The control dir, the single-process coordinator and the choice between it and the tree.
#include "coordinator.hpp"
#include "last_words_runtime.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>

#include "ckpt/posix.hpp"
#include "log.hpp"

namespace ckpt::hooks {

namespace {

using posix::errno_text;
using posix::join;

// mkdir that accepts an existing directory.
Status make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0 || errno == EEXIST) return Status::success();
  return Status::failure("ckpt: cannot create " + path + ": " + errno_text(errno));
}

std::string request_name(std::uint64_t step, store::Kind kind) {
  return (kind == store::Kind::Terminal ? "stop-" : "ckpt-") + store::step_dir_name(step);
}

std::string failure_name(std::uint64_t step, int rank) {
  return "failed-" + store::step_dir_name(step) + "-" + store::record_file_name(rank);
}

bool regular_file_at(int dir_fd, const std::string& name) {
  struct stat st {};
  return ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

// ---- one process --------------------------------------------------------------------------------------------

class SingleCoordinator final : public Coordinator {
 public:
  explicit SingleCoordinator(std::string dir) : dir_(std::move(dir)) {}
  const char* name() const override { return "single"; }
  Status begin(std::uint64_t) override {
    requests_.clear();
    return Status::success();
  }
  Status request(std::uint64_t step, store::Kind kind) override {
    auto [it, inserted] = requests_.emplace(step, kind);
    if (!inserted && kind == store::Kind::Terminal) it->second = kind;
    return Status::success();
  }
  std::optional<store::Kind> requested(std::uint64_t step) override {
    std::optional<store::Kind> kind;
    if (auto it = requests_.find(step); it != requests_.end()) kind = it->second;
    requests_.erase(requests_.begin(), requests_.upper_bound(step));
    return kind;
  }
  Status publish(std::uint64_t, const Status& outcome) override {
    std::lock_guard<std::mutex> lock(mu_);
    outcome_ = outcome;
    return Status::success();
  }
  Status wait_all(std::uint64_t, std::chrono::milliseconds) override {
    std::lock_guard<std::mutex> lock(mu_);
    return outcome_;
  }
  void note_record(std::uint64_t step, const store::ShardRecord& record) override {
    std::lock_guard<std::mutex> lock(mu_);
    record_ = {step, record};
  }
  Result<std::vector<store::ShardRecord>> records(std::uint64_t step) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!record_ || record_->first != step) {
      return Error{"ckpt: step " + std::to_string(step) + ": no record of this rank's shard"};
    }
    return std::vector<store::ShardRecord>{record_->second};
  }
  void retired(const std::vector<std::uint64_t>& steps) override {
    for (std::uint64_t step : steps) {
      if (Status s = store::remove_retired_own(dir_, step, 0); !s) log::warn(0, s.error());
    }
  }
  Result<RestoreTally> restore_tally() override { return Error{"ckpt: one process restores alone"}; }

 private:
  const std::string dir_;
  std::map<std::uint64_t, store::Kind> requests_;  // training thread only
  std::mutex mu_;
  Status outcome_;                                                      // guarded by mu_
  std::optional<std::pair<std::uint64_t, store::ShardRecord>> record_;  // guarded by mu_
};

}  // namespace

// ---- the control dir ------------------------------------------------------------------------------------------

ControlDir::ControlDir(std::string root, std::string run_id, int rank)
    : root_(std::move(root)), run_id_(std::move(run_id)), rank_(rank), ns_(run_id_ + "-from0") {}

ControlDir::~ControlDir() {
  if (fd_ >= 0) ::close(fd_);
}

void ControlDir::begin(std::uint64_t resume_step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ns_ = run_id_ + "-from" + std::to_string(resume_step);
}

std::string ControlDir::path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dir_path();
}

std::string ControlDir::dir_path() const { return join(join(root_, ".control"), ns_); }

int ControlDir::open_dir(bool create) {
  if (fd_ >= 0) return fd_;
  if (create) {
    for (const std::string& d : {root_, join(root_, ".control"), dir_path()}) {
      if (Status s = make_dir(d); !s) {
        log::error(rank_, s.error());
        return -1;
      }
    }
  }
  fd_ = ::open(dir_path().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  return fd_;
}

Status ControlDir::create_exclusive(const std::string& name, const std::string& content) {
  int dir = open_dir(true);
  if (dir < 0) return Status::failure("ckpt: cannot open the control dir " + dir_path() + ": " + errno_text(errno));
  // Exclusive: the first request for a name wins, complete; a later one finds it there, which is no error.
  if (Status s = posix::create_file_exclusive(dir, name, content, join(dir_path(), name)); !s) {
    return Status::failure("ckpt: " + s.error());
  }
  return Status::success();
}

Status ControlDir::request(std::uint64_t step, store::Kind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  return create_exclusive(request_name(step, kind),
                          std::string(store::to_string(kind)) + " " + std::to_string(step) + " rank " +
                              std::to_string(rank_) + "\n");
}

std::optional<store::Kind> ControlDir::requested(std::uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  int dir = open_dir(false);
  if (dir < 0) return std::nullopt;
  if (regular_file_at(dir, request_name(step, store::Kind::Terminal))) return store::Kind::Terminal;
  if (regular_file_at(dir, request_name(step, store::Kind::Periodic))) return store::Kind::Periodic;
  return std::nullopt;
}

Status ControlDir::report_failure(std::uint64_t step, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  return create_exclusive(failure_name(step, rank_), reason + "\n");
}

std::optional<std::string> ControlDir::failure(std::uint64_t step, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  int dir = open_dir(false);
  if (dir < 0) return std::nullopt;
  int fd = ::openat(dir, failure_name(step, rank).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  std::string text(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text.empty() ? std::string("unknown error") : text;
}

// ---- the choice -------------------------------------------------------------------------------------------------

Result<std::unique_ptr<Coordinator>> make_coordinator(const Config& config) {
  // One design at every world size: the tree's traffic is flat in the world size, it keeps no PMIx connection in
  // the failure path (survivors outlive a dead peer), and it gathers records and shares retention out.
  if (config.world_size > 1) return make_tree_coordinator(config);
  return std::unique_ptr<Coordinator>(std::make_unique<SingleCoordinator>(config.dir));
}

}  // namespace ckpt::hooks
