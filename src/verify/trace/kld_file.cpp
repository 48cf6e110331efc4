#include "verify/trace/kld_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace arbiter::verify {

namespace {

constexpr char kMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};
constexpr int32_t kMaxCtx = 1 << 24, kMaxVocab = 1 << 28;

// The bytes after the tokens, or -1 when the layout's sizes are out of range.
int64_t rows_bytes(const KldLayout& l) {
  if (l.n_ctx < 3 || l.n_ctx > kMaxCtx || l.n_vocab < 1 || l.n_vocab > kMaxVocab || l.n_chunk < 1) return -1;
  const __int128 b = __int128(l.n_chunk) * l.rows_per_chunk() * l.row_slots() * 2;
  return b > (__int128(1) << 62) ? -1 : int64_t(b);
}

}  // namespace

void kld_quantize_row(const float* logits, int n_vocab, uint16_t* slots) {
  float max_logit = logits[0], min_logit = logits[0];
  for (int i = 1; i < n_vocab; ++i) {
    max_logit = std::max(max_logit, logits[i]);
    min_logit = std::min(min_logit, logits[i]);
  }
  min_logit = std::max(min_logit, max_logit - 16);
  double sum_exp = 0;
  for (int i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - max_logit);
  const float log_sum_exp = float(std::log(sum_exp));
  const float min_log_prob = min_logit - max_logit - log_sum_exp;
  const float scale = (max_logit - min_logit) / 65535.f;
  std::memcpy(slots, &scale, 4);
  std::memcpy(slots + 2, &min_log_prob, 4);
  uint16_t* q = slots + 4;
  std::fill(q, q + (n_vocab + 1) / 2 * 2, uint16_t(0));
  if (scale == 0) return;
  const float inv_scale = 1 / scale;
  // Round to nearest, ties to even, in float: what llama.cpp's nearest_int computes.
  for (int i = 0; i < n_vocab; ++i)
    if (logits[i] > min_logit) q[i] = uint16_t(std::lrintf(inv_scale * (logits[i] - min_logit)));
}

KldReader::KldReader(const std::string& path) : file_(path, "[kld]") {
  auto fail = [&](const std::string& what) { throw Error("[kld] " + path + ": " + what); };
  char magic[8];
  int32_t dims[3];
  if (file_.size() < 20) fail("not a llama.cpp KL-divergence file (shorter than its header)");
  file_.read_at(0, magic, 8);
  if (std::memcmp(magic, kMagic, 8) != 0) fail("not a llama.cpp KL-divergence file (no \"_logits_\" magic)");
  file_.read_at(8, dims, sizeof dims);
  layout_.n_ctx = dims[0];
  layout_.n_vocab = dims[1];
  layout_.n_chunk = dims[2];
  const int64_t rb = rows_bytes(layout_);
  if (rb < 0)
    fail(strformat("n_ctx %d, n_vocab %d, n_chunk %d outside [3, %d], [1, %d], >= 1", layout_.n_ctx,
                   layout_.n_vocab, layout_.n_chunk, kMaxCtx, kMaxVocab));
  const __int128 n_tokens = __int128(layout_.n_ctx) * layout_.n_chunk;
  const __int128 want = 20 + n_tokens * 4 + rb;
  if (want != __int128(file_.size()))
    fail(strformat("%llu bytes, but n_ctx %d, n_vocab %d and n_chunk %d make %.0f", (unsigned long long)file_.size(),
                   layout_.n_ctx, layout_.n_vocab, layout_.n_chunk, double(want)));
  layout_.tokens.resize(size_t(n_tokens));
  file_.read_at(20, layout_.tokens.data(), layout_.tokens.size() * 4);
  for (size_t k = 0; k < layout_.tokens.size(); ++k)
    if (layout_.tokens[k] < 0 || layout_.tokens[k] >= layout_.n_vocab)
      fail(strformat("token %zu is %d, outside the vocabulary [0, %d)", k, layout_.tokens[k], layout_.n_vocab));
  rows_offset_ = 20 + uint64_t(n_tokens) * 4;
  buf_.resize(size_t(layout_.row_slots()));
}

void KldReader::read_row(int c, int r, std::vector<float>& logprobs) const {
  const KldLayout& l = layout_;
  ARB_CHECK(c >= 0 && c < l.n_chunk && r >= 0 && r < l.rows_per_chunk(), "[kld] %s: no row %d of chunk %d",
            path().c_str(), r, c);
  const uint64_t row = uint64_t(c) * uint64_t(l.rows_per_chunk()) + uint64_t(r);
  file_.read_at(rows_offset_ + row * uint64_t(l.row_slots()) * 2, buf_.data(), buf_.size() * 2);
  float scale, min_log_prob;
  std::memcpy(&scale, buf_.data(), 4);
  std::memcpy(&min_log_prob, buf_.data() + 2, 4);
  if (!std::isfinite(scale) || !std::isfinite(min_log_prob) || scale < 0)
    throw Error(strformat("[kld] %s: row %d of chunk %d has scale %g and minimum log-probability %g", path().c_str(),
                          r, c, double(scale), double(min_log_prob)));
  logprobs.resize(size_t(l.n_vocab));
  for (int v = 0; v < l.n_vocab; ++v) logprobs[size_t(v)] = scale * float(buf_[size_t(v) + 4]) + min_log_prob;
}

void KldWriter::open(const std::string& path, const KldLayout& layout) {
  ARB_CHECK(rows_bytes(layout) >= 0 && layout.tokens.size() == size_t(layout.n_ctx) * size_t(layout.n_chunk),
            "[kld] %s: n_ctx %d, n_vocab %d, n_chunk %d with %zu tokens", path.c_str(), layout.n_ctx, layout.n_vocab,
            layout.n_chunk, layout.tokens.size());
  layout_ = layout;
  rows_ = 0;
  buf_.assign(size_t(layout.row_slots()), 0);
  file_.open(path, "[kld]");
  file_.write(kMagic, 8);
  const int32_t dims[3] = {layout.n_ctx, layout.n_vocab, layout.n_chunk};
  file_.write(dims, sizeof dims);
  file_.write(layout.tokens.data(), layout.tokens.size() * 4);
}

void KldWriter::write_row(const float* logits) {
  ARB_CHECK(rows_ < int64_t(layout_.n_chunk) * layout_.rows_per_chunk(), "[kld] more rows than the layout holds");
  for (int v = 0; v < layout_.n_vocab; ++v)
    ARB_CHECK(std::isfinite(logits[v]), "[kld] logit %d of row %lld is %g; a KL-divergence file holds finite rows", v,
              (long long)rows_, double(logits[v]));
  kld_quantize_row(logits, layout_.n_vocab, buf_.data());
  file_.write(buf_.data(), buf_.size() * 2);
  ++rows_;
}

void KldWriter::finish() {
  ARB_CHECK(rows_ == int64_t(layout_.n_chunk) * layout_.rows_per_chunk(), "[kld] %lld rows written of %lld",
            (long long)rows_, (long long)int64_t(layout_.n_chunk) * layout_.rows_per_chunk());
  file_.commit();
}

}  // namespace arbiter::verify
