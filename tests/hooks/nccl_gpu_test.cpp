// hooks_nccl_gpu_test DIR: the NCCL watcher with the real NCCL on a real GPU, on a one-rank communicator (NCCL
// puts at most one rank of a communicator on a GPU). A healthy communicator is polled and left alone, collectives
// keep working while it is watched, and an abort really aborts. Exits 77 (skipped) when no GPU is usable.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "ckpt/hooks.hpp"
#include "hooks_test_util.hpp"
#include "nccl_watch.hpp"

using namespace ckpt;
using namespace ckpt::hooks;

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "nccl_gpu_test: FAIL: %s\n", what);
    ++failures;
  }
}

bool all_reduce_once(ncclComm_t comm, float* buf, cudaStream_t stream) {
  return ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comm, stream) == ncclSuccess &&
         cudaStreamSynchronize(stream) == cudaSuccess;
}

ncclComm_t one_rank_comm() {
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return nullptr;
  return comm;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hooks_nccl_gpu_test DIR\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("nccl_gpu_test: no GPU; skipped\n");
    return 77;
  }
  float* buf = nullptr;
  cudaStream_t stream = nullptr;
  if (cudaMalloc(&buf, 1024 * sizeof(float)) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess) {
    std::fprintf(stderr, "nccl_gpu_test: cannot allocate on the GPU\n");
    return 1;
  }

  // A watched healthy communicator keeps working.
  ncclComm_t comm = one_rank_comm();
  check(comm != nullptr, "a one-rank communicator");
  if (comm != nullptr) {
    auto cp = test::make(test::options({{"dir", argv[1]}, {"interval", "1000steps"}}));
    Status s = cp->watch_nccl(comm);
    check(s.ok(), s.ok() ? "" : s.error().c_str());
    check(all_reduce_once(comm, buf, stream), "an all-reduce while watched");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // several polls
    check(all_reduce_once(comm, buf, stream), "an all-reduce after several polls");
    check(cp->close().ok(), "close");
    check(ncclCommDestroy(comm) == ncclSuccess, "destroying the communicator after close");
  }

  // abort_all aborts a real communicator (which frees it).
  ncclComm_t doomed = one_rank_comm();
  auto watch = NcclWatch::start({}, std::chrono::milliseconds(20));
  check(watch.ok(), "the watcher finds the real NCCL");
  if (watch.ok() && doomed != nullptr) {
    check((*watch)->add(doomed).ok(), "watching a second communicator");
    (*watch)->abort_all("test");
    check((*watch)->aborted() == 1, "abort_all aborted it");
  }

  cudaFree(buf);
  cudaStreamDestroy(stream);
  if (failures == 0) std::printf("nccl_gpu_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
