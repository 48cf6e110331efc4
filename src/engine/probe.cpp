#include "engine/probe.h"

#include <algorithm>

#include "backend/cuda_factory.h"
#include "backend/mix.h"
#include "backend/ref/ref_backend.h"
#include "core/error.h"
#include "core/progress.h"

namespace arbiter {

const StageRecord* CapturedForward::find(const std::string& name, int layer) const {
  auto it = index_.find({name, layer});
  return it == index_.end() ? nullptr : &stages[it->second];
}

const StageRecord& CapturedForward::at(const std::string& name, int layer) const {
  const StageRecord* r = find(name, layer);
  ARB_CHECK(r != nullptr, "[probe] stage %s%s was not captured (forward at position %d)",
            name.c_str(), layer >= 0 ? ("@L" + std::to_string(layer)).c_str() : "", pos0);
  return *r;
}

StageRecord& CapturedForward::add(StageRecord r) {
  ARB_CHECK(index_.emplace(std::make_pair(r.name, r.layer), stages.size()).second,
            "[probe] stage %s at layer %d emitted twice in one forward", r.name.c_str(), r.layer);
  return stages.emplace_back(std::move(r));
}

namespace {

/// Records every stage of the current forward into it and, replaying, overwrites each with
/// the same stage of the source forward.
class Recorder final : public StageObserver {
 public:
  void begin(CapturedForward& f, const CapturedForward* src) {
    cur_ = &f;
    src_ = src;
  }
  void on_stage(const StagePoint& p, int pos0, StageTap& tap) override {
    ARB_ASSERT(cur_ != nullptr && pos0 == cur_->pos0);
    StageRecord n;
    n.name = p.name;
    n.layer = p.layer;
    StageRecord& r = cur_->add(std::move(n));
    r.layer = p.layer;
    r.op = p.op;
    r.rows = p.rows;
    r.cols = p.cols;
    r.reduction = p.reduction;
    r.roundings = p.roundings;
    if (p.attention) {
      const AttentionGeometry& g = *p.attention;
      r.has_attention = true;
      r.attention = {g.q, g.k, g.v, g.H, g.Hkv, g.Dh, g.window, g.scale};
    }
    tap.record = &r.values;
    tap.input_rounding = &r.input_rounding;
    if (src_) {
      const StageRecord& from = src_->at(r.name, r.layer);
      ARB_CHECK(from.rows == r.rows && from.cols == r.cols,
                "[probe] stage %s at layer %d: [%d, %d] here, [%d, %d] in the replayed capture",
                p.name, p.layer, r.rows, r.cols, from.rows, from.cols);
      tap.overwrite = &from.values;
    }
  }

 private:
  CapturedForward* cur_ = nullptr;
  const CapturedForward* src_ = nullptr;
};

/// Runs each forward of `forwards` (positions contiguous from 0) with a recorder attached.
Capture record(Session& s, std::vector<std::pair<std::vector<int32_t>, const CapturedForward*>> forwards,
               const std::string& progress_tag) {
  int64_t total = 0;
  for (const auto& f : forwards) total += int64_t(f.first.size());
  Progress meter(progress_tag, total, "positions", Progress::Unit::Count, !progress_tag.empty());
  Capture cap;
  Recorder rec;
  s.reset();
  s.set_observer(&rec);
  s.backend().measure_input_rounding(true);
  try {
    for (auto& [ids, src] : forwards) {
      CapturedForward& f = cap.emplace_back();
      f.pos0 = s.pos();
      f.T = int(ids.size());
      f.ids = std::move(ids);
      ARB_CHECK(!src || (src->pos0 == f.pos0 && src->T == f.T),
                "[probe] replayed forward at position %d of %d tokens, the capture's at %d of %d",
                f.pos0, f.T, src ? src->pos0 : 0, src ? src->T : 0);
      rec.begin(f, src);
      s.set_route_log(&f.routes);
      s.forward(f.ids);
      s.set_route_log(nullptr);
      meter.update(f.pos0 + f.T);
    }
  } catch (...) {
    s.set_observer(nullptr);
    s.set_route_log(nullptr);
    s.backend().measure_input_rounding(false);
    throw;
  }
  s.set_observer(nullptr);
  s.backend().measure_input_rounding(false);
  meter.finish();
  return cap;
}

}  // namespace

Capture capture_forwards(Session& s, const std::vector<int32_t>& tokens, int width, const std::string& progress_tag) {
  ARB_CHECK(width >= 1, "[probe] forward width %d must be >= 1", width);
  ARB_CHECK(!tokens.empty(), "[probe] no tokens to run");
  std::vector<std::pair<std::vector<int32_t>, const CapturedForward*>> fw;
  for (size_t i = 0; i < tokens.size(); i += size_t(width)) {
    const size_t n = std::min(tokens.size() - i, size_t(width));
    fw.emplace_back(std::vector<int32_t>(tokens.begin() + long(i), tokens.begin() + long(i + n)),
                    nullptr);
  }
  return record(s, std::move(fw), progress_tag);
}

Capture replay_forwards(Session& s, const Capture& from, const std::string& progress_tag) {
  ARB_CHECK(!from.empty(), "[probe] nothing to replay");
  std::vector<std::pair<std::vector<int32_t>, const CapturedForward*>> fw;
  for (const CapturedForward& f : from) fw.emplace_back(f.ids, &f);
  return record(s, std::move(fw), progress_tag);
}

std::unique_ptr<Backend> make_tier(const DeviceSpec& spec) { return make_backend(spec); }

std::string canonical_mix(const std::string& spec) {
  const MixSpec m = parse_mix(spec);
  return m.empty() ? "" : m.text();
}

std::string cuda_runtime_version() { return cuda_build_version(); }

std::vector<LogitsSummary> summarize_on_tier(Backend& be, const std::vector<double>& logits,
                                             int T, int V, int K,
                                             const std::vector<int32_t>& targets,
                                             DType* logits_dtype) {
  ARB_CHECK(int64_t(logits.size()) == int64_t(T) * V && int(targets.size()) == T,
            "[probe] summarize of %zu logits and %zu targets for [%d, %d]", logits.size(),
            targets.size(), T, V);
  Buffer b = be.alloc(int64_t(T) * V, /*logits=*/true);
  std::vector<LogitsSummary> out;
  try {
    be.write(b, 0, int64_t(T) * V, logits.data());
    be.summarize(b, T, V, K, targets.data(), out);
  } catch (...) {
    be.free(b);
    throw;
  }
  if (logits_dtype) *logits_dtype = b.dtype;
  be.free(b);
  return out;
}

void summarize_on_host(const double* row, int V, int K, int32_t target, LogitsSummary& s) {
  summarize_row(row, V, K, target, s);
}

}  // namespace arbiter
