#include "core/thread_pool.h"

#include <immintrin.h>

#include <chrono>

#include "core/error.h"

namespace arbiter {

namespace {
// Set while a thread runs a chunk: nested parallel_for calls then run inline.
thread_local bool tl_in_chunk = false;

// How long a waiting thread spins (pause instructions) before it sleeps in a futex wait:
// long enough to bridge the gap between two ops of one decode step (a few microseconds of
// single-threaded work), short enough not to burn a shared core for long when idle.
// Measured in time, not iterations: pause takes ~10 cycles on some cores and ~140 on others.
constexpr auto kSpinTime = std::chrono::microseconds(200);

// Returns the first value of a for which done(value) holds.
template <class T, class Pred>
T spin_then_wait(const std::atomic<T>& a, Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 1;; ++i) {
    T v = a.load(std::memory_order_acquire);
    if (done(v)) return v;
    _mm_pause();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
  }
  for (;;) {
    T v = a.load(std::memory_order_acquire);
    if (done(v)) return v;
    a.wait(v, std::memory_order_acquire);  // futex: sleeps while a still equals v
  }
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::thread::hardware_concurrency());
  n_threads_ = threads < 1 ? 1 : threads;
  try {
    workers_.reserve(size_t(n_threads_ - 1));
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
  } catch (const std::exception& e) {
    // The system's thread limit (or memory for the stacks): stop the workers already
    // started, which would otherwise terminate the process as joinable threads.
    const size_t started = workers_.size();
    stop_workers();
    throw Error(strformat("[threads] cannot start %d threads (started %zu: %s)", n_threads_, started + 1, e.what()));
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void ThreadPool::run_chunk(int64_t chunk) {
  const int64_t b = n_ * chunk / parts_, e = n_ * (chunk + 1) / parts_;
  if (b < e) {
    tl_in_chunk = true;
    try {
      tramp_(ctx_, b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    tl_in_chunk = false;
  }
  if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == parts_) done_.notify_one();
}

void ThreadPool::work(int index) {
  if (!dynamic_) {
    if (index < parts_) run_chunk(index);
    return;
  }
  for (int64_t c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < parts_;) run_chunk(c);
}

void ThreadPool::worker_main(int index) {
  uint64_t seen = 0;
  for (;;) {
    seen = spin_then_wait(generation_, [&](uint64_t g) { return g != seen; });
    if (stop_.load(std::memory_order_acquire)) return;
    inside_.fetch_add(1);
    // Join only the job of the generation seen, and only while it is open: a worker that
    // woke late for a job already finished leaves without touching its fields.
    if (open_gen_.load() == seen) work(index);
    if (inside_.fetch_sub(1) == 1) inside_.notify_one();
  }
}

void ThreadPool::run(int64_t n, int64_t dynamic_parts, Trampoline tramp, void* ctx) {
  if (n <= 0) return;
  if (tl_in_chunk || n_threads_ == 1 || n == 1) {
    tramp(ctx, 0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  tramp_ = tramp;
  ctx_ = ctx;
  n_ = n;
  dynamic_ = dynamic_parts > 0;
  const int64_t want = dynamic_ ? dynamic_parts : int64_t(n_threads_);
  parts_ = n < want ? n : want;
  error_ = nullptr;
  next_.store(0, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  // Opened before it is published: a worker that wakes for this generation finds it open
  // (unless it is already finished), and one still holding the previous generation does
  // not mistake it for its own.
  const uint64_t g = generation_.load() + 1;
  open_gen_.store(g);
  generation_.store(g);
  generation_.notify_all();
  work(0);
  spin_then_wait(done_, [&](int64_t v) { return v == parts_; });
  open_gen_.store(0);
  // The store above and the loads of inside_ below must not pass each other (the
  // handshake in thread_pool.h); spin_then_wait's loads are only acquire loads.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  spin_then_wait(inside_, [](int v) { return v == 0; });
  if (error_) std::rethrow_exception(error_);
}

}  // namespace arbiter
