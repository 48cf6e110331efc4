// Helpers shared by the test suites: paths to shipped models and fixtures, temp dirs,
// running the CLI, greedy decoding two ways, sampling from whole logits rows.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "engine/scheduler.h"

namespace arbiter {
class Backend;
class Session;
struct Model;
struct SamplerParams;
}

namespace arbiter::test {

/// <repo>/rel
std::string source_path(const std::string& rel);
/// <repo>/../shared/rel, or "" when ../shared is absent (callers GTEST_SKIP with a reason).
std::string shared_path(const std::string& rel);
/// A fresh empty directory under the build's temp area, removed at process exit.
std::string temp_dir(const std::string& tag);
/// Runs the arbiter CLI with args (a shell-quoted string); captures stdout and stderr.
struct CliResult {
  int exit_code = -1;
  std::string out, err;
};
CliResult run_cli(const std::string& args);
/// run_cli under `timeout`: a run still going after `seconds` is killed and exits 124 (so a
/// test of something that must not block fails instead of hanging the suite).
CliResult run_cli_bounded(const std::string& args, int seconds);
std::string read_file(const std::string& path);
/// |a - b| / |b| (Euclidean norms): the relative error of a against b.
double rel_l2(const std::vector<double>& a, const std::vector<double>& b);
/// The message of the arbiter::Error that f() throws, or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
void write_file(const std::string& path, const std::string& data);

/// The largest |logit - HF float64| of m on be over a fixture's reference_logits.json (the
/// forward of its prompt_ids, the logits rows at its positions); throws on a row whose size
/// differs from the reference's.
double max_reference_logit_error(const Model& m, Backend& be, const std::string& reference_json);

/// n greedy ids after a prefill of prompt (s is reset first), each token read back with
/// summarize's top-1 and fed as a host id; the session is left after the last forward.
std::vector<int32_t> greedy_by_summarize(Session& s, const std::vector<int32_t>& prompt, int n);
/// The same with the tokens kept on the tier (Session::pick / forward_picked / take_pick, a
/// token taken after the next step is queued, as generate and bench run it).
std::vector<int32_t> greedy_by_pick(Session& s, const std::vector<int32_t>& prompt, int n);
/// n sampled tokens after prompt, each drawn by `p`'s sampler from the whole logits row read
/// back to the host (what generate() did for every sampled token before it asked summarize
/// for the top-k).
std::vector<int32_t> sampled_by_rows(Session& s, const std::vector<int32_t>& prompt, int n,
                                     const SamplerParams& p);

/// What a scheduler streamed for one request (engine/scheduler.h): the prompt's logprobs (when
/// asked), each token, how it finished. collect() waits for the end (a failure after 10^4 s).
struct Outcome {
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> tokens, prompt;
  FinishReason finish = FinishReason::Error;
  std::string error;
};
Outcome collect(SeqStream& s);
/// Submits every request, then collects each stream (a refused submit: an empty Outcome).
std::vector<Outcome> run_all(Scheduler& s, const std::vector<SeqRequest>& reqs);
/// n greedy requests of TinyStories-like prompts of 1 to ~40 tokens (7 texts in turn), of 6
/// to 16 new tokens.
std::vector<SeqRequest> greedy_requests(const Model& m, int n);

/// A bound weight by its role (model/archs/): "embed", "lm_head", or a layer's "wq" with
/// layer >= 0. An empty tensor when the model has none.
Tensor weight(const Model& m, const char* role, int layer = -1);
/// The llama family's tensors of one layer, by role (tests read their shapes and bytes).
struct LlamaLayer {
  Tensor attn_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, ffn_norm, w_gate, w_up, w_down;
};
LlamaLayer llama_layer(const Model& m, int layer);

}  // namespace arbiter::test
