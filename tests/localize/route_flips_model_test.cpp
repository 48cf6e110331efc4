// Routing-flip evidence on a real mixture-of-experts checkpoint (tests/fixtures/models/
// tiny-qwen3-moe: sparse layers 0 and 2, 8 experts, top-2): traces record each token's
// experts and router margin at every sparse layer; the f32 cpu tier against the f64 ref
// tier has no decided flip; a fault on one layer's router logits shows as decided flips in
// compare and drift names that layer's router first. The fault is scale=-1, which turns the
// router's order upside down (softmax is shift-invariant, so a bias would change nothing).
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/inject.h"
#include "engine/probe.h"
#include "model/model.h"
#include "test_util.h"
#include "verify/judge/compare.h"
#include "verify/localize/drift.h"
#include "verify/trace/trace_run.h"

using namespace arbiter;
using namespace arbiter::verify;
using arbiter::test::source_path;

namespace {

const char* kModel = "tests/fixtures/models/tiny-qwen3-moe";
const char* kFault = "op=router,layer=0,scale=-1";

std::unique_ptr<Backend> tier(const std::string& d) {
  DeviceSpec s;
  s.device = d;
  s.threads = 1;
  return make_backend(s);
}

// A trace of 2 chunks of 8 tokens (no prefill) on device d with fault (or "").
Trace trace_on(const Model& m, const std::string& d, const std::string& fault, const std::string& out) {
  TraceRunOptions o;
  o.shape = {"moe16", 8, 2, 0, 0, "routing-flip test"};
  o.topk = 4;
  o.corpus_path = source_path("models/corpus/stories.txt");
  o.out_path = out;
  o.model_path = kModel;
  o.progress = false;
  const TraceCorpus c = load_trace_corpus(o, m);
  auto be = tier(d);
  Session s(m, *be, 16, 8);
  if (!fault.empty()) s.set_inject(InjectSpec::parse(fault));
  run_trace(s, o, c);
  return read_trace(out);
}

}  // namespace

TEST(RouteFlipsModel, TracesRecordRoutesAndOnlyAnInjectedRouterFlipsDecided) {
  const std::string dir = source_path(kModel);
  if (!std::filesystem::exists(dir + "/model.safetensors")) GTEST_SKIP() << dir << " not found";
  const std::unique_ptr<Model> m = load_model(dir);
  const std::string tmp = test::temp_dir("route-flips-model");
  const Trace ref = trace_on(*m, "ref", "", tmp + "/ref.tsv");
  const Trace cpu = trace_on(*m, "cpu", "", tmp + "/cpu.tsv");
  const Trace bad = trace_on(*m, "cpu", kFault, tmp + "/bad.tsv");

  // The fixture's config (tests/fixtures/README.md): sparse layers 0 and 2 (mlp_only_layers
  // [1]), num_experts 8, num_experts_per_tok 2, softmax scoring.
  const TraceRoutesHeader& h = ref.header.routes;
  EXPECT_EQ(h.layers, (std::vector<int>{0, 2}));
  EXPECT_EQ(h.experts, 8);
  EXPECT_EQ(h.top_k, 2);
  EXPECT_EQ(h.score, "softmax");
  ASSERT_EQ(ref.rows.size(), 16u);
  for (const TraceRow& r : ref.rows) ASSERT_EQ(r.routes.size(), 2u);

  const CompareResult ok = compare_traces(ref, cpu, CompareOptions{});
  ASSERT_TRUE(ok.routes.compared) << ok.routes.note;
  EXPECT_EQ(ok.routes.pairs, 32);
  EXPECT_EQ(ok.routes.decided, 0) << format_report(ok);

  const CompareResult f = compare_traces(ref, bad, CompareOptions{});
  ASSERT_TRUE(f.routes.compared);
  ASSERT_FALSE(f.routes.layers.empty());
  // Reversing the order sends every token at layer 0 to its two lowest-scored experts: a flip
  // at each of the 16 positions, decided wherever the reference's margin is >= 0.01.
  EXPECT_EQ(f.routes.layers[0].layer, 0);
  EXPECT_EQ(f.routes.layers[0].flips, 16) << format_report(f);
  EXPECT_GT(f.routes.decided, 0) << format_report(f);
  EXPECT_NE(format_report(f).find("DECIDED"), std::string::npos);

  // drift: the ladder names layer 0's router as the first stage over its bound, and counts
  // the same decided flips on its own positions.
  auto a = tier("ref"), b = tier("cpu");
  Session sa(*m, *a, 16, 16), sb(*m, *b, 16, 16);
  sb.set_inject(InjectSpec::parse(kFault));
  std::vector<int32_t> ids(ref.rows.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = ref.rows[i].target;
  const DriftReport d = drift_run(sa, sb, ids, 16);
  ASSERT_GE(d.first_flagged, 0) << drift_text(d);
  EXPECT_EQ(d.rows[size_t(d.first_flagged)].id.stage, "router") << drift_text(d);
  EXPECT_EQ(d.rows[size_t(d.first_flagged)].id.layer, 0);
  ASSERT_TRUE(d.routes.compared);
  EXPECT_GT(d.routes.decided, 0) << drift_text(d);
  EXPECT_EQ(d.routes.layers.at(0).flips, 16) << drift_text(d);
  EXPECT_NE(drift_text(d).find("routing flips"), std::string::npos);
  EXPECT_EQ(drift_json(d).at("routing_flips").at("decided"), d.routes.decided);

  // The CLI's --route-decided moves the class: above every margin, no flip is decided.
  const test::CliResult cli = test::run_cli("drift -m " + dir + " --corpus " + source_path("models/corpus/stories.txt") + " --positions 16 "
                                            "--a ref --b cpu+inject=" + std::string(kFault) + " --route-decided 1e9 --json");
  ASSERT_EQ(cli.exit_code, 1) << cli.err;  // the fault is still flagged
  const nlohmann::json dj = nlohmann::json::parse(cli.out).at("routing_flips");
  EXPECT_GT(dj.at("flips").get<int>(), 0) << cli.out;
  EXPECT_EQ(dj.at("decided"), 0) << cli.out;

  // Without the fault, drift of cpu against ref: no decided flip either.
  Session sc(*m, *b, 16, 16);
  EXPECT_EQ(drift_run(sa, sc, ids, 16).routes.decided, 0);
}
