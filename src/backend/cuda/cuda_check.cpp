#include "backend/cuda/cuda_check.h"

#include <cublasLt.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "core/error.h"

namespace arbiter::cuda {

bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("ARBITER_CUDA_SYNC");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

namespace {
int& pdl_state() {
  static int on = [] {
    const char* v = std::getenv("ARBITER_CUDA_PDL");
    return (v && *v && std::strcmp(v, "0") == 0) || sync_after_launch() ? 0 : 1;
  }();
  return on;
}
}  // namespace

bool pdl_enabled() { return pdl_state() != 0; }
void set_pdl(bool on) { pdl_state() = on && !sync_after_launch() ? 1 : 0; }

void prefer_max_shared(const void* kernel) {
  static std::mutex mu;
  static std::unordered_set<const void*> done;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.insert(kernel).second) return;
  ARB_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                int(cudaSharedmemCarveoutMaxShared)));
}

void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so later calls report their own
  throw Error(strformat("[cuda] %s failed: %s (%s) at %s:%d", call, cudaGetErrorName(e),
                        cudaGetErrorString(e), file, line));
}

void check_cublas(int status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(strformat("[cuda] %s failed: %s (status %d) at %s:%d", call,
                        cublasLtGetStatusString(cublasStatus_t(status)), status, file, line));
}

void check_launch(const char* kernel, cudaStream_t s, const char* file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(strformat("[cuda] launch of %s failed: %s (%s) at %s:%d", kernel,
                          cudaGetErrorName(e), cudaGetErrorString(e), file, line));
  if (sync_after_launch()) {
    e = cudaStreamSynchronize(s);
    if (e != cudaSuccess)
      throw Error(strformat("[cuda] %s faulted (ARBITER_CUDA_SYNC=1): %s (%s) at %s:%d", kernel,
                            cudaGetErrorName(e), cudaGetErrorString(e), file, line));
  }
}

}  // namespace arbiter::cuda
