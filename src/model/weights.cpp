#include "model/weights.h"

namespace arbiter {

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
