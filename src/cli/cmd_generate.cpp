// arbiter generate: prompt in, tokens streamed to stdout as they come; llama-cli's spelling
// of the common options. The prompt is the positional argument, -p TEXT, -f FILE, or stdin
// (-p -, or nothing given while stdin is not a terminal); exactly one of them. --chat runs
// the model's chat template over a conversation read from stdin, one user turn per line.
// Options it does not know are refused by the parser, never ignored.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>

#include "cli/common.h"
#include "core/error.h"
#include "engine/generate.h"
#include "io/file.h"
#include "tokenizer/chat_template.h"

namespace arbiter::cli {

static std::string read_stream(std::istream& in) {
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

static int cmd_generate(int argc, char** argv) {
  auto vopts = model_value_opts();
  vopts.insert(vopts.end(), {"-p|--prompt", "-f|--file", "-n|--n-predict", "--temp", "--top-k", "--top-p", "--min-p",
                             "--seed", "-c|--ctx-size|--ctx", "--repeat-penalty", "--presence-penalty",
                             "--frequency-penalty", "--chat-template"});
  auto fopts = model_flag_opts();
  fopts.insert(fopts.end(), {"--ids", "--no-bos", "--chat", "-h|--help"});
  Args a("generate", vopts, fopts);
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr,
                 "usage: arbiter generate -m MODEL [PROMPT | -p PROMPT | -p - | -f FILE | < FILE] [-n N (-1: until EOS"
                 " or the context)]\n"
                 "       [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S (default: random, printed)]\n"
                 "       [--repeat-penalty R] [--presence-penalty P] [--frequency-penalty F] [-c|--ctx-size N]\n"
                 "       [--chat [--chat-template FILE]] [--device ref|cpu|cuda[:N]] [--dtype bf16|f16|f32] [-t N]\n"
                 "       [--ids] [--no-bos] [--inject SPEC] [--stats]\n"
                 "  --chat: one user turn per stdin line, the reply after each (the model's chat template);\n"
                 "          a prompt given as well is the system message.\n");
    return 0;
  }
  // The prompt: exactly one source.
  const auto& pos = a.positional();
  ARB_CHECK(pos.size() <= 1, "[cli] generate: one prompt argument expected, got %zu (quote the prompt)", pos.size());
  const int sources = int(pos.size()) + a.has("prompt") + a.has("file");
  ARB_CHECK(sources <= 1, "[cli] generate: give the prompt once (positional, -p or -f)");
  std::string prompt_text;
  bool have_prompt = true;
  if (!pos.empty()) prompt_text = pos[0];
  else if (a.has("file")) prompt_text = read_input_file(a.str("file"), "[cli] generate:", kMaxInputBytes, "a prompt file");
  else if (a.has("prompt") && a.str("prompt") != "-") prompt_text = a.str("prompt");
  else if (!a.flag("chat") && (a.has("prompt") || !isatty(0))) {
    prompt_text = read_stream(std::cin);
    if (!prompt_text.empty() && prompt_text.back() == '\n') prompt_text.pop_back();  // `echo`'s newline
  }
  else have_prompt = false;

  SamplerParams sp;
  sp.temperature = a.number("temp", 0.0);
  sp.top_k = a.int_in("top-k", 0, 0, std::numeric_limits<int32_t>::max());
  sp.top_p = a.number("top-p", 1.0);
  sp.min_p = a.number("min-p", 0.0);
  const int64_t seed = a.integer("seed", 0);
  ARB_CHECK(seed >= 0, "[cli] generate: --seed %lld must be >= 0", (long long)seed);
  sp.seed = a.has("seed") ? uint64_t(seed) : uint64_t(std::random_device{}());
  PenaltyParams pen;
  pen.repeat = a.number("repeat-penalty", 1.0);
  pen.presence = a.number("presence-penalty", 0.0);
  pen.frequency = a.number("frequency-penalty", 0.0);
  check_penalties(pen);
  Sampler sampler(sp);  // checks the parameters before anything is printed or loaded
  const int64_t n = a.integer("n-predict", 64);
  ARB_CHECK(n >= -1, "[cli] generate: -n %lld: expected a count >= 0, or -1 (until EOS or the context is full)",
            (long long)n);
  if (!a.has("seed") && sp.temperature > 0) std::fprintf(stderr, "[generate] seed %llu\n", (unsigned long long)sp.seed);

  ModelRun run = open_model_run(a);
  const Model& m = *run.model;
  const bool ids = a.flag("ids");
  const int64_t max_pos = m.config.max_pos > 0 ? m.config.max_pos : 4096;
  // The cache is sized from -c, -n and the prompt: each is bounded by the model's positions
  // before anything is allocated.
  ARB_CHECK(n <= max_pos, "[cli] generate: -n %lld exceeds the model's %lld positions", (long long)n,
            (long long)max_pos);

  if (!a.flag("chat")) {
    ARB_CHECK(!a.has("chat-template"), "[cli] generate: --chat-template needs --chat");
    if (!have_prompt) std::fprintf(stderr, "[generate] no prompt given: generating from BOS\n");
    std::vector<int32_t> prompt = m.tokenizer->encode(prompt_text, !a.flag("no-bos"), true);
    const int ctx =
        context_option(a, "generate", n < 0 ? max_pos : std::min<int64_t>(max_pos, int64_t(prompt.size()) + n), 1, m);
    ActivityScope scope(strformat("generating with a %d-position session on model %s", ctx, m.path.c_str()));
    Session s(m, *run.backend, ctx);
    s.set_inject(run.inject);
    StreamDecoder dec(*m.tokenizer);
    GenerateResult r = generate(s, prompt, int(n), sampler, m.eos_ids, [&](int32_t id) {
      if (ids) std::printf("%d ", id);
      else std::fputs(dec.push(id).c_str(), stdout);
      std::fflush(stdout);
    }, pen);
    if (!ids) std::fputs(dec.flush().c_str(), stdout);
    std::printf("\n");
    std::fprintf(stderr, "[generate] %zu prompt tokens in %.3f s, %zu tokens in %.3f s (%.1f tok/s)%s\n", prompt.size(),
                 r.prefill_s, r.tokens.size(), r.decode_s, r.decode_s > 0 ? r.tokens.size() / r.decode_s : 0.0,
                 r.stopped_on_eos ? ", stopped at EOS" : "");
    print_stats_if_asked(run);
    return 0;
  }

  // --chat: the conversation so far is rendered whole and prefilled anew for every turn.
  ARB_CHECK(!ids && !a.flag("no-bos"), "[cli] generate: --ids and --no-bos do not apply to --chat");
  std::unique_ptr<ChatTemplate> tpl = a.has("chat-template") ? chat_template_from_file(a.str("chat-template"), *m.tokenizer)
                                                             : load_chat_template(a.str("model"), *m.tokenizer);
  ARB_CHECK(tpl, "[cli] generate: %s has no chat template; give one with --chat-template FILE", a.str("model").c_str());
  const int64_t ctx = context_option(a, "generate", max_pos, 1, m);
  ActivityScope scope(strformat("chatting with a %lld-position session on model %s", (long long)ctx, m.path.c_str()));
  Session s(m, *run.backend, int(ctx));
  s.set_inject(run.inject);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (have_prompt) messages.push_back({{"role", "system"}, {"content", prompt_text}});
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::vector<int32_t> prompt = m.tokenizer->encode(tpl->render(messages, true), false, true);
    ARB_CHECK(int64_t(prompt.size()) < ctx, "[cli] generate: the conversation (%zu tokens) fills the context (%lld)",
              prompt.size(), (long long)ctx);
    StreamDecoder dec(*m.tokenizer);
    std::string reply;
    generate(s, prompt, n < 0 ? -1 : int(std::min<int64_t>(n, ctx - int64_t(prompt.size()))), sampler, m.eos_ids,
             [&](int32_t id) {
               const std::string piece = dec.push(id);
               reply += piece;
               std::fputs(piece.c_str(), stdout);
               std::fflush(stdout);
             }, pen);
    const std::string rest = dec.flush();
    reply += rest;
    std::printf("%s\n", rest.c_str());
    std::fflush(stdout);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  print_stats_if_asked(run);
  return 0;
}

REGISTER_COMMAND("generate", "generate text from a prompt (greedy at --temp 0)", cmd_generate);

}  // namespace arbiter::cli
