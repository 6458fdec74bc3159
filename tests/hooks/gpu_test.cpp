// hooks_gpu_test DIR: the CUDA backend. A device region is snapshot on the copy stream behind an event of its
// compute stream; before_update() makes the compute stream wait, so an update queued right after it cannot reach
// the checkpoint. Exits 77 (skipped) when no GPU is usable.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "ckpt/hooks.hpp"
#include "hooks_test_util.hpp"

using namespace ckpt;
using namespace ckpt::hooks;

#define CUDA_OK(call)                                                                       \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "gpu_test: %s failed: %s\n", #call, cudaGetErrorString(e_));      \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hooks_gpu_test DIR\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("gpu_test: no GPU; skipped\n");
    return 77;
  }
  const std::string dir = argv[1];
  const std::size_t bytes = 256u << 20;  // large enough that the copy takes a while
  void* dev = nullptr;
  cudaStream_t compute = nullptr;
  CUDA_OK(cudaMalloc(&dev, bytes));
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_OK(cudaMemsetAsync(dev, 1, bytes, compute));

  int failures = 0;
  {
    auto cp = test::make(test::options({{"dir", dir}, {"interval", "1steps"}}));
    Status s = cp->register_region({"w", dev, bytes, Memory::Device, false, "{}", compute});
    if (!s) {
      std::fprintf(stderr, "gpu_test: %s\n", s.error().c_str());
      return 1;
    }
    auto stop = cp->after_step(1);  // queues the copy behind the memset above
    if (!stop || *stop) ++failures;
    if (!cp->before_update()) ++failures;
    // The update is queued on the compute stream at once; the guard must hold it until the copy is done.
    CUDA_OK(cudaMemsetAsync(dev, 2, bytes, compute));
    if (!cp->close()) ++failures;
  }
  auto saved = test::read_region(dir, 1, 0, "w");
  if (saved.size() != bytes || std::vector<unsigned char>(saved.begin(), saved.end()) != std::vector<unsigned char>(bytes, 1)) {
    std::fprintf(stderr, "gpu_test: FAIL: the checkpoint of step 1 is not the state of step 1\n");
    ++failures;
  }
  {
    CUDA_OK(cudaMemset(dev, 0, bytes));
    auto cp = test::make(test::options({{"dir", dir}}));
    if (!cp->register_region({"w", dev, bytes, Memory::Device, false, "{}", compute})) ++failures;
    auto step = cp->restore();
    if (!step || *step != 1) ++failures;
    std::vector<unsigned char> back(bytes);
    CUDA_OK(cudaMemcpy(back.data(), dev, bytes, cudaMemcpyDeviceToHost));
    if (back != std::vector<unsigned char>(bytes, 1)) {
      std::fprintf(stderr, "gpu_test: FAIL: restore into device memory is not bitwise\n");
      ++failures;
    }
    if (!cp->close()) ++failures;
  }
  CUDA_OK(cudaFree(dev));
  CUDA_OK(cudaStreamDestroy(compute));
  if (failures == 0) std::printf("gpu_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
