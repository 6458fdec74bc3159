#include "device.hpp"

#include <mutex>
#include <utility>

namespace ckpt::hooks {

namespace {

std::mutex factory_mu;
DeviceBackendFactory& factory_slot() {
  static DeviceBackendFactory factory;
  return factory;
}

Result<std::unique_ptr<DeviceBackend>> make_default_backend();

}  // namespace

void set_device_backend_factory(DeviceBackendFactory factory) {
  std::lock_guard<std::mutex> lock(factory_mu);
  factory_slot() = std::move(factory);
}

Result<std::unique_ptr<DeviceBackend>> make_device_backend() {
  DeviceBackendFactory factory;
  {
    std::lock_guard<std::mutex> lock(factory_mu);
    factory = factory_slot();
  }
  return factory ? factory() : make_default_backend();
}

}  // namespace ckpt::hooks

#if CKPT_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <thread>

namespace ckpt::hooks {

namespace {

std::string cuda_error(const char* what, cudaError_t err) {
  return std::string(what) + " failed: " + cudaGetErrorString(err);
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

class CudaBackend final : public DeviceBackend {
 public:
  ~CudaBackend() override {
    for (cudaEvent_t e : ready_) cudaEventDestroy(e);
    for (auto& [stream, e] : marks_) cudaEventDestroy(e);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (rescued_ != nullptr) cudaEventDestroy(rescued_);
    if (copy_ != nullptr) cudaStreamDestroy(copy_);
    if (rescue_ != nullptr) cudaStreamDestroy(rescue_);
  }

  Status init() {
    if (cudaError_t err = cudaGetDevice(&device_); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaGetDevice", err));
    }
    // Non-blocking: the copy stream must not serialize with the legacy default stream training may use.
    if (cudaError_t err = cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaStreamCreateWithFlags", err));
    }
    if (cudaError_t err = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaEventCreate", err));
    }
    // The rescue's own stream and event: a rescue must not queue behind a snapshot copy waiting on a hung stream.
    if (cudaError_t err = cudaStreamCreateWithFlags(&rescue_, cudaStreamNonBlocking); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaStreamCreateWithFlags", err));
    }
    if (cudaError_t err = cudaEventCreateWithFlags(&rescued_, cudaEventDisableTiming); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaEventCreate", err));
    }
    return Status::success();
  }

  Result<void*> alloc_pinned(std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) return Error{cuda_error("cudaSetDevice", err)};
    void* p = nullptr;
    if (cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault); err != cudaSuccess) {
      return Error{cuda_error("cudaHostAlloc", err)};
    }
    return p;
  }

  void free_pinned(void* p) override {
    if (p != nullptr) cudaFreeHost(p);
  }

  Status snapshot(const std::vector<DeviceCopy>& copies) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaSetDevice", err));
    }
    streams_.clear();
    for (const DeviceCopy& c : copies) {
      cudaStream_t s = as_stream(c.stream);
      if (std::find(streams_.begin(), streams_.end(), s) == streams_.end()) streams_.push_back(s);
    }
    while (ready_.size() < streams_.size()) {
      cudaEvent_t e = nullptr;
      if (cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); err != cudaSuccess) {
        return Status::failure(cuda_error("cudaEventCreate", err));
      }
      ready_.push_back(e);
    }
    // The copy starts after everything already queued on each compute stream (the last update included).
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      if (cudaError_t err = cudaEventRecord(ready_[i], streams_[i]); err != cudaSuccess) {
        return Status::failure(cuda_error("cudaEventRecord", err));
      }
      if (cudaError_t err = cudaStreamWaitEvent(copy_, ready_[i], 0); err != cudaSuccess) {
        return Status::failure(cuda_error("cudaStreamWaitEvent", err));
      }
    }
    for (const DeviceCopy& c : copies) {
      if (cudaError_t err = cudaMemcpyAsync(c.dst, c.src, c.size, cudaMemcpyDeviceToHost, copy_);
          err != cudaSuccess) {
        return Status::failure(cuda_error("cudaMemcpyAsync", err));
      }
    }
    if (cudaError_t err = cudaEventRecord(done_, copy_); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaEventRecord", err));
    }
    return Status::success();
  }

  Status guard() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (cudaStream_t s : streams_) {
      if (cudaError_t err = cudaStreamWaitEvent(s, done_, 0); err != cudaSuccess) {
        return Status::failure(cuda_error("cudaStreamWaitEvent", err));
      }
    }
    streams_.clear();
    return Status::success();
  }

  Status wait() override {
    // Not under mu_: the training thread may queue its guard meanwhile.
    if (cudaError_t err = cudaEventSynchronize(done_); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaEventSynchronize", err));
    }
    return Status::success();
  }

  Status upload(void* dst, const void* src, std::size_t size) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaSetDevice", err));
    }
    if (cudaError_t err = cudaMemcpy(dst, src, size, cudaMemcpyHostToDevice); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaMemcpy", err));
    }
    return Status::success();
  }

  Status mark_updates(const std::vector<void*>& streams) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
      return Status::failure(cuda_error("cudaSetDevice", err));
    }
    for (void* stream : streams) {
      cudaEvent_t& e = marks_[as_stream(stream)];
      if (e == nullptr) {
        if (cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); err != cudaSuccess) {
          e = nullptr;
          return Status::failure(cuda_error("cudaEventCreate", err));
        }
      }
      if (cudaError_t err = cudaEventRecord(e, as_stream(stream)); err != cudaSuccess) {
        return Status::failure(cuda_error("cudaEventRecord", err));
      }
    }
    return Status::success();
  }

  Status rescue(const std::vector<DeviceCopy>& copies, std::chrono::steady_clock::time_point deadline) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cudaError_t err = cudaSetDevice(device_); err != cudaSuccess) {
        return Status::failure(cuda_error("cudaSetDevice", err));
      }
      // Only the marked updates: anything queued after them (the next step's collectives) is not waited for.
      // A stream never marked has had no update since the restore, whose upload was synchronous.
      for (const DeviceCopy& c : copies) {
        auto mark = marks_.find(as_stream(c.stream));
        if (mark == marks_.end()) continue;
        if (cudaError_t err = cudaStreamWaitEvent(rescue_, mark->second, 0); err != cudaSuccess) {
          return Status::failure(cuda_error("cudaStreamWaitEvent", err));
        }
      }
      for (const DeviceCopy& c : copies) {
        if (cudaError_t err = cudaMemcpyAsync(c.dst, c.src, c.size, cudaMemcpyDeviceToHost, rescue_);
            err != cudaSuccess) {
          return Status::failure(cuda_error("cudaMemcpyAsync", err));
        }
      }
      if (cudaError_t err = cudaEventRecord(rescued_, rescue_); err != cudaSuccess) {
        return Status::failure(cuda_error("cudaEventRecord", err));
      }
    }
    // Polled, not synchronized: cudaEventSynchronize has no timeout.
    for (;;) {
      cudaError_t err = cudaEventQuery(rescued_);
      if (err == cudaSuccess) return Status::success();
      if (err != cudaErrorNotReady) return Status::failure(cuda_error("the device copy", err));
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status::failure("the device copy did not finish before the last words' deadline");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  std::mutex mu_;
  int device_ = 0;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t done_ = nullptr;
  cudaStream_t rescue_ = nullptr;
  cudaEvent_t rescued_ = nullptr;
  std::map<cudaStream_t, cudaEvent_t> marks_;  // the end of the last update on each compute stream
  std::vector<cudaEvent_t> ready_;     // one per compute stream, reused
  std::vector<cudaStream_t> streams_;  // the compute streams of the last snapshot, until guard()
};

Result<std::unique_ptr<DeviceBackend>> make_default_backend() {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess || count == 0) {
    return Error{"a device region needs a GPU, and none is usable" +
                 std::string(err != cudaSuccess ? std::string(" (") + cudaGetErrorString(err) + ")" : "")};
  }
  auto backend = std::make_unique<CudaBackend>();
  if (Status s = backend->init(); !s) return Error{s.error()};
  return std::unique_ptr<DeviceBackend>(std::move(backend));
}

}  // namespace
}  // namespace ckpt::hooks

#else  // built without CUDA

namespace ckpt::hooks {
namespace {

Result<std::unique_ptr<DeviceBackend>> make_default_backend() {
  return Error{"a device region needs the CUDA backend; this libckpt was built without CUDA"};
}

}  // namespace
}  // namespace ckpt::hooks

#endif
