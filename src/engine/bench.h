// The measurement library behind `arbiter bench` (in the spirit of llama-bench): prompt
// processing and token generation throughput, first-token latency, peak memory and trace
// throughput, each next to a physical limit measured IN THE SAME RUN (memory read
// bandwidth and matmul peak), so every speed is also a fraction of what the machine can do.
//
// Method (docs/performance.md has the long form):
//   pp  one prefill of P tokens from an empty cache (after --depth D untimed tokens);
//       tok/s = P / time. A forward produces logits for every position (what a trace needs).
//   tg  N decode steps of one token each after D tokens of context, each step followed by
//       the greedy argmax the generation loop does; tok/s = N / time.
//   ttft  prefill of P tokens + the argmax that picks the first new token, in ms.
//   Repetitions are interleaved with the limit probes (the host is noisy); one warm-up of
//   each test runs first and is not counted. Means, sds and medians over repetitions.
//   decode limit = bytes read per token (every weight the step reads in its storage dtype,
//       plus the KV cache rows it attends over) / measured read bandwidth.
//   prefill limit = FLOPs per token (2 x matmul parameters incl. the output matrix, plus
//       causal attention 4 H Dh ctx per layer) / measured matmul peak.
//   CPU tiers (cpu, ref): bandwidth = multi-threaded streaming read of a 1 GiB buffer
//       with transparent huge pages; peak = the f32 FMA peak (Backend::peak_gflops: the cpu
//       tier's ISA on its threads; ref: the widest compiled ISA on -t threads).
//   Other tiers (cuda): bandwidth = the tier's device read probe (Backend::read_bandwidth_gbs:
//       a 2 GiB streaming read timed with device events), or, for a tier without one, its
//       add op over large buffers (reads 2, writes 1: a lower bound); peak = the tier's own
//       matmul on the model's weight shapes at M = P tokens.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace arbiter {

/// Summary of repeated measurements.
struct BenchStat {
  std::vector<double> samples;
  double mean = 0, sd = 0, median = 0, min = 0, max = 0;  // sd: sample sd (n - 1); 0 if n < 2
  bool empty() const { return samples.empty(); }
};
BenchStat bench_stat(const std::vector<double>& samples);

struct BenchOptions {
  int n_prompt = 512;   // P
  int n_gen = 128;      // N
  int reps = 5;
  int depth = 0;        // D
  int threads = 0;      // probe threads (<= 0: all cores); the tier got its own setting
  std::vector<std::string> shapes;  // trace shapes (timed by the caller: see BenchTrace)
  std::string corpus_path;
  std::string model_path;           // as given
  bool probes = true;               // measure the limits (off: report throughput only)
  uint64_t seed = 1;                // prompt token ids
  bool progress = true;             // status lines on stderr (core/progress.h)
};

/// Throughput of teacher-forced traces (verify::run_trace) of a named shape: one untimed
/// warm-up trace, then `reps` timed ones; positions_per_s is their median, elapsed_s and
/// forward_tokens_per_s follow from it.
struct BenchTrace {
  std::string shape;
  int64_t rows = 0;
  double elapsed_s = 0;
  double positions_per_s = 0;
  BenchStat positions_per_s_reps;  // every timed repetition
  // Tokens the forwards processed (each chunk's context pass + its W traced tokens) per
  // second: for shapes with a context (w8, w1ctx512, ...) most of the work is the context.
  int64_t forward_tokens = 0;
  double forward_tokens_per_s = 0;
  std::string error;  // non-empty: the shape could not run (e.g. corpus too short)
};

struct BenchReport {
  BenchOptions opt;
  // What ran.
  std::string model_path, arch, format, weight_dtype;
  int n_layer = 0, d_model = 0, vocab = 0;
  int64_t n_params = 0;
  uint64_t weight_bytes = 0;  // all tensor bytes the model holds (storage dtype)
  /// weight_bytes by storage type, largest first (a quantized GGUF mixes its recipe's block
  /// types with f32 norms): the text names each type's share.
  std::vector<std::pair<std::string, uint64_t>> weight_types;
  int64_t state_bytes = 0;    // the session's KV caches and scratch on the tier
  int state_ctx = 0;          // the positions that state holds
  std::string device, compute;
  /// The tier's activations rounded on the fly during the run (OpStats::act_quant: "bf16",
  /// "q8_0,q8_K", ...; the trace header's act_quant line), empty when none.
  std::string act_quant;
  int threads = 0;
  std::string host_cpu;       // /proc/cpuinfo model name
  int host_cores = 0;
  std::string build;          // version + commit
  // Throughput.
  BenchStat pp_tok_s, tg_tok_s, ttft_ms;
  // Memory.
  int64_t peak_rss_bytes = -1;       // VmHWM over the model phases, -1 if unknown
  bool peak_rss_includes_probes = false;
  // Limits (0 when not measured).
  BenchStat bandwidth_gbs;           // 1e9 bytes/s
  std::string bandwidth_source;
  BenchStat matmul_gflops;
  std::string matmul_source;
  double decode_bytes_per_token = 0, decode_weight_bytes = 0, decode_kv_bytes = 0;
  double decode_limit_tok_s = 0, decode_fraction = 0, decode_achieved_gbs = 0;
  double prefill_flops_per_token = 0, prefill_limit_tok_s = 0, prefill_fraction = 0;
  double prefill_achieved_gflops = 0;
  // The same fractions per repetition, each against the probes taken just before it: on a
  // host whose bandwidth drifts, their spread shows how much the ratio of medians can be
  // trusted.
  BenchStat decode_fraction_per_rep, prefill_fraction_per_rep;
  std::vector<BenchTrace> traces;
};

/// Bytes one decode step at context ctx reads: weights and per-sequence state, as the
/// model's architecture counts them (model/arch.h), at kv_elem_bytes per cached element.
/// The weight part in *weights if given. FLOPs: Arch::flops_per_token.
double decode_bytes_per_token(const Model& m, double ctx, int kv_elem_bytes, double* weights = nullptr);

/// Runs pp, tg and the limit probes on a loaded model and a tier. Throws arbiter::Error on
/// bad options (P or N < 1, reps < 1, depth < 0). Trace timing lives above the engine
/// layer (src/cli/cmd_bench.cpp runs verify::run_trace per shape and fills r.traces).
BenchReport run_bench(const Model& m, Backend& be, const BenchOptions& opt);
/// Raises r.peak_rss_bytes to the process's current VmHWM (after extra phases).
void bench_note_peak_rss(BenchReport& r);

/// A human table (llama-bench style) plus the limits, for stdout.
std::string bench_report_text(const BenchReport& r);
/// The same as one JSON object (schema "arbiter-bench" 1; docs/performance.md).
std::string bench_report_json(const BenchReport& r);

/// Continuous batching at one concurrency (`bench --concurrency`): `streams` greedy sequences
/// of opt.n_prompt pseudo-random prompt tokens (each its own) and opt.n_gen new tokens, all
/// submitted at once to one make_batching_scheduler of `streams` slots; one untimed round,
/// then opt.reps timed ones, each after the limit probes (unless opt.probes is off). ttft:
/// from the submit to a sequence's first token (the batched prefills it shared included), the
/// mean over the sequences. decode: the tokens that arrive after every sequence has its first
/// one, over the time from then to the last token: the aggregate rate while all of them
/// decode together.
/// The roofline of that rate, at the decode's mean context c = P + N/2: a step of `streams`
/// rows reads the weights they need once (Arch::weight_bytes_per_step) and each row's K/V, so
/// bandwidth limit = streams x read bandwidth / (weights + streams x K/V(c)); compute limit =
/// the peak / the FLOPs of one token at c. The smaller one binds.
struct BatchBenchResult {
  int streams = 0;
  BenchStat ttft_ms, decode_tok_s;
  BenchStat bandwidth_gbs, peak_gflops;  // the probes (empty without them)
  std::string bandwidth_source, peak_source;
  double step_bytes = 0, flops_per_token = 0, context = 0;
  double bandwidth_limit_tok_s = 0, compute_limit_tok_s = 0;  // from the probes' medians
  std::string bound;                   // "bandwidth" or "compute"
  double fraction = 0;                 // decode median / the binding limit
  BenchStat fraction_per_rep;          // each repetition against its own probes
};
BatchBenchResult run_batch_bench(const Model& m, Backend& be, int streams, const BenchOptions& opt);
/// The results of every level as one JSON object (schema "arbiter-bench-concurrency" 1).
std::string batch_bench_json(const std::vector<BatchBenchResult>& levels, const BenchOptions& opt,
                             const std::string& device);

}  // namespace arbiter
