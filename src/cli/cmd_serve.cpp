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
                             "--chat-template", "--max-body", "--http-threads", "--max-logprobs"});
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
  std::unique_ptr<Scheduler> sched = make_time_slice_scheduler(m, *run.backend, int(parallel), int(ctx), int(queue), run.inject);
  srv.set_ready(m, *sched, tpl.get());
  std::fprintf(stderr, "[serve] ready: '%s' on %s, %lld slot(s) x %lld tokens, chat template: %s\n",
               so.model_name.c_str(), run.backend->device_name().c_str(), (long long)parallel, (long long)ctx,
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
