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
#include "model/forward.h"
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
  c.rope_theta = 500000;
  c.rope_scaling.kind = RopeScaling::Kind::Llama3;
  c.rope_scaling.factor = 32;
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
  const int64_t D = c.d_model, F = c.d_ff, q_dim = int64_t(c.n_head) * c.head_dim;
  const int64_t kv_dim = int64_t(c.n_head_kv) * c.head_dim;
  struct Spec {
    Tensor* t;
    int64_t rows, cols;
    bool matmul;
  };
  std::vector<Spec> specs;
  m.weights.layers.resize(size_t(c.n_layer));
  specs.push_back({&m.weights.embed, c.vocab, D, true});
  specs.push_back({&m.weights.out_norm, 1, D, false});
  for (auto& l : m.weights.layers) {
    specs.push_back({&l.attn_norm, 1, D, false});
    specs.push_back({&l.ffn_norm, 1, D, false});
    specs.push_back({&l.wq, q_dim, D, true});
    specs.push_back({&l.wk, kv_dim, D, true});
    specs.push_back({&l.wv, kv_dim, D, true});
    specs.push_back({&l.wo, D, q_dim, true});
    specs.push_back({&l.w_gate, F, D, true});
    specs.push_back({&l.w_up, F, D, true});
    specs.push_back({&l.w_down, D, F, true});
  }
  size_t total = 0;
  for (const Spec& s : specs) total += (dtype_bytes(dt, s.rows * s.cols) + 63) / 64 * 64;
  sm->storage = HugeBuffer(total, huge);
  size_t off = 0;
  uint64_t seed = 1;
  for (const Spec& s : specs) {
    s.t->dtype = s.matmul ? dt : DType::F32;
    s.t->shape = s.rows == 1 ? std::vector<int64_t>{s.cols} : std::vector<int64_t>{s.rows, s.cols};
    s.t->data = sm->storage.as<uint8_t>() + off;
    // Norm weights near 1, matrices scaled like a trained model's (std ~ 1/sqrt(fan-in)).
    if (s.matmul) {
      fill_random(dt, const_cast<void*>(s.t->data), s.rows * s.cols, seed++,
                  float(1.7 / std::sqrt(double(s.cols))));
      sm->matmul_bytes += dtype_bytes(dt, s.rows * s.cols);
      sm->matmul_params += double(s.rows * s.cols);
    } else {
      float* w = static_cast<float*>(const_cast<void*>(s.t->data));
      for (int64_t i = 0; i < s.cols; ++i) w[i] = 1.f;
    }
    off += (s.t->nbytes() + 63) / 64 * 64;
  }
  m.weights.lm_head = m.weights.embed;
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
  KVCache kv;
  Scratch s;
  kv_cache_init(*be, sm->model.config, 1024, kv);
  scratch_init(*be, sm->model.config, 1, s);
  int pos = 0;
  int32_t id = 1;
  for (auto _ : state) {
    forward(sm->model, *be, kv, s, &id, 1, pos, {}, true);
    pos = (pos + 1) % 256;  // attention over a context of 0..255 tokens: weights dominate
    id = (id * 31 + 7) % sm->model.config.vocab;
  }
  kv_cache_free(*be, kv);
  scratch_free(*be, s);
  // Every matrix is read once per token (the tied embedding in full, as lm_head); the
  // embedding row and the norm vectors are noise next to that and not counted.
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(sm->matmul_bytes));
  state.counters["weight_GB"] = double(sm->matmul_bytes) / 1e9;
  state.counters["tok/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

void prefill(benchmark::State& state, DType dt, int threads, int T) {
  auto sm = make_model(dt, true);
  auto be = make_be(threads);
  KVCache kv;
  Scratch s;
  kv_cache_init(*be, sm->model.config, T, kv);
  scratch_init(*be, sm->model.config, T, s);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) ids[size_t(t)] = (t * 7919) % sm->model.config.vocab;
  for (auto _ : state) forward(sm->model, *be, kv, s, ids.data(), T, 0, {}, true);
  kv_cache_free(*be, kv);
  scratch_free(*be, s);
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
