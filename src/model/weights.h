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

/// Where a matrix sits when it is one expert's part of a 3-D stack [E, R, C] stored as one
/// tensor (GGUF's ffn_{gate,up,down}_exps, HF v5's fused experts.gate_up_proj / down_proj,
/// Granite's input_linear / output_linear): rows [row0, row0 + rows of the spec) of slice
/// `expert`. Those rows are contiguous, so the loader binds a view (no copy), also for block
/// types, whose rows are whole blocks. An empty name: the matrix is stored on its own.
struct StackSlice {
  std::string name;     // the stack's tensor name
  int64_t experts = 0;  // E; 0: the stack is one 2-D matrix [R, C] (rows of several matrices)
  int64_t rows = 0;     // R: rows of one expert's slice
  int64_t expert = 0;
  int64_t row0 = 0;
  bool empty() const { return name.empty(); }
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
  // Stacked storage (see StackSlice). GGUF: the only form when set. HF: read when the file
  // lacks `hf` (a per-expert name; empty where the family stores only stacks).
  StackSlice hf_stack, gguf_stack;
  // The GGUF form has its own shape (llama.cpp's converter reshapes Mamba2's conv1d, A, D and
  // norm); same elements in the same order. Empty: `shape`.
  std::vector<int64_t> gguf_shape;
  // A GGUF holds a function of the HF values (Mamba2's A = -exp(A_log)): the loader inverts it.
  enum class GgufValue { Same, NegExp } gguf_value = GgufValue::Same;
};

/// One tensor of a GGUF file holding specs: a spec on its own (in its GGUF shape), or a 3-D
/// stack [E, R, C] once, made of the specs slicing it in storage order (expert, then row).
struct GgufTensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<const TensorSpec*> parts;
};
/// The GGUF tensors of specs, in spec order (a stack where its first slice is).
std::vector<GgufTensorPlan> gguf_plan(const std::vector<TensorSpec>& specs);
/// The same for an HF checkpoint: a spec with an `hf` name on its own, the others grouped into
/// their hf_stack (Granite's input_linear / output_linear).
std::vector<GgufTensorPlan> hf_plan(const std::vector<TensorSpec>& specs);

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
