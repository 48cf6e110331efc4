#include "model/weights.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace arbiter {

std::vector<GgufTensorPlan> gguf_plan(const std::vector<TensorSpec>& specs) {
  std::vector<GgufTensorPlan> out;
  std::map<std::string, size_t> stacks;
  for (const TensorSpec& s : specs) {
    const StackSlice& st = s.gguf_stack;
    if (st.empty()) {
      out.push_back({s.gguf, s.gguf_shape.empty() ? s.shape : s.gguf_shape, {&s}});
      continue;
    }
    const auto [it, fresh] = stacks.emplace(st.name, out.size());
    if (fresh) out.push_back({st.name, {st.experts, st.rows, s.shape[1]}, {}});
    out[it->second].parts.push_back(&s);
  }
  for (GgufTensorPlan& p : out) {
    std::stable_sort(p.parts.begin(), p.parts.end(), [](const TensorSpec* a, const TensorSpec* b) {
      return a->gguf_stack.expert != b->gguf_stack.expert ? a->gguf_stack.expert < b->gguf_stack.expert
                                                          : a->gguf_stack.row0 < b->gguf_stack.row0;
    });
    int64_t n = 0, want = 1;
    for (const TensorSpec* s : p.parts) n += s->shape.size() == 2 && !s->gguf_stack.empty()
                                                 ? s->shape[0] * s->shape[1]
                                                 : 0;
    for (int64_t d : p.shape) want *= d;
    ARB_ASSERT(p.parts.size() == 1 || n == want);  // a stack's slices cover it exactly
  }
  return out;
}

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
