// GET /metrics' exposition (server/metrics.h) from a real scheduler's stats: under continuous
// batching the paged KV pool's gauges, the preemption and forward counters and the last
// forward's rows move when the pool is used, and are back at rest after; time slicing, which
// has no pool, prints none of them.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <thread>

#include "backend/backend.h"
#include "engine/scheduler.h"
#include "server/metrics.h"
#include "test_util.h"

namespace arbiter::server {
namespace {

using namespace std::chrono_literals;

// The value of metric `name` (a line "name value"), or -1 when absent.
int64_t value(const std::string& text, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("\n" + name + " (-?[0-9]+)\n"))) return -1;
  return std::stoll(m[1]);
}

// The engine thread updates the gauges after the step whose events were seen: wait (up to
// 5 s) until the stats say what that step did.
template <class Pred>
Scheduler::Stats settled(const Scheduler& s, Pred pred) {
  Scheduler::Stats st = s.stats();
  for (int i = 0; i < 500 && !pred(st); ++i) {
    std::this_thread::sleep_for(10ms);
    st = s.stats();
  }
  return st;
}

void drain(SeqStream& s) {
  for (int i = 0; i < 100000; ++i) {
    auto ev = s.next(100ms);
    if (ev && ev->kind == SeqEvent::Kind::Finished) return;
  }
  ADD_FAILURE() << "sequence never finished";
}

TEST(ServerMetrics, ShowThePagedPoolMovingUnderContinuousBatching) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  auto be = make_backend(DeviceSpec{"cpu", "", 0, ""});
  Metrics metrics;
  BatchingOptions o;
  o.ctx = 512;  // a sequence that runs long enough to be seen running
  o.slots = 1;
  auto s = make_batching_scheduler(*m, *be, o);
  std::string t = metrics.render(s->stats());
  EXPECT_EQ(value(t, "arbiter_kv_blocks"), 32) << t;
  EXPECT_EQ(value(t, "arbiter_kv_blocks_used"), 0);
  EXPECT_EQ(value(t, "arbiter_kv_blocks_free"), 32);
  EXPECT_EQ(value(t, "arbiter_preemptions_total"), 0);
  EXPECT_EQ(value(t, "arbiter_batched_forwards_total"), 0);
  EXPECT_EQ(value(t, "arbiter_batch_rows"), 0);

  // One sequence running until cancelled: it holds blocks while it runs.
  SeqRequest r;
  r.prompt = m->tokenizer->encode("Once upon a time there was a little dog", true, false);
  r.max_tokens = -1;
  auto st = s->submit(r);
  ASSERT_NE(st, nullptr);
  auto ev = st->next(10s);
  ASSERT_TRUE(ev && ev->kind == SeqEvent::Kind::Token);
  t = metrics.render(settled(*s, [](const Scheduler::Stats& x) { return x.steps >= 1 && x.active == 1; }));
  EXPECT_GE(value(t, "arbiter_kv_blocks_used"), 1) << t;
  EXPECT_EQ(value(t, "arbiter_kv_blocks_used") + value(t, "arbiter_kv_blocks_free"), 32);
  EXPECT_GE(value(t, "arbiter_batched_forwards_total"), 1);
  EXPECT_GE(value(t, "arbiter_batch_rows"), 1);
  EXPECT_EQ(value(t, "arbiter_active_sequences"), 1);
  st->cancel();
  drain(*st);

  // Seven at once in a pool of one context of three blocks: preemptions.
  o.ctx = 48;
  o.slots = 7;
  o.kv_blocks = 3;
  s.reset();  // one batching scheduler on a backend at a time (each sets it row-invariant)
  s = make_batching_scheduler(*m, *be, o);
  std::vector<std::shared_ptr<SeqStream>> streams;
  for (int i = 0; i < 7; ++i) {
    SeqRequest q;
    q.prompt = {1, int32_t(10 + i), int32_t(20 + i), 5, 6, 7, 8, 9, 10, 11};
    q.max_tokens = 20;  // 30 positions: 2 blocks
    streams.push_back(s->submit(q));
    ASSERT_NE(streams.back(), nullptr);
  }
  for (auto& q : streams) drain(*q);
  t = metrics.render(settled(*s, [](const Scheduler::Stats& x) { return x.active == 0; }));
  EXPECT_GE(value(t, "arbiter_preemptions_total"), 1) << t;
  EXPECT_EQ(value(t, "arbiter_kv_blocks_used"), 0);
  EXPECT_EQ(value(t, "arbiter_kv_blocks_free"), 3);
  EXPECT_EQ(value(t, "arbiter_active_sequences"), 0);
  EXPECT_EQ(value(t, "arbiter_queue_depth"), 0);
}

TEST(ServerMetrics, TimeSlicingHasNoPoolLines) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  auto be = make_backend(DeviceSpec{"cpu", "", 0, ""});
  auto s = make_time_slice_scheduler(*m, *be, 2, 64, 8);
  const std::string t = Metrics().render(s->stats());
  EXPECT_EQ(value(t, "arbiter_slots"), 2) << t;
  EXPECT_EQ(t.find("arbiter_kv_blocks"), std::string::npos) << t;
  EXPECT_EQ(t.find("arbiter_preemptions_total"), std::string::npos) << t;
}

}  // namespace
}  // namespace arbiter::server
