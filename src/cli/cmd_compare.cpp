// arbiter compare REF CAND: judge a candidate trace against a reference (docs/traces.md).
// Exit code = verdict: 0 pass, 1 fail, 2 inconclusive, 3 incomparable, 4 unreadable. Any
// error that prevents a verdict (a file that cannot be read, bad arguments) exits 4 with
// one line on stderr, so that a script never mistakes it for a pass or a fail.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>

#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "io/gguf.h"
#include "verify/judge/compare.h"
#include "verify/judge/kld_compare.h"
#include "verify/trace/logprobs_jsonl.h"

namespace arbiter::cli {

// Invalid UTF-8 in a label must not make the JSON dump throw.
static constexpr auto kReplace = nlohmann::json::error_handler_t::replace;

static const char* kCompareUsage =
    "usage: arbiter compare REF CAND [--decided 2.0] [--kl-kappa K] [--route-decided %g] [--json|--explain]\n"
    "                       [--force] [--topk-only]\n"
    "                       [--ref-logits FILE --cand-logits FILE] [--window W] [--tokenizer MODEL]\n"
    "  REF, CAND   traces (arbiter format v1, or another engine's 6-column logit_trace TSV), or a\n"
    "              logprobs dump: completions replies with prompt logprobs, one chunk a line (a\n"
    "              .jsonl name or a first line starting with '{'; docs/traces.md §4), or two llama.cpp\n"
    "              KL-divergence files of the same tokens (llama-perplexity --kl-divergence-base,\n"
    "              arbiter trace --kld-out): llama-perplexity's statistics of CAND against REF, exit 0\n"
    "  --window    a dump's traced positions: the last W prompt tokens of each line (default:\n"
    "              the other side's chunk_tokens, else every scored prompt position)\n"
    "  --tokenizer a dump whose replies name tokens by text: MODEL's tokenizer maps them to ids\n"
    "  --decided   a position is decided when the reference's top-1 logit exceeds its top-2\n"
    "              by at least this (default 2.0); the gate is disagreement there\n"
    "  --kl-kappa  drift gate: fail when mean KL(ref||cand) > K * u^2 nats, u the coarser unit\n"
    "              roundoff of the two traces' compute dtypes (default %g; docs/traces.md)\n"
    "  --json      one JSON object on stdout instead of the report\n"
    "  --explain   after the report, each statistic's formula with this run's values\n"
    "  --force     judge even when model/corpus/tokenizer/shape/targets differ (report says so)\n"
    "  --topk-only ignore full-logits files (KL is then estimated from top-k + lse)\n"
    "  full-logits files default to REF.logits and CAND.logits when both exist\n"
    "exit: 0 pass, 1 fail, 2 inconclusive, 3 incomparable, 4 unreadable\n"
    "MoE traces:\n";

static int cmd_compare(int argc, char** argv) {
  using namespace verify;
  try {
    Args a("compare", {"--decided", "--kl-kappa", "--route-decided", "--ref-logits", "--cand-logits", "--window", "--tokenizer"},
           {"--json", "--force", "--topk-only", "--explain", "-h|--help"});
    a.parse(argc, argv);
    ARB_CHECK(!(a.flag("explain") && a.flag("json")), "[cli] compare: --explain adds to the text report; not with --json");
    if (a.flag("help")) {
      std::printf(kCompareUsage, kRouteDecided, kDefaultKlKappa);
      std::fputs(route_decided_help().c_str(), stdout);
      return 0;
    }
    ARB_CHECK(a.positional().size() == 2, "[cli] compare: expected REF and CAND, got %zu paths",
              a.positional().size());
    CompareOptions opt;
    opt.decided = a.number("decided", 2.0);
    ARB_CHECK(opt.decided > 0, "[cli] compare: --decided must be > 0 (got %g)", opt.decided);
    opt.kl_kappa = a.number("kl-kappa", kDefaultKlKappa);
    ARB_CHECK(opt.kl_kappa > 0 && std::isfinite(opt.kl_kappa),
              "[cli] compare: --kl-kappa must be a positive number (got %g)", opt.kl_kappa);
    opt.route_decided = route_decided_option(a, "compare");
    opt.force = a.flag("force");
    const std::string& ref_path = a.positional()[0];
    const std::string& cand_path = a.positional()[1];
    if (is_kld_file(ref_path) || is_kld_file(cand_path)) {  // llama.cpp's files: its statistics, no verdict
      const LlamaKldStats s = compare_kld_files(ref_path, cand_path);
      if (a.flag("json")) std::printf("%s\n", to_json(s).dump(2, ' ', false, kReplace).c_str());
      else std::fputs(format_llama_kld(s).c_str(), stdout);
      return 0;
    }
    if (!a.flag("topk-only")) {
      ARB_CHECK(a.has("ref-logits") == a.has("cand-logits"),
                "[cli] compare: give both --ref-logits and --cand-logits, or neither");
      if (a.has("ref-logits")) {
        opt.ref_logits = a.str("ref-logits");
        opt.cand_logits = a.str("cand-logits");
      } else {
        // Side files by convention; with only one present the KL is estimated and the
        // report says so.
        std::string lr = logits_path_for(ref_path), lc = logits_path_for(cand_path);
        if (std::filesystem::exists(lr)) opt.ref_logits = lr;
        if (std::filesystem::exists(lc)) opt.cand_logits = lc;
      }
    }
    const bool ref_dump = is_logprobs_jsonl_file(ref_path), cand_dump = is_logprobs_jsonl_file(cand_path);
    ARB_CHECK(ref_dump || cand_dump || (!a.has("window") && !a.has("tokenizer")),
              "[cli] compare: --window and --tokenizer apply to a logprobs dump (.jsonl) only");
    LogprobsJsonlOptions dump_opt;
    std::unique_ptr<Tokenizer> tok;
    if (a.has("tokenizer")) {
      const std::string m = a.str("tokenizer");
      if (std::filesystem::is_directory(m)) {
        tok = tokenizer_from_hf_dir(m);
      } else {
        GgufFile g(m);
        tok = tokenizer_from_gguf(g);
      }
      dump_opt.tokenizer = tok.get();
    }
    // A dump's window lines its rows up with the other side's chunks: --window, else that
    // side's chunk width (a dump does not say which of its prompt tokens were the context).
    auto read_side = [&](const std::string& path, bool dump, const Trace* other) {
      if (!dump) return read_trace(path);
      if (a.has("window")) {
        dump_opt.window = a.int_in("window", 1, std::numeric_limits<int32_t>::max());
        dump_opt.window_source = "--window";
      } else if (other && other->header.chunk_tokens > 0) {
        dump_opt.window = other->header.chunk_tokens;
        dump_opt.window_source = "the other side's chunk_tokens";
      }
      return read_logprobs_jsonl(path, dump_opt);
    };
    Trace ref, cand;
    if (ref_dump && !cand_dump) {
      cand = read_side(cand_path, false, nullptr);
      ref = read_side(ref_path, true, &cand);
    } else {
      ref = read_side(ref_path, ref_dump, nullptr);
      cand = read_side(cand_path, cand_dump, ref_dump ? nullptr : &ref);
    }
    CompareResult r = compare_traces(ref, cand, opt);
    if (a.flag("json")) std::printf("%s\n", to_json(r).dump(2, ' ', false, kReplace).c_str());
    else std::fputs(format_report(r).c_str(), stdout);
    if (a.flag("explain")) std::fputs(("\n" + format_explain(r)).c_str(), stdout);
    return int(r.verdict);
  } catch (const Error& e) {
    std::fprintf(stderr, "arbiter compare: unreadable: %s\n", e.what());
    return int(verify::Verdict::Unreadable);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arbiter compare: unreadable: %s\n", describe_failure(e).c_str());
    return int(verify::Verdict::Unreadable);
  }
}

REGISTER_COMMAND("compare", "judge a candidate trace against a reference (exit = verdict)",
                 cmd_compare);

}  // namespace arbiter::cli
