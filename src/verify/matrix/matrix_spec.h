// The correctness matrix's spec (docs/matrix.md): a TOML file that declares models, shapes,
// a reference arm, candidate arms and control arms, the decision threshold, and the list of
// traces that follow from them. Parsing is strict: an unknown key, a value of the wrong type,
// an unknown device/shape/arm gives one arbiter::Error "[matrix] FILE:LINE: KEY: problem".
//
// To add a spec key: read it in parse_matrix_spec_text (matrix_spec.cpp) through the Table
// helper there (which is what turns every other key into an "unknown key" error), document it
// in docs/matrix.md, add a bad-input case to tests/matrix/matrix_spec_test.cpp.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "verify/trace/trace.h"

namespace arbiter::verify {

/// One arm: a tier configuration that produces one trace per model x shape.
struct MatrixArm {
  std::string name;                                      // [A-Za-z0-9_-]+, used in trace file names
  std::string device;                                    // "ref", "cpu", "cuda", "cuda:N"
  std::string dtype;                                     // as given; "" = the tier's default
  int threads = 0;                                       // cpu threads (-t); 0 = all cores
  std::vector<std::pair<std::string, std::string>> env;  // extra environment, sorted by name
  std::string inject = "none";                           // canonical --inject text
  std::string mix;                                       // canonical --mix text, "" = none
  std::string note;                                      // free text for the report
  // An endpoint arm traces an engine through its OpenAI-compatible API (trace --endpoint):
  // no device; dtype is the engine's compute dtype as the spec states it ("" unknown).
  std::string endpoint;   // http://HOST:PORT[/v1], "" = a local tier
  std::string api_model;  // the "model" of each request

  bool is_gpu() const;
  bool is_endpoint() const { return !endpoint.empty(); }
  /// The compute dtype a trace of this arm must record: ref f64, cpu f32, cuda dtype|bf16,
  /// an endpoint its stated dtype ("" unknown).
  std::string compute() const;
  /// "device dtype [inject ...] [mix ...] [env ...]" for tables.
  std::string describe() const;
};

/// A shape of the matrix: a named trace shape, its chunk count possibly capped by the spec.
struct MatrixShape {
  TraceShape shape;     // max_chunks already capped
  int full_chunks = 0;  // the named shape's own chunk count
  bool capped() const { return shape.max_chunks < full_chunks; }
};

/// A pair of arms compared with each other: the reference side and the judged side.
struct ArmPair {
  std::string ref, cand;
};

/// The optional [gate] table: a greedy token gate (verify/localize/gate.h) per model across
/// arms of the matrix, run by `matrix run` after the traces (docs/matrix.md "Token gate").
struct MatrixGate {
  std::string prompts;               // as written; relative to the spec file's directory
  std::string prompts_path;          // resolved against the spec file's directory
  int n_tokens = 32, runs = 2;
  double band = 0.5;                 // nats
  std::vector<std::string> against;  // record directories as written (gate --against)
  std::vector<std::string> against_paths;  // resolved like prompts
  std::vector<std::string> arms;     // the sides, the reference arm first
  int threads = 0;                   // the cpu arms' common -t (0 = all cores)
  bool localize = false;             // also run gate --localize (verify/localize/gate_localize.h)
};

struct MatrixSpec {
  std::string path;  // the spec file as given
  std::string text;  // its bytes (copied into the output directory)
  std::string question;
  std::string corpus;
  std::vector<std::string> models;  // paths as written (relative to the working directory)
  /// [parents]: per model, the unquantized checkpoint it was quantized from ("" = none, same
  /// order as models). The reference arm also traces the parent, and the report measures the
  /// quantization error (quantized reference vs parent reference) apart from kernel error.
  std::vector<std::string> parents;
  std::vector<MatrixShape> shapes;
  int topk = 8;
  double decided = 2.0;
  double kl_kappa = 0;  // drift gate budget factor (CompareOptions::kl_kappa); 0 = compare's default
  std::vector<double> sweep;
  bool allow_long_context = false;  // trace shapes past a model's maximum positions (recorded)
  std::vector<MatrixArm> arms;  // sorted by name
  std::string reference;
  std::vector<std::string> candidates;  // in spec order
  std::vector<std::string> aa;          // arms rerun for an A/A determinism check
  std::vector<ArmPair> noise_floor;     // trusted pairs whose drift is the noise floor
  bool has_gate = false;                // a [gate] table is present
  MatrixGate gate;

  const MatrixArm& arm(const std::string& name) const;
};

/// Reads and validates a spec file. Throws arbiter::Error "[matrix] PATH:LINE: KEY: problem".
MatrixSpec parse_matrix_spec(const std::string& path);
/// Same, from text (path only names the source in messages).
MatrixSpec parse_matrix_spec_text(const std::string& text, const std::string& path);

/// Short name of a model for file names and tables: the directory's or file's base name
/// without a .gguf extension.
std::string matrix_model_name(const std::string& model_path);

/// One trace the matrix needs.
struct MatrixTrace {
  size_t model = 0, shape = 0;  // indices into spec.models / spec.shapes
  std::string arm;
  bool aa = false;      // the A/A rerun of arm
  bool parent = false;  // the reference arm on the model's [parents] checkpoint
  std::string file;     // file name inside DIR/traces
  std::string logits;   // its full-logits file inside DIR/traces ("" = none): the traces of a
                        // model with a parent keep them for llama-perplexity's KLD statistics
};

/// The checkpoint trace t runs: the model, or its parent for a parent trace.
const std::string& matrix_trace_model(const MatrixSpec& spec, const MatrixTrace& t);

/// The arms that produce traces, reference first, then candidates, noise-floor arms and A/A
/// arms in spec order, each once.
std::vector<std::string> matrix_arm_order(const MatrixSpec& spec);

/// Every trace of the spec, model-major, then shape, reference first, then the other arms
/// in spec order, each A/A rerun right after its arm.
std::vector<MatrixTrace> matrix_traces(const MatrixSpec& spec);

/// Why an existing trace's header does not match what the spec asks for it ("" = it
/// matches). model_sha256 / corpus_sha256 are checked when non-empty (the report checks
/// traces without loading models; compare then checks that all arms agree).
std::string matrix_trace_mismatch(const MatrixSpec& spec, const MatrixTrace& t,
                                  const TraceHeader& h, const std::string& model_sha256,
                                  const std::string& corpus_sha256);

/// The `arbiter trace` arguments (no binary, no env, no -o) that produce trace t into the
/// traces directory tdir (which names its full-logits file, if it has one).
std::vector<std::string> matrix_trace_args(const MatrixSpec& spec, const MatrixTrace& t,
                                           const std::string& tdir);

}  // namespace arbiter::verify
