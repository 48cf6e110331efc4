// The tensors a model's forward reads, described once by its architecture (TensorSpec: names
// in both formats, shape, role, --mix family) and bound by the loader to views into the
// mapped files. The same list drives the loader, synth and the tiers' weight upload.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace arbiter {

enum class TensorKind {
  Matrix,  // [out, in], read by matmul (synth: N(0, 0.02))
  Norm,    // a norm's scale vector (synth: ones)
  Bias,    // an additive vector (synth: N(0, 0.02))
};

/// One tensor of an architecture for one config.
struct TensorSpec {
  std::string role;  // "wq": the forward's name for it (one per slot)
  int slot = 0;      // the arch's index for role: global slots, or per-layer slots
  int layer = -1;    // -1: global
  std::string hf;    // name in an HF safetensors checkpoint
  std::string gguf;  // name in a GGUF file
  std::vector<int64_t> shape;
  TensorKind kind = TensorKind::Matrix;
  const char* family = "";    // --mix family of the ops reading it (backend/mix.h)
  bool rope_rows = false;     // rows are RoPE'd heads (q/k): GGUF llama-family files permute
                              // them to adjacent pairs (model/archs/llama.cpp)
  const char* tie_to = nullptr;  // role of a global it may alias (lm_head -> embed when tied)
  double gguf_offset = 0;  // a GGUF stores the HF values plus this (gemma's norms: 1 + w)
};

class Weights {
 public:
  /// Slots: n_global global tensors, n_layer_slots per layer for n_layers layers.
  void resize(int n_global, int n_layers, int n_layer_slots);
  const Tensor& global(int slot) const { return global_[size_t(slot)]; }
  const Tensor& layer(int l, int slot) const { return layers_[size_t(l)][size_t(slot)]; }
  Tensor& global(int slot) { return global_[size_t(slot)]; }
  Tensor& layer(int l, int slot) { return layers_[size_t(l)][size_t(slot)]; }
  int n_layers() const { return int(layers_.size()); }

  /// The specs bound (in the architecture's order), and the tensor of one of them.
  std::vector<TensorSpec> specs;
  const Tensor& at(const TensorSpec& s) const {
    return s.layer < 0 ? global(s.slot) : layer(s.layer, s.slot);
  }
  Tensor& at(const TensorSpec& s) { return s.layer < 0 ? global(s.slot) : layer(s.layer, s.slot); }
  /// By role name (global when layer is -1); nullptr when absent or empty.
  const Tensor* find(std::string_view role, int layer = -1) const;

  /// Calls fn(spec, tensor) once per distinct storage (a tied matrix once), in spec order.
  template <class F>
  void for_each_distinct(F&& fn) const {
    std::vector<const void*> seen;
    for (const TensorSpec& s : specs) {
      const Tensor& t = at(s);
      if (t.empty()) continue;
      bool dup = false;
      for (const void* p : seen) dup = dup || p == t.data;
      if (dup) continue;
      seen.push_back(t.data);
      fn(s, t);
    }
  }

 private:
  std::vector<Tensor> global_;
  std::vector<std::vector<Tensor>> layers_;
};

}  // namespace arbiter
