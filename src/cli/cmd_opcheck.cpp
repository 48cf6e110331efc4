// arbiter opcheck: every op with the model's real shapes and weights against the f64 ref
// tier on identical (captured) inputs (verify/localize/opcheck.h, docs/localize.md).
#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>

#include "cli/common.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/atomic_file.h"
#include "io/file.h"
#include "verify/localize/opcheck.h"
#include "verify/localize/svg.h"

namespace arbiter::cli {

std::vector<int32_t> corpus_positions(const Model& m, const InputFile& corpus, int n, const char* who);

static const char* kOpcheckUsage =
    "usage: arbiter opcheck -m MODEL [--device cpu|cuda[:N]] [--dtype bf16|f16|f32]\n"
    "                       [--corpus FILE] [--positions N] [--width W] [--inject SPEC]\n"
    "                       [--mix SPEC] [--tsv OUT] [--json] [-t N]\n"
    "  Runs a ref (f64) forward of BOS + N-1 tokens (of --corpus, or of a built-in text),\n"
    "  then each op of the model on the checked tier from the inputs ref's op saw.\n"
    "  --width W       tokens per forward (default: all N in one; 1 = the decode path)\n"
    "  --inject SPEC   fault on the checked tier (to prove a faulty op is named)\n"
    "exit: 0 when every op is within its bound, 1 when any is out of line (or on error)\n";

// Used when no --corpus is given: plain English prose, so the ops see realistic activations.
static const char* kBuiltinText =
    "Once upon a time, in a small town by the sea, there lived a girl named Mia. Every morning "
    "she walked to the harbor to watch the boats come in. One day she found a little blue shell "
    "with a hole in it. She held it up to her ear and heard a soft song. \"Who is singing?\" "
    "she asked. A crab climbed out of the sand and smiled at her. \"The sea sings to those who "
    "listen,\" he said. Mia laughed and ran home to tell her mother about the singing shell. "
    "Her mother gave her a warm cup of milk and a big hug, and they sat by the window together "
    "until the sun went down.";

static int cmd_opcheck(int argc, char** argv) {
  auto vopts = model_value_opts();
  vopts.insert(vopts.end(), {"--corpus", "--positions", "--width", "--tsv"});
  auto fopts = model_flag_opts();
  fopts.insert(fopts.end(), {"--json", "-h|--help"});
  Args a("opcheck", vopts, fopts);
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr, "%s", kOpcheckUsage);
    return 0;
  }
  const int positions = a.int_in("positions", 64, 1, std::numeric_limits<int32_t>::max());
  const int width = std::min(a.int_in("width", positions, 1, std::numeric_limits<int32_t>::max()), positions);

  ModelRun run = open_model_run(a);  // the checked tier, with --inject
  const Model& m = *run.model;
  std::vector<int32_t> ids;
  // Open until --tsv is written: naming the corpus there is then refused.
  std::unique_ptr<InputFile> corpus;
  if (a.has("corpus")) {
    corpus = std::make_unique<InputFile>(a.str("corpus"), "[opcheck]");
    ids = corpus_positions(m, *corpus, positions, "opcheck");
  } else {
    ARB_CHECK(positions <= m.config.max_pos, "[opcheck] --positions %d passes the model's maximum of %d positions",
              positions, m.config.max_pos);
    if (m.tokenizer->bos_id() >= 0) ids.push_back(m.tokenizer->bos_id());
    std::vector<int32_t> body = m.tokenizer->encode(kBuiltinText, false, false);
    // Repeat the text when a long check asks for more tokens than it has.
    while (int(ids.size()) < positions)
      for (int32_t t : body)
        if (int(ids.size()) < positions) ids.push_back(t);
  }
  std::unique_ptr<Backend> ref = make_tier(DeviceSpec{"ref", "", 0, ""});
  ActivityScope scope(strformat("checking ops of model %s over %d positions", m.path.c_str(), positions));
  Session s_ref(m, *ref, positions, width);
  progress_note("opcheck", strformat("ref forward of %d positions (capturing every op's inputs)", positions));
  Capture cap = capture_forwards(s_ref, ids, width, "opcheck ref");

  Session s(m, *run.backend, positions, width);
  s.set_inject(run.inject);
  progress_note("opcheck", "replaying every op on " + run.backend->device_name());
  Capture replayed = replay_forwards(s, cap, "opcheck replay");
  const Roundoff u = coarser(roundoff_of(DType::F64), roundoff_of(run.backend->compute()));
  verify::OpcheckReport r = verify::run_opcheck(cap, replayed, *run.backend, m.config.vocab, u);
  r.model_path = a.str("model");
  r.device = run.backend->device_name();
  r.compute = dtype_name(run.backend->compute());
  r.inject = run.inject.text;
  if (a.has("tsv")) write_file_atomic(a.str("tsv"), verify::opcheck_tsv(r), "[opcheck]");
  if (a.flag("json"))
    std::printf("%s\n", verify::opcheck_json(r)
                            .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                            .c_str());
  else
    std::printf("%s", verify::opcheck_text(r).c_str());
  print_stats_if_asked(run);
  return r.n_flagged > 0 ? 1 : 0;
}

REGISTER_COMMAND("opcheck",
                 "each op on a tier against ref on identical inputs (exit 1: out of line)",
                 cmd_opcheck);

}  // namespace arbiter::cli
