// arbiter bench: prompt processing, token generation, first-token latency, peak memory and
// trace throughput, each against a physical limit measured in the same run
// (src/engine/bench.h has the method; docs/performance.md the results).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "cli/common.h"
#include "core/error.h"
#include "engine/bench.h"
#include "engine/session.h"
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
    const int bos_rows = m.tokenizer->bos_id() >= 0 ? 1 : 0;
    const int W = to.shape.chunk_tokens, ctx = to.shape.prefill + bos_rows + W;
    std::vector<double> pos_s;
    for (int rep = 0; rep <= std::max(1, opt.reps); ++rep) {
      Session s(m, be, ctx, std::max(W, std::min(ctx, 512)));
      const verify::TraceRunResult r = verify::run_trace(s, to);
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

}  // namespace

static int cmd_bench(int argc, char** argv) {
  std::vector<std::string> vopts;
  for (const std::string& o : model_value_opts())
    if (o != "--inject") vopts.push_back(o);  // a benchmark of a perturbed model means nothing
  vopts.insert(vopts.end(), {"-p|--n-prompt", "-n|--n-gen", "-r|--reps", "--depth", "--shapes", "--corpus", "--seed",
                             "--json-out"});
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
                 "Throughput next to limits measured in the same run (read bandwidth, matmul peak).\n"
                 "--depth D runs pp and tg behind D context tokens: tg's context is D plus the tokens\n"
                 "generated (-p sizes the prefill test, not tg's context).\n");
    return 0;
  }
  ARB_CHECK(a.positional().empty(), "[cli] bench: unexpected argument '%s'", a.positional()[0].c_str());
  BenchOptions o;
  o.n_prompt = int(a.integer("n-prompt", 512));
  o.n_gen = int(a.integer("n-gen", 128));
  o.reps = int(a.integer("reps", 5));
  o.depth = int(a.integer("depth", 0));
  o.threads = int(a.integer("threads", 0));
  o.seed = uint64_t(std::max<int64_t>(0, a.integer("seed", 1)));
  o.shapes = split_commas(a.str("shapes", ""));
  o.corpus_path = a.str("corpus", "");
  o.model_path = a.str("model");
  o.probes = !a.flag("no-probes");
  ARB_CHECK(o.shapes.empty() || !o.corpus_path.empty(), "[cli] bench: --shapes needs --corpus FILE");
  for (const std::string& sh : o.shapes) (void)verify::named_shape(sh);  // unknown names fail now
  o.progress = [](const std::string& s) { std::fprintf(stderr, "[bench] %s\n", s.c_str()); };

  ModelRun run = open_model_run(a);
  BenchReport r = run_bench(*run.model, *run.backend, o);
  for (const std::string& sh : o.shapes) {
    o.progress("trace " + sh + " ...");
    r.traces.push_back(time_trace(*run.model, *run.backend, sh, o));
    bench_note_peak_rss(r);
  }
  std::fputs(a.flag("json") ? bench_report_json(r).c_str() : bench_report_text(r).c_str(), stdout);
  if (a.has("json-out")) {
    // The JSON beside the text, from the same run (written whole or not at all).
    const std::string path = a.str("json-out"), tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    ARB_CHECK(f != nullptr, "[cli] bench: cannot write %s", tmp.c_str());
    const std::string js = bench_report_json(r);
    const bool ok = std::fwrite(js.data(), 1, js.size(), f) == js.size();
    ARB_CHECK(std::fclose(f) == 0 && ok, "[cli] bench: write to %s failed", tmp.c_str());
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    ARB_CHECK(!ec, "[cli] bench: cannot rename %s to %s", tmp.c_str(), path.c_str());
  }
  print_stats_if_asked(run);
  return 0;
}

REGISTER_COMMAND("bench", "throughput (pp, tg, traces) against limits measured in the same run", cmd_bench);

}  // namespace arbiter::cli
