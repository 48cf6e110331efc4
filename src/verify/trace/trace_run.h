// The trace runner: teacher-forces a corpus through a Session and writes a trace
// (DESIGN.md §3). Per chunk: a fresh cache, an untraced context pass (BOS + the P corpus
// tokens before the chunk), then ONE traced forward of exactly W corpus tokens.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/session.h"
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
  bool progress = true;          // progress bar on stderr
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

/// The header fields a run knows before it starts: model, tokenizer, corpus, shape, build,
/// env and extra lines (device, compute, providers and inject are the runner's to fill).
TraceHeader trace_header_for(const Model& m, const TraceRunOptions& opt, const std::string& corpus_text,
                             int64_t corpus_tokens);
/// The corpus file's bytes; throws arbiter::Error naming it when it cannot be read.
std::string read_corpus(const std::string& path);

/// Tokenizes the corpus (whole file, no special tokens), runs every chunk, writes the trace
/// atomically. Throws arbiter::Error on a too-short corpus, top-k > vocab, or I/O failure.
TraceRunResult run_trace(Session& s, const TraceRunOptions& opt);

}  // namespace arbiter::verify
