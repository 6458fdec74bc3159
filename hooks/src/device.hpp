#pragma once
// The CUDA side of a snapshot (CKPT_HAVE_CUDA). The snapshot is a cudaMemcpyAsync on a dedicated copy stream into
// pinned staging, queued after an event recorded on each compute stream; an event marks its end. The guard makes
// the compute streams wait on that event, so the host never blocks for it; only the persist thread does.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "ckpt/hooks.hpp"

namespace ckpt::hooks {

struct DeviceCopy {
  void* dst = nullptr;        // pinned host memory
  const void* src = nullptr;  // device memory
  std::size_t size = 0;
  void* stream = nullptr;     // the compute stream that writes src
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // Pinned host memory (cudaHostAlloc), faulted in by the driver; free it with free_pinned.
  virtual Result<void*> alloc_pinned(std::size_t bytes) = 0;
  virtual void free_pinned(void* p) = 0;
  // Training thread: queues the copies behind the work already queued on their compute streams.
  virtual Status snapshot(const std::vector<DeviceCopy>& copies) = 0;
  // Training thread: makes every compute stream of the last snapshot wait for its copies; does not block.
  virtual Status guard() = 0;
  // Persist thread: blocks until the last snapshot's copies are in host memory.
  virtual Status wait() = 0;
  // A synchronous host-to-device copy, for a restore.
  virtual Status upload(void* dst, const void* src, std::size_t size) = 0;

  // Last words. Training thread, after every update while they are armed: marks the end of the update on each
  // compute stream (one event record each, microseconds), so that a rescue waits for that update and for nothing
  // queued after it, such as a collective of the next step that will never finish.
  virtual Status mark_updates(const std::vector<void*>& streams) = 0;
  // Last-words thread, training frozen: copies into pinned host memory after the marks of the copies' streams, on
  // a stream of its own, and gives up at `deadline` (a hung device must not hold the last words past KillWait).
  // After a failure the copy may still land: the caller must not free dst.
  virtual Status rescue(const std::vector<DeviceCopy>& copies, std::chrono::steady_clock::time_point deadline) = 0;
};

// The CUDA backend, or an error line when the library was built without CUDA or no GPU is usable.
Result<std::unique_ptr<DeviceBackend>> make_device_backend();

// Tests: make_device_backend returns what `factory` makes instead (an empty function restores the default).
using DeviceBackendFactory = std::function<Result<std::unique_ptr<DeviceBackend>>()>;
void set_device_backend_factory(DeviceBackendFactory factory);

}  // namespace ckpt::hooks
