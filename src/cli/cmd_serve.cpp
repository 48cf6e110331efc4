// arbiter serve: the OpenAI-compatible server (src/server/, docs/serve.md). Binds first (so
// /health answers 503 while the model loads), then serves until SIGINT or SIGTERM, and
// shuts down cleanly: in-flight requests end, the engine thread is joined.
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "cli/common.h"
#include "core/error.h"
#include "server/server.h"

namespace arbiter::cli {

static int cmd_serve(int argc, char** argv) {
  auto vopts = model_value_opts();
  vopts.insert(vopts.end(), {"--host", "--port", "--api-key", "--parallel", "-c|--ctx", "--queue", "--alias",
                             "--chat-template", "--max-body", "--http-threads", "--max-logprobs",
                             "--batching", "--kv-blocks", "--step-tokens"});
  auto fopts = model_flag_opts();
  fopts.insert(fopts.end(), {"-h|--help"});
  Args a("serve", vopts, fopts);
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr,
                 "usage: arbiter serve -m MODEL [--device ref|cpu|cuda[:N]] [--dtype D] [-t N] [--inject SPEC]\n"
                 "       [--host 127.0.0.1] [--port 8080 (0: any free)] [--api-key KEY] [--parallel 1] [-c|--ctx N]\n"
                 "       [--queue 64] [--alias NAME] [--chat-template FILE] [--max-body BYTES] [--http-threads N]\n"
                 "       [--max-logprobs 20 (the largest top-N a request may ask for)]\n"
                 "       [--batching slices|continuous] [--kv-blocks N] [--step-tokens 256]\n"
                 "  --batching slices (default): one KV cache per slot, each active sequence advanced in turn by its\n"
                 "    own forward: every family and tier, --inject, and `arbiter generate`'s bits\n"
                 "  --batching continuous: one batched forward per step over every active sequence (chunked prefill\n"
                 "    within --step-tokens rows), K/V in a paged pool of --kv-blocks blocks of 16 positions (default:\n"
                 "    --parallel full contexts); batch-invariant greedy output; every family, on ref and cpu\n"
                 "endpoints: GET /health /v1/models /metrics, POST /v1/completions /v1/chat/completions (docs/serve.md)\n");
    return 0;
  }
  ARB_CHECK(a.positional().empty(), "[cli] serve: unexpected argument '%s'", a.positional()[0].c_str());
  server::ServerOptions so;
  so.host = a.str("host", "127.0.0.1");
  const int64_t port = a.integer("port", 8080);
  ARB_CHECK(port >= 0 && port <= 65535, "[cli] serve: --port %lld outside [0, 65535]", (long long)port);
  so.port = int(port);
  so.api_key = a.str("api-key", "");
  const int64_t parallel = a.integer("parallel", 1), queue = a.integer("queue", 64);
  ARB_CHECK(parallel >= 1 && parallel <= 256, "[cli] serve: --parallel %lld outside [1, 256]", (long long)parallel);
  ARB_CHECK(queue >= 0 && queue <= 4096, "[cli] serve: --queue %lld outside [0, 4096]", (long long)queue);
  const int64_t max_body = a.integer("max-body", int64_t(1) << 20);
  ARB_CHECK(max_body >= 1024, "[cli] serve: --max-body %lld must be >= 1024", (long long)max_body);
  so.max_body = size_t(max_body);
  so.http_threads = int(a.integer("http-threads", parallel + queue + 8));
  so.max_logprobs = int(a.integer("max-logprobs", 20));
  ARB_CHECK(so.max_logprobs >= 0 && so.max_logprobs <= 1 << 20, "[cli] serve: --max-logprobs must be in [0, 1048576]");
  ARB_CHECK(so.http_threads >= 2, "[cli] serve: --http-threads must be >= 2");
  const std::string batching = a.str("batching", "slices");
  ARB_CHECK(batching == "slices" || batching == "continuous",
            "[cli] serve: --batching '%s' (expected slices or continuous)", batching.c_str());
  const bool continuous = batching == "continuous";
  for (const char* o : {"kv-blocks", "step-tokens"})
    ARB_CHECK(continuous || !a.has(o), "[cli] serve: --%s needs --batching continuous", o);
  ARB_CHECK(!continuous || !a.has("inject"),
            "[cli] serve: --inject needs --batching slices (the batched forward runs no stage hooks)");
  const int64_t kv_blocks = a.integer("kv-blocks", 0), step_tokens = a.integer("step-tokens", 256);
  ARB_CHECK(kv_blocks >= 0 && kv_blocks <= (int64_t(1) << 24), "[cli] serve: --kv-blocks %lld outside [0 (the default), 16777216]",
            (long long)kv_blocks);
  ARB_CHECK(step_tokens >= parallel && step_tokens <= 4096,
            "[cli] serve: --step-tokens %lld outside [--parallel %lld, 4096]", (long long)step_tokens, (long long)parallel);
  std::string model_path = a.str("model");
  while (model_path.size() > 1 && model_path.back() == '/') model_path.pop_back();
  so.model_name = a.str("alias", std::filesystem::path(model_path).filename().string());

  // Signals are taken by sigwait below; every thread started from here on inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  server::Server srv(so);
  srv.start();
  std::fprintf(stderr, "[serve] listening on http://%s:%d (loading %s)\n", so.host.c_str(), srv.port(),
               model_path.c_str());
  ModelRun run = open_model_run(a);
  const Model& m = *run.model;
  const int64_t ctx = context_option(a, "serve", std::min<int64_t>(m.config.max_pos > 0 ? m.config.max_pos : 4096, 4096), 2, m);
  std::unique_ptr<ChatTemplate> tpl =
      a.has("chat-template") ? chat_template_from_file(a.str("chat-template"), *m.tokenizer)
                             : load_chat_template(model_path, *m.tokenizer);
  std::unique_ptr<Scheduler> sched;
  if (continuous) {
    BatchingOptions bo;
    bo.slots = int(parallel);
    bo.ctx = int(ctx);
    bo.queue_max = int(queue);
    bo.kv_blocks = int(kv_blocks);
    bo.step_tokens = int(step_tokens);
    sched = make_batching_scheduler(m, *run.backend, bo);
  } else {
    sched = make_time_slice_scheduler(m, *run.backend, int(parallel), int(ctx), int(queue), run.inject);
  }
  srv.set_ready(m, *sched, tpl.get());
  const Scheduler::Stats st = sched->stats();
  std::fprintf(stderr, "[serve] ready: '%s' on %s, %lld slot(s) x %lld tokens, %s, chat template: %s\n",
               so.model_name.c_str(), run.backend->device_name().c_str(), (long long)parallel, (long long)ctx,
               continuous ? ("continuous batching, " + std::to_string(st.kv_blocks) + " KV blocks of " +
                             std::to_string(kKvBlockRows) + ", " + std::to_string(step_tokens) + " rows a step")
                                .c_str()
                          : "time slicing",
               tpl ? tpl->name().c_str() : "none");

  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "[serve] %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  srv.stop();
  sched.reset();
  print_stats_if_asked(run);
  return 0;
}

REGISTER_COMMAND("serve", "OpenAI-compatible HTTP server (completions, chat, metrics)", cmd_serve);

}  // namespace arbiter::cli
