// gate --localize and drift at any prefix (verify/localize/gate_localize.h, docs/localize.md):
// the jump and class rules on hand-made drift reports; an injected fault named by layer and op
// through the API and the CLI; near-tie flips from noise below every bound; drift --prompt /
// --ids / --continuation giving the same forward; bad id files refused; and, on a GPU, the
// shipped model's cuda:bf16 near-ties classed near-tie flips with uniform drift.
// To add a fault case: append {inject spec, stage, op, layer} to kFaults.
#include "verify/localize/gate_localize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "cuda/cuda_test_util.h"
#include "test_util.h"

using namespace arbiter;
using namespace arbiter::verify;
using namespace arbiter::test;

namespace {

const std::string kStories = source_path("models/stories260K/stories260K.gguf");
const std::string kTiny = source_path("models/TinyStories-656K");

// A drift row whose accumulated rel_l2 is `acc` and local/bound is `ratio` (bound 1e-6).
DriftRow row(const std::string& stage, int layer, double acc, double ratio) {
  DriftRow w;
  w.id.stage = stage;
  w.id.op = "matmul";
  w.id.layer = layer;
  w.id.bound.value = 1e-6;
  const double one = 1, a = 1 + acc, l = 1 + ratio * 1e-6;
  w.acc.add(&one, &a, 1);
  w.local.add(&one, &l, 1);
  w.flagged = ratio > 1;
  return w;
}

DriftReport report(std::vector<DriftRow> rows) {
  DriftReport r;
  r.rows = std::move(rows);
  for (size_t i = 0; i < r.rows.size(); ++i)
    if (r.rows[i].flagged) {
      ++r.n_flagged;
      if (r.first_flagged < 0) r.first_flagged = int(i);
    }
  return r;
}

std::string write_prompts(const std::string& tag, const std::string& text) {
  std::string p = temp_dir(tag) + "/prompts.txt";
  write_file(p, text);
  return p;
}

nlohmann::json json_of(const CliResult& r) {
  try {
    return nlohmann::json::parse(r.out);
  } catch (...) {
    ADD_FAILURE() << "not JSON:\n" << r.out << r.err;
    return {};
  }
}

size_t lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST(DriftSummary, JumpRuleAndWorstStage) {
  // embed 1e-7; layer 0 grows x3 (within rounding); layer 1 grows x1000 with a stage 50x over
  // its bound: the jump; layer 2 grows x20 but nothing there is over its bound.
  DriftReport r = report({row("embed", -1, 1e-7, 0.1), row("q", 0, 2e-7, 0.2),
                          row("ffn_res", 0, 3e-7, 0.1), row("down", 1, 3e-4, 50),
                          row("ffn_res", 1, 3e-4, 0.1), row("ffn_res", 2, 6e-3, 0.5),
                          row("logits", -1, 6e-3, 0.1)});
  DriftSummary s = drift_summary(r);
  EXPECT_TRUE(s.jump);
  EXPECT_EQ(s.growth_layer, 1);
  EXPECT_NEAR(s.growth, 1000, 1e-6);
  EXPECT_NEAR(s.growth_ratio, 50, 1e-6);
  EXPECT_EQ(s.worst, 3);
  EXPECT_NEAR(s.worst_ratio, 50, 1e-6);
  // The same growth without a stage over its bound is uniform: the largest growth is named.
  r.rows[3] = row("down", 1, 3e-4, 0.9);
  s = drift_summary(r);
  EXPECT_FALSE(s.jump);
  EXPECT_EQ(s.growth_layer, 1);
  // A stage over its bound without a x10 growth is not a jump; the largest growth (layer 0's
  // x5 against layer 1's x4) is the one named.
  DriftReport u = report({row("embed", -1, 1e-7, 0.1), row("ffn_res", 0, 5e-7, 3),
                          row("ffn_res", 1, 2e-6, 0.1)});
  s = drift_summary(u);
  EXPECT_FALSE(s.jump);
  EXPECT_EQ(s.growth_layer, 0);
  EXPECT_NEAR(s.growth, 5, 1e-6);
  // Error out of nothing (exact until then) is an infinite growth.
  DriftReport z = report({row("embed", -1, 0, 0), row("ffn_res", 0, 1e-3, 9)});
  s = drift_summary(z);
  EXPECT_TRUE(s.jump);
  EXPECT_TRUE(std::isinf(s.growth));
}

TEST(GateLocalize, ClassRule) {
  DriftReport clean = report({row("embed", -1, 1e-7, 0.1), row("ffn_res", 0, 2e-7, 0.5)});
  DriftReport over = report({row("embed", -1, 1e-7, 0.1), row("ffn_res", 0, 2e-3, 7)});
  EXPECT_EQ(localize_class(clean, 0.1, 0.5), LocalizeClass::NearTieFlip);
  EXPECT_EQ(localize_class(clean, 0.5, 0.5), LocalizeClass::NearTieFlip);  // band inclusive
  EXPECT_EQ(localize_class(clean, 0.7, 0.5), LocalizeClass::Unexplained);
  // A stage over its bound is a defect even where the flip itself was a near-tie.
  EXPECT_EQ(localize_class(over, 0.1, 0.5), LocalizeClass::LocalizedDefect);
  EXPECT_EQ(localize_class(over, 3.0, 0.5), LocalizeClass::LocalizedDefect);
  EXPECT_STREQ(localize_class_name(LocalizeClass::NearTieFlip), "near-tie flip");
}

namespace {

struct Fault {
  const char* spec;
  const char* stage;
  const char* op;
  int layer;
};
const Fault kFaults[] = {
    {"op=down,layer=1,scale=3", "down", "matmul", 1},
    {"op=attn_norm,layer=3,scale=2", "attn_norm", "rmsnorm", 3},
};
const char* kPrompts = "Once upon a time\nThe little dog\nLily wanted to\nTom and his mom went to the park. They\n";

// The logits row [V] after `ids` on one side (an independent forward, outside drift).
std::vector<double> row_after(const Model& m, const Side& side, const std::vector<int32_t>& ids) {
  auto be = make_side_backend(side, 1);
  Session s(m, *be, int(ids.size()));
  s.set_inject(side.inject);
  s.prefill(ids);
  return s.logits(s.last_T() - 1);
}

}  // namespace

TEST(GateLocalize, InjectedFaultNamedByLayerAndOp) {
  const std::string p = write_prompts("gloc-api", kPrompts);
  for (const Fault& f : kFaults) {
    SCOPED_TRACE(f.spec);
    GateOptions opt;
    opt.model_path = kStories;
    opt.prompts_path = p;
    opt.sides = parse_sides(std::string("ref,cpu+inject=") + f.spec);
    opt.n_tokens = 16;
    opt.runs = 1;
    opt.threads = 1;
    GateReport g = run_gate(opt);
    ASSERT_FALSE(g.divergences.empty()) << gate_text(g);
    GateLocalizeReport r = run_gate_localize(opt, g);
    ASSERT_EQ(r.items.size(), g.divergences.size());
    auto m = load_model(kStories);
    for (size_t i = 0; i < r.items.size(); ++i) {
      const GateLocalization& l = r.items[i];
      const GateDivergence& d = g.divergences[i];
      EXPECT_EQ(l.cls, LocalizeClass::LocalizedDefect);
      ASSERT_GE(l.drift.first_flagged, 0);
      const DriftRow& first = l.drift.rows[size_t(l.drift.first_flagged)];
      EXPECT_EQ(first.id.stage, f.stage);
      EXPECT_EQ(first.id.op, f.op);
      EXPECT_EQ(first.id.layer, f.layer);
      EXPECT_TRUE(l.summary.jump);
      EXPECT_EQ(l.summary.growth_layer, f.layer);
      // The drift forward's last position is the step the gate judged: the reference's top-1
      // and gap there are the gate's own teacher-forced judgement.
      ASSERT_EQ(l.ref_top.size(), 5u);
      EXPECT_EQ(l.ref_top[0].id, d.j.ref_top1);
      EXPECT_EQ(l.ref_top[1].id, d.j.ref_top2);
      EXPECT_NEAR(l.ref_gap, d.j.ref_gap, 1e-9);
      EXPECT_EQ(l.positions, int(g.prompt_ids[size_t(d.prompt)].size()) + d.step);
      // The side's top-5 and the rank of the reference token, against an independent forward
      // of the same prefix on the faulty side.
      std::vector<int32_t> ids = g.prompt_ids[size_t(d.prompt)];
      const std::vector<int32_t>& ref = g.side_runs[0].tokens[size_t(d.prompt)][0];
      ids.insert(ids.end(), ref.begin(), ref.begin() + d.step);
      std::vector<double> side = row_after(*m, opt.sides[1], ids);
      for (size_t k = 0; k < l.side_top.size(); ++k) {
        EXPECT_NEAR(l.side_top[k].logit, side[size_t(l.side_top[k].id)], 1e-4);
        if (k) {
          EXPECT_LE(l.side_top[k].logit, l.side_top[k - 1].logit);
        }
      }
      int rank = 1;
      for (double x : side) rank += x > side[size_t(d.j.ref_token)];
      EXPECT_EQ(l.ref_rank_in_side, rank);
    }
    const std::string text = gate_localize_text(r);
    EXPECT_NE(text.find(std::string("class: localized defect: ") + f.stage + " (op " + f.op +
                        ", layer " + std::to_string(f.layer) + ")"),
              std::string::npos)
        << text;
    const std::string md = gate_localize_markdown(r);
    EXPECT_NE(md.find("| rank | reference ref | logit |"), std::string::npos) << md;
    EXPECT_NE(md.find("**class: localized defect"), std::string::npos) << md;
  }
}

// A near-tie flip on the CPU: noise below every f32 bound can only flip a step where the
// reference is tied to about 1e-5 nats. This prompt is such a step (found by tracing the corpus
// on ref and keeping positions with top-1/top-2 gap < 2e-5 whose context starts a word: BOS +
// "playing in the living room." gives ' The'(291) 1.13e-5 above ' He'(346)), and logits noise
// of 1.5e-5 (0.8 of the logits stage's bound) flips it. If a change of the model or the noise
// seeding moves it, find another step that way rather than raise the noise over the bound.
TEST(GateLocalize, NoiseBelowEveryBoundIsANearTieFlip) {
  const std::string p = write_prompts("gloc-tie", "playing in the living room.\n");
  GateOptions opt;
  opt.model_path = kStories;
  opt.prompts_path = p;
  opt.sides = parse_sides("ref,cpu+inject=op=logits,noise=-1.5e-5");
  opt.n_tokens = 4;
  opt.runs = 1;
  opt.threads = 1;
  GateReport g = run_gate(opt);
  ASSERT_EQ(g.divergences.size(), 1u) << gate_text(g);
  EXPECT_EQ(g.divergences[0].step, 0);
  EXPECT_TRUE(g.divergences[0].j.near_tie);
  GateLocalizeReport r = run_gate_localize(opt, g);
  ASSERT_EQ(r.items.size(), 1u);
  const GateLocalization& l = r.items[0];
  EXPECT_EQ(l.cls, LocalizeClass::NearTieFlip) << gate_localize_text(r);
  EXPECT_EQ(l.drift.n_flagged, 0);
  EXPECT_LT(l.summary.worst_ratio, 1.0);
  EXPECT_EQ(l.drift.rows[size_t(l.summary.worst)].id.stage, "logits");  // the noise, seen
  EXPECT_GT(l.summary.worst_ratio, 0.5);
  EXPECT_FALSE(l.summary.jump);
  EXPECT_LT(l.ref_gap, 1e-4);
  EXPECT_EQ(l.ref_top[0].id, 291);
  EXPECT_EQ(l.ref_top[1].id, 346);
  EXPECT_EQ(l.side_top[0].id, 346);
  EXPECT_EQ(l.ref_rank_in_side, 2);
  EXPECT_NE(gate_localize_text(r).find("class: near-tie flip"), std::string::npos);
}

TEST(CliGateLocalize, FaultNamedInTextAndJson) {
  const std::string p = write_prompts("gloc-cli", kPrompts);
  const std::string base = "gate -m " + kStories + " --prompts " + p +
                           " -n 16 --runs 1 --sides ref,cpu+inject=op=down,layer=1,scale=3 -t 1 "
                           "--quiet --localize";
  CliResult r = run_cli(base);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  // The gate's own report comes first, unchanged; the localize section after its verdict.
  const size_t verdict = r.out.find("VERDICT: fail"), loc = r.out.find("\nlocalize (");
  ASSERT_NE(verdict, std::string::npos) << r.out;
  ASSERT_NE(loc, std::string::npos) << r.out;
  EXPECT_LT(verdict, loc);
  EXPECT_NE(r.out.find("first stage over its bound: down (op matmul, layer 1)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("growth: jump at layer 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0 near-tie flip, 0 unexplained"), std::string::npos) << r.out;
  r = run_cli(base + " --json");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  nlohmann::json j = json_of(r);
  ASSERT_TRUE(j.contains("localize")) << r.out;
  ASSERT_EQ(j["localize"].size(), j["divergences"].size());
  for (const auto& l : j["localize"]) {
    EXPECT_EQ(l["class"], "localized defect");
    EXPECT_EQ(l["drift"]["first_flagged"]["stage"], "down");
    EXPECT_EQ(l["drift"]["first_flagged"]["layer"], 1);
    EXPECT_EQ(l["drift"]["growth"]["kind"], "jump");
    EXPECT_EQ(l["ref_top"].size(), 5u);
    EXPECT_EQ(l["side_top"].size(), 5u);
  }
  // Without --localize the JSON has no such key (the gate's report is unchanged).
  r = run_cli("gate -m " + kStories + " --prompts " + p +
              " -n 4 --runs 1 --sides ref,cpu -t 1 --quiet --json");
  EXPECT_FALSE(json_of(r).contains("localize"));
}

TEST(CliGateLocalize, RecordedSidesAreCountedNotLocalized) {
  // A side recorded elsewhere (gate --against) has no tier here: its divergences are counted
  // as not localized, while the live side with the same fault is localized.
  const std::string p = write_prompts("gloc-rec", kPrompts);
  const std::string dir = temp_dir("gloc-rec") + "/rec";
  const std::string side = "cpu+inject=op=down,layer=1,scale=3";
  CliResult r = run_cli("gate -m " + kStories + " --prompts " + p + " -n 8 --runs 1 --sides " +
                        side + " --record " + dir + " -t 1 --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = run_cli("gate -m " + kStories + " --prompts " + p + " -n 8 --runs 1 --sides ref," + side +
              " --against " + dir + " -t 1 --quiet --localize");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("4 divergence(s) of recorded sides not localized"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("4 divergence(s) localized: 4 localized defect"), std::string::npos)
      << r.out;
}

TEST(CliDriftPrefix, PromptIdsAndContinuationAgree) {
  auto m = load_model(kStories);
  const std::string text = "Lily wanted to";
  // The gate's tokenization is BOS + the text's pieces; written out here by hand.
  std::vector<int32_t> ids = {m->tokenizer->bos_id()};
  for (int32_t t : m->tokenizer->encode(text, false, false)) ids.push_back(t);
  std::string id_text;  // separators mixed: spaces, commas, newlines
  for (size_t i = 0; i < ids.size(); ++i) id_text += std::to_string(ids[i]) + (i % 2 ? ",\n" : " ");
  const std::string dir = temp_dir("gloc-ids");
  write_file(dir + "/ids.txt", id_text);
  write_file(dir + "/cont.txt", "278,\n4\t91\n");
  const std::string base = "drift -m " + kStories + " --a ref --b cpu -t 1 --json ";
  CliResult a = run_cli(base + "--prompt '" + text + "' --continuation '278,4,91'");
  CliResult b = run_cli(base + "--ids " + dir + "/ids.txt --continuation " + dir + "/cont.txt");
  ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.out << b.err;
  nlohmann::json ja = json_of(a), jb = json_of(b);
  EXPECT_EQ(ja["positions"], int(ids.size()) + 3);
  EXPECT_EQ(ja["forwards"], 1);
  ASSERT_EQ(ja["stages"].size(), jb["stages"].size());
  EXPECT_EQ(ja["stages"], jb["stages"]);  // bit for bit: the same tokens, the same forward
  // And a different prefix is not equal (the comparison can fail).
  CliResult c = run_cli(base + "--prompt '" + text + "' --continuation 278,4");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(json_of(c)["stages"], ja["stages"]);
}

TEST(CliDriftPrefix, BadIdsRefusedWithOneLine) {
  const std::string dir = temp_dir("gloc-bad");
  const std::string base = "drift -m " + kStories + " --a ref --b cpu -t 1 ";
  auto refused = [&](const std::string& args, const std::string& what) {
    CliResult r = run_cli(base + args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.err.find(what), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.out, "") << args;
  };
  write_file(dir + "/word.txt", "1 12,\n 7x 5\n");
  refused("--ids " + dir + "/word.txt",
          dir + "/word.txt: entry 3 '7x' is not a token id");
  write_file(dir + "/neg.txt", "1 -4\n");
  refused("--ids " + dir + "/neg.txt", "neg.txt: entry 2 '-4' is not a token id");
  write_file(dir + "/big.txt", "1 2 512\n");  // stories260K's vocabulary is [0, 512)
  refused("--ids " + dir + "/big.txt",
          "big.txt: entry 3, token id 512, is outside the vocabulary [0, 512)");
  write_file(dir + "/huge.txt", "1 99999999999999999999\n");
  refused("--ids " + dir + "/huge.txt", "huge.txt: entry 2 '99999999999999999999' is not a token id");
  write_file(dir + "/empty.txt", " ,\n");
  refused("--ids " + dir + "/empty.txt", "empty.txt: no token ids");
  refused("--ids " + dir + "/missing.txt", "missing.txt: cannot open");
  refused("--prompt hi --continuation 5,x", "--continuation: entry 2 'x' is not a token id");
  std::string long_ids;
  for (int i = 0; i < 2049; ++i) long_ids += "1 ";
  write_file(dir + "/long.txt", long_ids);
  refused("--ids " + dir + "/long.txt", "2049 tokens, past the model's maximum of 2048 positions");
  refused("--prompt hi --corpus " + source_path("models/corpus/stories.txt"),
          "give exactly one of --corpus, --prompt, --ids");
  refused("--prompt hi --positions 8", "--positions counts corpus tokens");
  refused("--corpus " + source_path("models/corpus/stories.txt") + " --continuation 5",
          "--continuation follows --prompt or --ids");
  refused("", "give exactly one of --corpus, --prompt, --ids (got 0)");
  // An ids file is an input like the corpus: an output naming it is refused, the file kept.
  write_file(dir + "/cont.txt", "278 4\n");
  CliResult r = run_cli(base + "--prompt hi --continuation " + dir + "/cont.txt --tsv " + dir +
                        "/cont.txt");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cont.txt: is also an input of this run"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(dir + "/cont.txt"), "278 4\n");
}

// The shipped model on the H200: cuda:bf16 leaves the reference at near-ties only
// (docs/localize.md: 3 of the 8 prompts at -n 48), and each of them, localized, is a near-tie
// flip: no stage over its bf16 bound and no jump in the accumulated error.
TEST(GateLocalizeCuda, Bf16NearTiesAreNearTieFlipsWithUniformDrift) {
  ARB_CUDA_OR_SKIP(probe, "bf16");
  probe.reset();  // only asked whether a device is there; each side makes its own tier
  GateOptions opt;
  opt.model_path = kTiny;
  opt.prompts_path = source_path("tests/localize/prompts.txt");
  opt.sides = parse_sides("ref,cuda:bf16");
  opt.n_tokens = 48;
  opt.runs = 1;
  GateReport g = run_gate(opt);
  ASSERT_GE(g.divergences.size(), 1u) << "cuda:bf16 no longer diverges on these prompts: pick "
                                         "prompts where it does\n"
                                      << gate_text(g);
  GateLocalizeReport r = run_gate_localize(opt, g);
  ASSERT_EQ(r.items.size(), g.divergences.size());
  for (const GateLocalization& l : r.items) {
    EXPECT_EQ(l.cls, LocalizeClass::NearTieFlip) << gate_localize_text(r);
    EXPECT_EQ(l.drift.n_flagged, 0);
    EXPECT_LE(l.summary.worst_ratio, 1.0);
    EXPECT_FALSE(l.summary.jump);
    EXPECT_LE(l.ref_gap, r.band);
    EXPECT_EQ(l.drift.b_compute, "bf16");
  }
}
