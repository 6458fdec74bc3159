// The heartbeat network's rendezvous: address files, or PMIx (rendezvous.hpp).
#include "rendezvous.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "ckpt/posix.hpp"
#include "log.hpp"

#if CKPT_HAVE_PMIX
#include <pmix.h>
#endif

namespace ckpt::hooks {

namespace {

std::string addr_name(int rank) { return "rank-" + std::to_string(rank) + ".addr"; }

// "<address> <port> [<node>]" as whitespace-separated fields; nothing when fewer than two.
std::optional<std::vector<std::string>> fields_of(const std::string& line) {
  std::stringstream text(line);
  std::vector<std::string> fields;
  for (std::string f; fields.size() < 3 && text >> f;) fields.push_back(f);
  if (fields.size() < 2) return std::nullopt;
  return fields;
}

class FileRendezvous final : public Rendezvous {
 public:
  FileRendezvous(int dirfd, std::string dir_path, int rank) : dirfd_(dirfd), dir_(std::move(dir_path)), rank_(rank) {}
  const char* name() const override { return "files"; }

  Status publish(const std::string& line, std::chrono::milliseconds) override {
    // Read only while the network forms: not worth an fsync on a shared file system.
    posix::AtomicWriteOptions options;
    options.durable = false;
    const std::string name = addr_name(rank_);
    return posix::write_file_atomic(dirfd_, name, line + "\n", posix::join(dir_, name), options);
  }

  std::optional<std::vector<std::string>> lookup(int peer) const override {
    posix::Fd in(::openat(dirfd_, addr_name(peer).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!in.valid()) return std::nullopt;
    char buf[384] = {};
    ssize_t n = ::read(in.get(), buf, sizeof buf - 1);
    if (n <= 0) return std::nullopt;
    return fields_of(std::string(buf, static_cast<std::size_t>(n)));
  }

  void withdraw() override { (void)::unlinkat(dirfd_, addr_name(rank_).c_str(), 0); }
  bool tells_leaves() const override { return true; }

 private:
  const int dirfd_;
  const std::string dir_;
  const int rank_;
};

#if CKPT_HAVE_PMIX

constexpr const char* kKey = "slurm-ckpt.mesh";

std::string pmix_error(const char* what, pmix_status_t rc) {
  return std::string("ckpt: heartbeat: ") + what + " failed: " + PMIx_Error_string(rc);
}

pmix_proc_t proc_of(const pmix_proc_t& me, pmix_rank_t rank) {
  pmix_proc_t proc;
  std::memset(&proc, 0, sizeof proc);
  std::memcpy(proc.nspace, me.nspace, sizeof proc.nspace);
  proc.rank = rank;
  return proc;
}

// Frees a value PMIx_Get allocated.
void release(pmix_value_t* value) {
  if (value == nullptr) return;
  PMIx_Value_destruct(value);
  std::free(value);
}

class PmixRendezvous final : public Rendezvous {
 public:
  PmixRendezvous() { std::memset(&me_, 0, sizeof me_); }
  ~PmixRendezvous() override {
    if (initialized_) PMIx_Finalize(nullptr, 0);
  }

  // PMIx_Init and PMIx's size of the job (0 when it cannot say).
  Result<std::uint32_t> init() {
    pmix_status_t rc = PMIx_Init(&me_, nullptr, 0);
    if (rc != PMIX_SUCCESS) return Error{pmix_error("PMIx_Init", rc)};
    initialized_ = true;
    pmix_proc_t all = proc_of(me_, PMIX_RANK_WILDCARD);
    pmix_value_t* size = nullptr;
    rc = PMIx_Get(&all, PMIX_JOB_SIZE, nullptr, 0, &size);
    std::uint32_t job_size = 0;
    if (rc == PMIX_SUCCESS && size != nullptr && size->type == PMIX_UINT32) job_size = size->data.uint32;
    release(size);
    return job_size;
  }
  int rank() const { return static_cast<int>(me_.rank); }

  const char* name() const override { return "pmix"; }

  Status publish(const std::string& line, std::chrono::milliseconds timeout) override {
    pmix_value_t value;
    std::memset(&value, 0, sizeof value);
    pmix_status_t rc = PMIx_Value_load(&value, line.c_str(), PMIX_STRING);
    if (rc != PMIX_SUCCESS) return Status::failure(pmix_error("PMIx_Value_load", rc));
    rc = PMIx_Put(PMIX_GLOBAL, kKey, &value);
    PMIx_Value_destruct(&value);
    if (rc != PMIX_SUCCESS) return Status::failure(pmix_error("PMIx_Put", rc));
    rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) return Status::failure(pmix_error("PMIx_Commit", rc));
    // The one collective: every rank's line reaches every node's server, so each lookup after is answered locally.
    pmix_info_t info[2];
    std::memset(info, 0, sizeof info);
    bool collect = true;
    int seconds = static_cast<int>(std::max<std::int64_t>(1, timeout.count() / 1000));
    PMIx_Info_load(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIx_Info_load(&info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    pmix_proc_t all = proc_of(me_, PMIX_RANK_WILDCARD);
    rc = PMIx_Fence(&all, 1, info, 2);
    if (rc != PMIX_SUCCESS) return Status::failure(pmix_error("PMIx_Fence", rc));
    return Status::success();
  }

  std::optional<std::vector<std::string>> lookup(int peer) const override {
    pmix_info_t info[1];
    std::memset(info, 0, sizeof info);
    bool optional = true;  // collected by the fence: never ask a remote server
    PMIx_Info_load(&info[0], PMIX_OPTIONAL, &optional, PMIX_BOOL);
    pmix_proc_t proc = proc_of(me_, static_cast<pmix_rank_t>(peer));
    pmix_value_t* value = nullptr;
    pmix_status_t rc = PMIx_Get(&proc, kKey, info, 1, &value);
    std::optional<std::vector<std::string>> fields;
    if (rc == PMIX_SUCCESS && value != nullptr && value->type == PMIX_STRING && value->data.string != nullptr) {
      fields = fields_of(value->data.string);
    }
    release(value);
    return fields;
  }

  void withdraw() override {}
  bool tells_leaves() const override { return false; }

 private:
  pmix_proc_t me_;
  bool initialized_ = false;
};

#endif

// The process is a task of an srun step under PMIx whose task count is `world`: every rank is one PMIx process.
// Every rank of the job sees the same step size and world, so every rank decides alike. Not so for the ranks a
// launcher inside the task starts (torchrun's, several per task): they inherit the task's PMIx identity, and the
// step's task count is not their world, so they never call PMIx_Init under a rank that is not theirs.
bool one_pmix_process_per_rank(int world) {
  if (std::getenv("PMIX_RANK") == nullptr || std::getenv("PMIX_NAMESPACE") == nullptr) return false;
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  if (tasks == nullptr) tasks = std::getenv("SLURM_NTASKS");
  return tasks != nullptr && std::string(tasks) == std::to_string(world);
}

}  // namespace

RendezvousKind rendezvous_for(const Config& config) {
  if (config.rendezvous != RendezvousKind::Auto) return config.rendezvous;
  // A later generation of restart in place, or any rank of a job that restarts in place (its spares wait outside
  // the world): PMIx's job is not this world.
  if (config.generation > 0 || !config.inplace_id.empty()) return RendezvousKind::Files;
  return RendezvousKind::Auto;
}

Result<std::unique_ptr<Rendezvous>> make_rendezvous(RendezvousKind kind, int dirfd, const std::string& dir_path,
                                                    int rank, int world) {
  auto files = [&] { return std::unique_ptr<Rendezvous>(std::make_unique<FileRendezvous>(dirfd, dir_path, rank)); };
  if (kind == RendezvousKind::Files || (kind == RendezvousKind::Auto && !one_pmix_process_per_rank(world))) {
    return files();
  }
#if CKPT_HAVE_PMIX
  auto pmix = std::make_unique<PmixRendezvous>();
  auto size = pmix->init();
  if (!size) return Error{size.error() + (kind == RendezvousKind::Auto ? " (CKPT_RENDEZVOUS=files avoids PMIx)" : "")};
  if (static_cast<int>(*size) != world) {
    // Every rank sees the same two sizes, so every rank falls back alike.
    if (kind == RendezvousKind::Auto) {
      if (rank == 0) {
        log::debug(0, "heartbeat: PMIx's job has " + std::to_string(*size) + " ranks, this world " +
                          std::to_string(world) + ": address files instead");
      }
      return files();
    }
    return Error{"ckpt: heartbeat: CKPT_RENDEZVOUS=pmix, but PMIx's job has " + std::to_string(*size) +
                 " ranks and the world " + std::to_string(world)};
  }
  if (pmix->rank() != rank) {
    return Error{"ckpt: heartbeat: PMIx says rank " + std::to_string(pmix->rank()) + " but the settings say rank " +
                 std::to_string(rank) + "; set CKPT_RENDEZVOUS=files"};
  }
  return std::unique_ptr<Rendezvous>(std::move(pmix));
#else
  if (kind == RendezvousKind::Auto) return files();
  return Error{"ckpt: heartbeat: CKPT_RENDEZVOUS=pmix, but this library was built without PMIx"};
#endif
}

}  // namespace ckpt::hooks
