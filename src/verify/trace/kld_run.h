// `arbiter trace --kld-out FILE`: llama-perplexity's --kl-divergence-base run on one tier, so
// that `llama-perplexity --kl-divergence` judges llama.cpp against any arbiter tier, and
// `arbiter compare` reads both sides' files (verify/trace/kld_file.h).
//
// As llama-perplexity: the token array is BOS (when the tokenizer has one) + the corpus; chunk
// c is tokens[c*n_ctx, (c+1)*n_ctx) with its first token replaced by BOS, one forward per
// chunk from an empty cache, and rows for the positions n_ctx/2 .. n_ctx-2 (the second half
// of the chunk, whose logits predict the next token).
#pragma once
#include <string>
#include <vector>

#include "engine/session.h"

namespace arbiter::verify {

struct KldRunOptions {
  std::string out_path;
  int n_ctx = 512;          // llama-perplexity's -c
  int max_chunks = -1;      // --chunks; -1: as many as the tokens fill
  bool progress = true;
};

/// The token array llama-perplexity would evaluate for this corpus text.
std::vector<int32_t> kld_tokens(const Model& m, const std::string& corpus_text);

/// Writes the KLD file of `tokens` (at least 2 * n_ctx of them, as llama-perplexity asks).
/// Returns the number of rows.
int64_t run_kld_base(Session& s, const std::vector<int32_t>& tokens, const KldRunOptions& opt);

}  // namespace arbiter::verify
