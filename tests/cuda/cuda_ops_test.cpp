// Each CUDA op against the f64 ref tier, on seeded random inputs of real model shapes
// (Qwen3-0.6B, Llama-3.2-1B, stories260K) and odd sizes, for bf16, f16 and f32.
// Outputs are poisoned with NaN before each op; every check prints one "NMSE" line with the
// case, the seed, the NMSE, its bound (cuda_test_util.h's table) and the largest error.
// To add a case: append a row to the op's case list; the bound follows from dtype and the
// reduction length, never from a hand-picked number.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cuda/cuda_test_util.h"
#include "model/config.h"

#if ARBITER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace arbiter::test {
namespace {

/// A buffer freed with its backend.
struct Buf {
  Backend* be = nullptr;
  Buffer b;
  Buf(Backend& backend, int64_t n, bool logits = false) : be(&backend), b(backend.alloc(n, logits)) {}
  Buf(Backend& backend, const std::vector<double>& v, bool logits = false)
      : Buf(backend, int64_t(v.size()), logits) {
    be->write(b, 0, b.n, v.data());
  }
  ~Buf() { be->free(b); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

void check_close(const char* op, const std::string& dt, const std::string& what, uint64_t seed,
                 const std::vector<double>& cuda, const std::vector<double>& ref, double bound) {
  const Compare c = compare(cuda, ref);
  std::printf("NMSE %-10s %-5s %-44s seed=%-6llu nmse=%.3e bound=%.3e max_abs=%.3e\n", op,
              dt.c_str(), what.c_str(), (unsigned long long)seed, c.nmse, bound, c.max_abs);
  EXPECT_EQ(c.nan, 0) << op << " " << dt << " " << what << " seed " << seed
                      << ": non-finite or unwritten (poisoned) outputs";
  EXPECT_LE(c.nmse, bound) << op << " " << dt << " " << what << " seed " << seed
                           << ": worst element " << c.worst << " cuda " << cuda[c.worst]
                           << " ref " << ref[c.worst];
}

class CudaOps : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaOps, Embed) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  struct Case { int V, D; std::vector<int32_t> ids; };
  const std::vector<Case> cases = {{512, 64, {1, 0, 511, 7, 7}}, {4096, 1024, {4095, 17, 2}},
                                   {517, 33, {516, 3}}};
  uint64_t seed = 100;
  for (const Case& c : cases) {
    ++seed;
    std::vector<double> vals;
    auto tab = make_tensor("embed", {c.V, c.D}, random_values(int64_t(c.V) * c.D, seed, 1.0, dt),
                           storage_of(dt), &vals);
    const int T = int(c.ids.size());
    Buf out_c(*cu, int64_t(T) * c.D), out_r(*ref, int64_t(T) * c.D);
    poison(*cu, out_c.b);
    cu->embed(tab->t, c.ids.data(), T, out_c.b);
    ref->embed(tab->t, c.ids.data(), T, out_r.b);
    // A gather is exact: bound 0.
    check_close("embed", dt, strformat("V=%d D=%d T=%d", c.V, c.D, T), seed,
                read_all(*cu, out_c.b, out_c.b.n), read_all(*ref, out_r.b, out_r.b.n), 0.0);
  }
}

TEST_P(CudaOps, RmsNorm) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  struct Case { int R, N; bool in_place; };
  const std::vector<Case> cases = {{7, 1024, false}, {1, 2048, false}, {5 * 16, 128, true},
                                   {3, 33, false},   {1, 64, false},   {9, 8, true}};
  uint64_t seed = 200;
  for (const Case& c : cases) {
    ++seed;
    const auto x = random_values(int64_t(c.R) * c.N, seed, 1.5, dt);
    std::vector<double> wv = random_values(c.N, seed + 1000, 0.1, dt);
    for (double& w : wv) w = round_to(dt, 1.0 + w);
    auto w = make_tensor("norm", {c.N}, wv, storage_of(dt));
    Buf xc(*cu, x), xr(*ref, x), oc(*cu, x.size()), orf(*ref, x.size());
    poison(*cu, oc.b);
    Buffer& out_c = c.in_place ? xc.b : oc.b;
    Buffer& out_r = c.in_place ? xr.b : orf.b;
    cu->rmsnorm(xc.b, w->t, c.R, c.N, 1e-6, out_c);
    ref->rmsnorm(xr.b, w->t, c.R, c.N, 1e-6, out_r);
    check_close("rmsnorm", dt, strformat("R=%d N=%d%s", c.R, c.N, c.in_place ? " in-place" : ""),
                seed, read_all(*cu, out_c, x.size()), read_all(*ref, out_r, x.size()),
                nmse_bound(dt, c.N));
  }
}

struct MatmulCase {
  int T, N, K;
  bool bias, logits;
};

void run_matmul(Backend& cu, Backend& ref, const std::string& dt, const MatmulCase& c,
                uint64_t seed, DType storage, double extra_u2, const char* label) {
  std::vector<double> wexact;
  auto W = make_tensor("W", {c.N, c.K}, random_values(int64_t(c.N) * c.K, seed, 0.05, "f32"),
                       storage, &wexact);
  // The ref sees the stored weights; for a storage narrower than f32 the values are already
  // representable in the compute dtype unless extra_u2 says the upload rounds them.
  std::unique_ptr<HostTensor> B;
  if (c.bias) B = make_tensor("b", {c.N}, random_values(c.N, seed + 7, 0.5, dt), storage_of(dt));
  const auto x = random_values(int64_t(c.T) * c.K, seed + 3, 1.0, dt);
  Buf xc(cu, x), xr(ref, x);
  Buf oc(cu, int64_t(c.T) * c.N, c.logits), orf(ref, int64_t(c.T) * c.N, c.logits);
  poison(cu, oc.b);
  cu.matmul(xc.b, W->t, B ? &B->t : nullptr, c.T, oc.b);
  ref.matmul(xr.b, W->t, B ? &B->t : nullptr, c.T, orf.b);
  const std::string out_dt = c.logits ? "f32" : dt;
  const double u = unit_roundoff(dt);
  check_close(label, dt,
              strformat("T=%d N=%d K=%d%s%s %s", c.T, c.N, c.K, c.bias ? " +bias" : "",
                        c.logits ? " logits" : "", dtype_name(storage)),
              seed, read_all(cu, oc.b, oc.b.n), read_all(ref, orf.b, orf.b.n),
              nmse_bound(out_dt, c.K) + kSafety * extra_u2 * u * u);
}

const std::vector<MatmulCase>& matmul_cases() {
  static const std::vector<MatmulCase> cases = {
      {1, 3072, 1024, false, false},  // qwen3-0.6B gate/up, decode
      {1, 1024, 3072, false, false},  // down, decode
      {8, 3072, 1024, false, false},  // verify-sized
      {64, 2048, 2048, false, false}, // llama-3.2-1B q/o, prefill
      {1, 172, 64, false, false},     // stories260K ffn
      {3, 64, 172, false, false},     // stories260K down (K not a multiple of 8)
      {1, 33, 31, false, false},      // odd
      {5, 31, 33, false, false},      // odd
      {1, 1024, 1024, true, false},   // qwen2-style bias, decode
      {6, 512, 1024, true, false},    // bias, prefill
      {1, 50257, 1024, false, true},  // logits (f32 out), decode
      {4, 50257, 512, false, true},   // logits, several rows
  };
  return cases;
}

TEST_P(CudaOps, MatmulGemvAndCublasLt) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  uint64_t seed = 300;
  for (const MatmulCase& c : matmul_cases()) {
    ++seed;
    // Weights stored in the compute dtype's own storage: exact on upload.
    run_matmul(*cu, *ref, dt, c, seed, storage_of(dt), 0.0,
               c.T == 1 ? "matmul.gemv" : "matmul.lt");
  }
#if ARBITER_HAVE_CUDA
  // The same single-row cases through cuBLASLt (the path ARBITER_CUDA_GEMV=0 selects).
  CudaTuning t = cuda_tuning(*cu);
  t.gemv = false;
  cuda_set_tuning(*cu, t);
  for (const MatmulCase& c : matmul_cases())
    if (c.T == 1) run_matmul(*cu, *ref, dt, c, ++seed, storage_of(dt), 0.0, "matmul.lt1");
  EXPECT_GT(cu->stats().calls().at("matmul").count(std::string("cuda.gemv_") + dt), 0u);
  EXPECT_GT(cu->stats().calls().at("matmul").count(std::string("cublaslt.gemm_") + dt), 0u);
#endif
}

// The tier uploads each weight once, looked up by its host tensor: two views of the same bytes
// with different shapes ([64, 128] and [128, 64]) are two matrices, not one found twice.
TEST_P(CudaOps, MatmulViewsOfOneBufferKeepTheirShapes) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  const uint64_t seed = 390;
  auto W = make_tensor("W", {64, 128}, random_values(64 * 128, seed, 0.05, dt), storage_of(dt));
  Tensor wide = W->t, tall = W->t;
  tall.shape = {128, 64};
  for (const Tensor* w : {&wide, &tall}) {
    const int N = int(w->rows()), K = int(w->cols());
    const auto x = random_values(K, seed + uint64_t(N), 1.0, dt);
    Buf xc(*cu, x), xr(*ref, x), oc(*cu, N), orf(*ref, N);
    poison(*cu, oc.b);
    cu->matmul(xc.b, *w, nullptr, 1, oc.b);
    ref->matmul(xr.b, *w, nullptr, 1, orf.b);
    check_close("matmul.view", dt, strformat("N=%d K=%d", N, K), seed, read_all(*cu, oc.b, N),
                read_all(*ref, orf.b, N), nmse_bound(dt, K));
  }
}

/// The input of a fused norm GEMV: RMSNorm weights 1 + N(0, 0.1^2) (seed) and x ~ N(0, 1) in
/// the compute type (seed + 1).
struct NormInput {
  std::unique_ptr<HostTensor> w;
  std::vector<double> x;
};
NormInput norm_input(int K, uint64_t seed, const std::string& dt) {
  std::vector<double> wv = random_values(K, seed, 0.1, "f32");
  for (double& w : wv) w += 1.0;
  return {make_tensor("norm", {K}, wv, DType::F32), random_values(K, seed + 1, 1.0, dt)};
}

// The final norm + logits of a decode step (rmsnorm_matmul at T = 1 with f32 output): more
// rows than the fused GEMV's grid has warps, so each warp loops over rows (the shipped models'
// vocabularies fit one pass). The normalised x is rounded to the compute type (one u^2 more
// in the bound).
TEST_P(CudaOps, RmsnormMatmulLogits) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  uint64_t seed = 350;
  for (const auto& [N, K] : {std::pair{50257, 1024}, std::pair{9000, 512}}) {
    ++seed;
    auto W = make_tensor("W", {N, K}, random_values(int64_t(N) * K, seed, 0.05, dt),
                         storage_of(dt));
    const NormInput in = norm_input(K, seed + 1, dt);
    Buf xc(*cu, in.x), xr(*ref, in.x), nc(*cu, K), nr(*ref, K);
    Buf oc(*cu, N, true), orf(*ref, N, true);
    poison(*cu, oc.b);
    const Backend::MatmulTarget tc{&W->t, nullptr, &oc.b}, tr{&W->t, nullptr, &orf.b};
    cu->rmsnorm_matmul(xc.b, in.w->t, 1, K, 1e-6, nc.b, nullptr, &tc, 1);
    ref->rmsnorm_matmul(xr.b, in.w->t, 1, K, 1e-6, nr.b, nullptr, &tr, 1);
    const double u = unit_roundoff(dt);
    check_close("norm_gemv", dt, strformat("N=%d K=%d logits", N, K), seed,
                read_all(*cu, oc.b, N), read_all(*ref, orf.b, N),
                nmse_bound("f32", K) + kSafety * u * u);
  }
#if ARBITER_HAVE_CUDA
  EXPECT_GT(cu->stats().calls().count("rmsnorm_matmul"), 0u);
#endif
}

// The q/k/v form of the decode step's norm GEMV (rmsnorm_matmul at T = 1, three outputs):
// rows of 1,024 elements, which the fused kernel takes two per warp in bf16/f16 (reading the
// normalised x from shared memory); K 1,000 and 504 leave lanes and chunks past the row
// (zeros there), 504 also takes that form in f32. Segments of odd lengths cross warps, blocks
// and the pair of a warp; the last warps hold one row.
TEST_P(CudaOps, RmsnormMatmulThreeSegments) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  const int rows[3] = {1001, 37, 3000};
  for (const int K : {1024, 1000, 504}) {
    const uint64_t seed = 360 + uint64_t(K);
    std::vector<std::unique_ptr<HostTensor>> W;
    std::vector<std::unique_ptr<Buf>> oc, orf;
    for (int i = 0; i < 3; ++i) {
      W.push_back(make_tensor(strformat("W%d", i), {rows[i], K},
                              random_values(int64_t(rows[i]) * K, seed + uint64_t(i), 0.05, dt),
                              storage_of(dt)));
      oc.push_back(std::make_unique<Buf>(*cu, rows[i]));
      orf.push_back(std::make_unique<Buf>(*ref, rows[i]));
      poison(*cu, oc.back()->b);
    }
    const NormInput in = norm_input(K, seed + 3, dt);
    Buf xc(*cu, in.x), xr(*ref, in.x), nc(*cu, K), nr(*ref, K);
    Backend::MatmulTarget tc[3], tr[3];
    for (int i = 0; i < 3; ++i) {
      tc[i] = {&W[size_t(i)]->t, nullptr, &oc[size_t(i)]->b};
      tr[i] = {&W[size_t(i)]->t, nullptr, &orf[size_t(i)]->b};
    }
    cu->rmsnorm_matmul(xc.b, in.w->t, 1, K, 1e-6, nc.b, nullptr, tc, 3);
    ref->rmsnorm_matmul(xr.b, in.w->t, 1, K, 1e-6, nr.b, nullptr, tr, 3);
    const double u = unit_roundoff(dt);
    for (int i = 0; i < 3; ++i)
      check_close("norm_gemv", dt, strformat("segment %d of 3, N=%d K=%d", i, rows[i], K), seed,
                  read_all(*cu, oc[size_t(i)]->b, rows[i]),
                  read_all(*ref, orf[size_t(i)]->b, rows[i]),
                  nmse_bound(dt, K) + kSafety * u * u);
  }
#if ARBITER_HAVE_CUDA
  EXPECT_GT(cu->stats().calls().count("rmsnorm_matmul"), 0u);
#endif
}

// The gate/up form (rmsnorm_swiglu at T = 1): 3,001 rows of 1,024 elements, which the fused
// kernel takes two gate/up pairs per warp in bf16/f16; the last warps hold one pair. gate, up
// and the normalised x are rounded to the compute type before the product (three u^2 more).
TEST_P(CudaOps, RmsnormSwigluOddRows) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  const int K = 1024, F = 3001;
  const uint64_t seed = 370;
  auto Wg = make_tensor("gate", {F, K}, random_values(int64_t(F) * K, seed, 0.05, dt),
                        storage_of(dt));
  auto Wu = make_tensor("up", {F, K}, random_values(int64_t(F) * K, seed + 1, 0.05, dt),
                        storage_of(dt));
  const NormInput in = norm_input(K, seed + 2, dt);
  Buf xc(*cu, in.x), xr(*ref, in.x), nc(*cu, K), nr(*ref, K);
  Buf gc(*cu, F), gr(*ref, F), uc(*cu, F), ur(*ref, F), ac(*cu, F), ar(*ref, F);
  poison(*cu, ac.b);
  cu->rmsnorm_swiglu(xc.b, in.w->t, 1, K, 1e-6, nc.b, Wg->t, Wu->t, gc.b, uc.b, ac.b, {});
  ref->rmsnorm_swiglu(xr.b, in.w->t, 1, K, 1e-6, nr.b, Wg->t, Wu->t, gr.b, ur.b, ar.b, {});
  const double u = unit_roundoff(dt);
  check_close("norm_swiglu", dt, strformat("F=%d K=%d", F, K), seed, read_all(*cu, ac.b, F),
              read_all(*ref, ar.b, F), nmse_bound(dt, K) + kSafety * 3 * u * u);
#if ARBITER_HAVE_CUDA
  EXPECT_GT(cu->stats().calls().count("rmsnorm_swiglu"), 0u);
#endif
}

TEST_P(CudaOps, WeightUploadFromOtherStorage) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  // Q8_0 dequantises exactly in f32 (d * q has at most 19 significant bits); in bf16/f16 the
  // upload rounds each weight once more: one more u^2 in the bound. Same for f32 storage.
  const double extra = dt == "f32" ? 0.0 : 1.0;
  uint64_t seed = 400;
  for (DType st : {DType::Q8_0, DType::F32})
    for (const MatmulCase& c : {MatmulCase{1, 1024, 1024, false, false},
                                MatmulCase{7, 768, 256, false, false}})
      run_matmul(*cu, *ref, dt, c, ++seed, st, extra, "matmul.upld");
}

TEST_P(CudaOps, Rope) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  struct Case { int T, nh, Dh, pos0; RopeLayout layout; double theta; bool llama3; };
  const std::vector<Case> cases = {
      {5, 16, 128, 0, RopeLayout::Half, 1e6, false},      // qwen3 q
      {1, 8, 64, 3000, RopeLayout::Half, 5e5, true},      // llama3 scaling, table growth
      {7, 4, 8, 20, RopeLayout::Adjacent, 1e4, false},    // stories260K (GGUF layout)
      {3, 8, 16, 509, RopeLayout::Half, 1e4, false},      // TinyStories-656K
      {2, 3, 96, 7000, RopeLayout::Adjacent, 1e4, false}, // odd head count, far position
  };
  uint64_t seed = 500;
  for (const Case& c : cases) {
    ++seed;
    RopeSpec cfg;
    cfg.dims = c.Dh;
    cfg.theta = c.theta;
    cfg.layout = c.layout;
    if (c.llama3) {
      cfg.scaling.kind = RopeScaling::Kind::Llama3;
      cfg.scaling.factor = 32;
      cfg.scaling.original_max_pos = 8192;
    }
    const auto x = random_values(int64_t(c.T) * c.nh * c.Dh, seed, 1.0, dt);
    Buf xc(*cu, x), xr(*ref, x);
    cu->rope(xc.b, c.T, c.nh, c.Dh, c.pos0, cfg);
    ref->rope(xr.b, c.T, c.nh, c.Dh, c.pos0, cfg);
    check_close("rope", dt,
                strformat("T=%d nh=%d Dh=%d pos0=%d %s", c.T, c.nh, c.Dh, c.pos0,
                          c.layout == RopeLayout::Half ? "half" : "adjacent"),
                seed, read_all(*cu, xc.b, x.size()), read_all(*ref, xr.b, x.size()),
                nmse_bound(dt, 0));
  }
}

TEST_P(CudaOps, KvStore) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  const int ctx = 50, kv_dim = 4 * 32, T = 5, pos0 = 17;
  const uint64_t seed = 600;
  const auto k = random_values(int64_t(T) * kv_dim, seed, 1.0, dt);
  const auto v = random_values(int64_t(T) * kv_dim, seed + 1, 1.0, dt);
  Buf kc(*cu, k), vc(*cu, v), kcache(*cu, int64_t(ctx) * kv_dim), vcache(*cu, int64_t(ctx) * kv_dim);
  poison(*cu, kcache.b);
  poison(*cu, vcache.b);
  cu->kv_store(kc.b, vc.b, kcache.b, vcache.b, T, pos0, kv_dim);
  const auto kr = read_all(*cu, kcache.b, kcache.b.n), vr = read_all(*cu, vcache.b, vcache.b.n);
  int64_t bad = 0;
  for (int64_t i = 0; i < int64_t(ctx) * kv_dim; ++i) {
    const int64_t row = i / kv_dim;
    if (row >= pos0 && row < pos0 + T) {
      bad += kr[i] != k[i - int64_t(pos0) * kv_dim] || vr[i] != v[i - int64_t(pos0) * kv_dim];
    } else {
      bad += !std::isnan(kr[i]) || !std::isnan(vr[i]);  // rows outside must stay untouched
    }
  }
  std::printf("NMSE %-10s %-5s %-44s seed=%-6llu mismatches=%lld (exact copy expected)\n",
              "kv_store", dt.c_str(), "ctx=50 kv_dim=128 T=5 pos0=17", (unsigned long long)seed,
              (long long)bad);
  EXPECT_EQ(bad, 0);
}

TEST_P(CudaOps, Attention) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
#if ARBITER_HAVE_CUDA
  set_attn_split_keys(*cu, 128);  // the split counts the cases name
#endif
  auto ref = make_ref_backend();
  struct Case { int T, pos0, H, Hkv, Dh, window; };
  const std::vector<Case> cases = {
      {64, 0, 16, 8, 128, 0},      // qwen3-0.6B prefill
      {37, 100, 8, 4, 64, 0},      // prefill behind context
      {1, 700, 16, 8, 128, 0},     // decode, key range split across blocks
      {1, 0, 8, 4, 8, 0},          // stories260K first token
      {20, 30, 12, 4, 16, 16},     // sliding window, group of 3
      {1, 1500, 32, 8, 64, 1024},  // decode past a 1024 window (llama-3.2-1B heads)
      {1, 300, 32, 4, 128, 0},     // decode, group of 8 (one key per warp), 2 splits
      {1, 90, 8, 8, 256, 0},       // decode, Dh 256, MHA
      {1, 150, 16, 2, 256, 0},     // decode, group of 8 at Dh 256: over 48 KB of shared memory
      {9, 1530, 16, 16, 256, 1024},// Dh 256, MHA, w8ctx1536-like
      {5, 3, 4, 1, 96, 0},         // Dh not a multiple of 32, all heads share one KV head
      {200, 0, 8, 2, 128, 0},      // longer prefill
      {96, 40, 8, 2, 64, 48},      // tensor-core prefill: sliding window across key tiles
      {70, 5, 16, 4, 128, 0},      // tensor-core prefill: group of 4, partial last row block
  };
  // Decode blocks of one query head (the default) and of a whole group.
  for (const int hpb : {1, 8}) {
#if ARBITER_HAVE_CUDA
    set_attn_heads_per_block(*cu, hpb);
#endif
    uint64_t seed = 700;
    for (const Case& c : cases) {
      ++seed;
      if (c.T > 1 && hpb != 1) continue;  // prefill does not take the setting
      const int kv_dim = c.Hkv * c.Dh, end = c.pos0 + c.T;
      const int cap = end + 13;  // cache rows past the last position stay poisoned
      const int lo_min = c.window > 0 ? std::max(0, c.pos0 - c.window + 1) : 0;
      const auto q = random_values(int64_t(c.T) * c.H * c.Dh, seed, 1.0, dt);
      auto kcv = random_values(int64_t(cap) * kv_dim, seed + 1, 1.0, dt);
      auto vcv = random_values(int64_t(cap) * kv_dim, seed + 2, 1.0, dt);
      Buf qr(*ref, q), kr(*ref, kcv), vr(*ref, vcv), orf(*ref, q.size());
      // Rows no query may see are NaN in the CUDA cache: reading one would poison the output.
      for (int64_t i = 0; i < int64_t(cap) * kv_dim; ++i) {
        const int64_t row = i / kv_dim;
        if (row < lo_min || row >= end) kcv[i] = vcv[i] = std::nan("");
      }
      Buf qc(*cu, q), kc(*cu, kcv), vc(*cu, vcv), oc(*cu, q.size());
      poison(*cu, oc.b);
      cu->attention(qc.b, kc.b, vc.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, oc.b);
      ref->attention(qr.b, kr.b, vr.b, c.T, c.pos0, c.H, c.Hkv, c.Dh, c.window, orf.b);
      const int keys = c.window > 0 ? std::min(end, c.window) : end;
      check_close(c.T == 1 ? "attn.dec" : "attn.pre", dt,
                  strformat("T=%d pos0=%d H=%d Hkv=%d Dh=%d win=%d hpb=%d", c.T, c.pos0, c.H, c.Hkv,
                            c.Dh, c.window, hpb),
                  seed, read_all(*cu, oc.b, q.size()), read_all(*ref, orf.b, q.size()),
                  nmse_bound(dt, c.Dh + keys));
    }
  }
}

// The fused decode op qk_rope_attention (q/k norm + RoPE + KV store inside the decode
// attention kernel) against the same op on a tier with the fused ops off (rmsnorm, rope,
// kv_store and attention one by one, the path a stage hook takes): q and k (roped in place),
// both caches and the output must match bit for bit. The caches start with random rows
// before the position and NaN after it; a cache of many rows splits the keys, so the block
// holding the new row and the block merging the splits differ.
TEST_P(CudaOps, QkRopeAttentionEqualsOpsOneByOne) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
#if ARBITER_HAVE_CUDA
  auto plain = make_cuda_backend(0, dt);
  CudaTuning t = cuda_tuning(*plain);
  t.fused = false;
  cuda_set_tuning(*plain, t);
  set_attn_split_keys(*cu, 128);  // the split counts the cases name, on both tiers
  set_attn_split_keys(*plain, 128);
  struct Case { int H, Hkv, Dh, pos, cap, window; bool qk_norm; RopeLayout layout; };
  const std::vector<Case> cases = {
      {16, 8, 128, 700, 760, 0, true, RopeLayout::Half},       // qwen3-0.6B, 5 splits
      {4, 2, 32, 5, 600, 0, true, RopeLayout::Half},           // tiny-qwen3, 1 of 4 splits used
      {32, 8, 64, 1500, 1600, 1024, false, RopeLayout::Half},  // llama-3.2-1B past its window
      {8, 8, 64, 0, 64, 0, false, RopeLayout::Adjacent},       // first token, one split
      {16, 2, 256, 200, 300, 0, true, RopeLayout::Half},       // group of 8 at Dh 256 (78 KB)
  };
  // Decode blocks of one query head (the default: the first column's block writes k back
  // once the others have read it) and of a whole group, the same on both tiers; in groups of
  // up to 2 (the same keys per warp either way) the two give the same bits.
  std::vector<std::vector<std::vector<double>>> per_head(cases.size());
  for (const int hpb : {1, 8}) {
    set_attn_heads_per_block(*cu, hpb);
    set_attn_heads_per_block(*plain, hpb);
    uint64_t seed = 900;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& c = cases[ci];
      ++seed;
      SCOPED_TRACE(strformat("H=%d Hkv=%d Dh=%d pos=%d cap=%d window=%d heads/block=%d", c.H,
                             c.Hkv, c.Dh, c.pos, c.cap, c.window, hpb));
      RopeSpec cfg;
      cfg.dims = c.Dh;
      cfg.theta = 1e6;
      cfg.layout = c.layout;
      const int kv_dim = c.Hkv * c.Dh;
      const auto q = random_values(int64_t(c.H) * c.Dh, seed, 1.0, dt);
      const auto k = random_values(kv_dim, seed + 1, 1.0, dt);
      const auto v = random_values(kv_dim, seed + 2, 1.0, dt);
      auto kc = random_values(int64_t(c.cap) * kv_dim, seed + 3, 1.0, dt);
      auto vc = random_values(int64_t(c.cap) * kv_dim, seed + 4, 1.0, dt);
      for (int64_t i = int64_t(c.pos) * kv_dim; i < int64_t(c.cap) * kv_dim; ++i)
        kc[size_t(i)] = vc[size_t(i)] = std::nan("");
      auto qn =
          make_tensor("q_norm", {c.Dh}, random_values(c.Dh, seed + 5, 0.3, "f32"), DType::F32);
      auto kn =
          make_tensor("k_norm", {c.Dh}, random_values(c.Dh, seed + 6, 0.3, "f32"), DType::F32);
      std::vector<std::vector<double>> got[2];
      Backend* tiers[2] = {cu.get(), plain.get()};
      for (int i = 0; i < 2; ++i) {
        Backend& be = *tiers[i];
        Buf qb(be, q), kb(be, k), vb(be, v), kcb(be, kc), vcb(be, vc), ob(be, q.size());
        poison(be, ob.b);
        be.qk_rope_attention(qb.b, kb.b, vb.b, c.qk_norm ? &qn->t : nullptr,
                             c.qk_norm ? &kn->t : nullptr, 1e-6, 1, c.H, c.Hkv, c.Dh, c.pos, cfg,
                             kcb.b, vcb.b, c.window, ob.b, {});
        got[i] = {read_all(be, qb.b, qb.b.n), read_all(be, kb.b, kb.b.n),
                  read_all(be, kcb.b, kcb.b.n), read_all(be, vcb.b, vcb.b.n),
                  read_all(be, ob.b, ob.b.n)};
      }
      EXPECT_GT(cu->stats().calls().count("qk_rope_attention"), 0u)
          << "the fused kernel did not run";
      const char* names[] = {"q", "k", "k cache", "v cache", "out"};
      auto differing = [](const std::vector<double>& x, const std::vector<double>& y) {
        int64_t diff = 0;
        for (size_t e = 0; e < x.size(); ++e)
          diff += !(x[e] == y[e] || (std::isnan(x[e]) && std::isnan(y[e])));
        return diff;
      };
      for (int j = 0; j < 5; ++j)
        EXPECT_EQ(differing(got[0][j], got[1][j]), 0)
            << names[j] << " of " << got[0][j].size() << " elements differ from the ops one by one";
      EXPECT_FALSE(std::isnan(got[0][4][0])) << "output not written";
      if (hpb == 1) {
        per_head[ci] = got[0];
      } else if (c.H / c.Hkv <= 2) {
        for (int j = 0; j < 5; ++j)
          EXPECT_EQ(differing(got[0][j], per_head[ci][j]), 0)
              << names[j] << ": a block per KV head differs from a block per query head";
      }
    }
  }
#endif
}

TEST_P(CudaOps, SwigluAndAdd) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  uint64_t seed = 800;
  for (int64_t n : {int64_t(3072) * 3 + 7, int64_t(172), int64_t(1)}) {
    ++seed;
    const auto g = random_values(n, seed, 2.0, dt), u = random_values(n, seed + 1, 1.0, dt);
    Buf gc(*cu, g), uc(*cu, u), oc(*cu, n), gr(*ref, g), ur(*ref, u), orf(*ref, n);
    poison(*cu, oc.b);
    cu->swiglu(gc.b, uc.b, n, oc.b);
    ref->swiglu(gr.b, ur.b, n, orf.b);
    check_close("swiglu", dt, strformat("n=%lld", (long long)n), seed, read_all(*cu, oc.b, n),
                read_all(*ref, orf.b, n), nmse_bound(dt, 0));
    cu->add(gc.b, uc.b, n);
    ref->add(gr.b, ur.b, n);
    check_close("add", dt, strformat("n=%lld", (long long)n), seed, read_all(*cu, gc.b, n),
                read_all(*ref, gr.b, n), nmse_bound(dt, 0));
  }
}

// Logits rows for the summary tests. special: 0 random, 1 ties, 2 non-finite, 3 signed zeros.
struct SummaryCase { int T, V, K; int special; };
const std::vector<SummaryCase> kSummaryCases = {
    {2, 151936, 8, 0}, {3, 512, 64, 0}, {1, 33, 33, 0},     {2, 2048, 16, 1}, {2, 1000, 10, 2},
    {1, 128, 5, 3},    {1, 32000, 1, 0}, {2, 2048, 1, 1},   {2, 1000, 1, 2},  {1, 128, 1, 3},
    {1, 50000, 1, 2},  {1, 50000, 4, 1}, {3, 151936, 1, 0}, {1, 7, 1, 1}};
std::vector<double> summary_case_values(const SummaryCase& c, uint64_t seed) {
  auto v = random_values(int64_t(c.T) * c.V, seed, 3.0, "f32");
  std::mt19937_64 rng(seed);
  if (c.special == 1)  // few distinct values: long runs of ties, broken by the lower id
    for (double& x : v) x = double(int(rng() % 7)) - 3.0;
  if (c.special == 2) {
    v[5] = std::nan("");
    v[17] = INFINITY;
    v[40] = -INFINITY;
    if (c.T > 1) v[c.V + 3] = std::nan("");  // second row: NaN only
  }
  if (c.special == 3)
    for (size_t i = 0; i < v.size(); ++i) v[i] = (i % 3 == 0) ? -0.0 : (i % 3 == 1 ? 0.0 : -1.0);
  return v;
}

// Long rows with few rows are split into many slices (K = 1 then comes from the slices'
// partials).
TEST_P(CudaOps, Summarize) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  uint64_t seed = 900;
  for (const SummaryCase& c : kSummaryCases) {
    ++seed;
    const auto v = summary_case_values(c, seed);
    std::mt19937_64 rng(seed);
    std::vector<int32_t> targets(size_t(c.T));
    for (int t = 0; t < c.T; ++t) targets[t] = t == 0 ? -1 : int32_t(rng() % uint64_t(c.V));
    Buf lc(*cu, v, true), lr(*ref, v, true);
    std::vector<LogitsSummary> sc, sr;
    cu->summarize(lc.b, c.T, c.V, c.K, targets.data(), sc);
    ref->summarize(lr.b, c.T, c.V, c.K, targets.data(), sr);
    ASSERT_EQ(sc.size(), size_t(c.T));
    double worst_lse = 0;
    for (int t = 0; t < c.T; ++t) {
      const std::string where = strformat("T=%d V=%d K=%d special=%d row %d seed %llu", c.T, c.V,
                                          c.K, c.special, t, (unsigned long long)seed);
      EXPECT_EQ(sc[t].n_nonfinite, sr[t].n_nonfinite) << where;
      EXPECT_EQ(sc[t].top_ids, sr[t].top_ids) << where;
      for (int k = 0; k < c.K; ++k) {
        const double a = sc[t].top_logits[k], b = sr[t].top_logits[k];
        EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << where << " k " << k;
      }
      const double ta = sc[t].target_logit, tb = sr[t].target_logit;
      EXPECT_TRUE(ta == tb || (std::isnan(ta) && std::isnan(tb))) << where;
      if (std::isnan(sr[t].lse)) {
        EXPECT_TRUE(std::isnan(sc[t].lse)) << where;
      } else {
        // Both in f64; only the summation order and exp() implementations differ.
        const double err = std::fabs(sc[t].lse - sr[t].lse);
        worst_lse = std::max(worst_lse, err);
        EXPECT_LE(err, 1e-10 * std::max(1.0, std::fabs(sr[t].lse))) << where;
      }
    }
    std::printf("NMSE %-10s %-5s %-44s seed=%-6llu lse_abs_err=%.3e topk/target exact\n",
                "summarize", dt.c_str(),
                strformat("T=%d V=%d K=%d special=%d", c.T, c.V, c.K, c.special).c_str(),
                (unsigned long long)seed, worst_lse);
  }
}

// The greedy pick (one kernel, an atomicMax of the slices' best) takes summarize's top-1 of
// the ref tier on every row, ties and non-finite values included, and hands the picks back
// in order.
TEST_P(CudaOps, PickEqualsSummarizeTop1) {
  const std::string dt = GetParam();
  ARB_CUDA_OR_SKIP(cu, dt);
  auto ref = make_ref_backend();
  uint64_t seed = 950;
  for (const SummaryCase& c : kSummaryCases) {
    ++seed;
    const auto v = summary_case_values(c, seed);
    Buf lc(*cu, v, true), lr(*ref, v, true);
    std::vector<LogitsSummary> sr;
    const std::vector<int32_t> no_targets(size_t(c.T), -1);
    ref->summarize(lr.b, c.T, c.V, 1, no_targets.data(), sr);
    for (int t = 0; t < c.T; ++t) cu->pick_greedy(lc.b, t, c.V);
    for (int t = 0; t < c.T; ++t)
      EXPECT_EQ(cu->take_pick(), sr[t].top_ids[0])
          << strformat("T=%d V=%d special=%d row %d seed %llu", c.T, c.V, c.special, t,
                       (unsigned long long)seed);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values("bf16", "f16", "f32"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(CudaTier, ReportsBuildAndRefusesBadDtype) {
  if (!cuda_tier_built()) {
    EXPECT_EQ(cuda_build_version(), "none");
    EXPECT_THROW(make_cuda_backend(0, "f32"), Error);
    if (require_cuda()) FAIL() << "ARBITER_REQUIRE_CUDA=1 but the CUDA tier is not built";
    GTEST_SKIP() << "SKIP: no CUDA device (cuda tier not built)";
  }
  EXPECT_EQ(cuda_build_version().rfind("cuda-", 0), 0u) << cuda_build_version();
  EXPECT_THROW(make_cuda_backend(0, "f64"), Error);
  ARB_CUDA_OR_SKIP(cu, "bf16");
  EXPECT_EQ(cu->compute(), DType::BF16);
  EXPECT_EQ(cu->device_name().rfind("cuda:0 ", 0), 0u) << cu->device_name();
  EXPECT_THROW(make_cuda_backend(999, "bf16"), Error);
}

}  // namespace
}  // namespace arbiter::test
