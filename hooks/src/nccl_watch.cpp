#include "nccl_watch.hpp"

#include <dlfcn.h>

#include <utility>

#if CKPT_HAVE_NCCL_HEADER
#include <nccl.h>
#endif

namespace ckpt::hooks {

namespace {

// NCCL's ABI: ncclResult_t is an int-sized enum, ncclComm_t a pointer. Checked against nccl.h where it exists.
using Result_t = int;
using GetAsyncErrorFn = Result_t (*)(void* comm, Result_t* async_error);
using AbortFn = Result_t (*)(void* comm);
using ErrorStringFn = const char* (*)(Result_t result);
constexpr Result_t kSuccess = 0;
constexpr Result_t kInProgress = 7;  // non-blocking communicators: an operation is still being set up

#if CKPT_HAVE_NCCL_HEADER
static_assert(sizeof(ncclResult_t) == sizeof(Result_t) && ncclSuccess == kSuccess && ncclInProgress == kInProgress);
static_assert(sizeof(ncclComm_t) == sizeof(void*));
#endif

// A symbol from the program and the libraries it loaded globally, else from an NCCL loaded locally by someone
// else (RTLD_NOLOAD: never a second copy of NCCL).
void* find_symbol(const char* name) {
  if (void* sym = dlsym(RTLD_DEFAULT, name)) return sym;
  for (const char* lib : {"libnccl.so.2", "libnccl.so"}) {
    if (void* handle = dlopen(lib, RTLD_NOW | RTLD_NOLOAD)) {
      void* sym = dlsym(handle, name);
      dlclose(handle);  // drops only the reference NOLOAD took
      if (sym) return sym;
    }
  }
  return nullptr;
}

}  // namespace

struct NcclWatch::Api {
  GetAsyncErrorFn get_async_error = nullptr;
  AbortFn abort = nullptr;
  ErrorStringFn error_string = nullptr;

  std::string describe(Result_t r) const {
    const char* text = error_string ? error_string(r) : nullptr;
    return "NCCL error " + std::to_string(r) + (text ? std::string(" (") + text + ")" : "");
  }
};

Result<std::unique_ptr<NcclWatch>> NcclWatch::start(Hooks hooks, std::chrono::milliseconds period) {
  auto api = std::make_unique<Api>();
  api->get_async_error = reinterpret_cast<GetAsyncErrorFn>(find_symbol("ncclCommGetAsyncError"));
  api->abort = reinterpret_cast<AbortFn>(find_symbol("ncclCommAbort"));
  api->error_string = reinterpret_cast<ErrorStringFn>(find_symbol("ncclGetErrorString"));
  if (!api->get_async_error || !api->abort) {
    return Error{"ckpt: watch_nccl: no NCCL in this process (ncclCommGetAsyncError and ncclCommAbort not found); "
                 "link NCCL or load it before watching a communicator"};
  }
  if (period.count() <= 0) return Error{"ckpt: watch_nccl: the poll period must be positive"};
  return std::unique_ptr<NcclWatch>(new NcclWatch(std::move(api), std::move(hooks), period));
}

NcclWatch::NcclWatch(std::unique_ptr<Api> api, Hooks hooks, std::chrono::milliseconds period)
    : api_(std::move(api)), hooks_(std::move(hooks)), period_(period) {
  thread_ = std::thread([this] { loop(); });
}

NcclWatch::~NcclWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status NcclWatch::add(void* comm) {
  if (comm == nullptr) return Status::failure("ckpt: watch_nccl: the communicator is null");
  std::lock_guard<std::mutex> lock(mu_);
  for (const Watched& w : comms_) {
    if (w.comm == comm) return Status::success();
  }
  comms_.push_back(Watched{comm, false});
  return Status::success();
}

bool NcclWatch::abort_one(Watched& w) {
  if (w.aborted) return false;
  w.aborted = true;
  // ncclCommAbort also frees the communicator: nothing may touch it afterwards, and nothing here does.
  api_->abort(w.comm);
  return true;
}

void NcclWatch::abort_all(const std::string& /*why*/) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Watched& w : comms_) abort_one(w);
}

std::size_t NcclWatch::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const Watched& w : comms_) n += w.aborted ? 1 : 0;
  return n;
}

void NcclWatch::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, period_, [this] { return stop_; });
    if (stop_) break;
    if (hooks_.abort_requested && hooks_.abort_requested()) {
      for (Watched& w : comms_) abort_one(w);
      continue;
    }
    std::vector<std::string> errors;
    for (Watched& w : comms_) {
      if (w.aborted) continue;
      Result_t async = kSuccess;
      Result_t r = api_->get_async_error(w.comm, &async);
      if (r != kSuccess) async = r;
      if (async == kSuccess || async == kInProgress) continue;
      abort_one(w);
      errors.push_back("a watched NCCL communicator reported " + api_->describe(async) + "; aborted it");
    }
    if (!errors.empty() && hooks_.on_error) {
      lock.unlock();  // the callback may trigger last words, which may call abort_all
      for (const std::string& e : errors) hooks_.on_error(e);
      lock.lock();
    }
  }
}

}  // namespace ckpt::hooks
