#include "model/weights.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace arbiter {

namespace {

// Specs into tensors: each on its own, or grouped into the stack stack_of(spec) names.
std::vector<GgufTensorPlan> plan(const std::vector<TensorSpec>& specs, bool gguf) {
  std::vector<GgufTensorPlan> out;
  std::map<std::string, size_t> stacks;
  for (const TensorSpec& s : specs) {
    const StackSlice& st = gguf ? s.gguf_stack : s.hf_stack;
    if (st.empty() || (!gguf && !s.hf.empty())) {
      out.push_back({gguf ? s.gguf : s.hf,
                     gguf && !s.gguf_shape.empty() ? s.gguf_shape : s.shape, {&s}});
      continue;
    }
    const auto [it, fresh] = stacks.emplace(st.name, out.size());
    if (fresh)
      out.push_back({st.name,
                     st.experts > 0 ? std::vector<int64_t>{st.experts, st.rows, s.shape[1]}
                                    : std::vector<int64_t>{st.rows, s.shape[1]},
                     {}});
    out[it->second].parts.push_back(&s);
  }
  for (GgufTensorPlan& p : out) {
    if (p.parts.size() == 1 && p.parts[0]->shape.size() != 2) continue;
    auto slice = [gguf](const TensorSpec* s) -> const StackSlice& {
      return gguf ? s->gguf_stack : s->hf_stack;
    };
    std::stable_sort(p.parts.begin(), p.parts.end(), [&](const TensorSpec* a, const TensorSpec* b) {
      return slice(a).expert != slice(b).expert ? slice(a).expert < slice(b).expert
                                                : slice(a).row0 < slice(b).row0;
    });
    int64_t n = 0, want = 1;
    for (const TensorSpec* s : p.parts) n += s->shape[0] * s->shape[1];
    for (int64_t d : p.shape) want *= d;
    ARB_ASSERT(n == want);  // a stack's slices cover it exactly
  }
  return out;
}

}  // namespace

std::vector<GgufTensorPlan> gguf_plan(const std::vector<TensorSpec>& specs) { return plan(specs, true); }
std::vector<GgufTensorPlan> hf_plan(const std::vector<TensorSpec>& specs) { return plan(specs, false); }

void Weights::resize(int n_global, int n_layers, int n_layer_slots) {
  global_.assign(size_t(n_global), Tensor{});
  layers_.assign(size_t(n_layers), std::vector<Tensor>(size_t(n_layer_slots)));
}

const Tensor* Weights::find(std::string_view role, int layer) const {
  for (const TensorSpec& s : specs)
    if (s.role == role && s.layer == layer) {
      const Tensor& t = at(s);
      return t.empty() ? nullptr : &t;
    }
  return nullptr;
}

}  // namespace arbiter
