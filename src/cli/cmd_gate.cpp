// arbiter gate: greedy token gate across tiers (verify/localize/gate.h, docs/localize.md).
#include <cstdio>
#include <limits>
#include <optional>

#include "cli/common.h"
#include "core/error.h"
#include "io/file.h"
#include "verify/localize/gate.h"
#include "verify/localize/gate_localize.h"
#include "verify/localize/gate_record.h"

namespace arbiter::cli {

static const char* kGateUsage =
    "usage: arbiter gate -m MODEL --prompts FILE [-n N] [--runs K] --sides SIDE,SIDE[,...]\n"
    "                    [--band NATS] [--localize] [--json] [-t THREADS] [--mix SPEC] [--quiet]\n"
    "                    [--record DIR] [--against DIR[,DIR]] [--reproduce]\n"
    "  --prompts FILE  one prompt per line (blank lines skipped); its sha256 is printed\n"
    "  -n N            tokens to decode greedily per prompt (default 32)\n"
    "  --runs K        runs per side; a side must agree with itself (default 2)\n"
    "  --sides LIST    the first side is the reference. A side is\n"
    "                  DEVICE[:INDEX][:DTYPE][+inject=SPEC][+mix=SPEC], e.g.\n"
    "                  ref,cpu,cuda:bf16  or  ref,cpu+inject=op=down,layer=0,scale=3\n"
    "  --band NATS     a divergence within this many nats of the reference's top-1 is a\n"
    "                  near-tie, else a defect (default 0.5)\n"
    "  --localize      for each counted divergence of a side run here, drift between the\n"
    "                  reference and that side on the step's prefix: both sides' top-5, the\n"
    "                  first stage over its bound, and a class (near-tie flip, localized\n"
    "                  defect, unexplained)\n"
    "  --mix SPEC      ablation for every cuda side (per side: +mix=SPEC)\n"
    "  --json          one JSON object on stdout instead of the report\n"
    "  --record DIR    keep every side's decodes, top-5 and chain of custody in DIR (new or\n"
    "                  empty; one side alone is allowed)\n"
    "  --against DIRS  add the sides recorded in DIRS (after --sides; -n defaults to theirs);\n"
    "                  a record of other weights, tokenizer or prompts, a failed checksum or\n"
    "                  an op fallback is refused\n"
    "  --reproduce     rerun each recorded side here when its tier exists here, token by token\n"
    "exit: 0 pass, 1 fail (a defect, or with --reproduce a record that did not reproduce),\n"
    "      2 inconclusive (a side disagrees with itself), 3 incomparable (tokenizations\n"
    "      differ); other errors print one line and exit 1\n";

static int cmd_gate(int argc, char** argv) {
  Args a("gate",
         {"-m|--model", "--prompts", "-n|--n-tokens", "--runs", "--sides", "--band", "-t|--threads",
          "--mix", "--inject", "--device", "--dtype", "--record", "--against"},
         {"--json", "--localize", "--quiet", "--reproduce", "-h|--help"});
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
  std::string record_dir;
  if (a.has("record")) {
    record_dir = a.str("record");
    verify::gate_record_check_target(record_dir);  // before the run, not after it
    opt.topk = verify::kGateRecordTopK;
    opt.single_side = true;
  }
  for (const std::string& list : a.all("against"))
    for (size_t at = 0; at <= list.size();) {
      size_t end = list.find(',', at);
      if (end == std::string::npos) end = list.size();
      const std::string dir = list.substr(at, end - at);
      ARB_CHECK(!dir.empty(), "[cli] gate: --against '%s' holds an empty directory name",
                list.c_str());
      for (verify::GateRecordedSide& rs : verify::gate_record_read(dir))
        opt.recorded.push_back(std::move(rs));
      at = end + 1;
    }
  ARB_CHECK(!a.flag("reproduce") || !opt.recorded.empty(),
            "[cli] gate: --reproduce reruns recorded sides: give them with --against DIR");
  if (!a.has("n-tokens") && !opt.recorded.empty()) opt.n_tokens = opt.recorded[0].n_tokens;
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
  const std::vector<verify::GateResolutionRow> rows = verify::gate_resolve(r);
  std::vector<verify::GateReproduction> reps;
  if (a.flag("reproduce")) reps = verify::gate_reproduce(r, opt.recorded, opt.threads, opt.progress);
  if (!record_dir.empty()) {
    verify::GateRecordInfo info;
    info.env = arbiter_env();
    info.command = "arbiter gate";
    for (int i = 0; i < argc; ++i) info.command += std::string(" ") + argv[i];
    verify::gate_record_write(record_dir, r, info);
  }
  // Localized before anything is printed, so a failure there leaves no half report.
  std::optional<verify::GateLocalizeReport> loc;
  if (a.flag("localize")) loc = verify::run_gate_localize(opt, r);
  const bool show_resolution = r.sides.size() >= 3 || !opt.recorded.empty();
  if (a.flag("json")) {
    nlohmann::json j = verify::gate_json(r);
    if (loc) j["localize"] = verify::gate_localize_json(*loc);
    if (show_resolution) j["resolution"] = verify::gate_resolution_json(r, rows);
    if (a.flag("reproduce")) j["reproduction"] = verify::gate_reproduction_json(reps);
    if (!record_dir.empty()) j["record"] = record_dir;
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::string o = verify::gate_text(r);
    if (show_resolution) o += verify::gate_resolution_text(r, rows);
    if (a.flag("reproduce")) o += verify::gate_reproduction_text(r, reps);
    if (loc) o += verify::gate_localize_text(*loc);
    if (!record_dir.empty()) o += "\nrecord: " + record_dir + "\n";
    std::printf("%s", o.c_str());
  }
  // A record that does not reproduce on its own tier is evidence that cannot be trusted.
  for (const verify::GateReproduction& x : reps)
    if (x.attempted && !x.exact && r.verdict == verify::Verdict::Pass)
      return int(verify::Verdict::Fail);
  return int(r.verdict);
}

REGISTER_COMMAND("gate", "greedy token gate across tiers: near-tie or defect (exit = verdict)",
                 cmd_gate);

}  // namespace arbiter::cli
