// Continuous batching (engine/scheduler.h make_batching_scheduler, the llama family's batched
// forward, engine/kv_pool.h) without HTTP:
// - the batched forward: sequences at their own positions, K/V in scattered blocks, give the
//   logits of each sequence run alone through a Session, bit for bit (ref; cpu with its
//   row-invariant matmuls), on a fixture of every family: llama, qwen3, mistral, qwen2-moe,
//   gemma2/3 (sliding layers), the hybrids (recurrent state per slot);
// - on ref, the batching scheduler's streams (greedy, sampled, penalised, logprobs, echo)
//   equal the time-slice scheduler's: the same arithmetic, reached another way;
// - batch invariance: greedy outputs alone and in batches of 2, 7 and 64 are identical (ref, cpu);
//   alone and in batches of 2 and 7 on the gemma and hybrid fixtures, past the sliding window;
// - a tiny pool: admission waits, preemption recomputes, no sequence lost or changed;
// - a cancel frees the sequence's blocks within one step; refusals name the reason.
#include <gtest/gtest.h>

#include <chrono>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/kv_pool.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "model/arch.h"
#include "test_util.h"

namespace arbiter {
namespace {

using namespace std::chrono_literals;

using test::collect;
using test::Outcome;
using test::run_all;

const std::string kStories = "models/TinyStories-656K";

using test::greedy_requests;

// ---- the batched forward ------------------------------------------------------------------

struct Piece {
  std::vector<int32_t> ids;  // the sequence's tokens
  int split;                 // the first forward feeds [0, split), the second the rest
};

void batched_forward_equals_sessions(const std::string& model, const DeviceSpec& dev) {
  auto m = load_model(test::source_path(model));
  auto be = make_backend(dev);
  be->set_row_invariant(true);
  const int V = m->config.vocab;
  const std::vector<Piece> seqs = {{{1, 5, 9, 3, 7}, 3}, {{2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59}, 17},
                                   {{11, 3}, 1}};
  // Alone: a Session per sequence, the context then the rest as one forward.
  std::vector<std::vector<std::vector<double>>> want;
  for (const Piece& p : seqs) {
    Session s(*m, *be, 64);
    s.context({p.ids.begin(), p.ids.begin() + p.split});
    s.forward({p.ids.begin() + p.split, p.ids.end()});
    std::vector<std::vector<double>> rows;
    for (int t = 0; t < s.last_T(); ++t) rows.push_back(s.logits(t));
    want.push_back(rows);
  }
  // Batched: blocks of 4 positions, handed out from the pool's end, interleaved between the
  // sequences, so that no sequence's blocks are contiguous.
  const int block_rows = 4, pool_blocks = 24;
  std::vector<std::vector<int32_t>> tables(seqs.size());
  int next = pool_blocks - 1;
  for (int b = 0; b < 8; ++b)
    for (size_t i = 0; i < seqs.size(); ++i)
      if (int(tables[i].size()) * block_rows < int(seqs[i].ids.size())) tables[i].push_back(next--);
  auto st = m->arch->make_batch_state(*m, *be, pool_blocks * block_rows, 64, int(seqs.size()));
  ASSERT_NE(st, nullptr);
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<BatchSeq> batch;
    std::vector<int32_t> ids;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const Piece& p = seqs[i];
      BatchSeq b;
      b.pos0 = pass == 0 ? 0 : p.split;
      b.T = pass == 0 ? p.split : int(p.ids.size()) - p.split;
      b.pages = {tables[i].data(), int(tables[i].size()), block_rows};
      b.slot = int(seqs.size() - 1 - i);  // not the sequence's index: slots are the scheduler's
      b.logits = pass == 0 ? BatchSeq::Logits::None : BatchSeq::Logits::All;
      ids.insert(ids.end(), p.ids.begin() + b.pos0, p.ids.begin() + b.pos0 + b.T);
      batch.push_back(b);
    }
    ForwardArgs a;
    a.ids = ids.data();
    a.T = int(ids.size());
    a.batch = &batch;
    m->arch->forward(*m, *be, *st, a);
  }
  int row = 0;
  for (size_t i = 0; i < seqs.size(); ++i)
    for (size_t t = 0; t < want[i].size(); ++t, ++row) {
      std::vector<double> got(static_cast<size_t>(V));
      be->read(st->logits, int64_t(row) * V, V, got.data());
      ASSERT_EQ(got, want[i][t]) << model << " on " << dev.device << ": sequence " << i << " row " << t;
    }
  be->set_row_invariant(false);
}

TEST(Batching, BatchedForwardEqualsEachSequenceAloneBitForBit) {
  for (const char* f : {"tests/fixtures/models/tiny-llama", "tests/fixtures/models/tiny-qwen3",
                        "tests/fixtures/models/tiny-mistral", "tests/fixtures/models/tiny-qwen2-moe"})
    for (const char* d : {"ref", "cpu"})
      batched_forward_equals_sessions(f, DeviceSpec{d, "", 0, ""});
}

// The sequence of 30 tokens crosses both fixtures' windows (tiny-gemma3 16, tiny-gemma2 24):
// a sliding layer's queries see only their window of the pool's rows.
TEST(Batching, BatchedForwardOfGemmaEqualsEachSequenceAloneBitForBit) {
  for (const char* f : {"tests/fixtures/models/tiny-gemma3", "tests/fixtures/models/tiny-gemma2"})
    for (const char* d : {"ref", "cpu"})
      batched_forward_equals_sessions(f, DeviceSpec{d, "", 0, ""});
}

// Each sequence's Mamba2 states live in their own slot: a slot mixed up or not started afresh
// changes the logits. The chunk size (16) is crossed by the 17-token first forward.
TEST(Batching, BatchedForwardOfTheHybridsEqualsEachSequenceAloneBitForBit) {
  for (const char* f : {"tests/fixtures/models/tiny-granite-h", "tests/fixtures/models/tiny-granite-h-moe",
                        "tests/fixtures/models/tiny-nemotron-h"})
    for (const char* d : {"ref", "cpu"})
      batched_forward_equals_sessions(f, DeviceSpec{d, "", 0, ""});
}

TEST(Batching, RefusesTwoSequencesInOneStateSlot) {
  auto m = load_model(test::source_path("tests/fixtures/models/tiny-granite-h"));
  auto be = make_backend(DeviceSpec{"ref", "", 0, ""});
  auto st = m->arch->make_batch_state(*m, *be, 64, 8, 2);
  const std::vector<int32_t> blocks = {0, 1}, ids = {1, 2};
  std::vector<BatchSeq> batch(2);
  for (int i = 0; i < 2; ++i) {
    batch[size_t(i)].T = 1;
    batch[size_t(i)].pages = {blocks.data() + i, 1, 16};
    batch[size_t(i)].slot = 1;
  }
  ForwardArgs a;
  a.ids = ids.data();
  a.T = 2;
  a.batch = &batch;
  try {
    m->arch->forward(*m, *be, *st, a);
    FAIL() << "two sequences in one slot were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two batch sequences in state slot 1"), std::string::npos) << e.what();
  }
  batch[0].slot = 2;  // outside the state's 2 slots
  EXPECT_THROW(m->arch->forward(*m, *be, *st, a), Error);
}

// ---- the scheduler -------------------------------------------------------------------------

// On ref every path computes the same bits, so the batching scheduler must stream exactly
// what the time-slice scheduler streams, for every way a token is chosen.
TEST(Batching, EqualsTheTimeSliceSchedulerOnRef) {
  auto m = load_model(test::source_path(kStories));
  auto be = make_backend(DeviceSpec{"ref", "", 0, ""});
  std::vector<SeqRequest> reqs = greedy_requests(*m, 5);
  reqs[1].sampling.temperature = 0.8;
  reqs[1].sampling.seed = 7;
  reqs[2].top_logprobs = 3;
  reqs[2].prompt_logprobs = 2;
  reqs[3].penalties.repeat = 1.3;
  reqs[3].sampling.temperature = 0.7;
  reqs[3].sampling.top_k = 5;
  reqs[3].sampling.seed = 9;
  reqs[4].prompt_logprobs = 1;
  reqs[4].max_tokens = 0;
  reqs[0].stop_ids = {13};
  std::vector<Outcome> want;
  {
    auto ts = make_time_slice_scheduler(*m, *be, 2, 96, 8);
    want = run_all(*ts, reqs);
  }
  BatchingOptions o;
  o.slots = 3, o.ctx = 96, o.step_tokens = 8;  // prompts in several chunks
  auto bs = make_batching_scheduler(*m, *be, o);
  const std::vector<Outcome> got = run_all(*bs, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].ids, want[i].ids) << "request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << "request " << i << " " << got[i].error;
    ASSERT_EQ(got[i].tokens.size(), want[i].tokens.size());
    for (size_t t = 0; t < got[i].tokens.size(); ++t) {
      EXPECT_EQ(got[i].tokens[t].logprob, want[i].tokens[t].logprob);
      EXPECT_EQ(got[i].tokens[t].top, want[i].tokens[t].top);
    }
    ASSERT_EQ(got[i].prompt.size(), want[i].prompt.size()) << "request " << i;
    for (size_t t = 0; t < got[i].prompt.size(); ++t) {
      EXPECT_EQ(got[i].prompt[t].id, want[i].prompt[t].id);
      EXPECT_EQ(got[i].prompt[t].logprob, want[i].prompt[t].logprob);
      EXPECT_EQ(got[i].prompt[t].top, want[i].prompt[t].top);
    }
  }
  EXPECT_FALSE(want[2].prompt.empty());
  EXPECT_FALSE(want[2].tokens[0].top.empty());
}

// Greedy: each request alone, then in batches of 2, 7 and 64 (the 64 are the 7 prompts with
// other lengths; a greedy output of n tokens is the prefix of a longer one). Each token's
// logprob (from the f32 logits row) must be the same double too, so a batch-dependent
// rounding shows even where it does not flip a token.
void batch_invariance(const DeviceSpec& dev) {
  auto m = load_model(test::source_path(kStories));
  auto be = make_backend(dev);
  std::vector<SeqRequest> all = greedy_requests(*m, 64);
  for (SeqRequest& r : all) r.top_logprobs = 0;
  BatchingOptions o;
  o.ctx = 96;
  std::vector<Outcome> alone;  // per prompt, the longest request's output
  {
    o.slots = 1;
    auto s = make_batching_scheduler(*m, *be, o);
    for (int i = 0; i < 7; ++i) {
      SeqRequest r = all[size_t(i)];
      r.max_tokens = 16;
      alone.push_back(run_all(*s, {r})[0]);
      ASSERT_EQ(alone.back().ids.size(), 16u);
    }
  }
  for (int n : {2, 7, 64}) {
    o.slots = n;
    o.step_tokens = std::max(n, 32);
    auto s = make_batching_scheduler(*m, *be, o);
    const std::vector<SeqRequest> reqs(all.begin(), all.begin() + n);
    const std::vector<Outcome> got = run_all(*s, reqs);
    for (int i = 0; i < n; ++i) {
      const Outcome& a = alone[size_t(i % 7)];
      const Outcome& g = got[size_t(i)];
      ASSERT_EQ(g.ids, std::vector<int32_t>(a.ids.begin(), a.ids.begin() + reqs[size_t(i)].max_tokens))
          << dev.device << ": request " << i << " in a batch of " << n;
      for (size_t t = 0; t < g.tokens.size(); ++t)
        ASSERT_EQ(g.tokens[t].logprob, a.tokens[t].logprob)
            << dev.device << ": request " << i << " token " << t << " in a batch of " << n;
    }
  }
}

TEST(Batching, GreedyOutputsEqualAloneAndInBatchesOf2_7_64OnRef) {
  batch_invariance(DeviceSpec{"ref", "", 0, ""});
}
TEST(Batching, GreedyOutputsEqualAloneAndInBatchesOf2_7_64OnCpu) {
  batch_invariance(DeviceSpec{"cpu", "", 0, ""});
}

// The same on a fixture of the gemma or hybrid family, from token ids: 7 prompts of 3 to 27
// tokens and 12 greedy tokens each, so that most run past the sliding window (gemma: 16, 24)
// and the scan's chunk (the hybrids: 16). Alone each prompt is one forward; in the batches
// (step_tokens 16) it is cut in chunks where the others leave room, so a result that depended
// on where a prefill's forwards start (the chunked scan, a sliding layer's first key) shows.
void fixture_invariance(const std::string& model, const DeviceSpec& dev) {
  auto m = load_model(test::source_path(model));
  auto be = make_backend(dev);
  std::vector<SeqRequest> reqs;
  for (int i = 0; i < 7; ++i) {
    SeqRequest r;
    for (int t = 0; t < 3 + 4 * i; ++t) r.prompt.push_back(int32_t((7 + 13 * i + 31 * t) % m->config.vocab));
    r.max_tokens = 12;
    r.top_logprobs = 0;
    reqs.push_back(r);
  }
  BatchingOptions o;
  o.ctx = 48;
  std::vector<Outcome> alone;
  {
    o.slots = 1;
    auto s = make_batching_scheduler(*m, *be, o);
    for (const SeqRequest& r : reqs) alone.push_back(run_all(*s, {r})[0]);
  }
  for (int n : {2, 7}) {
    o.slots = n;
    o.step_tokens = 16;
    auto s = make_batching_scheduler(*m, *be, o);
    const std::vector<Outcome> got = run_all(*s, std::vector<SeqRequest>(reqs.begin(), reqs.begin() + n));
    for (int i = 0; i < n; ++i) {
      const Outcome &a = alone[size_t(i)], &g = got[size_t(i)];
      ASSERT_EQ(a.ids.size(), 12u) << model << " on " << dev.device << ": request " << i << " " << a.error;
      ASSERT_EQ(g.ids, a.ids) << model << " on " << dev.device << ": request " << i << " in a batch of " << n;
      for (size_t t = 0; t < g.tokens.size(); ++t)
        ASSERT_EQ(g.tokens[t].logprob, a.tokens[t].logprob)
            << model << " on " << dev.device << ": request " << i << " token " << t << " in a batch of " << n;
    }
  }
}

TEST(Batching, GreedyOutputsOfGemmaEqualAloneAndInBatchesOf2_7) {
  for (const char* f : {"tests/fixtures/models/tiny-gemma3", "tests/fixtures/models/tiny-gemma2"})
    for (const char* d : {"ref", "cpu"}) fixture_invariance(f, DeviceSpec{d, "", 0, ""});
}

TEST(Batching, GreedyOutputsOfTheHybridsEqualAloneAndInBatchesOf2_7) {
  for (const char* f : {"tests/fixtures/models/tiny-granite-h", "tests/fixtures/models/tiny-granite-h-moe",
                        "tests/fixtures/models/tiny-nemotron-h"})
    for (const char* d : {"ref", "cpu"}) fixture_invariance(f, DeviceSpec{d, "", 0, ""});
}

// A pool of exactly one context (3 blocks of 16 for ctx 48) shared by 7 sequences that each
// need 2 blocks: admission waits, growth preempts; every output still equals its alone output.
TEST(Batching, ATinyPoolPreemptsAndLosesNoSequence) {
  auto m = load_model(test::source_path(kStories));
  auto be = make_backend(DeviceSpec{"cpu", "", 0, ""});
  std::vector<SeqRequest> reqs = greedy_requests(*m, 7);
  for (SeqRequest& r : reqs) {
    r.prompt.resize(std::min<size_t>(r.prompt.size(), 12));
    r.max_tokens = 14;
  }
  BatchingOptions o;
  o.ctx = 48;
  o.slots = 1;
  std::vector<Outcome> alone;
  {
    auto s = make_batching_scheduler(*m, *be, o);
    for (const SeqRequest& r : reqs) alone.push_back(run_all(*s, {r})[0]);
  }
  o.slots = 7;
  o.kv_blocks = 3;
  auto s = make_batching_scheduler(*m, *be, o);
  const std::vector<Outcome> got = run_all(*s, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].finish, FinishReason::Length) << got[i].error;
    EXPECT_EQ(got[i].ids, alone[i].ids) << "request " << i;
  }
  const Scheduler::Stats st = s->stats();
  EXPECT_GT(st.preempted, 0);
  EXPECT_EQ(st.kv_free, 3);
}

TEST(Batching, ACancelFreesItsBlocksWithinOneStep) {
  auto m = load_model(test::source_path(kStories));
  auto be = make_backend(DeviceSpec{"cpu", "", 0, ""});
  BatchingOptions o;
  o.ctx = 96;
  o.slots = 2;
  auto s = make_batching_scheduler(*m, *be, o);
  SeqRequest r = greedy_requests(*m, 1)[0];
  r.max_tokens = -1;  // until the context is full: only the cancel ends it early
  auto st = s->submit(r);
  ASSERT_NE(st, nullptr);
  auto ev = st->next(10s);
  ASSERT_TRUE(ev && ev->kind == SeqEvent::Kind::Token);
  const int64_t steps = s->stats().steps;
  st->cancel();
  const Outcome rest = collect(*st);
  EXPECT_EQ(rest.finish, FinishReason::Cancelled);
  EXPECT_LT(rest.ids.size(), 80u);  // it did not run to the context's end
  // The blocks are back before any forward after the one running when cancel() came.
  const Scheduler::Stats after = s->stats();
  EXPECT_EQ(after.kv_free, after.kv_blocks);
  EXPECT_LE(after.steps, steps + 1);
}

TEST(Batching, RefusesAPoolSmallerThanOneContext) {
  auto m = load_model(test::source_path(kStories));
  auto be = make_backend(DeviceSpec{"cpu", "", 0, ""});
  BatchingOptions o;
  o.ctx = 64;
  o.kv_blocks = 3;  // 48 positions
  try {
    make_batching_scheduler(*m, *be, o);
    FAIL() << "a pool of 48 positions for a context of 64 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("less than one context of 64"), std::string::npos) << e.what();
  }
}

// trace --batch-with: a Session whose forwards run inside a batch of other sequences. The
// traced forward's logits rows, then (an MoE model) each of its routing picks as a row of
// layer, position, margin and the expert ids, as a trace records them.
std::vector<std::vector<double>> traced_logits(Session& s, const std::vector<int32_t>& ctx,
                                               const std::vector<int32_t>& in) {
  s.reset();
  s.context(ctx);
  RouteLog routes;
  s.set_route_log(&routes);
  s.forward(in);
  s.set_route_log(nullptr);
  std::vector<std::vector<double>> rows;
  for (int t = 0; t < s.last_T(); ++t) rows.push_back(s.logits(t));
  for (const RoutePick& p : routes.picks) {
    rows.push_back({double(p.layer), double(p.pos), p.margin});
    rows.back().insert(rows.back().end(), p.ids.begin(), p.ids.end());
  }
  return rows;
}

void session_inside_a_batch(const std::string& model) {
  auto m = load_model(test::source_path(model));
  const std::vector<int32_t> ctx = {1, 17, 33, 5, 80, 2, 9, 41, 7, 3, 66, 12, 19, 23, 4, 8, 15, 16, 42, 99};
  const std::vector<int32_t> in = {5, 6, 7, 8, 9, 10, 11};
  for (const char* d : {"ref", "cpu"}) {
    auto be = make_backend(DeviceSpec{d, "", 0, ""});
    Session s(*m, *be, 64);
    std::vector<std::vector<double>> plain;
    if (std::string(d) == "ref") plain = traced_logits(s, ctx, in);  // ref: invariant as it is
    const bool moe = m->config.router.n_experts > 0 || m->config.moe_experts > 0;
    if (!plain.empty() && moe) {  // the traced forward's 7 tokens at every MoE layer were logged
      EXPECT_GT(plain.size(), in.size() + in.size()) << model;
    }
    std::vector<std::vector<double>> prev;
    for (int n : {1, 2, 7}) {
      s.set_batch_with(n);
      // Twice: the other sequences have moved on (and restarted) by the second chunk.
      for (int rep = 0; rep < 2; ++rep) {
        const std::vector<std::vector<double>> got = traced_logits(s, ctx, in);
        if (!plain.empty()) {
          EXPECT_EQ(got, plain) << model << " on " << d << " batch_with " << n;
        }
        if (!prev.empty()) {
          EXPECT_EQ(got, prev) << model << " on " << d << " batch_with " << n;
        }
        prev = got;
      }
    }
    s.set_batch_with(0);
  }
}

// qwen3, gemma3 (past its window of 16), granite-h (its companions' Mamba2 states in their
// own slots, restarted when they restart), and the MoE qwen3-moe and granite-h-moe, whose
// traced forward's routing is logged from the batch (the traced sequence's rows alone).
TEST(Batching, ASessionInsideABatchComputesTheSameRows) {
  for (const char* f : {"tests/fixtures/models/tiny-qwen3", "tests/fixtures/models/tiny-gemma3",
                        "tests/fixtures/models/tiny-granite-h", "tests/fixtures/models/tiny-qwen3-moe",
                        "tests/fixtures/models/tiny-granite-h-moe"})
    session_inside_a_batch(f);
}

TEST(Batching, ASessionInsideABatchRefusesHooks) {
  auto be = make_backend(DeviceSpec{"cpu", "", 0, ""});
  auto m = load_model(test::source_path("tests/fixtures/models/tiny-llama"));
  Session s(*m, *be, 32);
  s.set_inject(InjectSpec::parse("op=q,scale=2"));
  EXPECT_THROW(s.set_batch_with(2), Error);
}

TEST(KvPool, GrowsWithoutMovingAndReleasesEverything) {
  KvPool p(5, 16);
  std::vector<int32_t> a, b;
  EXPECT_TRUE(p.grow(a, 17));  // 2 blocks
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(p.grow(b, 32));
  EXPECT_TRUE(p.grow(a, 33));  // a third block; the first two stay where they were
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 4}));
  EXPECT_FALSE(p.grow(b, 33));  // none left: b unchanged
  EXPECT_EQ(b.size(), 2u);
  p.release(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(p.free(), 3);
  EXPECT_TRUE(p.grow(b, 80));
  EXPECT_EQ(p.free(), 0);
}

}  // namespace
}  // namespace arbiter
