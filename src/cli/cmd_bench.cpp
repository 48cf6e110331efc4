// arbiter bench: prompt processing, token generation, first-token latency, peak memory and
// trace throughput, each against a physical limit measured in the same run
// (src/engine/bench.h has the method; docs/performance.md the results).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <sstream>

#include "cli/common.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/text_table.h"
#include "engine/bench.h"
#include "engine/session.h"
#include "io/atomic_file.h"
#include "model/synth.h"
#include "verify/trace/trace_run.h"

namespace arbiter::cli {

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

// Teacher-forced traces of a named shape into a temporary file (removed afterwards), sized
// like `arbiter trace`: one untimed (graph captures, library heuristics and first-touch pages
// land there), then opt.reps timed; returns their throughput or the reason they could not run.
BenchTrace time_trace(const Model& m, Backend& be, const std::string& shape, const BenchOptions& opt) {
  BenchTrace bt;
  bt.shape = shape;
  char tmpl[] = "/tmp/arbiter-bench-trace-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  ARB_CHECK(fd >= 0, "[bench] cannot create a temporary trace file");
  ::close(fd);
  try {
    verify::TraceRunOptions to;
    to.shape = verify::named_shape(shape);
    to.corpus_path = opt.corpus_path;
    to.out_path = tmpl;
    to.model_path = opt.model_path;
    to.env = arbiter_env();
    to.progress = false;
    // Throughput does not depend on whether positions pass the model's trained context.
    to.allow_long_context = true;
    const int bos_rows = m.tokenizer->bos_id() >= 0 ? 1 : 0;
    const verify::TraceCorpus corpus = verify::load_trace_corpus(to, m);
    const int W = to.shape.chunk_tokens, ctx = int(verify::trace_positions(to.shape, m));
    std::vector<double> pos_s;
    for (int rep = 0; rep <= std::max(1, opt.reps); ++rep) {
      Session s(m, be, ctx, std::max(W, std::min(ctx, 512)));
      const verify::TraceRunResult r = verify::run_trace(s, to, corpus);
      bt.rows = r.rows;
      if (rep > 0) pos_s.push_back(r.elapsed_s > 0 ? double(r.rows) / r.elapsed_s : 0);
    }
    bt.positions_per_s_reps = bench_stat(pos_s);
    bt.positions_per_s = bt.positions_per_s_reps.median;
    bt.elapsed_s = bt.positions_per_s > 0 ? double(bt.rows) / bt.positions_per_s : 0;
    // The context of chunk c is BOS + the min(P, begin) corpus tokens before it (trace_run.h).
    for (int c = 0; c < to.shape.max_chunks; ++c) {
      const int64_t b = verify::chunk_begin(to.shape, c);
      bt.forward_tokens += bos_rows + std::min<int64_t>(to.shape.prefill, b) + W;
    }
    bt.forward_tokens_per_s = bt.elapsed_s > 0 ? double(bt.forward_tokens) / bt.elapsed_s : 0;
  } catch (const Error& e) {
    bt.error = e.what();
  }
  std::error_code ec;
  std::filesystem::remove(tmpl, ec);
  return bt;
}

// --concurrency: continuous batching's aggregate decode rate and first-token latency per
// number of concurrent streams, each next to the single stream's (a Markdown table).
int bench_concurrency(const Args& a, const Model& m, Backend& be, const BenchOptions& o) {
  for (const char* k : {"shapes", "json", "depth"})
    ARB_CHECK(!a.has(k), "[cli] bench: --%s does not go with --concurrency", k);
  std::vector<int> levels;
  for (const std::string& x : split_commas(a.str("concurrency"))) {
    char* end = nullptr;
    const long v = std::strtol(x.c_str(), &end, 10);
    ARB_CHECK(end && *end == 0 && v >= 1 && v <= 256, "[cli] bench: --concurrency '%s' (expected counts in [1, 256])",
              x.c_str());
    levels.push_back(int(v));
  }
  ARB_CHECK(!levels.empty(), "[cli] bench: --concurrency needs at least one count");
  TextTable t({{"streams"}, {"ttft ms"}, {"decode tok/s"}, {"per stream"}, {"x single"}, {"limit tok/s"}, {"bound"},
               {"of the limit"}});
  std::vector<BatchBenchResult> results;
  double single = 0;
  for (int n : levels) {
    progress_note("bench", strformat("continuous batching, %d stream(s) ...", n));
    const BatchBenchResult& r = results.emplace_back(run_batch_bench(m, be, n, o));
    const double d = r.decode_tok_s.median;
    if (n == 1) single = d;
    const bool lim = !r.bound.empty();
    t.row({std::to_string(n), strformat("%.1f", r.ttft_ms.median), strformat("%.1f", d), strformat("%.1f", d / n),
           single > 0 ? strformat("%.2f", d / single) : "-",
           lim ? strformat("%.1f", std::min(r.bandwidth_limit_tok_s, r.compute_limit_tok_s)) : "-",
           lim ? r.bound : "-", lim ? strformat("%.3f", r.fraction) : "-"});
  }
  std::printf("continuous batching on %s: %s, -p %d -n %d, medians of %d (docs/serve.md)\n\n%s", be.device_name().c_str(),
              o.model_path.c_str(), o.n_prompt, o.n_gen, o.reps, t.markdown().c_str());
  if (!results.empty() && !results.front().bound.empty())
    std::printf("\nlimits (roofline at the decode's mean context %.1f; docs/performance.md):\n"
                "  read bandwidth  %.1f GB/s median: %s\n  compute peak    %.1f GFLOP/s median: %s\n",
                results.front().context, results.back().bandwidth_gbs.median, results.back().bandwidth_source.c_str(),
                results.back().peak_gflops.median, results.back().peak_source.c_str());
  if (a.has("json-out")) write_file_atomic(a.str("json-out"), batch_bench_json(results, o, be.device_name()), "[bench]");
  return 0;
}

}  // namespace

static int cmd_bench(int argc, char** argv) {
  std::vector<std::string> vopts;
  for (const std::string& o : model_value_opts())
    if (o != "--inject") vopts.push_back(o);  // a benchmark of a perturbed model means nothing
  vopts.insert(vopts.end(), {"-p|--n-prompt", "-n|--n-gen", "-r|--reps", "--depth", "--shapes", "--corpus", "--seed",
                             "--json-out", "--synth", "--synth-dtype", "--synth-layers", "--concurrency"});
  auto fopts = model_flag_opts();
  fopts.insert(fopts.end(), {"--json", "--no-probes", "-h|--help"});
  Args a("bench", vopts, fopts);
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr,
                 "usage: arbiter bench -m MODEL [--device ref|cpu|cuda[:N]] [--dtype D] [-t THREADS] [-p 512] "
                 "[-n 128] [-r 5]\n"
                 "       [--depth D] [--shapes w1,w8,w256 --corpus FILE] [--json | --json-out FILE] [--no-probes]"
                 " [--stats]\n"
                 "       or --synth PRESET [--synth-dtype bf16|f16|f32] [--synth-layers N] instead of -m\n"
                 "Throughput next to limits measured in the same run (read bandwidth, matmul peak).\n"
                 "--synth builds `arbiter synth --preset PRESET --seed 0`'s checkpoint in host memory\n"
                 "(the same weights, in one buffer) and benches it with no file (a model too large for the\n"
                 "disk; on the cpu tier see ARBITER_CPU_WEIGHTS in docs/performance.md).\n"
                 "--depth D runs pp and tg behind D context tokens: tg's context is D plus the tokens\n"
                 "generated (-p sizes the prefill test, not tg's context).\n"
                 "--concurrency 1,8,64 instead measures continuous batching (serve --batching continuous;\n"
                 "every family, every tier): per level, that many greedy streams of -p prompt and -n new\n"
                 "tokens submitted at once; mean time to first token and aggregate decode tok/s.\n");
    return 0;
  }
  ARB_CHECK(a.positional().empty(), "[cli] bench: unexpected argument '%s'", a.positional()[0].c_str());
  BenchOptions o;
  // Checked before a --synth model is built (minutes for a large preset).
  o.n_prompt = a.int_in("n-prompt", 512, 1, std::numeric_limits<int32_t>::max());
  o.n_gen = a.int_in("n-gen", 128, 1, std::numeric_limits<int32_t>::max());
  o.reps = a.int_in("reps", 5, 1, std::numeric_limits<int32_t>::max());
  o.depth = a.int_in("depth", 0, 0, std::numeric_limits<int32_t>::max());
  o.threads = thread_count(a);
  o.seed = uint64_t(std::max<int64_t>(0, a.integer("seed", 1)));
  o.shapes = split_commas(a.str("shapes", ""));
  o.corpus_path = a.str("corpus", "");
  const bool synth = a.has("synth");
  ARB_CHECK(synth != a.has("model"), "[cli] bench: give -m MODEL or --synth PRESET (exactly one)");
  ARB_CHECK(synth || !(a.has("synth-dtype") || a.has("synth-layers")),
            "[cli] bench: --synth-dtype and --synth-layers go with --synth");
  o.model_path = synth ? "synth:" + a.str("synth") : a.str("model");
  o.probes = !a.flag("no-probes");
  ARB_CHECK(o.shapes.empty() || !o.corpus_path.empty(), "[cli] bench: --shapes needs --corpus FILE");
  for (const std::string& sh : o.shapes) (void)verify::named_shape(sh);  // unknown names fail now

  std::unique_ptr<Model> synth_m;
  if (synth) {
    SynthOptions so;
    so.preset = a.str("synth");
    so.dtype = dtype_from_name(a.str("synth-dtype", "bf16"));
    so.layers = a.int_in("synth-layers", 0, 1, 1000);
    so.threads = o.threads;
    synth_m = synth_model(so);
  }
  ModelRun run = open_model_run(a, std::move(synth_m));
  // Speed past the trained context is still a speed (like --shapes, which allows long
  // contexts), so bench warns where generate, serve and trace refuse (docs/performance.md).
  const int64_t positions = int64_t(o.depth) + std::max(o.n_prompt, o.n_gen);
  if (run.model->config.max_pos > 0 && positions > run.model->config.max_pos)
    std::fprintf(stderr,
                 "[bench] warning: --depth %d + max(-p %d, -n %d) = %lld positions passes the model's maximum of %d; "
                 "timings only, the logits there mean nothing\n",
                 o.depth, o.n_prompt, o.n_gen, (long long)positions, run.model->config.max_pos);
  if (a.has("concurrency")) return bench_concurrency(a, *run.model, *run.backend, o);
  BenchReport r = run_bench(*run.model, *run.backend, o);
  for (const std::string& sh : o.shapes) {
    progress_note("bench", "trace " + sh + " ...");
    r.traces.push_back(time_trace(*run.model, *run.backend, sh, o));
    bench_note_peak_rss(r);
  }
  std::fputs(a.flag("json") ? bench_report_json(r).c_str() : bench_report_text(r).c_str(), stdout);
  // The JSON beside the text, from the same run (written whole or not at all).
  if (a.has("json-out")) write_file_atomic(a.str("json-out"), bench_report_json(r), "[bench]");
  print_stats_if_asked(run);
  return 0;
}

REGISTER_COMMAND("bench", "throughput (pp, tg, traces) against limits measured in the same run", cmd_bench);

}  // namespace arbiter::cli
