// arbiter gate: greedy token gate across tiers (verify/localize/gate.h, docs/localize.md).
#include <cstdio>
#include <limits>

#include "cli/common.h"
#include "core/error.h"
#include "io/file.h"
#include "verify/localize/gate.h"

namespace arbiter::cli {

static const char* kGateUsage =
    "usage: arbiter gate -m MODEL --prompts FILE [-n N] [--runs K] --sides SIDE,SIDE[,...]\n"
    "                    [--band NATS] [--json] [-t THREADS] [--mix SPEC] [--quiet]\n"
    "  --prompts FILE  one prompt per line (blank lines skipped); its sha256 is printed\n"
    "  -n N            tokens to decode greedily per prompt (default 32)\n"
    "  --runs K        runs per side; a side must agree with itself (default 2)\n"
    "  --sides LIST    the first side is the reference. A side is\n"
    "                  DEVICE[:INDEX][:DTYPE][+inject=SPEC][+mix=SPEC], e.g.\n"
    "                  ref,cpu,cuda:bf16  or  ref,cpu+inject=op=down,layer=0,scale=3\n"
    "  --band NATS     a divergence within this many nats of the reference's top-1 is a\n"
    "                  near-tie, else a defect (default 0.5)\n"
    "  --mix SPEC      ablation for every cuda side (per side: +mix=SPEC)\n"
    "  --json          one JSON object on stdout instead of the report\n"
    "exit: 0 pass, 1 fail (a defect), 2 inconclusive (a side disagrees with itself),\n"
    "      3 incomparable (tokenizations differ); other errors print one line and exit 1\n";

static int cmd_gate(int argc, char** argv) {
  Args a("gate",
         {"-m|--model", "--prompts", "-n|--n-tokens", "--runs", "--sides", "--band", "-t|--threads",
          "--mix", "--inject", "--device", "--dtype"},
         {"--json", "--quiet", "-h|--help"});
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr, "%s", kGateUsage);
    return 0;
  }
  ARB_CHECK(!a.has("inject"),
            "[cli] gate: a fault belongs to one side: write it on the side, e.g. "
            "--sides ref,cpu+inject=op=down,layer=0,scale=3");
  ARB_CHECK(!a.has("device") && !a.has("dtype"),
            "[cli] gate: name the tiers with --sides (e.g. --sides ref,cpu,cuda:bf16)");
  verify::GateOptions opt;
  opt.model_path = a.str("model");
  opt.prompts_path = a.str("prompts");
  // run_gate adds -n to the prompt length in an int before comparing with the model's
  // context: bounded here well below overflow, and above every model's context.
  opt.n_tokens = a.int_in("n-tokens", 32, 1, 1 << 24);
  opt.runs = a.int_in("runs", 2, 1, std::numeric_limits<int32_t>::max());
  opt.band = a.number("band", 0.5);
  opt.threads = thread_count(a);
  // The gate reads the prompt file itself (verify/localize): checked here first so that a
  // FIFO, a device or an oversized file is refused instead of read.
  const InputFile prompts(opt.prompts_path, "[gate]");
  ARB_CHECK(prompts.size() <= kMaxInputBytes, "[gate] %s: %llu bytes, over the %llu-byte limit for a prompt file",
            opt.prompts_path.c_str(), (unsigned long long)prompts.size(), (unsigned long long)kMaxInputBytes);
  opt.sides = verify::parse_sides(a.str("sides"));
  if (a.has("mix")) {
    bool any = false;
    for (verify::Side& s : opt.sides)
      if (s.spec.device.rfind("cuda", 0) == 0) {
        ARB_CHECK(s.spec.mix.empty(), "[cli] gate: side %s has +mix and --mix is given too",
                  s.label.c_str());
        s.spec.mix = a.str("mix");
        any = true;
      }
    ARB_CHECK(any, "[cli] gate: --mix applies to cuda sides and --sides has none");
  }
  opt.progress = !a.flag("quiet");
  verify::GateReport r = verify::run_gate(opt);
  if (a.flag("json"))
    std::printf(
        "%s\n",
        verify::gate_json(r).dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  else
    std::printf("%s", verify::gate_text(r).c_str());
  return int(r.verdict);
}

REGISTER_COMMAND("gate", "greedy token gate across tiers: near-tie or defect (exit = verdict)",
                 cmd_gate);

}  // namespace arbiter::cli
