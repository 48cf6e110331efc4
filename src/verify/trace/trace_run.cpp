#include "verify/trace/trace_run.h"

#include "core/build_info.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/probe.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/atomic_file.h"
#include "io/file.h"
#include "io/sha256.h"

namespace arbiter::verify {

int64_t chunk_begin(const TraceShape& shape, int c) {
  return std::max<int64_t>(shape.start_token, shape.prefill) + int64_t(c) * shape.chunk_tokens;
}

int64_t tokens_needed(const TraceShape& shape) {
  return chunk_begin(shape, shape.max_chunks - 1) + shape.chunk_tokens + 1;
}

int64_t trace_positions(const TraceShape& shape, const Model& m) {
  return int64_t(shape.prefill) + (m.tokenizer->bos_id() >= 0 ? 1 : 0) + shape.chunk_tokens;
}

void check_trace_context(const TraceShape& shape, const Model& m, bool allow_long_context) {
  ARB_CHECK(shape.chunk_tokens >= 1 && shape.max_chunks >= 1 && shape.prefill >= 0 && shape.start_token >= 0,
            "[trace] bad shape: chunk %d, chunks %d, prefill %d, start %d", shape.chunk_tokens, shape.max_chunks,
            shape.prefill, shape.start_token);
  const int64_t n = trace_positions(shape, m);
  ARB_CHECK(allow_long_context || n <= m.config.max_pos,
            "[trace] shape %s: a chunk runs %lld positions (BOS + prefill %d + chunk %d) but the model's maximum "
            "is %d (max_position_embeddings / context_length); pass --allow-long-context to trace past it",
            shape.name.c_str(), (long long)n, shape.prefill, shape.chunk_tokens, m.config.max_pos);
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
  h.build_compiler = build_compiler();
  h.build_cuda = cuda_runtime_version();
  for (const auto& e : opt.extra_header) h.extra.push_back(e);
  if (trace_positions(opt.shape, m) > m.config.max_pos)
    h.extra.emplace_back("long_context", strformat("positions\t%lld\tmax_positions\t%d",
                                                   (long long)trace_positions(opt.shape, m), m.config.max_pos));
  if (opt.env != "none") {
    std::istringstream es(opt.env);
    for (std::string v; es >> v;) h.env.push_back(v);
  }
  return h;
}

TraceCorpus load_trace_corpus(const TraceRunOptions& opt, const Model& m) {
  check_trace_context(opt.shape, m, opt.allow_long_context);
  TraceCorpus c;
  c.file = std::make_unique<InputFile>(opt.corpus_path, "[trace]");
  c.text = c.file->read_all(kMaxInputBytes, "a corpus");
  c.tokens = m.tokenizer->encode(c.text, false, false);
  ARB_CHECK(int64_t(c.tokens.size()) >= tokens_needed(opt.shape),
            "[trace] %s: corpus has %zu tokens; shape %s needs %lld", opt.corpus_path.c_str(),
            c.tokens.size(), opt.shape.name.c_str(), (long long)tokens_needed(opt.shape));
  return c;
}

namespace {

// A traced forward's routing (positions pos0 .. pos0 + W - 1) as one list per row, in the
// order of h.layers; the first routed forward fills h (a dense model: h stays empty and
// every list too).
std::vector<std::vector<TraceRoute>> routes_by_row(const RouteLog& log, int pos0, int W,
                                                   TraceRoutesHeader& h) {
  std::vector<std::vector<TraceRoute>> rows(static_cast<size_t>(W));
  if (log.picks.empty()) {
    ARB_CHECK(h.layers.empty(), "[trace] a forward routed no token on this MoE model");
    return rows;
  }
  std::vector<int> layers;
  for (const RoutePick& p : log.picks) layers.push_back(p.layer);
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  if (h.layers.empty()) h = {log.experts, log.top_k, log.score, layers};
  ARB_CHECK(layers == h.layers && log.picks.size() == size_t(W) * layers.size(),
            "[trace] a forward routed %zu (token, layer) pairs over %zu layers; expected %d "
            "tokens at each of the %zu layers of the first",
            log.picks.size(), layers.size(), W, h.layers.size());
  for (std::vector<TraceRoute>& r : rows) r.resize(h.layers.size());
  for (const RoutePick& p : log.picks) {
    const size_t l = size_t(std::lower_bound(h.layers.begin(), h.layers.end(), p.layer) -
                            h.layers.begin());
    ARB_CHECK(p.pos >= pos0 && p.pos < pos0 + W, "[trace] a route at position %d outside the forward",
              p.pos);
    rows[size_t(p.pos - pos0)][l] = {std::vector<int32_t>(p.ids.begin(), p.ids.end()), p.margin};
  }
  return rows;
}

}  // namespace

TraceRunResult run_trace(Session& s, const TraceRunOptions& opt, const TraceCorpus& tc) {
  const Model& m = s.model();
  const TraceShape& sh = opt.shape;
  const int W = sh.chunk_tokens, C = sh.max_chunks, P = sh.prefill;
  check_trace_context(sh, m, opt.allow_long_context);
  ARB_CHECK(opt.topk >= 1 && opt.topk <= m.config.vocab,
            "[trace] --topk %d outside [1, vocabulary %d]", opt.topk, m.config.vocab);
  const int32_t bos = m.tokenizer->bos_id();
  ARB_CHECK(trace_positions(sh, m) <= s.max_ctx(), "[trace] shape needs %lld cache rows, session has %d",
            (long long)trace_positions(sh, m), s.max_ctx());

  // Unusable outputs are refused before the run, not after it (the writers check again).
  check_output_target(opt.out_path, "[trace]");
  if (!opt.full_logits_path.empty()) {
    check_output_target(opt.full_logits_path, "[logits]");
    ARB_CHECK(canonical_output_path(opt.out_path) != canonical_output_path(opt.full_logits_path),
              "[trace] %s: names both the trace and the full-logits file", opt.out_path.c_str());
  }
  const std::string& text = tc.text;
  const std::vector<int32_t>& corpus = tc.tokens;
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
  Progress meter(opt.progress_tag, int64_t(C) * W, "positions", Progress::Unit::Count, opt.progress);
  for (int c = 0; c < C; ++c) {
    const int64_t b = chunk_begin(sh, c);
    s.reset();
    std::vector<int32_t> ctx;
    if (bos >= 0) ctx.push_back(bos);
    ctx.insert(ctx.end(), corpus.begin() + (b - P), corpus.begin() + b);
    if (!ctx.empty()) s.context(ctx);
    std::vector<int32_t> in(corpus.begin() + b, corpus.begin() + b + W);
    std::vector<int32_t> tgt(corpus.begin() + b + 1, corpus.begin() + b + W + 1);
    const int pos0 = s.pos();
    RouteLog routes;  // the traced forward's routing only, not the context pass's
    s.set_route_log(&routes);
    try {
      s.forward(in);
    } catch (...) {
      s.set_route_log(nullptr);
      throw;
    }
    s.set_route_log(nullptr);
    const std::vector<std::vector<TraceRoute>> row_routes = routes_by_row(routes, pos0, W, h.routes);
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
      r.routes = row_routes[size_t(p)];
      rows.push_back(std::move(r));
      if (!opt.full_logits_path.empty()) {
        std::vector<double> l = s.logits(p);
        for (size_t v = 0; v < l.size(); ++v) row_f32[v] = float(l[v]);
        full.write_row(row_f32.data());
      }
    }
    meter.update(int64_t(c + 1) * W);
  }
  be.sync();
  h.providers = be.stats().summary();
  h.act_quant = be.stats().act_quant();
  h.fallbacks = be.stats().fallbacks();

  TraceRunResult res;
  res.elapsed_s = meter.elapsed_s();
  TraceWriter w;
  w.open(opt.out_path, h);
  for (const TraceRow& r : rows) w.write_row(r);
  w.finish(res.elapsed_s);
  meter.finish();
  if (!opt.full_logits_path.empty()) full.finish();
  res.rows = w.rows();
  res.nonfinite = w.nonfinite_values();
  return res;
}

}  // namespace arbiter::verify
