// A persistent thread pool with static or dynamically claimed chunks, for the CPU tier's
// kernels.
//
// Determinism contract: parallel_for only decides WHICH thread runs a range of work items;
// it never splits one item's arithmetic across threads. Kernels that compute each output
// element inside one item with a fixed reduction order therefore give bit-identical results
// for any thread count (tests/backend/thread_pool_test.cpp, determinism_test.cpp check this).
//
// Latency matters more than throughput here: a decode step issues ~10 parallel ops per layer,
// each a few tens of microseconds long, so workers spin briefly before they sleep (a futex
// wake-up costs about as much as a small op).
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace arbiter {

class ThreadPool {
 public:
  /// threads <= 0: std::thread::hardware_concurrency(). The caller's thread is one of them,
  /// so size() - 1 workers are started. Throws arbiter::Error when the system cannot start
  /// that many (the CLI caps -t at the hardware's threads first: cli/common.h).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Number of threads that run chunks (the caller included).
  int size() const { return n_threads_; }

  /// Calls fn(begin, end) on P = min(size(), n) disjoint chunks covering [0, n): chunk i is
  /// [n*i/P, n*(i+1)/P) and runs on thread i (the caller runs chunk 0). Returns when all are
  /// done; rethrows the first exception a chunk threw. A call from inside a chunk (nested)
  /// runs fn(0, n) inline. Calls from different outside threads are serialised.
  template <class F>
  void parallel_for(int64_t n, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n, 0, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  /// The same over P = min(parts, n) chunks with the same boundaries, but each chunk runs on
  /// whichever thread claims it first (an atomic counter), the caller included: when the
  /// host takes a core away from one thread (a shared 2-vCPU machine does), the others
  /// finish its chunks instead of waiting for it, and the call returns once every chunk is
  /// done, without waiting for a worker that never woke. Which thread runs a chunk varies
  /// from call to call, so fn must give the same result wherever a chunk runs.
  template <class F>
  void parallel_for_dynamic(int64_t n, int64_t parts, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n, parts < 1 ? 1 : parts, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using Trampoline = void (*)(void* ctx, int64_t begin, int64_t end);
  // dynamic_parts 0: static chunks, one per thread; > 0: that many claimed chunks.
  void run(int64_t n, int64_t dynamic_parts, Trampoline tramp, void* ctx);
  void worker_main(int index);
  void stop_workers();
  void run_chunk(int64_t chunk);
  // Runs the chunks this thread gets (thread `index`'s static chunk, or claimed ones).
  void work(int index);

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time

  // The current job: written by the caller while no worker is inside_ (below), then
  // published by bumping generation_ and opening it.
  Trampoline tramp_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t parts_ = 0;
  bool dynamic_ = false;
  std::atomic<uint64_t> generation_{0};
  // A worker reads the job's fields only between inside_ += 1 and -= 1, and only after it
  // found open_gen_ equal to the generation it woke for; the caller closes the job
  // (open_gen_ = 0) and waits for inside_ == 0 before it returns, so the next job's writes
  // race with no reader. Both sides use sequentially consistent operations: either the
  // worker sees the job closed or the caller sees the worker inside.
  std::atomic<uint64_t> open_gen_{0};
  std::atomic<int> inside_{0};
  std::atomic<int64_t> next_{0};  // dynamic: the next unclaimed chunk
  std::atomic<int64_t> done_{0};  // chunks finished
  std::atomic<bool> stop_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace arbiter
