// `arbiter compare A.kld B.kld`: two llama.cpp KL-divergence files of the same tokens (one
// written by llama-perplexity --kl-divergence-base, one by `arbiter trace --kld-out`, or two
// of either), summarised as llama-perplexity --kl-divergence summarises a run against a base.
#pragma once
#include <string>

#include "verify/judge/llama_stats.h"

namespace arbiter::verify {

/// The file starts with llama.cpp's "_logits_" magic (false when it cannot be read: the
/// trace reader then says why).
bool is_kld_file(const std::string& path);

/// B judged against the base A, row by row. Throws arbiter::Error "[kld] ..." when the files
/// differ in context, vocabulary, chunks or tokens.
LlamaKldStats compare_kld_files(const std::string& base_path, const std::string& cand_path);

}  // namespace arbiter::verify
