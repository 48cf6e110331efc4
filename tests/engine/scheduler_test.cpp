// The time-slicing scheduler (engine/scheduler.h) without HTTP: sequences served together
// give exactly what each gives alone (interleaving never mixes their caches or samplers),
// echo scores the prompt as a teacher-forced trace would, a full queue refuses, a cancelled
// sequence frees its slot, and bad requests are refused before they are queued.
#include <gtest/gtest.h>

#include <chrono>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/generate.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "test_util.h"

namespace arbiter {
namespace {

using namespace std::chrono_literals;

using test::collect;
using test::Outcome;

TEST(Scheduler, InterleavedSequencesEqualEachAlone) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  auto be = make_backend(DeviceSpec{});
  const std::vector<std::string> prompts = {"Once upon a time", "The dog", "Lily and Ben", "One day"};
  std::vector<SeqRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SeqRequest r;
    r.prompt = m->tokenizer->encode(prompts[i], true, false);
    r.max_tokens = 12 + int(i);
    r.sampling.temperature = i % 2 ? 0.9 : 0.0;
    r.sampling.seed = 100 + i;
    reqs.push_back(r);
  }
  // Alone: generate() on one session per request.
  std::vector<std::vector<int32_t>> alone;
  for (const SeqRequest& r : reqs) {
    Session s(*m, *be, 64);
    Sampler sampler(r.sampling);
    alone.push_back(generate(s, r.prompt, r.max_tokens, sampler, {}, nullptr).tokens);
  }
  auto sched = make_time_slice_scheduler(*m, *be, 3, 64, 8);
  std::vector<std::shared_ptr<SeqStream>> streams;
  for (const SeqRequest& r : reqs) streams.push_back(sched->submit(r));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_NE(streams[i], nullptr);
    Outcome o = collect(*streams[i]);
    EXPECT_EQ(o.ids, alone[i]) << prompts[i];
    EXPECT_EQ(o.finish, FinishReason::Length);
  }
}

// A greedy sequence alone queues the forward of each token before reading it; one that stops
// on a stop id leaves that forward's pick behind, which must not reach the next sequence.
TEST(Scheduler, AGreedySequenceThatStopsLeavesNoPickBehind) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  auto be = make_backend(DeviceSpec{});
  auto alone = [&](const std::string& text, int n) {
    Session s(*m, *be, 64);
    Sampler sampler(SamplerParams{});
    return generate(s, m->tokenizer->encode(text, true, false), n, sampler, {}, nullptr).tokens;
  };
  const std::vector<int32_t> a = alone("Once upon a time", 8), b = alone("The dog", 8);
  ASSERT_EQ(a.size(), 8u);
  auto sched = make_time_slice_scheduler(*m, *be, 1, 64, 4);
  SeqRequest ra;
  ra.prompt = m->tokenizer->encode("Once upon a time", true, false);
  ra.max_tokens = 8;
  ra.stop_ids = {a[5]};
  const size_t first = size_t(std::find(a.begin(), a.end(), a[5]) - a.begin());
  Outcome oa = collect(*sched->submit(ra));
  EXPECT_EQ(oa.finish, FinishReason::Stop);
  EXPECT_EQ(oa.ids, std::vector<int32_t>(a.begin(), a.begin() + long(first)));
  SeqRequest rb;
  rb.prompt = m->tokenizer->encode("The dog", true, false);
  rb.max_tokens = 8;
  Outcome ob = collect(*sched->submit(rb));
  EXPECT_EQ(ob.finish, FinishReason::Length);
  EXPECT_EQ(ob.ids, b);
  // A context that fills: as many tokens as generate gives in the same context.
  auto small = make_time_slice_scheduler(*m, *be, 1, 12, 4);
  SeqRequest rc = rb;
  rc.max_tokens = -1;
  Outcome oc = collect(*small->submit(rc));
  Session s(*m, *be, 12);
  Sampler sampler(SamplerParams{});
  EXPECT_EQ(oc.ids, generate(s, rc.prompt, -1, sampler, {}, nullptr).tokens);
  EXPECT_EQ(oc.finish, FinishReason::Length);
}

TEST(Scheduler, EchoScoresThePromptAndQueueAndCancel) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  auto be = make_backend(DeviceSpec{});
  auto sched = make_time_slice_scheduler(*m, *be, 1, 64, 1);
  SeqRequest echo;
  echo.prompt = m->tokenizer->encode("Once upon a time, there was", true, false);
  echo.max_tokens = 0;
  echo.prompt_logprobs = 3;
  Outcome o = collect(*sched->submit(echo));
  ASSERT_EQ(o.prompt.size(), echo.prompt.size() - 1);
  EXPECT_TRUE(o.ids.empty());
  // The same numbers as a teacher-forced forward's summarize.
  Session s(*m, *be, 64);
  s.forward(echo.prompt);
  std::vector<int32_t> targets(echo.prompt.begin() + 1, echo.prompt.end());
  targets.push_back(-1);
  const auto sum = s.summarize(3, targets);
  for (size_t t = 0; t + 1 < echo.prompt.size(); ++t) {
    EXPECT_EQ(o.prompt[t].id, echo.prompt[t + 1]);
    EXPECT_DOUBLE_EQ(o.prompt[t].logprob, sum[t].target_logit - sum[t].lse);
    ASSERT_EQ(o.prompt[t].top.size(), 3u);
    EXPECT_EQ(o.prompt[t].top[0].first, sum[t].top_ids[0]);
  }

  // One slot, one queue place: a long sequence holds the slot, one waits, the next is refused.
  // The model's whole context (511 tokens) outlasts the cancel that follows by far.
  auto wide = make_time_slice_scheduler(*m, *be, 1, m->config.max_pos, 1);
  SeqRequest long_run;
  long_run.prompt = {1};
  long_run.max_tokens = -1;
  auto a = wide->submit(long_run);
  auto b = wide->submit(long_run);
  auto c = wide->submit(long_run);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(c, nullptr) << "a full queue must refuse";
  a->cancel();
  EXPECT_EQ(collect(*a).finish, FinishReason::Cancelled);
  b->cancel();
  EXPECT_EQ(collect(*b).finish, FinishReason::Cancelled);
  for (int i = 0; i < 100 && wide->stats().active > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(wide->stats().active, 0);
  EXPECT_EQ(wide->stats().queued, 0);

  SeqRequest bad;
  EXPECT_THROW(sched->submit(bad), Error);  // empty prompt
  bad.prompt = std::vector<int32_t>(64, 5);
  EXPECT_THROW(sched->submit(bad), Error);  // does not fit the context
  bad.prompt = {m->config.vocab};
  EXPECT_THROW(sched->submit(bad), Error);  // outside the vocabulary
  bad.prompt = {1};
  bad.sampling.top_p = 0;
  EXPECT_THROW(sched->submit(bad), Error);  // bad sampling
}

}  // namespace
}  // namespace arbiter
