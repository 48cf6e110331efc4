// Whole-model CPU-tier benchmarks on a llama-3.2-1B-shaped model with random weights:
//   decode   one token per forward() behind a short context; bytes/s = weight bytes read per
//            token x tokens/s, to be compared with stream_read of the same run (the limit)
//   prefill  one 512-token forward(); FLOP/s counts the matmuls (2 x T x params) only, to be
//            compared with fma_peak and sgemm_openblas of the same run
// Weights live in anonymous memory on huge pages (pages:huge) or 4 KiB pages (pages:4k, what a
// file mmap of a checkpoint gets on ext4).
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <string>

#include "backend/cpu/kernels.h"
#include "bench_util.h"
#include "engine/session.h"
#include "model/model.h"

namespace arbiter::bench {
namespace {

ModelConfig llama_1b() {
  ModelConfig c;
  c.arch = "llama";
  c.n_layer = 16;
  c.d_model = 2048;
  c.n_head = 32;
  c.n_head_kv = 8;
  c.head_dim = 64;
  c.d_ff = 8192;
  c.vocab = 128256;
  c.max_pos = 131072;
  c.norm_eps = 1e-5;
  c.rope.dims = c.head_dim;
  c.rope.theta = 500000;
  c.rope.scaling.kind = RopeScaling::Kind::Llama3;
  c.rope.scaling.factor = 32;
  c.tied_embeddings = true;
  return c;
}

// A model whose tensors are views into one buffer (tied embedding / lm_head).
struct SyntheticModel {
  Model model;
  HugeBuffer storage;
  size_t matmul_bytes = 0;   // bytes of every matrix a decode step reads (incl. lm_head)
  double matmul_params = 0;  // parameters taking part in matmuls
};

std::unique_ptr<SyntheticModel> make_model(DType dt, bool huge) {
  auto sm = std::make_unique<SyntheticModel>();
  Model& m = sm->model;
  m.config = llama_1b();
  const ModelConfig& c = m.config;
  m.arch = &arch_of(c.arch);
  m.weights.specs = m.arch->tensors(c);
  m.weights.resize(m.arch->global_slots(), c.n_layer, m.arch->layer_slots());
  size_t total = 0;
  for (const TensorSpec& s : m.weights.specs)
    if (!s.tie_to)
      total += (dtype_bytes(s.kind == TensorKind::Matrix ? dt : DType::F32,
                            s.shape.size() == 2 ? s.shape[0] * s.shape[1] : s.shape[0]) + 63) / 64 * 64;
  sm->storage = HugeBuffer(total, huge);
  size_t off = 0;
  uint64_t seed = 1;
  for (const TensorSpec& s : m.weights.specs) {
    if (s.tie_to) continue;  // lm_head: the embedding (below)
    Tensor& t = m.weights.at(s);
    const bool matmul = s.kind == TensorKind::Matrix;
    const int64_t rows = s.shape.size() == 2 ? s.shape[0] : 1, cols = s.shape.back();
    t.name = s.hf;
    t.dtype = matmul ? dt : DType::F32;
    t.shape = s.shape;
    t.data = sm->storage.as<uint8_t>() + off;
    // Norm weights near 1, matrices scaled like a trained model's (std ~ 1/sqrt(fan-in)).
    if (matmul) {
      fill_random(dt, const_cast<void*>(t.data), rows * cols, seed++,
                  float(1.7 / std::sqrt(double(cols))));
      sm->matmul_bytes += dtype_bytes(dt, rows * cols);
      sm->matmul_params += double(rows * cols);
    } else {
      float* w = static_cast<float*>(const_cast<void*>(t.data));
      for (int64_t i = 0; i < cols; ++i) w[i] = 1.f;
    }
    off += (t.nbytes() + 63) / 64 * 64;
  }
  for (const TensorSpec& s : m.weights.specs)
    if (s.tie_to) m.weights.at(s) = *m.weights.find(s.tie_to);
  m.weight_dtype = dt;
  return sm;
}

std::unique_ptr<Backend> make_be(int threads) {
  cpu::CpuOptions o;
  o.threads = threads;
  return cpu::make_cpu_backend(o);
}

void decode(benchmark::State& state, DType dt, int threads, bool huge) {
  auto sm = make_model(dt, huge);
  auto be = make_be(threads);
  Session s(sm->model, *be, 1024, 1);
  int32_t id = 1;
  for (auto _ : state) {
    s.forward({id});
    if (s.pos() == 256) s.reset();  // attention over a context of 0..255 tokens: weights dominate
    id = (id * 31 + 7) % sm->model.config.vocab;
  }
  // Every matrix is read once per token (the tied embedding in full, as lm_head); the
  // embedding row and the norm vectors are noise next to that and not counted.
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(sm->matmul_bytes));
  state.counters["weight_GB"] = double(sm->matmul_bytes) / 1e9;
  state.counters["tok/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

void prefill(benchmark::State& state, DType dt, int threads, int T) {
  auto sm = make_model(dt, true);
  auto be = make_be(threads);
  Session s(sm->model, *be, T, T);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) ids[size_t(t)] = (t * 7919) % sm->model.config.vocab;
  for (auto _ : state) {
    s.reset();
    s.forward(ids);
  }
  // Matmul FLOPs only (the embedding table is read, not multiplied, except as lm_head).
  const double params = sm->matmul_params;
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * T * params, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tok/s"] = benchmark::Counter(T, benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  for (DType dt : {DType::BF16, DType::F32, DType::Q8_0})
    for (int th : {1, 2})
      for (bool huge : {true, false}) {
        std::string name = std::string("decode/llama1b/") + dtype_name(dt) + "/threads:" +
                           std::to_string(th) + "/pages:" + (huge ? "huge" : "4k");
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
          decode(s, dt, th, huge);
        })->UseRealTime()->Unit(benchmark::kMillisecond);
      }
  for (DType dt : {DType::BF16, DType::F32})
    for (int th : {1, 2}) {
      std::string name = std::string("prefill/llama1b/") + dtype_name(dt) + "/threads:" +
                         std::to_string(th) + "/T:512";
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
        prefill(s, dt, th, 512);
      })->UseRealTime()->Unit(benchmark::kMillisecond);
    }
}

const bool registered = (register_all(), true);

}  // namespace
}  // namespace arbiter::bench
