// arbiter generate: prompt in, tokens streamed to stdout as they come.
#include <algorithm>
#include <cstdio>
#include <limits>

#include "cli/common.h"
#include "core/error.h"
#include "engine/generate.h"

namespace arbiter::cli {

static int cmd_generate(int argc, char** argv) {
  auto vopts = model_value_opts();
  vopts.insert(vopts.end(), {"-p|--prompt", "-n|--n-predict", "--temp", "--top-k", "--top-p",
                             "--seed", "--ctx"});
  auto fopts = model_flag_opts();
  fopts.insert(fopts.end(), {"--ids", "--no-bos", "-h|--help"});
  Args a("generate", vopts, fopts);
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr,
                 "usage: arbiter generate -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] "
                 "[--top-p P] [--seed S]\n"
                 "       [--device ref|cpu|cuda[:N]] [--dtype bf16|f16|f32] [-t THREADS] "
                 "[--ctx N] [--ids] [--no-bos] [--inject SPEC] [--stats]\n");
    return 0;
  }
  ModelRun run = open_model_run(a);
  const Model& m = *run.model;
  SamplerParams sp;
  sp.temperature = a.number("temp", 0.0);
  sp.top_k = a.int_in("top-k", 0, 0, std::numeric_limits<int32_t>::max());
  sp.top_p = a.number("top-p", 1.0);
  const int64_t seed = a.integer("seed", 0);
  ARB_CHECK(seed >= 0, "[cli] generate: --seed %lld must be >= 0", (long long)seed);
  sp.seed = uint64_t(seed);
  Sampler sampler(sp);
  // The cache is sized from --ctx, -n and the prompt: each is bounded by the model's maximum
  // positions before anything is allocated.
  int n = a.int_in("n-predict", 64, 0, m.config.max_pos);
  std::vector<int32_t> prompt = m.tokenizer->encode(a.str("prompt", ""), !a.flag("no-bos"), true);
  int ctx = a.int_in("ctx", std::min<int64_t>(m.config.max_pos, int64_t(prompt.size()) + n), 1, m.config.max_pos);
  ActivityScope scope(strformat("generating with a %d-position session on model %s", ctx, m.path.c_str()));
  Session s(m, *run.backend, ctx);
  s.set_inject(run.inject);

  const bool ids = a.flag("ids");
  StreamDecoder dec(*m.tokenizer);
  GenerateResult r = generate(s, prompt, n, sampler, m.eos_ids, [&](int32_t id) {
    if (ids) std::printf("%d ", id);
    else std::fputs(dec.push(id).c_str(), stdout);
    std::fflush(stdout);
  });
  if (!ids) std::fputs(dec.flush().c_str(), stdout);
  std::printf("\n");
  std::fprintf(stderr, "[generate] %zu prompt tokens in %.3f s, %zu tokens in %.3f s (%.1f tok/s)%s\n",
               prompt.size(), r.prefill_s, r.tokens.size(), r.decode_s,
               r.decode_s > 0 ? r.tokens.size() / r.decode_s : 0.0,
               r.stopped_on_eos ? ", stopped at EOS" : "");
  print_stats_if_asked(run);
  return 0;
}

REGISTER_COMMAND("generate", "generate text from a prompt (greedy at --temp 0)", cmd_generate);

}  // namespace arbiter::cli
