// The engine loop behind `arbiter serve`: requests come in as sequences (token ids plus
// sampling settings), results go out as a stream of events per sequence. The HTTP layer
// (src/server/) only sees this interface, so a continuous-batching scheduler (paged KV
// cache, batched kernels) can replace the time-slicing one without touching it.
//
// Threads: submit(), stats() and a SeqStream's next()/cancel() may be called from any
// thread; all model work happens on the scheduler's own engine thread.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/inject.h"
#include "engine/kv_pool.h"
#include "engine/sampler.h"
#include "model/model.h"

namespace arbiter {

class Backend;

/// One position's log-probabilities under the model's own distribution (raw logits, before
/// penalties and temperature): the chosen or given token's, and the top ones (descending,
/// ties to the lower id).
struct TokenLogprob {
  int32_t id = -1;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;
};

struct SeqRequest {
  std::vector<int32_t> prompt;  // non-empty, shorter than the context
  int max_tokens = 16;          // new tokens; < 0: until a stop id or the context is full
  SamplerParams sampling;
  PenaltyParams penalties;
  int top_logprobs = -1;     // per generated token: -1 none, else that many top entries
  int prompt_logprobs = -1;  // per prompt token after the first (echo): -1 none, else top-N
  std::vector<int32_t> stop_ids;  // ending ids (not emitted)
};

enum class FinishReason { Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct SeqEvent {
  enum class Kind { Prompt, Token, Finished };
  Kind kind = Kind::Token;
  std::vector<TokenLogprob> prompt;  // Prompt: tokens 1..n-1 of the prompt (with logprobs)
  TokenLogprob token;                // Token: the new token (logprobs when asked)
  FinishReason finish = FinishReason::Stop;  // Finished
  std::string error;                         // Finished with Error: the message
};

/// One sequence's events, from the engine thread to whoever waits for them. Ends with
/// exactly one Finished event.
class SeqStream {
 public:
  void push(SeqEvent e);
  /// The next event, waiting up to timeout; nullopt on timeout.
  std::optional<SeqEvent> next(std::chrono::milliseconds timeout);
  /// Asks the engine to stop this sequence (client gone, stop string seen); it then
  /// finishes with Cancelled at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SeqEvent> events_;
  std::atomic<bool> cancelled_{false};
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  /// Queues a sequence. Returns nullptr when the queue is full (the caller answers 503).
  /// Throws arbiter::Error for a request it can never run (empty prompt, prompt not shorter
  /// than the context, an id outside the vocabulary).
  virtual std::shared_ptr<SeqStream> submit(SeqRequest r) = 0;
  struct Stats {
    int queued = 0;      // waiting for a slot
    int active = 0;      // holding a slot
    int slots = 0;       // --parallel
    int last_batch = 0;  // sequences advanced by the last engine round
    int kv_blocks = 0;   // continuous batching: blocks in the pool, and free ones
    int kv_free = 0;
    int64_t preempted = 0;  // continuous batching: sequences preempted so far
    int64_t steps = 0;      // continuous batching: batched forwards run so far
    int last_rows = 0;      // continuous batching: token rows of the last batched forward
  };
  virtual Stats stats() const = 0;
  /// Tokens one sequence may hold (prompt + generated).
  virtual int max_ctx() const = 0;
};

/// Time slicing: `slots` sessions (KV caches of ctx rows each, made up front); up to `slots`
/// sequences active, each round advances every active sequence by one step (its whole
/// prefill, or one token) in turn; at most queue_max sequences wait for a slot. inject: the
/// fault every session carries (serve --inject), so a faulty engine can be traced by API.
std::unique_ptr<Scheduler> make_time_slice_scheduler(const Model& m, Backend& be, int slots,
                                                     int ctx, int queue_max,
                                                     const InjectSpec& inject = {});

/// Continuous batching (docs/serve.md): up to `slots` sequences active; each round is ONE
/// batched forward (ForwardArgs::batch) of at most step_tokens rows: a row for every decoding
/// sequence, then prefill chunks of the others in admission order in what is left. K/V live
/// in a paged pool (engine/kv_pool.h) of kv_blocks blocks of kKvBlockRows positions (0: enough
/// for `slots` full contexts). A sequence is admitted when the pool can hold its tokens and
/// one more; a sequence that cannot grow preempts the youngest active one (maybe itself),
/// which frees its blocks and waits at the queue's head, to be recomputed from its prompt and
/// the tokens it already streamed. The tier runs row-invariant matmuls while this lives
/// (Backend::set_row_invariant), so with greedy sampling a request's tokens do not depend on
/// what else is in the batch (ref, cpu; cuda measures it: Backend::set_row_invariant). Only
/// families with a batched forward (Arch::make_batch_state): batching_problem() says why not.
struct BatchingOptions {
  int slots = 4;
  int ctx = 2048;  // tokens one sequence may hold (prompt + generated)
  int queue_max = 64;
  int kv_blocks = 0;
  int step_tokens = 256;  // rows of one forward (>= slots)
};
std::unique_ptr<Scheduler> make_batching_scheduler(const Model& m, Backend& be,
                                                   const BatchingOptions& o);
/// Why make_batching_scheduler cannot serve m on be, in one line, or "" when it can.
std::string batching_problem(const Model& m, Backend& be);

/// The log-probabilities of a logits row [V]: target's (when target >= 0) and the top n.
TokenLogprob row_logprobs(const std::vector<double>& logits, int32_t target, int n);

}  // namespace arbiter
