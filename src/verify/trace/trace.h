// Teacher-forced logit traces (DESIGN.md §3, docs/traces.md): the header, one row per
// traced position, an atomic writer, a strict reader that also accepts other engines'
// 6-column logit_trace TSV, and the named shapes. The trace *runner* lives elsewhere; it
// fills a TraceHeader, calls TraceWriter::open, write_row per position and finish.
#pragma once
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/atomic_file.h"
#include "io/file.h"

namespace arbiter::verify {

/// Format version written in `# arbiter-trace<TAB>1`.
constexpr int kTraceFormatVersion = 1;

/// A named trace shape (DESIGN.md §3 table): W = chunk_tokens positions per traced forward,
/// max_chunks chunks, prefill P corpus tokens of untraced context before each chunk,
/// start_token S the corpus index where chunk 0's traced tokens begin.
struct TraceShape {
  std::string name;
  int chunk_tokens = 0;  // W
  int max_chunks = 0;    // C
  int prefill = 0;       // P
  int start_token = 0;   // S
  std::string models;    // what the shape stands for (documentation only)
};

/// The five named shapes, in DESIGN.md order.
const std::vector<TraceShape>& named_shapes();
/// The shape called name; throws arbiter::Error listing the known names when there is none.
TraceShape named_shape(const std::string& name);

/// The `# routes` header line (docs/traces.md §"Routes"): which layers route and how.
/// layers empty = the trace records no routing (a dense model, an older trace, a foreign one).
struct TraceRoutesHeader {
  int64_t experts = -1, top_k = -1;  // E, k
  std::string score;                 // what the margins are differences of
  std::vector<int> layers;           // the MoE layers, ascending
};

/// One token's routing at one layer: the k experts chosen, by descending selection score,
/// and the router's margin (k-th minus (k+1)-th selection score; inf when k == E).
struct TraceRoute {
  std::vector<int32_t> ids;
  double margin = 0;
};

/// Every header field of DESIGN.md §3. Unknown values (foreign traces, or a header line
/// that is absent) are "" for strings and -1 for numbers.
struct TraceHeader {
  // # model <path> sha256 <hex> arch <arch> params <n>
  std::string model_path, model_sha256, model_arch;
  int64_t model_params = -1;
  // # tokenizer sha256 <hex> bos <id|none>
  std::string tokenizer_sha256;
  std::string tokenizer_bos;  // decimal token id, "none" (no BOS), or "" unknown
  // # corpus <path> sha256 <hex> tokens <N>
  std::string corpus_path, corpus_sha256;
  int64_t corpus_tokens = -1;
  // # shape <name> chunk_tokens <W> max_chunks <C> topk <K> prefill <P> start_token <S>
  std::string shape_name;
  int64_t chunk_tokens = -1, max_chunks = -1, topk = -1, prefill = -1, start_token = -1;
  // # device <ref|cpu|cuda:0 NVIDIA H200> compute <f64|f32|bf16|f16> weights <dtype>
  std::string device, compute, weights;
  // # providers <op>=<provider>:<calls>,... fallbacks <n>
  std::string providers;
  int64_t fallbacks = -1;
  // # act_quant <kinds>: only when some op ran on activations quantized on the fly (the cpu
  // tier's integer dot kernels: "q8_0", "q8_K", comma-separated); empty = the line is absent.
  std::string act_quant;
  // # inject <spec|none>
  std::string inject;
  // # build <version> <git commit> <compiler> <cuda version|none>
  std::string build_version, build_commit, build_compiler, build_cuda;
  // # env <ARBITER_* variables set, or none>: each "NAME=value"; empty = none
  std::vector<std::string> env;
  // # routes experts <E> top_k <k> score <softmax|logit|sigmoid> layers <l,l,...>: present
  // when the model routes tokens to experts; every row then has a `routes` column holding,
  // for each of these layers in this order, the k experts chosen and the router's margin.
  TraceRoutesHeader routes;
  // Any other `# key<TAB>values...` line, in file order: key -> values joined by TAB.
  // Arbiter traces keep unknown keys (newer writers); foreign traces keep all metadata.
  std::vector<std::pair<std::string, std::string>> extra;

  /// Fills shape_name/chunk_tokens/max_chunks/prefill/start_token from a named shape.
  void set_shape(const TraceShape& s, int64_t topk_);
};

/// One traced position. abs_pos is the corpus index of target; nll = lse - target_logit in
/// nats; lse = log-sum-exp of the full-vocabulary logits; top_ids/top_logits the K largest
/// raw logits, descending, ties broken by lower id. Unknown values (foreign traces): abs_pos
/// -1, target_logit and lse NaN, with Trace::has_* false.
struct TraceRow {
  int chunk = 0, pos = 0;
  int64_t abs_pos = -1;
  int32_t target = 0;
  double nll = 0, target_logit = 0, lse = 0;
  std::vector<int32_t> top_ids;
  std::vector<double> top_logits;
  std::vector<TraceRoute> routes;  // one per TraceHeader::routes.layers entry; empty: none
};

/// Arbiter: format v1. Foreign: another engine's 6-column TSV. LogprobsJsonl: OpenAI/vLLM
/// completions replies with prompt logprobs, one chunk a line (logprobs_jsonl.h).
enum class TraceFormat { Arbiter, Foreign, LogprobsJsonl };

/// Lines before a foreign trace's first `#` header line that the reader skipped: another
/// engine's loader output ("[NemotronH] Loading config..."). first: the first of them, cut
/// to at most kPreambleFirstBytes bytes.
struct TracePreamble {
  int64_t lines = 0;
  std::string first;
};

/// Bounds of a foreign trace's preamble: a file with no `#` line within them is refused as
/// not a trace, with one message naming its first line, instead of being searched further.
constexpr size_t kMaxPreambleLines = 1000;
constexpr size_t kMaxPreambleBytes = size_t(1) << 20;
constexpr size_t kPreambleFirstBytes = 200;

/// A trace read from disk. rows are in file order (full-logits files follow this order).
struct Trace {
  std::string path;
  TraceFormat format = TraceFormat::Arbiter;
  TraceHeader header;
  std::vector<TraceRow> rows;
  double elapsed_s = std::numeric_limits<double>::quiet_NaN();  // from `# end`; NaN unknown
  bool has_abs_pos = true, has_target_logit = true, has_lse = true;  // false: foreign
  int64_t nonfinite_values = 0;  // NaN/Inf among nll, target_logit, lse, top_logits read
  int64_t nonfinite_rows = 0;    // rows holding at least one of them
  TracePreamble preamble;        // foreign traces only; an arbiter trace has none
};

/// Reads an arbiter trace (format v1) or a foreign 6-column logit_trace TSV, detected from
/// the first line. A foreign trace may start with a preamble of non-`#` lines before its
/// first `#` line (bounded by kMaxPreambleLines / kMaxPreambleBytes); an arbiter trace may
/// not. Throws arbiter::Error "[trace] PATH:LINE: what" on anything malformed, on an arbiter
/// trace without its `# end` line, or when the row count differs from `# end`.
Trace read_trace(const std::string& path);
/// The same over a trace's bytes already in memory (path names it in messages).
Trace parse_trace(const std::string& data, const std::string& path);

/// Formats a value as the trace format does: %.9g, and nan / inf / -inf.
std::string format_trace_float(double v);

/// Writes an arbiter trace to PATH.tmp.<pid>, renamed to PATH by finish(). Destroying an
/// unfinished writer removes the temporary file, so a crashed or failed run leaves no
/// trace that looks complete.
class TraceWriter {
 public:
  TraceWriter() = default;
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  /// Creates the temporary file and writes the header. header.topk must be >= 1 (every row
  /// then carries exactly that many ids and logits). Throws arbiter::Error on I/O failure
  /// or a header value holding a TAB or newline.
  void open(const std::string& path, const TraceHeader& header);
  /// Appends one row; throws arbiter::Error when top_ids/top_logits do not hold topk entries,
  /// or its routes do not match the header's (one per layer, k ids each; none without).
  void write_row(const TraceRow& row);
  /// Writes `# end<TAB>rows<TAB>N<TAB>elapsed_s<TAB>T`, flushes, fsyncs and renames onto the
  /// final path. Throws arbiter::Error on I/O failure (the temporary file is then removed).
  void finish(double elapsed_s);

  int64_t rows() const { return rows_; }
  /// NaN/Inf values written so far (nll, target_logit, lse, top_logits); the runner exits
  /// non-zero when this is non-zero.
  int64_t nonfinite_values() const { return nonfinite_; }
  const std::string& temp_path() const { return file_.temp_path(); }

 private:
  AtomicFile file_;
  int64_t topk_ = 0;
  TraceRoutesHeader routes_;
  int64_t rows_ = 0;
  int64_t nonfinite_ = 0;
};

/// Full-logits side file (docs/traces.md §"Full-logits side file"): 15-byte magic
/// "arbiter-logits\0", u32 version (1), u64 rows, u32 vocab, then rows x vocab float32,
/// all little-endian, rows in the trace's row order. Written atomically like traces.
constexpr char kLogitsMagic[15] = {'a', 'r', 'b', 'i', 't', 'e', 'r', '-',
                                   'l', 'o', 'g', 'i', 't', 's', '\0'};
constexpr uint32_t kLogitsVersion = 1;
constexpr size_t kLogitsHeaderBytes = 15 + 4 + 8 + 4;

class LogitsWriter {
 public:
  LogitsWriter() = default;
  LogitsWriter(const LogitsWriter&) = delete;
  LogitsWriter& operator=(const LogitsWriter&) = delete;

  /// Creates PATH.tmp.<pid> for rows of `vocab` logits (V).
  void open(const std::string& path, uint32_t vocab);
  /// Appends one row of V float32 logits.
  void write_row(const float* logits);
  /// Patches the row count into the header, fsyncs and renames onto the final path.
  void finish();
  uint64_t rows() const { return rows_; }

 private:
  AtomicFile file_;
  uint32_t vocab_ = 0;
  uint64_t rows_ = 0;
};

/// Random access to a full-logits file; validates magic, version and exact file size.
class LogitsReader {
 public:
  /// Throws arbiter::Error "[logits] PATH: what" on a malformed or truncated file.
  explicit LogitsReader(const std::string& path);
  ~LogitsReader();
  LogitsReader(const LogitsReader&) = delete;
  LogitsReader& operator=(const LogitsReader&) = delete;

  uint64_t rows() const { return rows_; }
  uint32_t vocab() const { return vocab_; }
  const std::string& path() const { return path_; }
  /// Reads row i (V float32 logits) into out (resized to V); returns how many of them are
  /// NaN or Inf, which the caller must count (a non-finite logit is never skipped).
  int64_t read_row(uint64_t i, std::vector<float>& out) const;

 private:
  std::string path_;
  std::unique_ptr<InputFile> f_;
  uint64_t rows_ = 0;
  uint32_t vocab_ = 0;
};

}  // namespace arbiter::verify
