#include "verify/trace/trace_run.h"

#include "core/build_info.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/probe.h"
#include "core/error.h"
#include "io/sha256.h"

namespace arbiter::verify {

int64_t chunk_begin(const TraceShape& shape, int c) {
  return std::max<int64_t>(shape.start_token, shape.prefill) + int64_t(c) * shape.chunk_tokens;
}

int64_t tokens_needed(const TraceShape& shape) {
  return chunk_begin(shape, shape.max_chunks - 1) + shape.chunk_tokens + 1;
}

static std::string read_whole(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ARB_CHECK(f.good(), "[trace] %s: cannot open corpus", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static void progress(int64_t done, int64_t total, double elapsed) {
  double rate = elapsed > 0 ? done / elapsed : 0;
  double eta = rate > 0 ? (total - done) / rate : 0;
  int width = 30, filled = total ? int(width * done / total) : width;
  std::fprintf(stderr, "\r[trace] [%-*s] %lld/%lld positions  %.0f pos/s  ETA %.0f s ", width,
               std::string(size_t(filled), '#').c_str(), (long long)done, (long long)total, rate,
               eta);
  if (done == total) std::fprintf(stderr, "\n");
}

TraceHeader trace_header_for(const Model& m, const TraceRunOptions& opt, const std::string& corpus_text,
                             int64_t corpus_tokens) {
  const int32_t bos = m.tokenizer->bos_id();
  TraceHeader h;
  h.model_path = opt.model_path;
  h.model_sha256 = m.weights_sha256;
  h.model_arch = m.config.arch;
  h.model_params = m.n_params;
  h.tokenizer_sha256 = m.tokenizer->sha256();
  h.tokenizer_bos = bos >= 0 ? std::to_string(bos) : "none";
  h.corpus_path = opt.corpus_path;
  h.corpus_sha256 = sha256_hex(corpus_text.data(), corpus_text.size());
  h.corpus_tokens = corpus_tokens;
  h.set_shape(opt.shape, opt.topk);
  h.weights = dtype_name(m.weight_dtype);
  h.build_version = kVersion;
  h.build_commit = kGitCommit;
  h.build_compiler = std::string("gcc-") + __VERSION__;
  for (char& ch : h.build_compiler)
    if (ch == ' ') ch = '-';
  h.build_cuda = cuda_runtime_version();
  for (const auto& e : opt.extra_header) h.extra.push_back(e);
  if (opt.env != "none") {
    std::istringstream es(opt.env);
    for (std::string v; es >> v;) h.env.push_back(v);
  }
  return h;
}

std::string read_corpus(const std::string& path) { return read_whole(path); }

TraceRunResult run_trace(Session& s, const TraceRunOptions& opt) {
  const Model& m = s.model();
  const TraceShape& sh = opt.shape;
  const int W = sh.chunk_tokens, C = sh.max_chunks, P = sh.prefill;
  ARB_CHECK(W >= 1 && C >= 1 && P >= 0 && sh.start_token >= 0,
            "[trace] bad shape: chunk %d, chunks %d, prefill %d, start %d", W, C, P,
            sh.start_token);
  ARB_CHECK(opt.topk >= 1 && opt.topk <= m.config.vocab,
            "[trace] --topk %d outside [1, vocabulary %d]", opt.topk, m.config.vocab);
  const int32_t bos = m.tokenizer->bos_id();
  const int ctx_tokens = P + (bos >= 0 ? 1 : 0);
  ARB_CHECK(ctx_tokens + W <= s.max_ctx(), "[trace] shape needs %d cache rows, session has %d",
            ctx_tokens + W, s.max_ctx());

  const std::string text = read_corpus(opt.corpus_path);
  const std::vector<int32_t> corpus = m.tokenizer->encode(text, false, false);
  ARB_CHECK(int64_t(corpus.size()) >= tokens_needed(sh),
            "[trace] %s: corpus has %zu tokens; shape %s needs %lld", opt.corpus_path.c_str(),
            corpus.size(), sh.name.c_str(), (long long)tokens_needed(sh));

  TraceHeader h = trace_header_for(m, opt, text, int64_t(corpus.size()));
  Backend& be = s.backend();
  h.device = be.device_name();
  h.compute = dtype_name(be.compute());
  h.inject = s.inject().text;

  // Rows are kept in memory and written at the end, because the header names the providers
  // that served the run (known only afterwards). The file appears whole or not at all.
  be.stats().reset();
  std::vector<TraceRow> rows;
  rows.reserve(size_t(W) * C);
  LogitsWriter full;
  if (!opt.full_logits_path.empty()) full.open(opt.full_logits_path, uint32_t(m.config.vocab));
  std::vector<float> row_f32(size_t(m.config.vocab));
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int c = 0; c < C; ++c) {
    const int64_t b = chunk_begin(sh, c);
    s.reset();
    std::vector<int32_t> ctx;
    if (bos >= 0) ctx.push_back(bos);
    ctx.insert(ctx.end(), corpus.begin() + (b - P), corpus.begin() + b);
    if (!ctx.empty()) s.context(ctx);
    std::vector<int32_t> in(corpus.begin() + b, corpus.begin() + b + W);
    std::vector<int32_t> tgt(corpus.begin() + b + 1, corpus.begin() + b + W + 1);
    s.forward(in);
    std::vector<LogitsSummary> sum = s.summarize(opt.topk, tgt);
    for (int p = 0; p < W; ++p) {
      TraceRow r;
      r.chunk = c;
      r.pos = p;
      r.abs_pos = b + p + 1;
      r.target = tgt[p];
      r.lse = sum[p].lse;
      r.target_logit = sum[p].target_logit;
      r.nll = r.lse - r.target_logit;
      r.top_ids = sum[p].top_ids;
      r.top_logits = sum[p].top_logits;
      rows.push_back(std::move(r));
      if (!opt.full_logits_path.empty()) {
        std::vector<double> l = s.logits(p);
        for (size_t v = 0; v < l.size(); ++v) row_f32[v] = float(l[v]);
        full.write_row(row_f32.data());
      }
    }
    if (opt.progress) progress(int64_t(c + 1) * W, int64_t(C) * W, elapsed());
  }
  be.sync();
  h.providers = be.stats().summary();
  h.fallbacks = be.stats().fallbacks();

  TraceRunResult res;
  res.elapsed_s = elapsed();
  TraceWriter w;
  w.open(opt.out_path, h);
  for (const TraceRow& r : rows) w.write_row(r);
  w.finish(res.elapsed_s);
  if (!opt.full_logits_path.empty()) full.finish();
  res.rows = w.rows();
  res.nonfinite = w.nonfinite_values();
  return res;
}

}  // namespace arbiter::verify
