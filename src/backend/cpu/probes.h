// Physical limits of the host, measured: the streaming read bandwidth, the f32 FMA peak, the
// 8-bit dot peak and the bf16 pair-dot peak.
// bench divides the CPU tiers' speeds by them (engine/bench.h).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"

namespace arbiter::cpu {

/// One streaming read of `bytes` (rounded down to 4 KiB) with `threads` threads over memory
/// advised MADV_HUGEPAGE and touched first; returns GB/s (1e9 bytes/s) of each of `passes`
/// timed passes. The buffer is unmapped before returning. Throws if it cannot be mapped.
std::vector<double> measure_host_read_bandwidth(size_t bytes, int threads, int passes);

/// The f32 FMA peak at the vector width of `isa`: `threads` threads (as many as the tier's
/// cores, released together) each run independent register FMA chains, enough of them to
/// cover the FMA latency; GFLOP/s (2 per lane per FMA, each thread's over its own CPU time,
/// summed) of each of `passes` timed passes after one shorter untimed pass. No kernel of that ISA can
/// exceed it: the CPU tier's prefill fraction is divided by it (an OpenBLAS sgemm rate,
/// used until issue 27, was exceeded by the tier's own GEMM). Throws if `isa` is not
/// compiled in.
std::vector<double> measure_fma_gflops(Isa isa, int threads, int passes);
/// One line naming that probe and its arguments, for reports.
std::string fma_probe_source(Isa isa, int threads, int passes);

/// The 8-bit dot peak of the integer GEMM's multiply on `isa` (AVX512-VNNI vpdpbusd, 64
/// multiply-adds; AVX2 vpmaddubsw, 32; counted 2 operations each as a FLOP is), measured as
/// measure_fma_gflops measures its peak: GOP/s of each of `passes` passes. It exceeds the f32
/// FMA peak 4x on paper, and bounds a prefill whose matmuls run partly on it and partly on
/// FMAs. Throws where qgemm_kernel(isa, ...) is nullptr for every type.
std::vector<double> measure_int8_gops(Isa isa, int threads, int passes);
std::string int8_probe_source(Isa isa, int threads, int passes);

/// The bf16 pair-dot peak of gemm_bf16_dot's instruction (AVX512-BF16 vdpbf16ps, 32
/// multiply-adds, 2 operations each), measured the same way: GFLOP/s of each pass. Twice the
/// f32 FMA's products per instruction; it bounds a prefill on bf16 weights with x in bf16.
/// Throws in a build without AVX512-BF16 (where bf16_dot is false for every ISA).
std::vector<double> measure_bf16_dot_gflops(int threads, int passes);
std::string bf16_dot_probe_source(int threads, int passes);

}  // namespace arbiter::cpu
