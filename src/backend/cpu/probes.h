// Physical limits of the host, measured: the streaming read bandwidth and OpenBLAS's sgemm
// rate. bench divides the CPU tiers' speeds by them (engine/bench.h).
#pragma once
#include <cstddef>
#include <vector>

namespace arbiter::cpu {

/// One streaming read of `bytes` (rounded down to 4 KiB) with `threads` threads over memory
/// advised MADV_HUGEPAGE and touched first; returns GB/s (1e9 bytes/s) of each of `passes`
/// timed passes. The buffer is unmapped before returning. Throws if it cannot be mapped.
std::vector<double> measure_host_read_bandwidth(size_t bytes, int threads, int passes);

/// OpenBLAS cblas_sgemm of n x n x n with `threads` BLAS threads (restored afterwards):
/// GFLOP/s (2 n^3 / time) of each of `passes` timed calls after one untimed call.
std::vector<double> measure_sgemm_gflops(int n, int threads, int passes);

}  // namespace arbiter::cpu
