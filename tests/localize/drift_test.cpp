// Stage capture, stage replay, error statistics, bounds, drift and opcheck on the shipped
// models. The replay is checked against the forward itself (a deterministic tier replaying its
// own capture must reproduce it bit for bit); faults injected at (op, layer) must be the first
// flagged stage; without a fault nothing is flagged on cpu vs ref; drift runs the providers a
// trace runs. To add a fault case: append {model, inject spec, stage, layer, width} to kFaults.
#include "verify/localize/drift.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/probe.h"
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
  Session sa(*p.m, *p.a, n, w), sb(*p.m, *p.b, n, w);
  sb.set_inject(InjectSpec::parse(fault));
  std::vector<int32_t> ids = corpus_ids(*p.m, n);
  Capture ca = capture_forwards(sa, ids, w), cb = capture_forwards(sb, ids, w);
  Capture cl = replay_forwards(sb, ca);
  p.r = drift_compare(ca, cb, cl, coarser(roundoff_of(p.a->compute()), roundoff_of(p.b->compute())));
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

TEST(StageBound, DocumentedFormula) {
  const Roundoff bf16 = roundoff_of(DType::BF16), f32 = roundoff_of(DType::F32);
  // matmul over D = 64 in bf16 with f32 accumulation: 4 (2^-8 sqrt 3 + 2^-24 * 8)
  EXPECT_NEAR(stage_bound(64, 3, 0, bf16).value, 0.02706518, 1e-7);
  // down over F = 172 in f32: 4 * 2^-24 * (sqrt 3 + sqrt 172)
  EXPECT_NEAR(stage_bound(172, 3, 0, f32).value, 3.5398e-6, 1e-9);
  // attention over 100 cached rows with S = 3: 4 (2^-8 (2 + 6) + 2^-24 * 10)
  const StageBound b = stage_bound(100, 4, 3.0, bf16);
  EXPECT_EQ(b.reduction, 100);
  EXPECT_EQ(b.amp, 6.0);
  EXPECT_NEAR(b.value, 0.12500238, 1e-7);
  // elementwise add in f16: 4 * (2^-11 sqrt 3 + 2^-24)
  EXPECT_NEAR(stage_bound(1, 3, 0, roundoff_of(DType::F16)).value, 0.00338315, 1e-8);
}

TEST(StageBound, TheForwardDeclaresEachStagesReductionAndRoundings) {
  // The llama family's table: norms over D, projections over their input width, RoPE two
  // terms, attention over max(Dh, cache rows) with 4 roundings, embed a copy.
  auto m = load(kStories);
  const ModelConfig& c = m->config;
  auto be = tier("ref");
  Session s(*m, *be, 10, 10);
  Capture cap = capture_forwards(s, corpus_ids(*m, 10), 4);  // the last forward reads 10 rows
  const std::vector<LocalRow> rows = local_rows(cap, roundoff_of(DType::F32));
  auto row = [&](const char* stage, int layer) {
    for (const LocalRow& r : rows)
      if (r.stage == stage && r.layer == layer) return r;
    ADD_FAILURE() << stage << "@" << layer << " missing";
    return LocalRow{};
  };
  EXPECT_EQ(row("embed", -1).bound.reduction, 1);
  EXPECT_EQ(row("embed", -1).bound.roundings, 2);
  EXPECT_EQ(row("attn_norm", 0).bound.reduction, c.d_model);
  EXPECT_EQ(row("q", 1).bound.reduction, c.d_model);
  EXPECT_EQ(row("o", 1).bound.reduction, c.n_head * c.head_dim);
  EXPECT_EQ(row("down", 2).bound.reduction, c.d_ff);
  EXPECT_EQ(row("k_rope", 3).bound.reduction, 2);
  EXPECT_EQ(row("attn", 4).bound.reduction, std::max(c.head_dim, 10));
  EXPECT_EQ(row("attn", 4).bound.roundings, 4);
  EXPECT_GT(row("attn", 4).bound.amp, 0.0);  // the data's score scale
  EXPECT_EQ(row("attn", 4).op, "attention");
  EXPECT_EQ(row("logits", -1).cols, c.vocab);
  EXPECT_EQ(row("logits", -1).rows, 10);
}

TEST(Replay, RefReplayingItsOwnCaptureIsExact) {
  // The f64 tier is deterministic: running the forward again with every stage overwritten by
  // its own capture must reproduce each stage exactly. Any miswired tap shows up here.
  for (const char* model : {kStories, kTiny})
    for (int w : {24, 1, 7}) {
      auto m = load(model);
      auto be = tier("ref");
      Session s(*m, *be, 24, w);
      Capture cap = capture_forwards(s, corpus_ids(*m, 24), w);
      ASSERT_EQ(cap.size(), size_t((24 + w - 1) / w));
      Capture rep = replay_forwards(s, cap);
      ASSERT_EQ(rep.size(), cap.size());
      for (size_t f = 0; f < cap.size(); ++f) {
        ASSERT_EQ(rep[f].stages.size(), cap[f].stages.size());
        for (const StageRecord& r : cap[f].stages)
          ASSERT_EQ(rep[f].at(r.name, r.layer).values, r.values)
              << model << " width " << w << " forward " << f << " "
              << stage_id_name(r.name, r.layer);
      }
    }
}

TEST(Replay, OverwriteFeedsTheNextOp) {
  // A replay of a capture whose q@L0 was doubled shows the change downstream (q_rope is
  // linear in q), while q itself is recorded as the replaying tier computed it.
  auto m = load(kTiny);
  auto be = tier("ref");
  Session s(*m, *be, 8, 8);
  Capture cap = capture_forwards(s, corpus_ids(*m, 8), 8);
  Capture edited = cap;
  StageRecord& q = const_cast<StageRecord&>(edited[0].at("q", 0));
  for (double& v : q.values) v *= 2;
  Capture rep = replay_forwards(s, edited);
  EXPECT_EQ(rep[0].at("q", 0).values, cap[0].at("q", 0).values);
  const std::vector<double>& a = cap[0].at("q_rope", 0).values;
  const std::vector<double>& b = rep[0].at("q_rope", 0).values;
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], 2 * a[i], 1e-12 * std::fabs(a[i]));
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
  EXPECT_EQ(cap[0].at("logits", -1).cols, c.vocab);
  EXPECT_EQ(cap[0].at("up", 1).cols, c.d_ff);
  EXPECT_EQ(cap[0].at("k", 0).cols, c.n_head_kv * c.head_dim);
  EXPECT_EQ(cap[1].at("attn", 1).values.size(), size_t(4 * c.n_head * c.head_dim));
  // embed, 15 stages per layer (no q/k norm on a llama), final_norm, logits
  EXPECT_EQ(cap[0].stages.size(), size_t(1 + 15 * c.n_layer + 2));
  EXPECT_EQ(cap[0].stages.front().name, "embed");
  EXPECT_EQ(cap[0].stages.back().name, "logits");
  EXPECT_THROW(cap[0].at("q_norm", 0), Error);  // llama has no q/k norm
  // Every stage the forward emits is one the family declares (what --inject accepts).
  const std::vector<std::string> declared = m->arch->stages();
  for (const StageRecord& r : cap[0].stages)
    EXPECT_NE(std::find(declared.begin(), declared.end(), r.name), declared.end()) << r.name;
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
  const char* stage;
  int layer;
  int width;
};

TEST(Drift, InjectedFaultIsTheFirstFlaggedStage) {
  const FaultCase kFaults[] = {
      {kStories, "op=up,layer=1,scale=1.05", "up", 1, 32},
      {kStories, "op=down,layer=3,scale=1.01", "down", 3, 1},
      {kStories, "op=attn,layer=4,noise=0.001", "attn", 4, 32},
      {kStories, "op=k_rope,layer=2,noise=0.001", "k_rope", 2, 8},
      {kTiny, "op=q,layer=0,scale=0.99", "q", 0, 32},
      {kTiny, "op=attn_norm,layer=1,noise=0.01", "attn_norm", 1, 3},
      {kTiny, "op=act,layer=1,scale=1.02", "act", 1, 32},
      {kTiny, "op=logits,bias=0.5", "logits", -1, 32},
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
    EXPECT_GT(p.r.rows.back().acc.rel_l2(), first.id.bound.value) << fc.inject;
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
  EXPECT_THROW(drift_compare(a, b, b, roundoff_of(DType::F64)), Error);
  EXPECT_THROW(capture_forwards(s, {}, 4), Error);
  EXPECT_THROW(capture_forwards(s, corpus_ids(*m, 4), 0), Error);
}

TEST(Drift, RunsTheProvidersATraceRuns) {
  // Localization examines the code being judged: a capture and a replay call the same ops on
  // the same providers as plain forwards of the same width (fused ops included).
  for (int w : {1, 8}) {
    auto m = load(kTiny);
    auto plain = tier("cpu"), probed = tier("cpu");
    Session sp(*m, *plain, 16, w), sd(*m, *probed, 16, w);
    std::vector<int32_t> ids = corpus_ids(*m, 16);
    for (size_t i = 0; i < ids.size(); i += size_t(w))
      sp.forward(std::vector<int32_t>(ids.begin() + long(i), ids.begin() + long(i) + w));
    Capture c = capture_forwards(sd, ids, w);
    replay_forwards(sd, c);
    auto providers = [](const Backend& be) {
      std::vector<std::pair<std::string, std::string>> out;
      for (const auto& [op, by] : be.stats().calls())
        for (const auto& [prov, n] : by) out.emplace_back(op, prov);
      return out;
    };
    EXPECT_EQ(providers(*probed), providers(*plain)) << "width " << w;
    EXPECT_FALSE(providers(*plain).empty());
  }
}

TEST(Inject, AStageTheModelLacksIsNamedAtTheFirstForward) {
  auto m = load(kTiny);
  auto be = tier("cpu");
  Session s(*m, *be, 8, 8);
  s.set_inject(InjectSpec::parse("op=q_norm,scale=2"));  // a qwen3 stage
  std::string e;
  try {
    s.forward(corpus_ids(*m, 4));
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("no stage 'q_norm'"), std::string::npos) << e;
  EXPECT_NE(e.find("attn_norm"), std::string::npos) << e;  // the stages it has
  s.reset();
  s.set_inject(InjectSpec::parse("op=down,layer=9,scale=2"));  // past the last layer
  EXPECT_THROW(s.forward(corpus_ids(*m, 4)), Error);
  EXPECT_THROW(InjectSpec::parse("op=nosuch,scale=2"), Error);  // in no family
}

TEST(Opcheck, CpuPassesAndAFaultyOpIsNamed) {
  for (const char* model : {kStories, kTiny}) {
    auto m = load(model);
    auto ref = tier("ref");
    Session s(*m, *ref, 40, 40);
    Capture cap = capture_forwards(s, corpus_ids(*m, 40), 40);
    auto cpu = tier("cpu");
    Session sc(*m, *cpu, 40, 40);
    const Roundoff u = coarser(roundoff_of(DType::F64), roundoff_of(DType::F32));
    {
      OpcheckReport r = run_opcheck(cap, replay_forwards(sc, cap), *cpu, m->config.vocab, u);
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
      sc.set_inject(InjectSpec::parse("op=gate,layer=1,scale=1.01"));
      OpcheckReport r = run_opcheck(cap, replay_forwards(sc, cap), *cpu, m->config.vocab, u);
      ASSERT_EQ(r.n_flagged, 1) << opcheck_text(r);
      for (const OpcheckRow& row : r.rows)
        EXPECT_EQ(row.flagged, row.id.stage == "gate" && row.id.layer == 1)
            << stage_id_name(row.id.stage, row.id.layer);
      EXPECT_NE(opcheck_text(r).find("first: matmul (gate@L1)"), std::string::npos);
    }
  }
}

TEST(StageBound, AttentionScoreScaleByHand) {
  // H = 2 query heads sharing Hkv = 1 kv head, Dh = 2, two positions in one forward.
  const double a = std::log(3.0) * std::sqrt(2.0);
  CapturedForward f;
  f.T = 2;
  auto rec = [&](const char* name, int cols, std::vector<double> v) {
    StageRecord r;
    r.name = name;
    r.layer = 0;
    r.rows = 2;
    r.cols = cols;
    r.values = std::move(v);
    return r;
  };
  f.add(rec("q_rope", 4, {1, 0, 0, 0,     // t = 0: head 0 (1, 0), head 1 (0, 0)
                          1, 0, 0, 0}));  // t = 1: the same
  f.add(rec("k_rope", 2, {0, 0,           // j = 0: score 0
                          a, 0}));        // j = 1: score a / sqrt 2 = ln 3 for head 0
  f.add(rec("v", 2, {0, 0,                // v_0
                     4, 0}));             // v_1
  StageRecord attn = rec("attn", 4, {});
  attn.has_attention = true;
  attn.attention = {"q_rope", "k_rope", "v", 2, 1, 2, 0, 1.0 / std::sqrt(2.0)};
  f.add(attn);
  // t = 0 sees only j = 0: out = v_0 = 0, no shift. t = 1, head 0: p = (1/4, 3/4),
  // out = (3, 0), r_0 = 0, r_1^2 = a^2 / 2 = ln^2 3, |v_1 - out|^2 = 1: numerator
  // (3/4)^2 ln^2 3. Head 1 (q = 0): p = (1/2, 1/2), r = 0, out = (2, 0). Denominator
  // |(3,0)|^2 + |(2,0)|^2 = 13. S = (3/4) ln 3 / sqrt 13.
  Capture cap = {f};
  EXPECT_NEAR(attention_score_scale(cap, "attn", 0), 0.75 * std::log(3.0) / std::sqrt(13.0),
              1e-12);
  EXPECT_EQ(attention_score_scale(cap, "v", 0), 0.0);  // not an attention
  // A window of 1 leaves each query only its own key: scores cannot move the output.
  const_cast<StageRecord&>(cap[0].at("attn", 0)).attention.window = 1;
  EXPECT_NEAR(attention_score_scale(cap, "attn", 0), 0.0, 1e-15);
}
