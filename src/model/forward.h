// The transformer forward pass, written once against the Backend op interface.
// llama / mistral / qwen2 / qwen3 differ only by config flags (bias, q/k norm, window).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace arbiter {

/// Named points inside the forward pass where a hook can read (capture) or change
/// (fault injection) the output just written. Layer is -1 for the ones outside blocks.
enum class Stage {
  Embed, AttnNorm, Q, K, V, QNorm, KNorm, QRope, KRope, Attn, O, AttnRes,
  FfnNorm, Gate, Up, Act, Down, FfnRes, FinalNorm, Logits
};
const char* stage_name(Stage s);
/// Throws arbiter::Error listing the valid names.
Stage stage_from_name(const std::string& name);
std::vector<Stage> all_stages();

/// Called after each stage with the buffer and its logical shape [rows, cols].
using StageHook = std::function<void(Stage s, int layer, Buffer& buf, int rows, int cols)>;

/// Per-layer KV cache, device-resident.
struct KVCache {
  std::vector<Buffer> k, v;  // L x [max_ctx, Hkv*Dh]
  int max_ctx = 0;
};

/// Scratch activations for forwards of up to max_T tokens.
struct Scratch {
  Buffer x, xn, q, k, v, att, o, gate, up, act, down;  // [max_T, ...]
  Buffer logits;                                      // [max_T, V]
  int max_T = 0;
};

void kv_cache_init(Backend& be, const ModelConfig& cfg, int max_ctx, KVCache& kv);
void kv_cache_free(Backend& be, KVCache& kv);
void scratch_init(Backend& be, const ModelConfig& cfg, int max_T, Scratch& s);
void scratch_free(Backend& be, Scratch& s);

/// Runs ids[T] at positions pos0.. through the model and writes logits [T, V] into s.logits,
/// or, when logits is false (a context pass that only fills the cache), stops after the last
/// layer. ids == nullptr (T == 1): the token of the backend's latest pick_greedy. The cache
/// rows [0, pos0) must hold earlier tokens. hook may be empty.
void forward(const Model& m, Backend& be, KVCache& kv, Scratch& s, const int32_t* ids, int T,
             int pos0, const StageHook& hook, bool logits);

}  // namespace arbiter
