// Error checks of the CUDA tier: every CUDA runtime and cuBLASLt call goes through one of
// these, so a failure throws arbiter::Error naming the call, the error string and the source
// line. ARBITER_CUDA_SYNC=1 makes check_launch() synchronise after every kernel launch, so
// an asynchronous fault is reported at the launch that caused it (and disables graphs).
#pragma once
#include <cuda_runtime.h>

namespace arbiter::cuda {

/// Throws arbiter::Error "[cuda] <call> failed: <error> (file:line)" when e != cudaSuccess.
void check_cuda(cudaError_t e, const char* call, const char* file, int line);
/// Throws for a cuBLAS(Lt) status other than success (status as int: no cuBLAS header here).
void check_cublas(int status, const char* call, const char* file, int line);
/// After a kernel launch: cudaGetLastError(), plus a stream synchronise when
/// ARBITER_CUDA_SYNC=1 (read once per process).
void check_launch(const char* kernel, cudaStream_t s, const char* file, int line);
/// Whether ARBITER_CUDA_SYNC=1 is set.
bool sync_after_launch();
/// Whether kernels are launched with programmatic dependent launch (PDL: the next kernel
/// starts while this one drains and waits in griddepcontrol.wait before reading its inputs).
/// ARBITER_CUDA_PDL=0 turns it off; ARBITER_CUDA_SYNC=1 too. set_pdl overrides (tests).
bool pdl_enabled();
void set_pdl(bool on);
/// Sets the kernel's preferred L1/shared-memory split to the most shared memory (once per
/// kernel; launch_decode_k calls it). The split is chosen per kernel from its shared memory, and
/// blocks of kernels with different splits do not share an SM: under PDL the next kernel's
/// blocks, launched early to load their weights, would wait for the SM to drain instead. One
/// split for every kernel keeps them co-resident (docs/evidence/h200/decode-variants-s12.txt).
void prefer_max_shared(const void* kernel);

}  // namespace arbiter::cuda

#define ARB_CUDA(call) ::arbiter::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define ARB_CUBLAS(call) ::arbiter::cuda::check_cublas(int(call), #call, __FILE__, __LINE__)
#define ARB_LAUNCHED(name, stream) ::arbiter::cuda::check_launch(name, stream, __FILE__, __LINE__)
