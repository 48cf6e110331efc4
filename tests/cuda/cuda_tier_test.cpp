// What only the CUDA tier has (each op against ref on every tier is in tests/ops/): the
// single-row matmuls through cuBLASLt (ARBITER_CUDA_GEMV=0), views of one weight buffer kept
// apart by the upload cache, the decode attention in blocks of a whole group and with the key
// splits the cases name, the build's identity and its words when no device is visible. SKIP
// without a GPU, except the message's own test, which needs none.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "backend/ref/ref_backend.h"
#include "cuda/cuda_test_util.h"
#include "tier_util.h"

#if ARBITER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace arbiter::test {
namespace {

OpTier tier_of(DType dt) {
  for (const OpTier& t : op_tiers())
    if (t.cuda && t.compute == dt) return t;
  ADD_FAILURE() << "no cuda tier";
  return {};
}

class CudaTier : public ::testing::TestWithParam<DType> {};

TEST_P(CudaTier, SingleRowMatmulsThroughCublasLt) {
  const OpTier tier = tier_of(GetParam());
  ARB_TIER_OR_SKIP(cu, tier);
  auto ref = make_ref_backend();
#if ARBITER_HAVE_CUDA
  CudaTuning t = cuda_tuning(*cu);
  t.gemv = false;
  cuda_set_tuning(*cu, t);
#endif
  struct Case {
    int N, K;
  };
  uint64_t seed = 300;
  for (const Case& c : {Case{3072, 1024}, Case{1024, 3072}, Case{33, 31}, Case{172, 64}}) {
    ++seed;
    auto W = make_tensor("W", {c.N, c.K}, values(int64_t(c.N) * c.K, seed, 0.05, DType::F32),
                         tier.compute);
    const std::vector<double> x = values(c.K, seed + 1, 1.0, tier.compute);
    Buf xc(*cu, x), xr(*ref, x), oc(*cu, c.N), orf(*ref, c.N);
    oc.poison();
    cu->matmul(xc.b, W->t, nullptr, 1, oc.b);
    ref->matmul(xr.b, W->t, nullptr, 1, orf.b);
    check_close("matmul.lt1", tier, strformat("N=%d K=%d", c.N, c.K), seed, oc.read(), orf.read(),
                nmse_bound(tier.compute, tier.compute, c.K, 2));
  }
  EXPECT_GT(cu->stats().calls().at("matmul").count(std::string("cublaslt.gemm_") +
                                                    dtype_name(tier.compute)),
            0u);
}

// The tier uploads each weight once, looked up by its host tensor: two views of the same bytes
// with different shapes ([64, 128] and [128, 64]) are two matrices, not one found twice.
TEST_P(CudaTier, MatmulViewsOfOneBufferKeepTheirShapes) {
  const OpTier tier = tier_of(GetParam());
  ARB_TIER_OR_SKIP(cu, tier);
  auto ref = make_ref_backend();
  const uint64_t seed = 390;
  auto W = make_tensor("W", {64, 128}, values(64 * 128, seed, 0.05, tier.compute), tier.compute);
  Tensor wide = W->t, tall = W->t;
  tall.shape = {128, 64};
  for (const Tensor* w : {&wide, &tall}) {
    const int N = int(w->rows()), K = int(w->cols());
    const std::vector<double> x = values(K, seed + uint64_t(N), 1.0, tier.compute);
    Buf xc(*cu, x), xr(*ref, x), oc(*cu, N), orf(*ref, N);
    oc.poison();
    cu->matmul(xc.b, *w, nullptr, 1, oc.b);
    ref->matmul(xr.b, *w, nullptr, 1, orf.b);
    check_close("matmul.view", tier, strformat("N=%d K=%d", N, K), seed, oc.read(), orf.read(),
                nmse_bound(tier.compute, tier.compute, K, 2));
  }
}

// The direct decode attention in blocks of a whole group (heads_per_block 8) and with keys
// split every 128 cache rows: the same results within the bound, and in groups of up to 2
// (the same keys per warp either way) the same bits as a block per query head.
TEST_P(CudaTier, DecodeAttentionBlockShapes) {
  const OpTier tier = tier_of(GetParam());
  ARB_TIER_OR_SKIP(cu, tier);
  auto ref = make_ref_backend();
  struct Case {
    int pos0, H, Hkv, Dh, window;
  };
  const Case cases[] = {{700, 16, 8, 128, 0}, {1500, 32, 8, 64, 1024}, {300, 32, 4, 128, 0},
                        {150, 16, 2, 256, 0}, {40, 8, 4, 16, 0},       {300, 8, 4, 64, 0}};
  uint64_t seed = 720;
  for (const Case& c : cases) {
    ++seed;
    const int kv_dim = c.Hkv * c.Dh, end = c.pos0 + 1, cap = end + 13;
    const int lo = c.window > 0 ? std::max(0, c.pos0 - c.window + 1) : 0;
    const std::vector<double> q = values(int64_t(c.H) * c.Dh, seed, 1.0, tier.compute);
    std::vector<double> k = values(int64_t(cap) * kv_dim, seed + 1, 1.0, tier.compute);
    std::vector<double> v = values(int64_t(cap) * kv_dim, seed + 2, 1.0, tier.compute);
    std::vector<double> kr = k, vr = v;
    for (int64_t i = 0; i < int64_t(cap) * kv_dim; ++i)
      if (i / kv_dim < lo || i / kv_dim >= end) {
        k[size_t(i)] = v[size_t(i)] = std::nan("");
        kr[size_t(i)] = vr[size_t(i)] = 0;
      }
    Buf qr(*ref, q), kbr(*ref, kr), vbr(*ref, vr), want(*ref, q.size());
    ref->attention(qr.b, kbr.b, vbr.b, 1, c.pos0, c.H, c.Hkv, c.Dh, c.window, want.b);
    std::vector<double> per_head;
    for (const int hpb : {1, 8}) {
#if ARBITER_HAVE_CUDA
      set_attn_heads_per_block(*cu, hpb);
      set_attn_split_keys(*cu, 128);
#endif
      Buf qc(*cu, q), kc(*cu, k), vc(*cu, v), oc(*cu, q.size());
      oc.poison();
      cu->attention(qc.b, kc.b, vc.b, 1, c.pos0, c.H, c.Hkv, c.Dh, c.window, oc.b);
      const std::string what = strformat("pos0=%d H=%d Hkv=%d Dh=%d window=%d heads/block=%d",
                                         c.pos0, c.H, c.Hkv, c.Dh, c.window, hpb);
      const int keys = c.window > 0 ? std::min(end, c.window) : end;
      const std::vector<double> got = oc.read();
      check_close("attention.dec", tier, what, seed, got, want.read(),
                  nmse_bound(tier.compute, tier.compute, c.Dh + keys, 13));
      if (hpb == 1) per_head = got;
      else if (c.H / c.Hkv <= 2) check_exact("attention.dec.hpb", tier, what, seed, got, per_head);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaTier, ::testing::Values(DType::BF16, DType::F16, DType::F32),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// Issue 32: without a GPU the runtime says "CUDA driver version is insufficient for CUDA
// runtime version", which sends users after a driver update. The message names what is
// missing, from cudaGetDeviceCount / cudaDriverGetVersion / cudaRuntimeGetVersion results.
TEST(CudaBuild, NoDeviceMessageNamesCountDriverAndRuntime) {
  const std::string insufficient = "CUDA driver version is insufficient for CUDA runtime version";
  // No driver at all (cudaDriverGetVersion gives 0): the runtime's words are left out.
  EXPECT_EQ(cuda_no_device_message(0, 0, 13000, insufficient),
            "[cuda] no CUDA device visible (0 GPUs; driver none; runtime 13.0): no NVIDIA driver loaded: is this a "
            "machine with a GPU?");
  // A driver older than the runtime: then it is a driver problem, and it says so.
  EXPECT_EQ(cuda_no_device_message(0, 12020, 13000, insufficient),
            "[cuda] no CUDA device visible (0 GPUs; driver 12.2; runtime 13.0): the driver is older than the "
            "runtime: update the driver");
  // A good driver that sees no device (CUDA_VISIBLE_DEVICES= or a container without GPUs).
  EXPECT_EQ(cuda_no_device_message(0, 13010, 13000, "no CUDA-capable device is detected"),
            "[cuda] no CUDA device visible (0 GPUs; driver 13.1; runtime 13.0): cudaGetDeviceCount: no "
            "CUDA-capable device is detected; check CUDA_VISIBLE_DEVICES");
  // The words the CUDA tests' skip and the matrix's GPU-arm skip look for.
  EXPECT_NE(cuda_no_device_message(0, 0, 13000, "").find("no CUDA device"), std::string::npos);
}

// The same through the binary on a CUDA build: devices hidden from a working driver.
TEST(CudaBuild, HiddenDevicesAreReportedAsNotVisible) {
  if (!cuda_tier_built()) {
    if (cuda_required()) FAIL() << "ARBITER_REQUIRE_CUDA=1 but the CUDA tier is not built";
    GTEST_SKIP() << "SKIP: cuda tier not built";
  }
  const std::string err = test::temp_dir("cuda-hidden") + "/err";
  const std::string cmd = std::string("CUDA_VISIBLE_DEVICES= ") + ARBITER_CLI + " generate -m " +
                          test::source_path("models/stories260K/stories260K.gguf") +
                          " -p hi -n 1 --device cuda >/dev/null 2>" + err;
  EXPECT_NE(std::system(cmd.c_str()), 0);
  const std::string text = test::read_file(err);
  EXPECT_NE(text.find("[cuda] no CUDA device visible (0 GPUs; driver "), std::string::npos) << text;
  EXPECT_EQ(text.find("insufficient"), std::string::npos) << text;
}

TEST(CudaBuild, ReportsBuildAndRefusesBadDtype) {
  if (!cuda_tier_built()) {
    EXPECT_EQ(cuda_build_version(), "none");
    EXPECT_THROW(make_cuda_backend(0, "f32"), Error);
    if (cuda_required()) FAIL() << "ARBITER_REQUIRE_CUDA=1 but the CUDA tier is not built";
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
