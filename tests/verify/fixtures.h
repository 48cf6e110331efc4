// Hand-designed traces for the verify tests, written with the real TraceWriter.
// The basic fixture (six_rows) is 2 chunks x 3 positions, top-3, with reference gaps
//   row (chunk,pos):  (0,0) 3.0   (0,1) 0.5   (0,2) 3.0   (1,0) 1.5   (1,1) 6.0   (1,2) 0.2
// so at the default threshold 2.0 exactly rows (0,0), (0,2), (1,1) are decided.
// To add a case: copy six_rows(), change the rows you need, write it with write_trace().
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "verify/trace/trace.h"

namespace arbiter::test {

using verify::TraceHeader;
using verify::TraceRow;

/// The error read_trace throws for path (a test failure when it reads it).
inline std::string read_trace_error(const std::string& path) {
  try {
    verify::read_trace(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "read_trace(" << path << ") did not throw";
  return "";
}

inline TraceHeader fixture_header(int64_t W = 3, int64_t C = 2, int64_t K = 3) {
  TraceHeader h;
  h.model_path = "models/tiny";
  h.model_sha256 = std::string(64, 'a');
  h.model_arch = "llama";
  h.model_params = 656000;
  h.tokenizer_sha256 = std::string(64, 'b');
  h.tokenizer_bos = "1";
  h.corpus_path = "corpus.txt";
  h.corpus_sha256 = std::string(64, 'c');
  h.corpus_tokens = 5000;
  h.shape_name = "custom";
  h.chunk_tokens = W;
  h.max_chunks = C;
  h.topk = K;
  h.prefill = 0;
  h.start_token = 0;
  h.device = "cpu";
  h.compute = "f32";
  h.weights = "f32";
  h.providers = "matmul=cpu.gemm:12,rmsnorm=cpu.rmsnorm:24";
  h.fallbacks = 0;
  h.inject = "none";
  h.build_version = "0.1.0";
  h.build_commit = "abcdef123456";
  h.build_compiler = "gcc-12.2.0";
  h.build_cuda = "none";
  return h;
}

/// A row whose lse is top-1 logit + 1 (any consistent value works for non-KL tests) and
/// whose target logit is lse - nll.
inline TraceRow make_row(int chunk, int pos, int32_t target, double nll, std::vector<int32_t> ids,
                         std::vector<double> logits, int64_t W = 3) {
  TraceRow r;
  r.chunk = chunk;
  r.pos = pos;
  r.abs_pos = 100 + chunk * W + pos;
  r.target = target;
  r.nll = nll;
  r.lse = logits.empty() ? 0 : logits[0] + 1.0;
  r.target_logit = r.lse - nll;
  r.top_ids = std::move(ids);
  r.top_logits = std::move(logits);
  return r;
}

/// The reference of the basic fixture. NLLs 1.0 2.0 0.5 1.5 3.0 1.0 (mean 1.5).
inline std::vector<TraceRow> six_rows() {
  return {
      make_row(0, 0, 10, 1.0, {10, 11, 12}, {5.0, 2.0, 1.0}),  // gap 3.0
      make_row(0, 1, 21, 2.0, {20, 21, 22}, {4.0, 3.5, 1.0}),  // gap 0.5
      make_row(0, 2, 30, 0.5, {30, 31, 32}, {6.0, 3.0, 2.0}),  // gap 3.0
      make_row(1, 0, 40, 1.5, {40, 41, 42}, {3.0, 1.5, 0.0}),  // gap 1.5
      make_row(1, 1, 50, 3.0, {50, 51, 52}, {7.0, 1.0, 0.5}),  // gap 6.0
      make_row(1, 2, 61, 1.0, {60, 61, 62}, {2.0, 1.8, 1.0}),  // gap 0.2
  };
}

inline std::string write_trace(const std::string& path, const TraceHeader& h,
                               const std::vector<TraceRow>& rows, double elapsed = 1.5) {
  verify::TraceWriter w;
  w.open(path, h);
  for (const auto& r : rows) w.write_row(r);
  w.finish(elapsed);
  return path;
}

}  // namespace arbiter::test
