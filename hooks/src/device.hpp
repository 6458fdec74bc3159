#pragma once
// The CUDA side of a snapshot (CKPT_HAVE_CUDA). The snapshot is a cudaMemcpyAsync on a dedicated copy stream into
// pinned staging, queued after an event recorded on each compute stream; an event marks its end. The guard makes
// the compute streams wait on that event, so the host never blocks for it; only the persist thread does.
#include <cstddef>
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
};

// The CUDA backend, or an error line when the library was built without CUDA or no GPU is usable.
Result<std::unique_ptr<DeviceBackend>> make_device_backend();

}  // namespace ckpt::hooks
