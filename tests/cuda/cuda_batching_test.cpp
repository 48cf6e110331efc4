// Continuous batching on the CUDA tier (backend/cuda/paged.cpp: every sequence's RoPE, K/V
// store and paged attention in one launch per stage; row invariance: GEMMs at every row
// count, no single-token kernels or step graphs):
//  - `--batch-with`: a sequence forwarded inside a batch of other sequences, on a fixture of
//    every family (dense, gemma's sliding layers, MoE, the Mamba2 hybrids): cuda f32 within
//    the f32 bound of ref (the HF-reference bound of cuda_families_test.cpp), bf16 with ref's
//    top-1 at every decided position (ref leads by >= 2 logits);
//  - batched forwards replayed as CUDA graphs (a step's launches captured at the second
//    sighting of their signature) give the bits of the same forwards run op by op;
//  - batch invariance, measured: greedy outputs of 7 prompts alone and in batches of 2, 7
//    and 64 through the batching scheduler. cuBLASLt may order a row's sums differently at
//    another row count, so cuda does not promise the bits (backend.h set_row_invariant); it
//    must keep every token up to the first divergence, and a divergence may only come where
//    the run alone was a near tie (its top two logits within 2). The counts of identical
//    outputs and the largest logprob difference are printed: the measured batch effect.
#include <algorithm>
#include <cmath>

#include "cuda/cuda_test_util.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "model/model.h"

namespace arbiter::test {
namespace {

const char* kFixtures[] = {"tests/fixtures/models/tiny-qwen3", "tests/fixtures/models/tiny-gemma3",
                           "tests/fixtures/models/tiny-gemma2", "tests/fixtures/models/tiny-qwen3-moe",
                           "tests/fixtures/models/tiny-granite-h", "tests/fixtures/models/tiny-nemotron-h"};

int argmax(const std::vector<double>& r) {
  return int(std::max_element(r.begin(), r.end()) - r.begin());
}

TEST(CudaBatching, BatchWithForwardsAgreeWithRef) {
  ARB_CUDA_OR_SKIP(f32, "f32");
  ARB_CUDA_OR_SKIP(bf16, "bf16");
  auto ref = make_ref_backend();
  for (const char* f : kFixtures) {
    auto m = load_model(source_path(f));
    std::vector<int32_t> ids(40);
    for (int t = 0; t < 40; ++t) ids[size_t(t)] = int32_t((t * 37 + 11) % m->config.vocab);
    const std::vector<int32_t> ctx(ids.begin(), ids.begin() + 24), rest(ids.begin() + 24, ids.end());
    // The plain forward on ref; the batched ones on cuda (3 companions), context then 16 rows.
    Session sr(*m, *ref, 64);
    sr.context(ctx);
    sr.forward(rest);
    for (Backend* cu : {f32.get(), bf16.get()}) {
      const bool is_f32 = cu == f32.get();
      Session sc(*m, *cu, 64);
      sc.set_batch_with(3);
      sc.context(ctx);
      sc.forward(rest);
      double worst = 0;
      int decided = 0, agree = 0;
      for (int t = 0; t < int(rest.size()); ++t) {
        const std::vector<double> lc = sc.logits(t), lr = sr.logits(t);
        for (size_t v = 0; v < lr.size(); ++v) worst = std::max(worst, std::fabs(lc[v] - lr[v]));
        std::vector<double> top = lr;
        std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<double>());
        if (top[0] - top[1] >= 2.0) {
          ++decided;
          agree += argmax(lc) == argmax(lr);
        }
      }
      std::printf("[ batch    ] %-40s %s: max |dlogit| %.3g, decided %d of %zu, top-1 agree %d\n", f,
                  is_f32 ? "f32 " : "bf16", worst, decided, rest.size(), agree);
      if (is_f32) {
        EXPECT_LE(worst, 2e-4) << f;
      }
      EXPECT_TRUE(std::isfinite(worst)) << f;
      EXPECT_EQ(agree, decided) << f;
    }
  }
}

#if ARBITER_HAVE_CUDA
TEST(CudaBatching, GraphReplaysOfBatchedForwardsEqualOpByOp) {
  ARB_CUDA_OR_SKIP(cu, "bf16");
  for (const char* f : {"tests/fixtures/models/tiny-qwen3", "tests/fixtures/models/tiny-qwen3-moe",
                        "tests/fixtures/models/tiny-granite-h"}) {
    auto m = load_model(source_path(f));
    std::vector<int32_t> ids(30);
    for (int t = 0; t < 30; ++t) ids[size_t(t)] = int32_t((t * 37 + 11) % m->config.vocab);
    auto run = [&](bool graphs) {
      CudaTuning t = cuda_tuning(*cu);
      t.graphs = graphs;
      cuda_set_tuning(*cu, t);
      Session s(*m, *cu, 64);
      s.set_batch_with(3);  // companions of 1, 2 and 3 rows a forward
      s.context(std::vector<int32_t>(ids.begin(), ids.begin() + 10));
      std::vector<std::vector<double>> rows;
      for (int i = 10; i < 30; ++i) {  // single-token forwards of this sequence, in a batch
        s.forward({ids[size_t(i)]});
        rows.push_back(s.logits(0));
      }
      return rows;
    };
    const CudaGraphStats before = cuda_graph_stats(*cu);
    const std::vector<std::vector<double>> replayed = run(true);
    const CudaGraphStats after = cuda_graph_stats(*cu);
    const std::vector<std::vector<double>> eager = run(false);
    std::printf("[ batch    ] %-40s graphs: %lld replays, %lld captures, %lld op by op\n", f,
                (long long)(after.replays - before.replays), (long long)(after.captures - before.captures),
                (long long)(after.eager_steps - before.eager_steps));
    EXPECT_GT(after.replays - before.replays, 10) << f;
    for (size_t i = 0; i < eager.size(); ++i) ASSERT_EQ(replayed[i], eager[i]) << f << " step " << i;
  }
}
#endif

void measured_invariance(const std::string& dtype) {
  ARB_CUDA_OR_SKIP(cu, dtype);
  auto m = load_model(source_path("models/TinyStories-656K"));
  std::vector<SeqRequest> all = greedy_requests(*m, 64);
  for (SeqRequest& q : all) q.top_logprobs = 2;  // the run alone's margin at each token
  BatchingOptions o;
  o.ctx = 96;
  std::vector<Outcome> alone;
  {
    o.slots = 1;
    auto s = make_batching_scheduler(*m, *cu, o);
    for (int i = 0; i < 7; ++i) {
      SeqRequest r = all[size_t(i)];
      r.max_tokens = 16;
      alone.push_back(run_all(*s, {r})[0]);
      ASSERT_EQ(alone.back().ids.size(), 16u) << alone.back().error;
    }
  }
  for (int n : {2, 7, 64}) {
    o.slots = n;
    o.step_tokens = std::max(n, 32);
    auto s = make_batching_scheduler(*m, *cu, o);
    const std::vector<SeqRequest> reqs(all.begin(), all.begin() + n);
    const std::vector<Outcome> got = run_all(*s, reqs);
    int identical = 0, diverged = 0;
    double max_dlogprob = 0;
    for (int i = 0; i < n; ++i) {
      const Outcome &a = alone[size_t(i % 7)], &g = got[size_t(i)];
      ASSERT_EQ(g.ids.size(), size_t(reqs[size_t(i)].max_tokens)) << g.error;
      bool same = true;
      for (size_t t = 0; t < g.ids.size(); ++t) {
        if (g.ids[t] != a.ids[t]) {
          // Alone, the top two were within 2 logits (logprob differences are logit differences).
          const std::vector<std::pair<int32_t, double>>& top = a.tokens[t].top;
          ASSERT_GE(top.size(), 2u);
          EXPECT_LT(top[0].second - top[1].second, 2.0)
              << dtype << ": request " << i << " token " << t << " in a batch of " << n
              << " left a decided pick";
          ++diverged;
          same = false;
          break;
        }
        max_dlogprob = std::max(max_dlogprob, std::fabs(g.tokens[t].logprob - a.tokens[t].logprob));
        same = same && g.tokens[t].logprob == a.tokens[t].logprob;
      }
      identical += same;
    }
    std::printf("[ batch    ] cuda %s, batch of %2d: %d of %d outputs bit-identical to alone, %d diverged "
                "at a near tie, max |dlogprob| before a divergence %.3g\n",
                dtype.c_str(), n, identical, n, diverged, max_dlogprob);
  }
}

TEST(CudaBatching, GreedyAloneAndInBatchesOf2_7_64F32) { measured_invariance("f32"); }
TEST(CudaBatching, GreedyAloneAndInBatchesOf2_7_64Bf16) { measured_invariance("bf16"); }

}  // namespace
}  // namespace arbiter::test
