// The PMIx coordinator: under srun --mpi=pmix, every rank publishes its shard outcome for a step with PMIx_Put and
// PMIx_Commit, and a collecting PMIx_Fence makes all of them visible; the writer reads them with PMIx_Get. A rank
// that published no value for the step (it checkpointed a different one) fails the commit. Step requests go
// through the control dir like the file coordinator's, so no collective runs on the training thread.
#include "coordinator.hpp"

#if CKPT_HAVE_PMIX

#include <pmix.h>

#include <cstdlib>
#include <cstring>

#include "log.hpp"

namespace ckpt::hooks {

namespace {

std::string pmix_error(const char* what, pmix_status_t rc) {
  return std::string("ckpt: ") + what + " failed: " + PMIx_Error_string(rc);
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

class PmixCoordinator final : public ControlDirCoordinator {
 public:
  explicit PmixCoordinator(const Config& config) : ControlDirCoordinator(config), world_(config.world_size) {
    std::memset(&me_, 0, sizeof me_);
  }
  ~PmixCoordinator() override {
    if (initialized_) PMIx_Finalize(nullptr, 0);
  }

  Status init(const Config& config) {
    pmix_status_t rc = PMIx_Init(&me_, nullptr, 0);
    if (rc != PMIX_SUCCESS) return Status::failure(pmix_error("PMIx_Init", rc));
    initialized_ = true;
    pmix_proc_t all = proc_of(me_, PMIX_RANK_WILDCARD);
    pmix_value_t* size = nullptr;
    rc = PMIx_Get(&all, PMIX_JOB_SIZE, nullptr, 0, &size);
    if (rc != PMIX_SUCCESS || size == nullptr || size->type != PMIX_UINT32) {
      release(size);
      return Status::failure(pmix_error("PMIx_Get(job size)", rc));
    }
    std::uint32_t job_size = size->data.uint32;
    release(size);
    if (static_cast<int>(me_.rank) != config.rank || static_cast<int>(job_size) != config.world_size) {
      return Status::failure("ckpt: PMIx says rank " + std::to_string(me_.rank) + " of " +
                             std::to_string(job_size) + " but the settings say rank " + std::to_string(config.rank) +
                             " of " + std::to_string(config.world_size) + " (" + config.rank_source +
                             "); set CKPT_COORDINATOR=file");
    }
    return Status::success();
  }

  const char* name() const override { return "pmix"; }

  Status publish(std::uint64_t step, const Status& outcome) override {
    fence_ok_ = false;
    std::string text = outcome ? "ok" : outcome.error();
    pmix_value_t value;
    std::memset(&value, 0, sizeof value);
    pmix_status_t rc = PMIx_Value_load(&value, text.c_str(), PMIX_STRING);
    if (rc != PMIX_SUCCESS) return Status::failure(pmix_error("PMIx_Value_load", rc));
    rc = PMIx_Put(PMIX_GLOBAL, key(step).c_str(), &value);
    PMIx_Value_destruct(&value);
    if (rc != PMIX_SUCCESS) return Status::failure(pmix_error("PMIx_Put", rc));
    rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) return Status::failure(pmix_error("PMIx_Commit", rc));
    // Every rank's persist thread reaches this fence once per checkpoint, in step order.
    pmix_info_t info[2];
    std::memset(info, 0, sizeof info);
    bool collect = true;
    int timeout = fence_timeout_s_;
    PMIx_Info_load(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIx_Info_load(&info[1], PMIX_TIMEOUT, &timeout, PMIX_INT);
    pmix_proc_t all = proc_of(me_, PMIX_RANK_WILDCARD);
    rc = PMIx_Fence(&all, 1, info, 2);
    if (rc != PMIX_SUCCESS) return Status::failure(pmix_error("PMIx_Fence", rc));
    fence_ok_ = true;
    return Status::success();
  }

  Status wait_all(std::uint64_t step, std::chrono::milliseconds) override {
    if (!fence_ok_) return Status::failure("ckpt: step " + std::to_string(step) + ": the PMIx fence failed");
    pmix_info_t info[1];
    std::memset(info, 0, sizeof info);
    bool optional = true;  // collected by the fence: never ask a remote server
    PMIx_Info_load(&info[0], PMIX_OPTIONAL, &optional, PMIX_BOOL);
    for (int r = 0; r < world_; ++r) {
      pmix_proc_t proc = proc_of(me_, static_cast<pmix_rank_t>(r));
      pmix_value_t* value = nullptr;
      pmix_status_t rc = PMIx_Get(&proc, key(step).c_str(), info, 1, &value);
      if (rc != PMIX_SUCCESS || value == nullptr || value->type != PMIX_STRING) {
        release(value);
        return Status::failure("ckpt: rank " + std::to_string(r) + " published nothing for step " +
                               std::to_string(step) + " (" + PMIx_Error_string(rc) +
                               "); did the ranks agree on the step?");
      }
      std::string text = value->data.string != nullptr ? value->data.string : "";
      release(value);
      if (text != "ok") {
        return Status::failure("ckpt: rank " + std::to_string(r) + " could not persist step " +
                               std::to_string(step) + ": " + text);
      }
    }
    return Status::success();
  }

  void set_fence_timeout(std::uint64_t seconds) {
    fence_timeout_s_ = static_cast<int>(std::min<std::uint64_t>(seconds, 1u << 30));
  }

 private:
  static std::string key(std::uint64_t step) { return "ckpt.shard." + std::to_string(step); }

  pmix_proc_t me_;
  bool initialized_ = false;
  int world_;
  int fence_timeout_s_ = 600;
  bool fence_ok_ = false;  // persist thread only
};

}  // namespace

bool have_pmix() { return true; }

Result<std::unique_ptr<Coordinator>> make_pmix_coordinator(const Config& config) {
  auto coordinator = std::make_unique<PmixCoordinator>(config);
  if (Status s = coordinator->init(config); !s) return Error{s.error()};
  coordinator->set_fence_timeout(config.commit_timeout_s);
  return std::unique_ptr<Coordinator>(std::move(coordinator));
}

}  // namespace ckpt::hooks

#else  // built without PMIx

namespace ckpt::hooks {

bool have_pmix() { return false; }

Result<std::unique_ptr<Coordinator>> make_pmix_coordinator(const Config&) {
  return Error{"ckpt: coordinator 'pmix' asked for, but this libckpt was built without PMIx"};
}

}  // namespace ckpt::hooks

#endif
