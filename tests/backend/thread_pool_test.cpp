// ThreadPool (src/core/thread_pool.h): coverage, the documented static chunking, exceptions,
// nesting, many back-to-back jobs (the decode pattern), and the dynamically claimed chunks.
// Lives with the backend tests because the CPU tier is its only user.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace arbiter {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnceWithDocumentedChunks) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(2), int64_t(3), int64_t(7),
                      int64_t(1000)}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + " n " + std::to_string(n));
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::mutex m;
      std::vector<std::pair<int64_t, int64_t>> chunks;
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        {
          std::lock_guard<std::mutex> lock(m);
          chunks.emplace_back(b, e);
        }
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "index " << i;
      // Chunk i of P = min(threads, n) is [n*i/P, n*(i+1)/P) (n = 1 runs inline as [0, 1)).
      std::sort(chunks.begin(), chunks.end());
      const int64_t P = std::min<int64_t>(threads, n);
      if (n > 0) {
        ASSERT_EQ(int64_t(chunks.size()), P);
        for (int64_t i = 0; i < P; ++i) {
          EXPECT_EQ(chunks[size_t(i)].first, n * i / P);
          EXPECT_EQ(chunks[size_t(i)].second, n * (i + 1) / P);
        }
      } else {
        EXPECT_TRUE(chunks.empty());
      }
    }
  }
}

TEST(ThreadPool, UsesSeveralThreads) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one hardware thread";
  ThreadPool pool(2);
  std::mutex m;
  std::vector<std::thread::id> ids;
  pool.parallel_for(2, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(m);
    ids.push_back(std::this_thread::get_id());
  });
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_NE(ids[0], ids[1]);
}

TEST(ThreadPool, RethrowsAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(9,
                                 [](int64_t b, int64_t) {
                                   if (b >= 3) throw std::runtime_error("chunk failed");
                                 }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> count{0};
  pool.parallel_for(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) { count += e2 - b2; });
  });
  EXPECT_EQ(count.load(), 40);
}

TEST(ThreadPool, ManySmallJobsBackToBack) {
  ThreadPool pool(0);  // all cores
  EXPECT_GE(pool.size(), 1);
  std::vector<int64_t> v(64, 0);
  for (int rep = 0; rep < 20000; ++rep)
    pool.parallel_for(int64_t(v.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) v[size_t(i)] += 1;
    });
  for (int64_t x : v) EXPECT_EQ(x, 20000);
}

TEST(ThreadPool, JobsAfterIdleSleepStillRun) {
  ThreadPool pool(2);
  std::atomic<int> n{0};
  pool.parallel_for(2, [&](int64_t b, int64_t e) { n += int(e - b); });
  // Long enough for the workers to stop spinning and block in the futex wait.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  pool.parallel_for(2, [&](int64_t b, int64_t e) { n += int(e - b); });
  EXPECT_EQ(n.load(), 4);
}

TEST(ThreadPool, DynamicCoversEveryIndexExactlyOnceWithDocumentedChunks) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {int64_t(1), int64_t(5), int64_t(64), int64_t(1000)}) {
      for (int64_t parts : {int64_t(1), int64_t(7), int64_t(24)}) {
        std::mutex m;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        pool.parallel_for_dynamic(n, parts, [&](int64_t b, int64_t e) {
          std::lock_guard<std::mutex> lock(m);
          chunks.emplace_back(b, e);
        });
        std::sort(chunks.begin(), chunks.end());
        const int64_t P = std::min(n, parts);
        if (threads == 1 || n == 1) {  // run inline: one call over [0, n)
          ASSERT_EQ(chunks.size(), 1u);
          EXPECT_EQ(chunks[0], std::make_pair(int64_t(0), n));
          continue;
        }
        ASSERT_EQ(int64_t(chunks.size()), P) << "threads " << threads << " n " << n << " parts " << parts;
        for (int64_t i = 0; i < P; ++i) {
          EXPECT_EQ(chunks[size_t(i)].first, n * i / P);
          EXPECT_EQ(chunks[size_t(i)].second, n * (i + 1) / P);
        }
      }
    }
  }
}

// A worker that stops in the middle of its chunk (as when the host takes its core away)
// leaves the other chunks to the caller: here the worker's chunk waits until every other
// chunk is done, which only finishes when the caller claims them. Static chunks would
// deadlock; the 10 s cap turns that into a failure instead of a hang.
TEST(ThreadPool, DynamicChunksDoNotWaitForAStalledWorker) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one hardware thread";
  ThreadPool pool(2);
  const auto caller = std::this_thread::get_id();
  for (int rep = 0; rep < 20; ++rep) {
    const int64_t parts = 8;
    std::atomic<int64_t> done{0};
    std::atomic<bool> timed_out{false};
    pool.parallel_for_dynamic(parts, parts, [&](int64_t b, int64_t e) {
      if (std::this_thread::get_id() != caller) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (done.load() < parts - (e - b))
          if (std::chrono::steady_clock::now() > deadline) {
            timed_out = true;
            break;
          }
      }
      done += e - b;
    });
    EXPECT_EQ(done.load(), parts);
    ASSERT_FALSE(timed_out.load()) << "rep " << rep << ": the caller did not take the stalled worker's chunks";
  }
}

}  // namespace
}  // namespace arbiter
