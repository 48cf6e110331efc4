// llama.cpp's KL-divergence base file, as `llama-perplexity --kl-divergence-base FILE` writes
// it and `--kl-divergence` reads it (tools/perplexity/perplexity.cpp of llama.cpp; layout
// learned from it, code our own). Little-endian:
//
//   "_logits_"                          8 bytes
//   n_ctx, n_vocab, n_chunk             int32 each
//   tokens                              int32 x n_ctx*n_chunk (the evaluated tokens; chunk c is
//                                       tokens[c*n_ctx, (c+1)*n_ctx), its first one replaced
//                                       by BOS when evaluated if the model adds one)
//   per chunk, rows first .. n_ctx-2   (first = n_ctx/2; n_ctx-1-first rows), each
//     float scale, float min_log_prob   (2 floats = 4 uint16 slots)
//     uint16 q[n_vocab], padded to even (nv = 2*((n_vocab+1)/2) + 4 uint16 per row)
//
// Row r of a chunk holds the log-probabilities after the logits at position first+r, which
// predict token first+r+1: log p[v] = scale*q[v] + min_log_prob. The logits are clipped 16
// below their maximum (q = 0 there) and quantized to 16 bits across that range.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "io/file.h"

namespace arbiter::verify {

struct KldLayout {
  int32_t n_ctx = 0, n_vocab = 0, n_chunk = 0;
  std::vector<int32_t> tokens;  // n_ctx * n_chunk

  int first() const { return n_ctx / 2; }
  int rows_per_chunk() const { return n_ctx - 1 - first(); }
  int64_t row_slots() const { return 2 * ((int64_t(n_vocab) + 1) / 2) + 4; }  // uint16 per row
  /// The target of row r of chunk c: the token at position first + r + 1.
  int32_t target(int c, int r) const { return tokens[size_t(int64_t(c) * n_ctx + first() + r + 1)]; }
};

/// One row quantized as llama-perplexity quantizes it (float arithmetic in its order, so
/// the same logits give the same bytes): `slots` must hold KldLayout::row_slots() uint16.
void kld_quantize_row(const float* logits, int n_vocab, uint16_t* slots);

/// Reads a KLD file, checking the magic, the sizes (n_ctx in [3, 2^24], n_vocab in [1, 2^28],
/// n_chunk >= 1, the file's exact length) and every token id against n_vocab before anything
/// is sized from them. Errors: "[kld] PATH: what".
class KldReader {
 public:
  explicit KldReader(const std::string& path);
  const KldLayout& layout() const { return layout_; }
  const std::string& path() const { return file_.path(); }
  /// The log-probabilities of row r of chunk c (n_vocab values).
  void read_row(int c, int r, std::vector<float>& logprobs) const;

 private:
  InputFile file_;
  KldLayout layout_;
  uint64_t rows_offset_ = 0;
  mutable std::vector<uint16_t> buf_;
};

/// Writes a KLD file atomically (io/atomic_file.h): the header and tokens at open, then
/// every row of every chunk in order, then finish().
class KldWriter {
 public:
  void open(const std::string& path, const KldLayout& layout);
  /// The next row, from its n_vocab raw logits.
  void write_row(const float* logits);
  void finish();

 private:
  AtomicFile file_;
  KldLayout layout_;
  int64_t rows_ = 0;
  std::vector<uint16_t> buf_;
};

}  // namespace arbiter::verify
