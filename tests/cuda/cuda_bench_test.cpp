// Throughput of the CUDA tier, printed as "BENCH" lines (scripts/gpu-check.sh collects them).
// Runs only with ARBITER_CUDA_BENCH=1 and never asserts on time (DESIGN.md section 6): every
// number is reported next to a limit measured in the same run (device-to-device copy
// bandwidth) or as a ratio between variants (graph replay vs op by op, GEMV vs cuBLASLt).
// Models: a random-weight model of the Qwen3-0.6B shape (bf16 weights, 28 layers, D 1024,
// q/k norm, tied 151,936-row embedding), and the shipped tiny models (launch-bound).
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "cuda/cuda_test_util.h"
#include "engine/session.h"
#include "model/model.h"

#if ARBITER_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#endif

namespace arbiter::test {
namespace {

bool bench_enabled() {
  const char* v = std::getenv("ARBITER_CUDA_BENCH");
  return v && std::strcmp(v, "1") == 0;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#if ARBITER_HAVE_CUDA
/// Device-to-device copy bandwidth (bytes read + written per second) over 1 GiB.
double copy_bandwidth() {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaMemset(a, 1, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e0);
  const int reps = 10;
  for (int i = 0; i < reps; ++i) cudaMemcpy(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes * reps / (ms / 1e3);
}

/// Seconds per decode step (forward of one token + argmax on the device), median of 3 runs
/// of n steps after a prompt of p tokens.
double decode_step_s(const Model& m, Backend& be, int p, int n) {
  std::vector<double> runs;
  for (int rep = 0; rep < 3; ++rep) {
    Session s(m, be, p + n + 8, std::max(p, 1));
    std::vector<int32_t> prompt(static_cast<size_t>(p));
    for (int i = 0; i < p; ++i) prompt[i] = (i * 7919 + 1) % m.config.vocab;
    s.forward(prompt);
    std::vector<int32_t> no_target(size_t(p), -1);
    int32_t next = s.summarize(1, no_target).back().top_ids[0];
    for (int i = 0; i < 4; ++i) {  // warm-up: first sightings and graph capture
      s.forward({next});
      next = s.summarize(1, {-1})[0].top_ids[0];
    }
    const double t0 = now_s();
    for (int i = 0; i < n; ++i) {
      s.forward({next});
      next = s.summarize(1, {-1})[0].top_ids[0];
    }
    runs.push_back((now_s() - t0) / n);
  }
  std::sort(runs.begin(), runs.end());
  return runs[1];
}

void bench_decode_variants(const char* name, const Model& m, Backend& be, int64_t bytes_per_token,
                           double copy_bw, int n) {
  struct Variant { const char* label; bool gemv, graphs; };
  for (const Variant& v : {Variant{"graph+gemv", true, true}, Variant{"eager+gemv", true, false},
                           Variant{"graph+cublaslt", false, true}}) {
    CudaTuning t;
    t.gemv = v.gemv;
    t.graphs = v.graphs;
    cuda_set_tuning(be, t);
    const double s = decode_step_s(m, be, 16, n);
    const double gbs = double(bytes_per_token) / s;
    std::printf("BENCH decode %-22s %-5s %-15s %9.1f tok/s  %8.1f GB/s  %.3f of copy bw  "
                "(%.1f us/token)\n",
                name, dtype_name(be.compute()), v.label, 1.0 / s, gbs / 1e9, gbs / copy_bw,
                s * 1e6);
  }
  cuda_set_tuning(be, CudaTuning{});
}
#endif

TEST(CudaBench, Qwen3ShapeAndShippedModels) {
  if (!bench_enabled()) GTEST_SKIP() << "benchmarks run with ARBITER_CUDA_BENCH=1";
  ARB_CUDA_OR_SKIP(probe, "bf16");
#if ARBITER_HAVE_CUDA
  const double bw = copy_bandwidth();
  std::printf("BENCH copy_bandwidth %.1f GB/s (device-to-device, read + write)\n", bw / 1e9);
  const double t_build = now_s();
  auto syn = synthetic_qwen3_06b();
  std::printf("BENCH synthetic qwen3-0.6B shape: %.3f G matrix params, built in %.1f s\n",
              syn->matrix_params / 1e9, now_s() - t_build);
  for (const char* dt : {"bf16", "f32"}) {
    auto be = make_cuda_backend(0, dt);
    const double t0 = now_s();
    be->prepare(prepare_spec(syn->m));
    be->sync();
    std::printf("BENCH upload %-5s %.2f s\n", dt, now_s() - t0);
    const int64_t bytes = syn->matrix_params * (std::string(dt) == "f32" ? 4 : 2);
    bench_decode_variants("qwen3-0.6B-shape", syn->m, *be, bytes, bw, 128);

    // Prefill: one forward of 512 tokens (logits for every row, as a trace needs).
    for (int T : {512, 256}) {
      Session s(syn->m, *be, T, T);
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (int i = 0; i < T; ++i) ids[i] = (i * 104729 + 3) % syn->m.config.vocab;
      s.forward(ids);
      be->sync();
      std::vector<double> runs;
      for (int rep = 0; rep < 3; ++rep) {
        s.reset();
        const double a = now_s();
        s.forward(ids);
        be->sync();
        runs.push_back(now_s() - a);
      }
      std::sort(runs.begin(), runs.end());
      const double flops = 2.0 * double(syn->matrix_params) * T;
      std::printf("BENCH prefill T=%-4d %-5s %9.0f tok/s  %6.1f TFLOP/s (matrices only)\n", T, dt,
                  T / runs[1], flops / runs[1] / 1e12);
      // Teacher-forced rows: forward + top-8/lse/target summaries of every row.
      std::vector<int32_t> targets(ids.begin() + 1, ids.end());
      targets.push_back(-1);
      s.reset();
      const double a = now_s();
      s.forward(ids);
      s.summarize(8, targets);
      const double el = now_s() - a;
      std::printf("BENCH forced T=%-4d %-5s %9.0f positions/s (forward + summarize K=8)\n", T, dt,
                  T / el);
    }
    // Summarize alone, one row of 151,936 logits (the per-token argmax cost of decode).
    {
      Session s(syn->m, *be, 2, 1);
      s.forward({1});
      s.summarize(1, {-1});
      const double a = now_s();
      for (int i = 0; i < 50; ++i) s.summarize(1, {-1});
      std::printf("BENCH summarize V=151936 K=1 %-5s %.1f us/row\n", dt, (now_s() - a) / 50 * 1e6);
    }
  }
  // Single-row matmul: hand-written GEMV vs cuBLASLt on the decode shapes (bf16 weights).
  // 200 back-to-back calls, then one sync: the time per call includes launch gaps, which is
  // what a decode step pays outside a graph.
  {
    auto be = make_cuda_backend(0, "bf16");
    for (const auto& [N, K] : std::vector<std::pair<int, int>>{
             {2048, 1024}, {3072, 1024}, {1024, 3072}, {151936, 1024}}) {
      std::vector<uint16_t> w(size_t(N) * K);
      for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(float(int(i % 17) - 8) / 64.f);
      Tensor W;
      W.dtype = DType::BF16;
      W.shape = {N, K};
      W.data = w.data();
      Buffer x = be->alloc(K), y = be->alloc(N, true);
      std::vector<double> xv(size_t(K), 0.5);
      be->write(x, 0, K, xv.data());
      for (bool gemv : {true, false}) {
        CudaTuning t;
        t.gemv = gemv;
        t.graphs = false;
        cuda_set_tuning(*be, t);
        for (int i = 0; i < 10; ++i) be->matmul(x, W, nullptr, 1, y);
        be->sync();
        const int reps = 200;
        const double a = now_s();
        for (int i = 0; i < reps; ++i) be->matmul(x, W, nullptr, 1, y);
        be->sync();
        const double per = (now_s() - a) / reps;
        std::printf("BENCH matmul M=1 N=%-6d K=%-5d bf16 %-9s %7.2f us  %7.1f GB/s\n", N, K,
                    gemv ? "gemv" : "cublaslt", per * 1e6, 2.0 * N * K / per / 1e9);
      }
      be->free(x);
      be->free(y);
    }
  }
  // Launch-bound tiny models.
  for (const char* rel : {"stories260K/stories260K.gguf", "TinyStories-656K"}) {
    std::string p = source_path(std::string("models/") + rel);
    if (!std::filesystem::exists(p)) continue;
    auto m = load_model(p);
    auto be = make_cuda_backend(0, "bf16");
    bench_decode_variants(rel, *m, *be, 0, bw, 128);
  }
#endif
}

}  // namespace
}  // namespace arbiter::test
