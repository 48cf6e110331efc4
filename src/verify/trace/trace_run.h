// The trace runner: teacher-forces a corpus through a Session and writes a trace
// (DESIGN.md §3). Per chunk: a fresh cache, an untraced context pass (BOS + the P corpus
// tokens before the chunk), then ONE traced forward of exactly W corpus tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/session.h"
#include "io/file.h"
#include "verify/trace/trace.h"

namespace arbiter::verify {

struct TraceRunOptions {
  TraceShape shape;             // W, C, P, S
  int topk = 8;                 // K
  std::string corpus_path;
  std::string out_path;
  std::string full_logits_path;  // empty: none
  std::string model_path;        // as the user gave it (header)
  std::string env = "none";      // ARBITER_* variables (header)
  bool progress = true;          // progress on stderr (core/progress.h)
  std::string progress_tag = "trace";  // its prefix; the matrix names the trace file
  /// Trace even when a chunk's positions pass the model's maximum (check_trace_context);
  /// the header then records it (`# long_context` line).
  bool allow_long_context = false;
  /// Extra `# key<TAB>value` header lines (e.g. {"mix", "attn=f32"} for a --mix ablation).
  std::vector<std::pair<std::string, std::string>> extra_header;
};

struct TraceRunResult {
  int64_t rows = 0;
  int64_t nonfinite = 0;  // NaN/Inf values written; the CLI exits non-zero when > 0
  double elapsed_s = 0;
};

/// Index of the first traced input token of chunk c: max(S, P) + c * W, so that every chunk
/// has its P context tokens inside the corpus. Its targets are the next W tokens.
int64_t chunk_begin(const TraceShape& shape, int c);
/// Corpus tokens a shape needs: chunk_begin(C - 1) + W + 1.
int64_t tokens_needed(const TraceShape& shape);

/// Positions one chunk occupies: BOS (when the tokenizer has one), P context tokens, W traced.
int64_t trace_positions(const TraceShape& shape, const Model& m);
/// Refuses a shape whose chunks run positions beyond the model's maximum (HF
/// max_position_embeddings, GGUF context_length) unless allow_long_context: RoPE computes
/// any position, but past the trained context a model's logits say little about the tiers.
void check_trace_context(const TraceShape& shape, const Model& m, bool allow_long_context);

/// The corpus of a trace: read whole (at most kMaxInputBytes) and tokenized (no special
/// tokens). The file stays open while this lives, so an output naming it is refused.
struct TraceCorpus {
  std::unique_ptr<InputFile> file;
  std::string text;
  std::vector<int32_t> tokens;
};
/// Loads opt.corpus_path for opt.shape on model m, after check_trace_context, and refuses a
/// corpus shorter than tokens_needed(shape). Everything a Session is sized from (shape,
/// corpus, context) is checked here, so call it before making the Session.
TraceCorpus load_trace_corpus(const TraceRunOptions& opt, const Model& m);

/// Runs every chunk of opt.shape over the corpus and writes the trace atomically. Throws
/// arbiter::Error on a too-short corpus, top-k > vocab, or I/O failure. The corpus, the
/// model's files and the outputs must be distinct files (io/atomic_file.h).
TraceRunResult run_trace(Session& s, const TraceRunOptions& opt, const TraceCorpus& corpus);

/// The header fields a run knows before it starts: model, tokenizer, corpus, shape, build,
/// env, extra and long_context lines (device, compute, providers and inject are the runner's to fill).
TraceHeader trace_header_for(const Model& m, const TraceRunOptions& opt, const std::string& corpus_text,
                             int64_t corpus_tokens);

}  // namespace arbiter::verify
