// Stage capture, stage replay, error statistics, bounds, drift and opcheck on the shipped
// models. The replay is checked against the forward itself (a deterministic tier replaying its
// own capture must reproduce it bit for bit); faults injected at (op, layer) must be the first
// flagged stage; without a fault nothing is flagged on cpu vs ref.
// To add a fault case: append {model, inject spec, expected stage, expected layer} to kFaults.
#include "verify/localize/drift.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/session.h"
#include "model/model.h"
#include "test_util.h"
#include "verify/localize/opcheck.h"

using namespace arbiter;
using namespace arbiter::verify;
using arbiter::test::source_path;

namespace {

const char* kStories = "models/stories260K/stories260K.gguf";
const char* kTiny = "models/TinyStories-656K";

std::unique_ptr<Model> load(const char* rel) { return load_model(source_path(rel)); }

std::vector<int32_t> corpus_ids(const Model& m, int n) {
  std::ifstream f(source_path("models/corpus/stories.txt"), std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> ids = {m.tokenizer->bos_id()};
  std::vector<int32_t> body = m.tokenizer->encode(ss.str(), false, false);
  ids.insert(ids.end(), body.begin(), body.begin() + (n - 1));
  return ids;
}

std::unique_ptr<Backend> tier(const std::string& d) {
  DeviceSpec s;
  s.device = d;
  s.threads = 1;
  return make_backend(s);
}

struct Pair {
  std::unique_ptr<Model> m;
  std::unique_ptr<Backend> a, b;
  DriftReport r;
};

// drift of b (with fault spec) against a, over n positions in forwards of width w.
Pair drift(const char* model, const std::string& a_dev, const std::string& b_dev,
           const std::string& fault, int n, int w) {
  Pair p;
  p.m = load(model);
  p.a = tier(a_dev);
  p.b = tier(b_dev);
  InjectSpec inj = InjectSpec::parse(fault);
  Session sa(*p.m, *p.a, n, w), sb(*p.m, *p.b, n, w);
  sb.set_inject(inj);
  std::vector<int32_t> ids = corpus_ids(*p.m, n);
  Capture ca = capture_forwards(sa, ids, w), cb = capture_forwards(sb, ids, w);
  StageReplayer rep(*p.m, *p.b, inj);
  p.r = drift_compare(*p.m, ca, cb, rep,
                      coarser(roundoff_of(p.a->compute_name()), roundoff_of(p.b->compute_name())));
  return p;
}

}  // namespace

TEST(ErrAccum, HandComputedStatistics) {
  ErrAccum e;
  double ref[2] = {3, 4}, cand[2] = {3, 5};
  e.add(ref, cand, 2);
  EXPECT_DOUBLE_EQ(e.rel_l2(), 0.2);  // sqrt(1 / 25)
  EXPECT_DOUBLE_EQ(e.nmse(), 0.04);
  EXPECT_DOUBLE_EQ(e.max_abs, 1.0);
  EXPECT_DOUBLE_EQ(e.mean_abs(), 0.5);
  EXPECT_NEAR(e.cosine(), 29.0 / (5.0 * std::sqrt(34.0)), 1e-15);
  ErrAccum z;
  double zero[3] = {0, 0, 0};
  z.add(zero, zero, 3);
  EXPECT_EQ(z.rel_l2(), 0.0);
  EXPECT_EQ(z.cosine(), 1.0);
  ErrAccum bad;
  double c2[2] = {3, NAN};
  bad.add(ref, c2, 2);
  EXPECT_EQ(bad.nonfinite, 1);
  EXPECT_TRUE(std::isinf(bad.rel_l2()));
}

TEST(StageBound, DocumentedTable) {
  ModelConfig c;
  c.d_model = 64, c.n_head = 8, c.head_dim = 8, c.d_ff = 172, c.n_layer = 1;
  Roundoff bf16 = roundoff_of("bf16"), f32 = roundoff_of("f32");
  // matmul over D = 64 in bf16 with f32 accumulation: 4 (2^-8 sqrt 3 + 2^-24 * 8)
  StageBound b = stage_bound({Stage::Q, 0}, c, 32, 0, bf16);
  EXPECT_EQ(b.reduction, 64);
  EXPECT_NEAR(b.value, 0.02706518, 1e-7);
  // down over F = 172 in f32: 4 * 2^-24 * (sqrt 3 + sqrt 172)
  b = stage_bound({Stage::Down, 0}, c, 32, 0, f32);
  EXPECT_EQ(b.reduction, 172);
  EXPECT_NEAR(b.value, 3.5398e-6, 1e-9);
  // attention over 100 cached rows with S = 3: 4 (2^-8 (2 + 6) + 2^-24 * 10)
  b = stage_bound({Stage::Attn, 0}, c, 100, 3.0, bf16);
  EXPECT_EQ(b.reduction, 100);
  EXPECT_NEAR(b.value, 0.12500238, 1e-7);
  // elementwise add in f16: 4 * (2^-11 sqrt 3 + 2^-24)
  b = stage_bound({Stage::FfnRes, 0}, c, 1, 0, roundoff_of("f16"));
  EXPECT_NEAR(b.value, 0.00338315, 1e-8);
}

TEST(Replay, RefReplayingItsOwnCaptureIsExact) {
  // The f64 tier is deterministic: running each stage's op on the inputs the forward gave it
  // must reproduce the forward's output exactly. Any miswired input shows up here.
  for (const char* model : {kStories, kTiny})
    for (int w : {24, 1, 7}) {
      auto m = load(model);
      auto be = tier("ref");
      Session s(*m, *be, 24, w);
      Capture cap = capture_forwards(s, corpus_ids(*m, 24), w);
      ASSERT_EQ(cap.size(), size_t((24 + w - 1) / w));
      StageReplayer rep(*m, *be, InjectSpec{});
      for (size_t f = 0; f < cap.size(); ++f)
        for (const StageId& id : forward_stages(m->config)) {
          std::vector<double> got = rep.replay(cap, f, id);
          ASSERT_EQ(got, cap[f].at(id))
              << model << " width " << w << " forward " << f << " " << stage_id_name(id);
        }
    }
}

TEST(Replay, CaptureHoldsEveryStageWithItsShape) {
  auto m = load(kTiny);
  auto be = tier("ref");
  Session s(*m, *be, 10, 10);
  Capture cap = capture_forwards(s, corpus_ids(*m, 10), 4);  // forwards of 4, 4, 2
  ASSERT_EQ(cap.size(), 3u);
  EXPECT_EQ(cap[2].pos0, 8);
  EXPECT_EQ(cap[2].T, 2);
  const ModelConfig& c = m->config;
  EXPECT_EQ(cap[0].cols.at({Stage::Logits, -1}), c.vocab);
  EXPECT_EQ(cap[0].cols.at({Stage::Up, 1}), c.d_ff);
  EXPECT_EQ(cap[0].cols.at({Stage::K, 0}), c.n_head_kv * c.head_dim);
  EXPECT_EQ(cap[1].at({Stage::Attn, 1}).size(), size_t(4 * c.n_head * c.head_dim));
  EXPECT_EQ(cap[0].out.size(), forward_stages(c).size());
  EXPECT_THROW(cap[0].at({Stage::QNorm, 0}), Error);  // llama has no q/k norm
}

TEST(Drift, CpuAgainstRefFlagsNothing) {
  for (const char* model : {kStories, kTiny})
    for (int w : {48, 1, 5}) {
      Pair p = drift(model, "ref", "cpu", "none", 48, w);
      EXPECT_EQ(p.r.n_flagged, 0) << model << " width " << w << "\n" << drift_text(p.r);
      // And the sides did differ (f32 vs f64): the check is not vacuous.
      EXPECT_GT(p.r.rows.back().acc.rel_l2(), 0.0);
    }
}

struct FaultCase {
  const char* model;
  const char* inject;
  Stage stage;
  int layer;
  int width;
};

TEST(Drift, InjectedFaultIsTheFirstFlaggedStage) {
  const FaultCase kFaults[] = {
      {kStories, "op=up,layer=1,scale=1.05", Stage::Up, 1, 32},
      {kStories, "op=down,layer=3,scale=1.01", Stage::Down, 3, 1},
      {kStories, "op=attn,layer=4,noise=0.001", Stage::Attn, 4, 32},
      {kStories, "op=k_rope,layer=2,noise=0.001", Stage::KRope, 2, 8},
      {kTiny, "op=q,layer=0,scale=0.99", Stage::Q, 0, 32},
      {kTiny, "op=attn_norm,layer=1,noise=0.01", Stage::AttnNorm, 1, 3},
      {kTiny, "op=act,layer=1,scale=1.02", Stage::Act, 1, 32},
      {kTiny, "op=logits,bias=0.5", Stage::Logits, -1, 32},
  };
  for (const FaultCase& fc : kFaults) {
    Pair p = drift(fc.model, "ref", "cpu", fc.inject, 32, fc.width);
    ASSERT_GE(p.r.first_flagged, 0) << fc.inject << "\n" << drift_text(p.r);
    const DriftRow& first = p.r.rows[size_t(p.r.first_flagged)];
    EXPECT_EQ(first.id.stage, fc.stage) << fc.inject << "\n" << drift_text(p.r);
    EXPECT_EQ(first.id.layer, fc.layer) << fc.inject;
    // Local errors do not compound: only the faulty stage is over its bound.
    EXPECT_EQ(p.r.n_flagged, 1) << fc.inject << "\n" << drift_text(p.r);
    // The accumulated error after the fault is visible too (the chain carries it).
    EXPECT_GT(p.r.rows.back().acc.rel_l2(), first.bound.value) << fc.inject;
  }
}

TEST(Drift, ReportsNameTheFirstFlaggedStage) {
  Pair p = drift(kStories, "ref", "cpu", "op=up,layer=1,scale=1.05", 16, 16);
  std::string t = drift_text(p.r);
  EXPECT_NE(t.find("FIRST FLAGGED: up (op matmul, layer 1)"), std::string::npos) << t;
  std::string tsv = drift_tsv(p.r);
  EXPECT_NE(tsv.find("\nup\t1\tmatmul\t16\t172\t"), std::string::npos) << tsv;
  EXPECT_EQ(drift_json(p.r)["first_flagged"]["stage"], "up");
  EXPECT_EQ(drift_json(p.r)["first_flagged"]["layer"], 1);
  // The local error of a 5% scale fault is 0.05 (relative L2 of 0.05 * x against x).
  EXPECT_NEAR(p.r.rows[size_t(p.r.first_flagged)].local.rel_l2(), 0.05, 1e-5);
  std::string svg = drift_svg(p.r);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find(">L4</text>"), std::string::npos);
  EXPECT_NE(svg.find("first flagged: up@L1"), std::string::npos);
}

TEST(Drift, RefusesMismatchedCaptures) {
  auto m = load(kStories);
  auto be = tier("ref");
  Session s(*m, *be, 16, 16);
  Capture a = capture_forwards(s, corpus_ids(*m, 16), 16);
  Capture b = capture_forwards(s, corpus_ids(*m, 16), 8);
  StageReplayer rep(*m, *be, InjectSpec{});
  EXPECT_THROW(drift_compare(*m, a, b, rep, roundoff_of("f64")), Error);
  EXPECT_THROW(capture_forwards(s, {}, 4), Error);
  EXPECT_THROW(capture_forwards(s, corpus_ids(*m, 4), 0), Error);
}

TEST(Opcheck, CpuPassesAndAFaultyOpIsNamed) {
  for (const char* model : {kStories, kTiny}) {
    auto m = load(model);
    auto ref = tier("ref");
    Session s(*m, *ref, 40, 40);
    Capture cap = capture_forwards(s, corpus_ids(*m, 40), 40);
    auto cpu = tier("cpu");
    cpu->prepare(m->config, m->weights);
    Roundoff u = coarser(roundoff_of("f64"), roundoff_of("f32"));
    {
      StageReplayer rep(*m, *cpu, InjectSpec{});
      OpcheckReport r = run_opcheck(*m, cap, rep, u);
      EXPECT_EQ(r.n_flagged, 0) << opcheck_text(r);
      EXPECT_FALSE(r.summarize.flagged);
      EXPECT_EQ(r.summarize.rows, 40);
      // Every op of the model was exercised.
      std::vector<std::string> ops;
      for (const auto& o : r.ops) ops.push_back(o.op);
      for (const char* op : {"embed", "rmsnorm", "matmul", "rope", "attention", "swiglu", "add"})
        EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << op;
    }
    {
      StageReplayer rep(*m, *cpu, InjectSpec::parse("op=gate,layer=1,scale=1.01"));
      OpcheckReport r = run_opcheck(*m, cap, rep, u);
      ASSERT_EQ(r.n_flagged, 1) << opcheck_text(r);
      for (const OpcheckRow& row : r.rows)
        EXPECT_EQ(row.flagged, row.id.stage == Stage::Gate && row.id.layer == 1)
            << stage_id_name(row.id);
      EXPECT_NE(opcheck_text(r).find("first: matmul (gate@L1)"), std::string::npos);
    }
  }
}

TEST(StageBound, AttentionScoreScaleByHand) {
  // H = 2 query heads sharing Hkv = 1 kv head, Dh = 2, two positions in one forward.
  ModelConfig c;
  c.n_head = 2, c.n_head_kv = 1, c.head_dim = 2;
  const double a = std::log(3.0) * std::sqrt(2.0);
  CapturedForward f;
  f.T = 2;
  f.out[{Stage::QRope, 0}] = {1, 0, 0, 0,   // t = 0: head 0 (1, 0), head 1 (0, 0)
                              1, 0, 0, 0};  // t = 1: the same
  f.out[{Stage::KRope, 0}] = {0, 0,         // j = 0: score 0
                              a, 0};        // j = 1: score a / sqrt 2 = ln 3 for head 0
  f.out[{Stage::V, 0}] = {0, 0,             // v_0
                          4, 0};            // v_1
  // t = 0 sees only j = 0: out = v_0 = 0, no shift. t = 1, head 0: p = (1/4, 3/4),
  // out = (3, 0), r_0 = 0, r_1^2 = a^2 / 2 = ln^2 3, |v_1 - out|^2 = 1: numerator
  // (3/4)^2 ln^2 3. Head 1 (q = 0): p = (1/2, 1/2), r = 0, out = (2, 0). Denominator
  // |(3,0)|^2 + |(2,0)|^2 = 13. S = (3/4) ln 3 / sqrt 13.
  Capture cap = {f};
  EXPECT_NEAR(attention_score_scale(cap, 0, c), 0.75 * std::log(3.0) / std::sqrt(13.0), 1e-12);
  // A window of 1 leaves each query only its own key: scores cannot move the output.
  c.sliding_window = 1;
  EXPECT_NEAR(attention_score_scale(cap, 0, c), 0.0, 1e-15);
}
