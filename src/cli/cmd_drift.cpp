// arbiter drift: where in the forward do two tiers part? (verify/localize/drift.h, docs/localize.md)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "cli/common.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/atomic_file.h"
#include "io/file.h"
#include "verify/localize/drift.h"
#include "verify/localize/gate.h"
#include "verify/localize/side.h"
#include "verify/localize/svg.h"

namespace arbiter::cli {

static const char* kDriftUsage =
    "usage: arbiter drift -m MODEL (--corpus FILE [--positions N] | --prompt TEXT | --ids FILE)\n"
    "                     [--continuation IDS] --a SIDE --b SIDE [--width W]\n"
    "                     [--tsv OUT] [--svg OUT] [--json] [--inject SPEC] [--mix SPEC] [-t N]\n"
    "                     [--route-decided X]\n"
    "  --a, --b        sides (DEVICE[:INDEX][:DTYPE][+inject=SPEC][+mix=SPEC]); a is the\n"
    "                  reference, b is checked (e.g. --a ref --b cuda:bf16)\n"
    "  --corpus FILE   BOS + the first N-1 tokens of FILE; --positions N (default 64)\n"
    "  --prompt TEXT   the prompt tokenized as arbiter gate does (BOS when the model has one)\n"
    "  --ids FILE      token ids as given (whitespace or comma separated; no BOS added)\n"
    "  --continuation IDS  ids appended after --prompt/--ids (a gate run's generated tokens):\n"
    "                  a list such as 12,7,99, or a file of ids; the last position's logits\n"
    "                  are the next step's\n"
    "  --width W       tokens per forward (default: all in one forward; 1 = decode path)\n"
    "  --inject SPEC   fault on side b (same as --b DEVICE+inject=SPEC)\n"
    "  --mix SPEC      ablation on the cuda side(s)\n"
    "  --tsv / --svg   per-stage table as TSV / error-by-layer plot\n"
    "  --json          one JSON object on stdout instead of the table\n"
    "exit: 0 when no stage's local error exceeds its bound, 1 when one does (or on error)\n";

/// BOS + the first n-1 tokens of the corpus text (whole file, no special tokens); n must not
/// pass the model's maximum positions.
std::vector<int32_t> corpus_positions(const Model& m, const InputFile& corpus, int n, const char* who) {
  const std::string& path = corpus.path();
  ARB_CHECK(n <= m.config.max_pos, "[%s] --positions %d passes the model's maximum of %d positions", who, n,
            m.config.max_pos);
  std::vector<int32_t> ids;
  if (m.tokenizer->bos_id() >= 0) ids.push_back(m.tokenizer->bos_id());
  std::vector<int32_t> body =
      m.tokenizer->encode(read_input_file(path, std::string("[").append(who).append("]"), kMaxInputBytes, "a corpus"),
                          false, false);
  ARB_CHECK(int64_t(ids.size() + body.size()) >= n, "[%s] %s: %zu tokens, --positions %d needs %d",
            who, path.c_str(), body.size(), n, n - int(ids.size()));
  ids.insert(ids.end(), body.begin(), body.begin() + (n - int(ids.size())));
  return ids;
}

/// Token ids written as integers separated by whitespace or commas; `source` names them in
/// errors ("[drift] ids.txt: entry 3 'x7' is not a token id ...").
static std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& source,
                                            int vocab) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (true) {
    i = text.find_first_not_of(" \t\r\n,", i);
    if (i == std::string::npos) break;
    const size_t e = std::min(text.find_first_of(" \t\r\n,", i), text.size());
    const std::string tok = text.substr(i, e - i);
    const size_t n = ids.size() + 1;
    ARB_CHECK(tok.size() <= 10 && tok.find_first_not_of("0123456789") == std::string::npos,
              "[drift] %s: entry %zu '%.40s' is not a token id (expected non-negative integers "
              "separated by whitespace or commas)",
              source.c_str(), n, tok.c_str());
    const long long v = std::stoll(tok);
    ARB_CHECK(v < vocab, "[drift] %s: entry %zu, token id %lld, is outside the vocabulary [0, %d)",
              source.c_str(), n, v, vocab);
    ids.push_back(int32_t(v));
    i = e;
  }
  ARB_CHECK(!ids.empty(), "[drift] %s: no token ids", source.c_str());
  return ids;
}

/// --continuation: a value naming an existing file is read from it (and `file` holds it open
/// like the other inputs); anything else is the list itself (so a mistyped path is refused as
/// a list entry, naming it).
static std::vector<int32_t> continuation_ids(const std::string& v, int vocab,
                                             std::unique_ptr<InputFile>& file) {
  std::error_code ec;
  if (!std::filesystem::exists(v, ec)) return parse_token_ids(v, "--continuation", vocab);
  file = std::make_unique<InputFile>(v, "[drift]");
  return parse_token_ids(read_input_file(v, "[drift]", kMaxInputBytes, "a token id file"), v,
                         vocab);
}

static int cmd_drift(int argc, char** argv) {
  Args a("drift",
         {"-m|--model", "--corpus", "--prompt", "--ids", "--continuation", "--a", "--b",
          "--positions", "--width", "--tsv", "--svg", "--inject", "--mix", "-t|--threads", "--device", "--dtype",
          "--route-decided"},
         {"--json", "-h|--help"});
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr, "%s%s", kDriftUsage, route_decided_help().c_str());
    return 0;
  }
  ARB_CHECK(!a.has("device") && !a.has("dtype"),
            "[cli] drift: name the tiers with --a and --b (e.g. --a ref --b cuda:bf16)");
  verify::Side sa = verify::parse_side(a.str("a")), sb = verify::parse_side(a.str("b"));
  if (a.has("inject")) {
    ARB_CHECK(!sb.inject.active, "[cli] drift: --b %s already has +inject; --inject given too",
              sb.label.c_str());
    sb.inject = InjectSpec::parse(a.str("inject"));
  }
  if (a.has("mix")) {
    bool any = false;
    for (verify::Side* s : {&sa, &sb})
      if (s->spec.device.rfind("cuda", 0) == 0 && s->spec.mix.empty())
        s->spec.mix = a.str("mix"), any = true;
    ARB_CHECK(any, "[cli] drift: --mix applies to a cuda side and neither --a nor --b is one");
  }
  const int n_inputs = int(a.has("corpus")) + int(a.has("prompt")) + int(a.has("ids"));
  ARB_CHECK(n_inputs == 1, "[cli] drift: give exactly one of --corpus, --prompt, --ids (got %d)",
            n_inputs);
  ARB_CHECK(!a.has("positions") || a.has("corpus"),
            "[cli] drift: --positions counts corpus tokens; with --prompt/--ids the positions "
            "are the prompt's (and --continuation's)");
  ARB_CHECK(!a.has("continuation") || !a.has("corpus"),
            "[cli] drift: --continuation follows --prompt or --ids, not --corpus");
  const int threads = thread_count(a);
  const double route_decided = route_decided_option(a, "drift");

  ActivityScope scope("running drift on model " + a.str("model"));
  std::unique_ptr<Model> m = load_model(a.str("model"));
  // Open until the outputs are written: --tsv or --svg naming an input is then refused.
  std::unique_ptr<InputFile> in_file, cont_file;
  std::vector<int32_t> ids;
  std::string input;
  if (a.has("corpus")) {
    in_file = std::make_unique<InputFile>(a.str("corpus"), "[drift]");
    ids = corpus_positions(
        *m, *in_file, a.int_in("positions", 64, 1, std::numeric_limits<int32_t>::max()), "drift");
    input = "BOS + corpus";
  } else {
    if (a.has("prompt")) {
      ids = verify::gate_prompt_ids(*m, a.str("prompt"));
      ARB_CHECK(!ids.empty(), "[cli] drift: --prompt encodes to no tokens");
      input = "prompt";
    } else {
      in_file = std::make_unique<InputFile>(a.str("ids"), "[drift]");
      ids = parse_token_ids(
          read_input_file(a.str("ids"), "[drift]", kMaxInputBytes, "a token id file"),
          a.str("ids"), m->config.vocab);
      input = "ids";
    }
    if (a.has("continuation")) {
      std::vector<int32_t> c = continuation_ids(a.str("continuation"), m->config.vocab, cont_file);
      ids.insert(ids.end(), c.begin(), c.end());
      input += " + " + std::to_string(c.size()) + " continuation";
    }
    ARB_CHECK(int64_t(ids.size()) <= m->config.max_pos,
              "[cli] drift: %s is %zu tokens, past the model's maximum of %d positions",
              input.c_str(), ids.size(), m->config.max_pos);
  }
  const int positions = int(ids.size());
  const int width = a.int_in("width", positions, 1, std::numeric_limits<int32_t>::max());
  auto be_a = verify::make_side_backend(sa, threads);
  auto be_b = verify::make_side_backend(sb, threads);
  const int wmax = std::min(width, positions);
  Session s_a(*m, *be_a, positions, wmax), s_b(*m, *be_b, positions, wmax);
  s_a.set_inject(sa.inject);
  s_b.set_inject(sb.inject);
  progress_note("drift", strformat("capturing %d positions on a = %s and b = %s, replaying b on a's inputs",
                                   positions, sa.label.c_str(), sb.label.c_str()));
  verify::DriftReport r = verify::drift_run(s_a, s_b, ids, wmax, nullptr, nullptr, "drift", route_decided);
  r.model_path = a.str("model");
  r.corpus_path = a.str("corpus", "");
  r.input = input;
  r.a_label = sa.label, r.b_label = sb.label;

  if (a.has("tsv")) write_file_atomic(a.str("tsv"), verify::drift_tsv(r), "[drift]");
  if (a.has("svg")) write_file_atomic(a.str("svg"), verify::drift_svg(r), "[drift]");
  if (a.flag("json"))
    std::printf("%s\n", verify::drift_json(r)
                            .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                            .c_str());
  else
    std::printf("%s", verify::drift_text(r).c_str());
  return r.n_flagged > 0 ? 1 : 0;
}

REGISTER_COMMAND("drift", "per-stage error between two tiers, accumulated and local", cmd_drift);

}  // namespace arbiter::cli
