// arbiter trace: teacher-forced logit trace of a corpus on one tier (DESIGN.md §3).
#include <algorithm>
#include <cstdio>
#include <limits>

#include "backend/mix.h"
#include "cli/common.h"
#include "core/error.h"
#include "io/file.h"
#include "verify/trace/api_trace.h"
#include "verify/trace/host_info.h"
#include "verify/trace/kld_file.h"
#include "verify/trace/kld_run.h"
#include "verify/trace/trace_run.h"

namespace arbiter::cli {

// --kld-out: llama-perplexity's chunking and file instead of a trace shape (kld_run.h).
static int trace_kld(const Args& a) {
  for (const char* k : {"out", "shape", "chunk", "prefill", "start", "topk", "full-logits", "endpoint"})
    ARB_CHECK(!a.has(k), "[cli] trace: --%s does not apply to --kld-out (llama-perplexity's chunks, every logit)", k);
  ARB_CHECK(a.has("corpus") != a.has("kld-tokens"), "[cli] trace: --kld-out takes --corpus FILE or --kld-tokens FILE.kld");
  ModelRun run = open_model_run(a);
  const Model& m = *run.model;
  std::vector<int32_t> tokens;
  int n_ctx = 512;
  if (a.has("kld-tokens")) {  // the tokens another engine's file evaluated
    const verify::KldReader other(a.str("kld-tokens"));
    ARB_CHECK(other.layout().n_vocab == m.config.vocab, "[cli] trace: %s has a vocabulary of %d; the model's is %d",
              other.path().c_str(), other.layout().n_vocab, m.config.vocab);
    tokens = other.layout().tokens;
    n_ctx = other.layout().n_ctx;
  } else {
    InputFile corpus(a.str("corpus"), "[trace]");
    tokens = verify::kld_tokens(m, corpus.read_all(kMaxInputBytes, "a corpus"));
  }
  verify::KldRunOptions opt;
  opt.out_path = a.str("kld-out");
  opt.n_ctx = a.int_in("kld-ctx", n_ctx, 4, std::numeric_limits<int32_t>::max());
  opt.max_chunks = a.has("chunks") ? a.int_in("chunks", 1, std::numeric_limits<int32_t>::max()) : -1;
  opt.progress = !a.flag("quiet");
  ARB_CHECK(opt.n_ctx <= m.config.max_pos || a.flag("allow-long-context"),
            "[cli] trace: --kld-ctx %d passes the model's %d positions (--allow-long-context to trace there anyway)",
            opt.n_ctx, m.config.max_pos);
  ActivityScope scope(strformat("writing the KL-divergence base %s (a %d-position session) on model %s",
                                opt.out_path.c_str(), opt.n_ctx, a.str("model").c_str()));
  const int W = opt.n_ctx - 1 - opt.n_ctx / 2;
  Session s(m, *run.backend, opt.n_ctx, std::max(W, std::min(opt.n_ctx, 512)));
  s.set_inject(run.inject);
  const int64_t rows = verify::run_kld_base(s, tokens, opt);
  std::fprintf(stderr, "[trace] wrote %s: %lld rows of %d log-probabilities (llama.cpp's KL-divergence base)\n",
               opt.out_path.c_str(), (long long)rows, m.config.vocab);
  print_stats_if_asked(run);
  return 0;
}

static int cmd_trace(int argc, char** argv) {
  auto vopts = model_value_opts();
  vopts.insert(vopts.end(), {"--corpus", "--shape", "--chunk", "--chunks", "--prefill", "--start",
                             "--topk", "-o|--out", "--full-logits", "--endpoint", "--tokenizer", "--api-key",
                             "--compute", "--api-mode", "--api-top", "--kld-out", "--kld-ctx", "--kld-tokens",
                             "--batch-with"});
  auto fopts = model_flag_opts();
  fopts.insert(fopts.end(), {"--quiet", "--allow-long-context", "-h|--help"});
  Args a("trace", vopts, fopts);
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr,
                 "usage: arbiter trace -m MODEL --corpus FILE (--shape w1|w1ctx512|w8|w256|w8ctx1536"
                 " [--chunks C] | --chunk W --chunks C [--prefill P] [--start S])\n"
                 "       [--topk K] [--device ref|cpu|cuda[:N]] [--dtype D] [-t N] [--inject SPEC]"
                 " [--mix SPEC] -o OUT.tsv [--full-logits OUT.bin] [--stats] [--quiet]\n"
                 "       arbiter trace --endpoint http://HOST:PORT --model NAME --tokenizer MODEL [--api-key K]"
                 " [--compute f64|f32|bf16|f16]\n"
                 "         [--api-mode echo|next] [--api-top N]\n"
                 "         --corpus FILE --shape ... [--topk K] -o OUT.tsv\n"
                 "         (through an OpenAI-compatible /v1/completions with echo + logprobs; MODEL: the local\n"
                 "          checkpoint the endpoint serves, for its tokenizer and identity; docs/serve.md)\n"
                 "       arbiter trace -m MODEL (--corpus FILE | --kld-tokens FILE.kld) --kld-out OUT.kld [--kld-ctx N]"
                 " [--chunks C] [--device ...]\n"
                 "         (llama-perplexity --kl-divergence-base's file: chunks of N tokens (512), every logit of\n"
                 "          their second half; --kld-tokens evaluates another file's tokens; docs/traces.md)\n"
                 "       [--batch-with N]         run each traced forward inside a batch with N other sequences, as\n"
                 "                                serve --batching continuous runs it (ref, cpu; '# batch_with' header)\n"
                 "       [--allow-long-context]   trace chunks past the model's maximum positions\n"
                 "                                (recorded in the header as '# long_context')\n");
    return 0;
  }
  if (a.has("kld-out")) return trace_kld(a);
  verify::TraceRunOptions opt;
  if (a.has("shape")) {
    ARB_CHECK(!a.has("chunk") && !a.has("prefill") && !a.has("start"),
              "[cli] trace: give either --shape or --chunk/--prefill/--start, not both");
    opt.shape = verify::named_shape(a.str("shape"));
    // --chunks with --shape caps the chunk count (a quick run; the header records it).
    if (a.has("chunks")) opt.shape.max_chunks = std::min(a.int_in("chunks", 1, std::numeric_limits<int32_t>::max()), opt.shape.max_chunks);
  } else {
    opt.shape.name = "custom";
    opt.shape.chunk_tokens = a.int_in("chunk", 1, std::numeric_limits<int32_t>::max());
    opt.shape.max_chunks = a.int_in("chunks", 1, std::numeric_limits<int32_t>::max());
    opt.shape.prefill = a.int_in("prefill", 0, 0, std::numeric_limits<int32_t>::max());
    opt.shape.start_token = a.int_in("start", 0, 0, std::numeric_limits<int32_t>::max());
  }
  opt.topk = a.int_in("topk", 8, 1, std::numeric_limits<int32_t>::max());
  opt.allow_long_context = a.flag("allow-long-context");
  opt.corpus_path = a.str("corpus");
  opt.out_path = a.str("out");
  opt.full_logits_path = a.str("full-logits", "");
  opt.model_path = a.str("model");
  opt.env = arbiter_env();
  opt.progress = !a.flag("quiet");
  opt.extra_header = verify::host_header_lines();
  // A --mix ablation is part of what was measured: record it (`# mix` header line).
  if (a.has("mix")) opt.extra_header.emplace_back("mix", parse_mix(a.str("mix")).text());

  for (const char* k : {"compute", "api-mode", "api-top", "api-key", "tokenizer"})
    ARB_CHECK(a.has("endpoint") || !a.has(k), "[cli] trace: --%s applies to --endpoint only", k);
  if (a.has("endpoint")) {
    for (const char* k : {"device", "dtype", "threads", "inject", "mix", "full-logits", "batch-with"})
      ARB_CHECK(!a.has(k), "[cli] trace: --%s does not apply to --endpoint (the serving engine decides)", k);
    ARB_CHECK(!a.flag("stats"), "[cli] trace: --stats does not apply to --endpoint");
    verify::ApiTraceOptions api;
    api.endpoint = a.str("endpoint");
    api.api_model = a.str("model");
    api.api_key = a.str("api-key", "");
    api.compute = a.str("compute", "");
    api.mode = a.str("api-mode", "echo");
    api.top = int(a.integer("api-top", 0));
    ARB_CHECK(api.top >= 0, "[cli] trace: --api-top must be >= 0");
    ARB_CHECK(api.compute.empty() || api.compute == "f64" || api.compute == "f32" || api.compute == "bf16" ||
                  api.compute == "f16",
              "[cli] trace: --compute '%s': expected f64, f32, bf16 or f16", api.compute.c_str());
    opt.model_path = a.str("tokenizer");
    api.trace = opt;
    std::unique_ptr<Model> m = load_model(opt.model_path);
    verify::TraceRunResult r = verify::run_api_trace(*m, api);
    std::fprintf(stderr, "[trace] wrote %s: %lld rows through %s in %.2f s\n", opt.out_path.c_str(), (long long)r.rows,
                 api.endpoint.c_str(), r.elapsed_s);
    return r.nonfinite > 0 ? 1 : 0;
  }
  ModelRun run = open_model_run(a);
  // Shape, context and corpus are checked before the Session is sized from them.
  const verify::TraceCorpus corpus = verify::load_trace_corpus(opt, *run.model);
  const int W = opt.shape.chunk_tokens, ctx = int(verify::trace_positions(opt.shape, *run.model));
  ActivityScope scope(strformat("tracing %s (a %d-position session) on model %s", opt.corpus_path.c_str(), ctx,
                                opt.model_path.c_str()));
  Session s(*run.model, *run.backend, ctx, std::max(W, std::min(ctx, 512)));
  s.set_inject(run.inject);
  if (a.has("batch-with")) {
    const int n = a.int_in("batch-with", 0, 0, 256);
    s.set_batch_with(n);
    // Part of what was measured (the cpu tier's matmuls are its GEMM at every width then).
    opt.extra_header.emplace_back("batch_with", std::to_string(n));
  }
  verify::TraceRunResult r = verify::run_trace(s, opt, corpus);
  std::fprintf(stderr, "[trace] wrote %s: %lld rows in %.2f s (%.0f positions/s)\n",
               opt.out_path.c_str(), (long long)r.rows, r.elapsed_s,
               r.elapsed_s > 0 ? r.rows / r.elapsed_s : 0.0);
  print_stats_if_asked(run);
  if (r.nonfinite > 0) {
    std::fprintf(stderr, "arbiter trace: %s: %lld NaN/Inf values in logits (trace written and marked)\n",
                 opt.out_path.c_str(), (long long)r.nonfinite);
    return 1;
  }
  return 0;
}

REGISTER_COMMAND("trace", "teacher-forced logit trace of a corpus on one tier", cmd_trace);

}  // namespace arbiter::cli
