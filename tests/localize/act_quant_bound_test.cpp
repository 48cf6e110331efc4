// drift and opcheck with activations quantized on the fly (docs/localize.md §The bound): the
// cpu tier's decode matmuls of ggml block formats round x to 8-bit codes, and the stage bound
// adds what that rounding can cause (q) exactly where the tier did it. On synth Q4_K_M models
// at width 1: opcheck and drift pass; the same run judged without q is flagged (the term
// matters); a fault of the size of the activation rounding is still caught (the bound did not
// go blind); q is 0 everywhere with act_quant off; the MoE block carries its experts' codes
// to its output; a composite that loses a matmul's rounding is refused by name.
// To add a model: synth it in SetUpTestSuite and run the checks of the first test on it.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "engine/probe.h"
#include "model/model.h"
#include "model/synth.h"
#include "test_util.h"
#include "tier_util.h"
#include "verify/localize/drift.h"
#include "verify/localize/opcheck.h"

namespace arbiter::test {
namespace {

using namespace arbiter::verify;

class ActQuantBound : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("act-quant-bound"));
    for (const char* preset : {"tiny-qwen3-256", "tiny-moe"}) {
      SynthOptions so;
      so.preset = preset;
      so.format = SynthFormat::Gguf;
      so.dtype = DType::F32;
      so.quant = QuantRecipe::Q4_K_M;
      so.out_dir = *dir_ + "/" + preset + ".gguf";
      so.layers = 1;
      so.progress = false;
      synth_checkpoint(so);
    }
    SynthOptions so;  // bf16 weights: the bf16 dot kernels' x rounding (CpuOptions::bf16_dot)
    so.preset = "tiny-qwen3-256";
    so.format = SynthFormat::Gguf;
    so.dtype = DType::BF16;
    so.out_dir = *dir_ + "/tiny-qwen3-256-bf16.gguf";
    so.layers = 1;
    so.progress = false;
    synth_checkpoint(so);
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::unique_ptr<Model> load(const char* preset) {
    return load_model(*dir_ + "/" + preset + ".gguf");
  }
  static std::string* dir_;
};
std::string* ActQuantBound::dir_ = nullptr;

// Token ids spread over the vocabulary (the synth models' weights are random: any ids do).
std::vector<int32_t> ids(const Model& m, int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((7 + 37 * i) % m.config.vocab));
  return v;
}

std::unique_ptr<Backend> ref_tier() {
  DeviceSpec s;
  s.device = "ref";
  s.threads = 1;
  return make_backend(s);
}

std::unique_ptr<Backend> cpu_tier(bool act_quant, bool bf16_dot = false) {
  cpu::CpuOptions o;
  o.threads = 1;
  o.act_quant = act_quant;
  o.bf16_dot = bf16_dot;
  return cpu::make_cpu_backend(o);
}

const Roundoff kF32 = coarser(roundoff_of(DType::F64), roundoff_of(DType::F32));
constexpr int kPositions = 12;

struct Opcheck {
  std::unique_ptr<Backend> cpu;
  OpcheckReport r;
};
Opcheck opcheck(const Model& m, const Capture& cap, bool act_quant, const std::string& fault = "",
                bool bf16_dot = false) {
  Opcheck o;
  o.cpu = cpu_tier(act_quant, bf16_dot);
  Session s(m, *o.cpu, kPositions, 1);
  if (!fault.empty()) s.set_inject(InjectSpec::parse(fault));
  o.r = run_opcheck(cap, replay_forwards(s, cap), *o.cpu, m.config.vocab, kF32);
  return o;
}

// docs/localize.md: bound = C (u_s (sqrt(m) + amp) + u_a sqrt(n) + q).
TEST(StageBoundQ, AddsCTimesQ) {
  const Roundoff f32 = roundoff_of(DType::F32);
  // matmul over K = 256 with q = 0.01: 4 (2^-24 (sqrt 3 + 16) + 0.01)
  const StageBound b = stage_bound(256, 3, 0, f32, 0.01);
  EXPECT_EQ(b.act, 0.01);
  EXPECT_NEAR(b.value, 0.04000423, 1e-8);
  EXPECT_NEAR(b.value - stage_bound(256, 3, 0, f32).value, 0.04, 1e-15);
}

TEST_F(ActQuantBound, OpcheckCountsTheCodesWhereTheTierQuantized) {
  auto m = load("tiny-qwen3-256");
  auto ref = ref_tier();
  Session sr(*m, *ref, kPositions, 1);
  const Capture cap = capture_forwards(sr, ids(*m, kPositions), 1);

  Opcheck on = opcheck(*m, cap, true);
  EXPECT_EQ(on.r.n_flagged, 0) << opcheck_text(on.r);
  EXPECT_NE(on.cpu->stats().summary().find("_q8_"), std::string::npos) << on.cpu->stats().summary();
  // q where the tier rounded x (every matmul of this all-quantized model at T == 1), and
  // nowhere else; with it every matmul is within its bound, without it some are not.
  int matmuls = 0, over_without_q = 0;
  for (const OpcheckRow& row : on.r.rows) {
    const std::string at = stage_id_name(row.id.stage, row.id.layer);
    if (row.id.op != "matmul") {
      EXPECT_EQ(row.id.bound.act, 0.0) << at;
      continue;
    }
    ++matmuls;
    EXPECT_GT(row.id.bound.act, 0.0) << at;
    const double without = row.id.bound.value - kBoundSafety * row.id.bound.act;
    over_without_q += row.err.rel_l2() > without;
  }
  EXPECT_GE(matmuls, 8);  // q, k, v, o, gate, up, down, logits
  EXPECT_GT(over_without_q, matmuls / 2) << "the term did not matter:\n" << opcheck_text(on.r);
  EXPECT_NE(opcheck_text(on.r).find("act_q"), std::string::npos);

  // act_quant off: f32 activations, no q, and the old bound holds.
  Opcheck off = opcheck(*m, cap, false);
  EXPECT_EQ(off.r.n_flagged, 0) << opcheck_text(off.r);
  for (const OpcheckRow& row : off.r.rows) EXPECT_EQ(row.id.bound.act, 0.0);
  EXPECT_EQ(opcheck_text(off.r).find("act_q"), std::string::npos);
}

// The bf16 dot kernels (ARBITER_CPU_BF16_DOT=1) round x to bf16: on a bf16 model every
// matmul carries that rounding as q (act_bf16_rounding), and with it opcheck passes where the
// f32 bound alone flags most of them.
TEST_F(ActQuantBound, OpcheckCountsTheBf16RoundingOfTheBf16DotKernels) {
  if (!cpu::bf16_dot(cpu::best_isa()))
    GTEST_SKIP() << "SKIP: this build or CPU has no AVX512-BF16, so no bf16 dot kernels";
  auto m = load_model(*dir_ + "/tiny-qwen3-256-bf16.gguf");
  auto ref = ref_tier();
  Session sr(*m, *ref, kPositions, 1);
  const Capture cap = capture_forwards(sr, ids(*m, kPositions), 1);
  Opcheck on = opcheck(*m, cap, true, "", true);
  EXPECT_EQ(on.r.n_flagged, 0) << opcheck_text(on.r);
  EXPECT_NE(on.cpu->stats().summary().find("_bf16_bf16_"), std::string::npos) << on.cpu->stats().summary();
  int matmuls = 0, over_without_q = 0;
  for (const OpcheckRow& row : on.r.rows) {
    if (row.id.op != "matmul") continue;
    ++matmuls;
    EXPECT_GT(row.id.bound.act, 0.0) << stage_id_name(row.id.stage, row.id.layer);
    over_without_q += row.err.rel_l2() > row.id.bound.value - kBoundSafety * row.id.bound.act;
  }
  EXPECT_GE(matmuls, 8);
  EXPECT_GT(over_without_q, matmuls / 2) << "the term did not matter:\n" << opcheck_text(on.r);
}

// The smallest fault the bound can see is about the bound itself: the rounding error sits
// near q / sqrt(3) (uniform roundings against q's worst case d/2), the bound at C = 4 times
// q and the rest, so about 7x the real error. A scale fault on o@L0 of 1.25 bounds (the same
// order as the activation rounding's error) is caught and is the only flagged check, on
// opcheck and drift alike.
TEST_F(ActQuantBound, AFaultTheSizeOfTheRoundingIsStillCaught) {
  auto m = load("tiny-qwen3-256");
  auto ref = ref_tier();
  Session sr(*m, *ref, kPositions, 1);
  const std::vector<int32_t> tokens = ids(*m, kPositions);
  const Capture cap = capture_forwards(sr, tokens, 1);
  Opcheck clean = opcheck(*m, cap, true);
  const OpcheckRow* o = nullptr;
  for (const OpcheckRow& row : clean.r.rows)
    if (row.id.stage == "o" && row.id.layer == 0) o = &row;
  ASSERT_NE(o, nullptr);
  const double real = o->err.rel_l2(), bound = o->id.bound.value;
  const std::string fault = "op=o,layer=0,scale=" + std::to_string(1 + 1.25 * bound);
  Opcheck bad = opcheck(*m, cap, true, fault);
  ASSERT_EQ(bad.r.n_flagged, 1) << opcheck_text(bad.r);
  EXPECT_NE(opcheck_text(bad.r).find("first: matmul (o@L0)"), std::string::npos) << opcheck_text(bad.r);
  std::printf("o@L0: activation rounding error %.3g, bound %.3g (q %.3g), fault %.3g\n", real, bound,
              o->id.bound.act, 1.25 * bound);

  // drift at width 1, ref against cpu: clean, then with the same fault on cpu.
  for (const std::string& f : {std::string(), fault}) {
    auto cpu = cpu_tier(true);
    Session sa(*m, *ref, kPositions, 1), sb(*m, *cpu, kPositions, 1);
    if (!f.empty()) sb.set_inject(InjectSpec::parse(f));
    const DriftReport r = drift_run(sa, sb, tokens, 1);
    if (f.empty()) {
      EXPECT_EQ(r.n_flagged, 0) << drift_text(r);
    } else {
      ASSERT_EQ(r.n_flagged, 1) << drift_text(r);
      EXPECT_EQ(r.rows[size_t(r.first_flagged)].id.stage, "o");
    }
  }
}

// The MoE block runs its experts on the rows routed to them: at width 1 each is a decode GEMV
// on codes, and Backend::moe carries their roundings through the activation and the down
// projection to the routed sum (moe_ops.cpp), so the moe stage has its q and passes.
TEST_F(ActQuantBound, TheMoeStageCarriesItsExpertsCodes) {
  auto m = load("tiny-moe");
  auto ref = ref_tier();
  Session sr(*m, *ref, kPositions, 1);
  const Capture cap = capture_forwards(sr, ids(*m, kPositions), 1);
  Opcheck on = opcheck(*m, cap, true);
  EXPECT_EQ(on.r.n_flagged, 0) << opcheck_text(on.r);
  bool moe = false;
  for (const OpcheckRow& row : on.r.rows)
    if (row.id.stage == "moe") {
      moe = true;
      EXPECT_GT(row.id.bound.act, 0.0);
      EXPECT_GT(row.err.rel_l2(), row.id.bound.value - kBoundSafety * row.id.bound.act)
          << "the moe stage passes without its experts' q too: the test shows nothing";
    }
  EXPECT_TRUE(moe);
}

// A matmul's rounding goes to the next tap; one that a second matmul replaces before any tap
// or composite took it is lost, and the tap records NaN, which drift and opcheck refuse.
TEST_F(ActQuantBound, ALostRoundingIsRecordedAsNaN) {
  const int64_t N = 4, K = 256;
  auto w = make_tensor("w", {N, K}, values(N * K, 4500, 0.05, DType::F32), DType::Q4_K);
  auto be = cpu_tier(true);
  be->measure_input_rounding(true);
  Buf x(*be, values(K, 4501, 1.0, DType::F32)), out(*be, N);
  double got = -1;
  StageTap tap;
  std::vector<double> rec;
  tap.record = &rec;
  tap.input_rounding = &got;
  be->matmul(x.b, w->t, nullptr, 1, out.b);
  be->apply_tap(&tap, out.b, 1, int(N));
  // sum_k (w_nk d / 2 (1 + 2^-14))^2 over the rows, by hand from the codes' scale.
  std::vector<double> xs = values(K, 4501, 1.0, DType::F32), wr(static_cast<size_t>(K));
  double amax = 0, want = 0;
  for (double v : xs) amax = std::max(amax, std::fabs(double(float(v))));
  const double r = double(float(float(amax) / 127.f)) * (0.5 + std::ldexp(1.0, -15));
  for (int64_t n = 0; n < N; ++n) {
    row_to_f64(w->t.dtype, w->t.row(n), wr.data(), K);
    for (double v : wr) want += (v * r) * (v * r);
  }
  EXPECT_NEAR(got, want, 1e-12 * want);
  be->matmul(x.b, w->t, nullptr, 1, out.b);
  be->matmul(x.b, w->t, nullptr, 1, out.b);
  be->apply_tap(&tap, out.b, 1, int(N));
  EXPECT_TRUE(std::isnan(got));
  // The loss is spent: the next tapped matmul is counted again.
  be->matmul(x.b, w->t, nullptr, 1, out.b);
  be->apply_tap(&tap, out.b, 1, int(N));
  EXPECT_NEAR(got, want, 1e-12 * want);
  // Not measuring: nothing is computed or recorded.
  be->measure_input_rounding(false);
  be->matmul(x.b, w->t, nullptr, 1, out.b);
  be->apply_tap(&tap, out.b, 1, int(N));
  EXPECT_EQ(got, 0.0);

  Capture cap(1);
  StageRecord sr;
  sr.name = "shared_expert";
  sr.layer = 0;
  sr.op = "moe";
  sr.rows = 1;
  sr.cols = 1;
  sr.values = {1.0};
  sr.input_rounding = NAN;
  cap[0].T = 1;
  cap[0].add(sr);
  try {
    local_rows(cap, kF32);
    FAIL() << "a NaN input rounding was judged";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared_expert@L0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ARBITER_CPU_ACT_QUANT=0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace arbiter::test
