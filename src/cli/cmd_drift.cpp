// arbiter drift: where in the forward do two tiers part? (verify/localize/drift.h, docs/localize.md)
#include <algorithm>
#include <cstdio>
#include <limits>

#include "cli/common.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/atomic_file.h"
#include "io/file.h"
#include "verify/localize/drift.h"
#include "verify/localize/side.h"
#include "verify/localize/svg.h"

namespace arbiter::cli {

static const char* kDriftUsage =
    "usage: arbiter drift -m MODEL --corpus FILE --a SIDE --b SIDE [--positions N] [--width W]\n"
    "                     [--tsv OUT] [--svg OUT] [--json] [--inject SPEC] [--mix SPEC] [-t N]\n"
    "  --a, --b        sides (DEVICE[:INDEX][:DTYPE][+inject=SPEC][+mix=SPEC]); a is the\n"
    "                  reference, b is checked (e.g. --a ref --b cuda:bf16)\n"
    "  --positions N   BOS + the first N-1 corpus tokens (default 64)\n"
    "  --width W       tokens per forward (default: all N in one forward; 1 = decode path)\n"
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
      m.tokenizer->encode(read_input_file(path, "[" + std::string(who) + "]", kMaxInputBytes, "a corpus"),
                          false, false);
  ARB_CHECK(int64_t(ids.size() + body.size()) >= n, "[%s] %s: %zu tokens, --positions %d needs %d",
            who, path.c_str(), body.size(), n, n - int(ids.size()));
  ids.insert(ids.end(), body.begin(), body.begin() + (n - int(ids.size())));
  return ids;
}

static int cmd_drift(int argc, char** argv) {
  Args a("drift",
         {"-m|--model", "--corpus", "--a", "--b", "--positions", "--width", "--tsv", "--svg",
          "--inject", "--mix", "-t|--threads", "--device", "--dtype"},
         {"--json", "-h|--help"});
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr, "%s", kDriftUsage);
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
  const int positions = a.int_in("positions", 64, 1, std::numeric_limits<int32_t>::max());
  const int width = a.int_in("width", positions, 1, std::numeric_limits<int32_t>::max());
  const int threads = thread_count(a);

  ActivityScope scope("running drift on model " + a.str("model"));
  std::unique_ptr<Model> m = load_model(a.str("model"));
  const std::string corpus = a.str("corpus");
  // Open until the outputs are written: --tsv or --svg naming the corpus is then refused.
  const InputFile corpus_file(corpus, "[drift]");
  std::vector<int32_t> ids = corpus_positions(*m, corpus_file, positions, "drift");
  auto be_a = verify::make_side_backend(sa, threads);
  auto be_b = verify::make_side_backend(sb, threads);
  const int wmax = std::min(width, positions);
  Session s_a(*m, *be_a, positions, wmax), s_b(*m, *be_b, positions, wmax);
  s_a.set_inject(sa.inject);
  s_b.set_inject(sb.inject);
  progress_note("drift", strformat("capturing %d positions on %s and %s", positions, sa.label.c_str(), sb.label.c_str()));
  Capture ca = capture_forwards(s_a, ids, wmax, "drift " + sa.label);
  Capture cb = capture_forwards(s_b, ids, wmax, "drift " + sb.label);
  progress_note("drift", "replaying every stage on " + sb.label + " from " + sa.label + "'s inputs");
  Capture cl = replay_forwards(s_b, ca, "drift replay " + sb.label);
  const Roundoff u = coarser(roundoff_of(be_a->compute()), roundoff_of(be_b->compute()));
  verify::DriftReport r = verify::drift_compare(ca, cb, cl, u);
  r.b_providers = be_b->stats().summary();
  r.model_path = a.str("model");
  r.corpus_path = corpus;
  r.a_label = sa.label, r.b_label = sb.label;
  r.a_device = be_a->device_name(), r.b_device = be_b->device_name();
  r.a_compute = dtype_name(be_a->compute()), r.b_compute = dtype_name(be_b->compute());
  r.a_inject = sa.inject.text, r.b_inject = sb.inject.text;

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
