// The probe API: what the verify layer needs from below the engine, in one place. Stage
// capture and replay on the path trace and generate run (the forward itself, with a hook
// that records or overwrites each stage, fused kernels included), tiers by name, and the
// build's identity. verify/ includes this and no backend header.
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/session.h"

namespace arbiter {

/// A stage's attention geometry, kept with the capture (model/stage.h AttentionGeometry).
struct CapturedAttention {
  std::string q, k, v;
  int H = 0, Hkv = 0, Dh = 0, window = 0;
  double scale = 0;
};

/// One stage output of one forward, as f64 [rows, cols], with what its bound needs.
struct StageRecord {
  std::string name;
  int layer = -1;
  std::string op;
  int rows = 0, cols = 0;
  int64_t reduction = 1;
  int roundings = 3;
  bool has_attention = false;
  CapturedAttention attention;
  std::vector<double> values;
  /// The squared error the tier's own rounding of the op's inputs beyond the storage type
  /// can add, summed over the values (StageTap::input_rounding: the cpu tier's decode
  /// matmuls on 8-bit activation codes); 0 when none, NaN when the tier could not attribute it.
  double input_rounding = 0;
};

/// The stages of one forward of T tokens at positions pos0.., in the order it computed them.
struct CapturedForward {
  int pos0 = 0, T = 0;
  std::vector<int32_t> ids;
  std::deque<StageRecord> stages;  // a deque: taps point into records while a forward runs
  RouteLog routes;                 // its MoE layers' routing decisions (none on a dense model)
  /// The record of (name, layer); throws arbiter::Error when it was not captured.
  const StageRecord& at(const std::string& name, int layer) const;
  const StageRecord* find(const std::string& name, int layer) const;
  /// Appends a record (a stage may appear once per forward); the reference stays valid.
  StageRecord& add(StageRecord r);

 private:
  std::map<std::pair<std::string, int>, size_t> index_;
};
using Capture = std::vector<CapturedForward>;

/// Resets s and runs tokens through it as forwards of at most width tokens (width = 1 is the
/// decode path), recording every stage after injection, its input rounding
/// (Backend::measure_input_rounding) and every routing decision. A non-empty progress_tag reports the
/// positions done on stderr (core/progress.h).
Capture capture_forwards(Session& s, const std::vector<int32_t>& tokens, int width,
                         const std::string& progress_tag = "");
/// Resets s and runs the forwards of `from` again on s's tier (its own fault included),
/// recording each stage and then overwriting it with from's output, so every op reads from's
/// inputs: each stage's error alone ("local"). A stage from does not hold is refused.
Capture replay_forwards(Session& s, const Capture& from, const std::string& progress_tag = "");

/// Tiers by name (backend/backend.h DeviceSpec): ref, cpu, cuda[:N] with a dtype and --mix.
std::unique_ptr<Backend> make_tier(const DeviceSpec& spec);
/// The canonical text of a --mix spec ("" for none); throws naming a bad entry.
std::string canonical_mix(const std::string& spec);
/// The CUDA runtime compiled in ("cuda-13.0"), or "none".
std::string cuda_runtime_version();
/// summarize() of one logits row computed on the host in f64 (the oracle of every tier's).
void summarize_on_host(const double* row, int V, int K, int32_t target, LogitsSummary& s);
/// The tier's own summarize() of logits rows [T, V] given on the host (written to a logits
/// buffer of the tier, which rounds them to its logits type: *logits_dtype).
std::vector<LogitsSummary> summarize_on_tier(Backend& be, const std::vector<double>& logits,
                                             int T, int V, int K,
                                             const std::vector<int32_t>& targets,
                                             DType* logits_dtype);

}  // namespace arbiter
