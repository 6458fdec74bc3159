// hooks_gpu_test DIR: the CUDA backend. A device region is snapshot on the copy stream behind an event of its
// compute stream; before_update() makes the compute stream wait, so an update queued right after it cannot reach
// the checkpoint. Then the last words of two ranks whose compute streams hang (a host function that never returns
// until released, as a collective whose peer died): the device state after their last update reaches a committed
// terminal checkpoint within the deadline, and nothing queued after the hang does. Exits 77 (skipped) when no GPU
// is usable.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>
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

namespace {

std::atomic<bool> released{false};

// A hung collective, as the stream sees it: nothing queued behind it runs until it returns.
void CUDART_CB hang(void*) {
  while (!released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

int last_words_on_hung_streams(const std::string& dir) {
  const std::size_t bytes = 64u << 20;
  int failures = 0;
  void* dev[2] = {nullptr, nullptr};
  cudaStream_t compute[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) {
    CUDA_OK(cudaMalloc(&dev[r], bytes));
    CUDA_OK(cudaStreamCreateWithFlags(&compute[r], cudaStreamNonBlocking));
  }
  std::unique_ptr<Checkpointer> cps[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // the mesh needs both ranks at once
    threads.emplace_back([&, r] {
      cps[r] = test::make(test::options({{"dir", dir}, {"rank", std::to_string(r)}, {"world_size", "2"},
                                         {"layout", "dp=2,tp=1,pp=1"}, {"last_words", "on"}, {"exit_grace", "0s"},
                                         {"interval", "1000steps"}, {"run_id", "gpu-lw"}, {"signals", "on"}}));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    if (!cps[r]->register_region({"w", dev[r], bytes, Memory::Device, false, "{}", compute[r]})) ++failures;
    if (!cps[r]->restore()) ++failures;
  }
  // Step 1 on both ranks: the update writes 7s; then each stream hangs with the next update queued behind.
  for (int r = 0; r < 2; ++r) {
    if (!cps[r]->before_update()) ++failures;
    CUDA_OK(cudaMemsetAsync(dev[r], 7, bytes, compute[r]));
    auto stop = cps[r]->after_step(1);
    if (!stop || *stop) ++failures;
  }
  for (int r = 0; r < 2; ++r) {
    CUDA_OK(cudaLaunchHostFunc(compute[r], hang, nullptr));
    CUDA_OK(cudaMemsetAsync(dev[r], 9, bytes, compute[r]));
  }
  auto t0 = std::chrono::steady_clock::now();
  std::raise(SIGTERM);
  bool committed = test::wait_for([&] { return test::committed_steps(dir) == std::vector<std::uint64_t>{1}; },
                                  std::chrono::milliseconds(10000));
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!committed) {
    std::fprintf(stderr, "gpu_test: FAIL: no terminal checkpoint while the compute streams hang\n");
    ++failures;
  } else {
    std::printf("gpu_test: last words on hung streams committed step 1 after %.3f s\n", took);
    auto saved = test::read_region(dir, 1, 0, "w");
    if (saved.size() != bytes || std::vector<unsigned char>(saved.begin(), saved.end()) != std::vector<unsigned char>(bytes, 7)) {
      std::fprintf(stderr, "gpu_test: FAIL: the terminal checkpoint is not the state after step 1's update\n");
      ++failures;
    }
  }
  released = true;
  for (int r = 0; r < 2; ++r) {
    CUDA_OK(cudaStreamSynchronize(compute[r]));
    (void)cps[r]->close();
    cps[r].reset();
    CUDA_OK(cudaFree(dev[r]));
    CUDA_OK(cudaStreamDestroy(compute[r]));
  }
  return failures;
}

}  // namespace

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
  failures += last_words_on_hung_streams(dir + "-last-words");
  if (failures == 0) std::printf("gpu_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
