// The hybrid family: Mamba2/attention hybrids. GraniteMoeHybridForCausalLM (granite-4.0-h)
// and NemotronHForCausalLM (Nemotron-H, Nemotron 3). Semantics from transformers v5.17's
// modeling_granitemoehybrid.py and modeling_nemotron_h.py (its mixer is Zamba2MambaMixer's);
// GGUF as llama.cpp's converter writes them (granitehybrid, nemotron_h, nemotron_h_moe).
//
// Granite, per layer (pre-norm, both sublayers scaled by residual_multiplier):
//   x += m * mixer(input_layernorm(x)),  mixer = Mamba2 or attention (layer_types)
//   x += m * shared_mlp(xn),             xn = post_attention_layernorm(x); shared_mlp is
//        SwiGLU with gate and up stacked in input_linear
// with the embedding times embedding_multiplier, attention scores times attention_multiplier,
// RoPE only under position_embedding_type "rope", and the logits divided by logits_scaling.
// Nemotron-H: one block per layer, x += block(norm(x)), the block a Mamba2 mixer ('M'),
// attention without RoPE ('*'), a relu2 MLP ('-') or an MoE ('E'), after its pattern string.
//
// The Mamba2 mixer: in_proj gives z [I], xBC [I + 2 G N] and dt [nh]; xBC goes through the
// causal conv (ssm_conv) and the selective scan (ssm_scan, from the layer's state); then
// out_proj(rmsnorm_gated(y, z)). The two models differ inside it in two places, both taken
// from HF's torch paths: the gated norm's RMS (Granite: the full width; Nemotron-H: each of
// the n_groups groups) and dt's clamp (Granite: time_step_limit; Nemotron-H: time_step_min
// from below only, Zamba2MambaMixer's torch_forward).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "io/json_config.h"
#include "model/archs/batched.h"
#include "model/archs/decoder_state.h"
#include "model/archs/hybrid.h"
#include "model/model.h"
#include "model/rope_config.h"
#include "model/synth.h"

namespace arbiter {

namespace hybrid {

namespace {

// Rows [r0, r0 + n) of a matrix as a matrix of their own (in_proj's z / xBC / dt parts): a
// view into the same storage.
Tensor row_slice(const Tensor& W, int64_t r0, int64_t n, const char* part) {
  Tensor t;
  t.name = W.name + part;
  t.dtype = W.dtype;
  t.shape = {n, W.cols()};
  t.data = W.row(r0);
  return t;
}


// The widest MLP the scratch must hold: the dense MLP's, or Nemotron-H's shared expert's,
// which may be wider (Nemotron-3-Nano: 3,712 against 1,856; Granite's shared MLP is d_ff).
int64_t mlp_width(const ModelConfig& c) {
  return c.moe_experts > 0 && !granite(c) ? std::max<int64_t>(c.d_ff, c.moe_shared_ff) : c.d_ff;
}

class HybridState final : public DecoderState {
 public:
  /// seqs: the sequences whose recurrent states it holds (slots; 1 for a Session, the
  /// batching scheduler's slots for a batched forward, whose K/V caches are its paged pool).
  HybridState(Backend& be, const ModelConfig& c, int max_ctx_, int max_T_, int seqs_ = 1)
      : DecoderState(be, c, max_ctx_, max_T_, /*ring_sliding=*/false, kv_layers(c), mlp_width(c)),
        seqs(seqs_) {
    const int64_t T = max_T_, I = int64_t(c.ssm_heads) * c.ssm_head_dim;
    const int64_t C = I + 2 * int64_t(c.ssm_groups) * c.ssm_state;
    conv_n_ = (c.ssm_conv - 1) * C;
    ssm_n_ = I * c.ssm_state;
    for (int l = 0; l < c.n_layer; ++l) {
      const bool m = c.layer_blocks[size_t(l)] == 'M';
      conv_state.push_back(m ? be.alloc(seqs * conv_n_) : Buffer{});  // [seqs, K-1, C]
      // The SSM state in the tier's logits type (f32 on cuda, as on cpu; f64 on ref): each
      // token decays and adds to it, so a bf16 state would be rounded T times over.
      ssm_state.push_back(m ? be.alloc(seqs * ssm_n_, /*logits=*/true) : Buffer{});  // [seqs, nh, hd, N]
    }
    slot_pos.assign(size_t(seqs), 0);
    if (c.moe_experts > 0) {
      router = be.alloc(T * c.moe_experts);
      moe = be.alloc(T * c.d_model);
    }
    z = be.alloc(T * I);
    xbc = be.alloc(T * C);
    xbc_act = be.alloc(T * C);
    dt = be.alloc(T * c.ssm_heads);
    y = be.alloc(T * I);
    yn = be.alloc(T * I);
  }
  ~HybridState() override {
    for (Buffer* b : {&z, &xbc, &xbc_act, &dt, &y, &yn, &router, &moe})
      be_.free(*b);
    for (Buffer& b : conv_state) be_.free(b);
    for (Buffer& b : ssm_state) be_.free(b);
  }
  /// Zeroes slot's recurrent states (a sequence starting at position 0).
  void clear_slot(int slot) {
    for (auto [v, n] : {std::pair{&conv_state, conv_n_}, std::pair{&ssm_state, ssm_n_}})
      for (Buffer& b : *v)
        if (b.n) {
          const std::vector<double> zeros(size_t(n), 0.0);
          be_.write(b, slot * n, n, zeros.data());
        }
    slot_pos[size_t(slot)] = 0;
  }
  /// Layer l's conv state [K-1, C] and SSM state [nh, hd, N] of slot.
  Buffer conv_slot(int l, int slot) const {
    return buffer_view(conv_state[size_t(l)], slot * conv_n_, conv_n_);
  }
  Buffer ssm_slot(int l, int slot) const {
    return buffer_view(ssm_state[size_t(l)], slot * ssm_n_, ssm_n_);
  }

  /// Layer l's routed experts as Backend::moe reads them, built at the layer's first MoE
  /// forward (a decode step would otherwise rebuild 3E views per layer).
  const Backend::MoeExperts& experts(const Model& m, int l);

  const int seqs;
  std::vector<Buffer> conv_state, ssm_state;  // [L]; empty on non-Mamba layers
  Buffer z, xbc, xbc_act, dt, y, yn;           // [max_T, ...]
  Buffer router, moe;                          // [max_T, E], [max_T, D]
  std::vector<int> slot_pos;  // [seqs] tokens each slot's recurrent states have consumed

 private:
  int64_t conv_n_ = 0, ssm_n_ = 0;  // elements of one slot's conv and SSM state
  std::vector<Backend::MoeExperts> experts_;  // [L], filled on first use
  static std::vector<bool> kv_layers(const ModelConfig& c) {
    std::vector<bool> kv(static_cast<size_t>(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l) kv[size_t(l)] = c.layer_blocks[size_t(l)] == '*';
    return kv;
  }
};

const Backend::MoeExperts& HybridState::experts(const Model& m, int l) {
  const ModelConfig& c = m.config;
  if (experts_.empty()) experts_.resize(size_t(c.n_layer));
  Backend::MoeExperts& ex = experts_[size_t(l)];
  if (!ex.up.empty()) return ex;
  auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
  const int E = c.moe_experts;
  ex.spec = router_spec(c);
  if (granite(c)) {  // views into [E, 2F, D] (gate rows, then up rows) and [E, D, F]
    for (int e = 0; e < E; ++e) {
      ex.gate.push_back(&lw(kExpert0 + 3 * e));
      ex.up.push_back(&lw(kExpert0 + 3 * e + 1));
      ex.down.push_back(&lw(kExpert0 + 3 * e + 2));
    }
  } else {  // Nemotron-H: relu2 experts, a selection bias
    ex.bias = &lw(kRouterBias);
    ex.relu2 = true;
    for (int e = 0; e < E; ++e) {
      ex.up.push_back(&lw(kExpert0 + 3 * e + 1));
      ex.down.push_back(&lw(kExpert0 + 3 * e + 2));
    }
  }
  return ex;
}

// A block's norm weight and the names of its norm and residual stages.
struct Block {
  const Tensor& w;
  const char* norm;
  const char* res;
};

// The stage of x += residual_multiplier * o (Granite; Nemotron-H adds o as it is).
const StageTap* residual_tap(const ModelConfig& c, const Block& in, int l, const Stages& tap) {
  return tap(in.res, l, "add", c.d_model, 1, c.residual_mult != 1 ? 4 : 3);
}

// The causal conv of a mixer layer (width K) on one sequence's rows, continuing conv_state
// [K-1, C] into act, with its stages.
Backend::ConvTarget mamba_conv(const Model& m, int l, Buffer& conv_state, Buffer& act,
                               const Stages& tap) {
  const ModelConfig& c = m.config;
  const int C = c.ssm_heads * c.ssm_head_dim + 2 * c.ssm_groups * c.ssm_state, K = c.ssm_conv;
  Backend::ConvTarget conv;
  conv.of = 1;  // xBC, the second of the in_proj's outputs
  conv.w = &m.weights.layer(l, kConvW);
  conv.bias = c.ssm_conv_bias ? &m.weights.layer(l, kConvB) : nullptr;
  conv.K = K;
  conv.state = &conv_state;
  conv.act = &act;
  conv.tap = tap("ssm_conv", l, "ssm_conv", C, K + 1, 4);
  // The conv state keeps the last K-1 input rows: a copy of xBC, one rounding to its type.
  conv.state_tap = tap.state("ssm_conv_state", l, "ssm_conv", K - 1, C, 1, 1);
  return conv;
}

// The selective scan of one sequence's T rows at positions pos0..: xbc_act [T, C] (the conv's
// output) with dt [T, nh] into y [T, I], continuing the sequence's ssm_state [nh, hd, N].
void mamba_scan(const Model& m, Backend& be, int l, int T, int pos0, const Buffer& xbc_act,
                const Buffer& dt, Buffer& ssm_state, Buffer& y, const Stages& tap) {
  const ModelConfig& c = m.config;
  auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
  const int nh = c.ssm_heads, hd = c.ssm_head_dim, N = c.ssm_state;
  const int G = c.ssm_groups, I = nh * hd;
  be.ssm_scan(xbc_act, dt, lw(kALog), lw(kD), lw(kDtBias), c.ssm_dt_min, c.ssm_dt_max, T, nh, hd,
              G, N, c.ssm_chunk, ssm_state, y);
  // Each output sums N state terms; each state carries every earlier token's update; a
  // prefill's chunked form (cpu, cuda) adds a chunk's terms, each with its summed decays.
  const int chunk_terms = T > 1 ? 2 * std::min(c.ssm_chunk, T) : 0;
  be.apply_tap(tap("ssm_scan", l, "ssm_scan", I, N + pos0 + T + chunk_terms, 6), y, T, I);
  // The state [nh, hd * N], one row per head: each element sums every token's decayed
  // update so far (plus the chunked form's terms), without the output's sum over N.
  be.apply_tap(tap.state("ssm_state", l, "ssm_scan", nh, hd * N, pos0 + T + chunk_terms, 6),
               ssm_state, nh, hd * N);
}

// x += residual_multiplier * out_proj(rmsnorm_gated(scan(conv(xBC)), z)), z/xBC/dt of
// rmsnorm(x). The projections and the gated norm run once over all T rows; the conv and the
// scan per sequence (batch: each on its rows and its slot's states; else the one sequence,
// whose conv may run inside the projection: rmsnorm_matmul_conv).
void mamba(const Model& m, Backend& be, HybridState& s, int l, int T, int pos0, const Block& in,
           const std::vector<BatchSeq>* batch, const Stages& tap) {
  const ModelConfig& c = m.config;
  auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
  const int D = c.d_model, nh = c.ssm_heads, hd = c.ssm_head_dim;
  const int G = c.ssm_groups, I = nh * hd, C = I + 2 * G * c.ssm_state;
  const Tensor& in_proj = lw(kInProj);
  const Tensor wz = row_slice(in_proj, 0, I, "[z]"), wxbc = row_slice(in_proj, I, C, "[xBC]");
  const Tensor wdt = row_slice(in_proj, I + C, nh, "[dt]");
  const StageTap* norm = tap(in.norm, l, "rmsnorm", D, D, 3);
  const Backend::MatmulTarget proj[3] = {
      {&wz, nullptr, &s.z, tap("ssm_z", l, "matmul", I, D, 3)},          // z [T, I]
      {&wxbc, nullptr, &s.xbc, tap("ssm_xbc", l, "matmul", C, D, 3)},  // xBC [T, C]
      {&wdt, nullptr, &s.dt, tap("ssm_dt", l, "matmul", nh, D, 3)}};   // dt [T, nh]
  if (!batch) {
    const Backend::ConvTarget conv = mamba_conv(m, l, s.conv_state[size_t(l)], s.xbc_act, tap);
    be.rmsnorm_matmul_conv(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.xn, norm, proj, 3,
                           conv);
    mamba_scan(m, be, l, T, pos0, s.xbc_act, s.dt, s.ssm_state[size_t(l)], s.y, tap);
  } else {
    be.rmsnorm_matmul(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.xn, false, norm, proj, 3);
    int r = 0;
    for (const BatchSeq& q : *batch) {
      Buffer conv_state = s.conv_slot(l, q.slot), ssm = s.ssm_slot(l, q.slot);
      Buffer act = batch_rows(s.xbc_act, r, q.T, C), y = batch_rows(s.y, r, q.T, I);
      be.apply_conv(batch_rows(s.xbc, r, q.T, C), q.T, C, mamba_conv(m, l, conv_state, act, tap));
      mamba_scan(m, be, l, q.T, q.pos0, act, batch_rows(s.dt, r, q.T, nh), ssm, y, tap);
      r += q.T;
    }
  }
  const int group = c.ssm_norm_per_group ? I / G : I;
  be.rmsnorm_gated(s.y, s.z, lw(kSsmNorm), T, I, group, c.norm_eps, s.yn);
  be.apply_tap(tap("ssm_norm", l, "rmsnorm_gated", I, group, 4), s.yn, T, I);
  const StageTap* out = tap("ssm_out", l, "matmul", D, I, 3);
  be.matmul_add(s.yn, lw(kOutProj), T, s.o, s.x, c.residual_mult, out, residual_tap(c, in, l, tap));
}

// x += residual_multiplier * o_proj(attention(q, k, v)), q/k/v of rmsnorm(x), RoPE'd when
// the config says so.
void attention(const Model& m, Backend& be, HybridState& s, int l, int T, int pos0,
               const Block& in, const std::vector<BatchSeq>* batch, const Stages& tap) {
  const ModelConfig& c = m.config;
  auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
  const int D = c.d_model, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim;
  const int q_dim = H * Dh, kv_dim = Hkv * Dh;
  const char* q_stage = c.use_rope ? "q_rope" : "q";
  const char* k_stage = c.use_rope ? "k_rope" : "k";
  const AttentionGeometry geo{q_stage, k_stage, "v", H, Hkv, Dh, 0, c.attn_scale};
  const StageTap* norm = tap(in.norm, l, "rmsnorm", D, D, 3);
  const Backend::MatmulTarget qkv[3] = {
      {&lw(kWq), nullptr, &s.q, tap("q", l, "matmul", q_dim, D, 3)},
      {&lw(kWk), nullptr, &s.k, tap("k", l, "matmul", kv_dim, D, 3)},
      {&lw(kWv), nullptr, &s.v, tap("v", l, "matmul", kv_dim, D, 3)}};
  be.rmsnorm_matmul(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.xn, false, norm, qkv, 3);
  Buffer &kc = s.k_cache[size_t(l)], &vc = s.v_cache[size_t(l)];
  if (batch) {  // each sequence's rows at its own positions, against its own pages
    batch_attention(be, *batch, s.q, s.k, s.v, nullptr, nullptr, NormWeight::Plain, c.norm_eps, H,
                    Hkv, Dh, c.use_rope ? &c.rope : nullptr, kc, vc, 0, {c.attn_scale, 0}, s.att);
  } else if (c.use_rope) {
    Backend::AttentionTaps at;
    at.q_rope = tap("q_rope", l, "rope", q_dim, 2, 3);
    at.k_rope = tap("k_rope", l, "rope", kv_dim, 2, 3);
    at.out = tap("attn", l, "attention", q_dim, std::max(Dh, pos0 + T), 4, &geo);
    be.qk_rope_attention(s.q, s.k, s.v, nullptr, nullptr, NormWeight::Plain, c.norm_eps, T, H,
                         Hkv, Dh, pos0, c.rope, kc, vc, 0, {c.attn_scale, 0}, s.att, at);
  } else {
    be.kv_store(s.k, s.v, kc, vc, T, pos0, kv_dim);
    be.scaled_attention(s.q, kc, vc, T, pos0, H, Hkv, Dh, 0, c.attn_scale, 0, s.att);
    be.apply_tap(tap("attn", l, "attention", q_dim, std::max(Dh, pos0 + T), 4, &geo), s.att,
                 T, q_dim);
  }
  const StageTap* o = tap("o", l, "matmul", D, q_dim, 3);
  be.matmul_add(s.att, lw(kWo), T, s.o, s.x, c.residual_mult, o, residual_tap(c, in, l, tap));
}

// x += residual_multiplier * mlp(rmsnorm(x)): Granite's shared SwiGLU MLP or Nemotron-H's
// relu2 MLP as a block of its own (no experts).
void mlp(const Model& m, Backend& be, HybridState& s, int l, int T, const Block& in,
         const Stages& tap) {
  const ModelConfig& c = m.config;
  auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
  const int D = c.d_model, F = c.d_ff;
  const StageTap* norm = tap(in.norm, l, "rmsnorm", D, D, 3);
  const Tensor* down = nullptr;
  if (granite(c)) {
    Backend::GluTaps ft;
    ft.norm = norm;
    ft.gate = tap("gate", l, "matmul", F, D, 3);
    ft.up = tap("up", l, "matmul", F, D, 3);
    ft.act = tap("act", l, "swiglu", F, 1, 3);
    be.rmsnorm_glu(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.xn, lw(kMlpGate), lw(kMlpUp),
                   GluAct::SiLU, s.gate, s.up, s.act, ft);
    down = &lw(kMlpOut);
  } else {
    const Backend::MatmulTarget up = {&lw(kUp), nullptr, &s.up, tap("up", l, "matmul", F, D, 3)};
    be.rmsnorm_matmul(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.xn, false, norm, &up, 1);
    be.relu2(s.up, int64_t(T) * F, s.act);
    be.apply_tap(tap("act", l, "relu2", F, 1, 3), s.act, T, F);
    down = &lw(kDown);
  }
  const StageTap* product = tap("down", l, "matmul", D, F, 3);
  be.matmul_add(s.act, *down, T, s.o, s.x, c.residual_mult, product, residual_tap(c, in, l, tap));
}

// o [T, D]: the MoE block's shared expert (Granite's shared SwiGLU MLP of rmsnorm(x), its norm
// computed again by rmsnorm_glu so that a tier can fuse it into the gate/up GEMV; Nemotron-H's
// relu2 MLP of xn).
void shared_expert(const Model& m, Backend& be, HybridState& s, int l, int T, const Block& in,
                   const Stages& tap) {
  const ModelConfig& c = m.config;
  auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
  const int D = c.d_model, F = granite(c) ? c.d_ff : c.moe_shared_ff;
  if (granite(c)) {
    Backend::GluTaps ft;  // the norm's stage is the block's (moe())
    ft.gate = tap("gate", l, "matmul", F, D, 3);
    ft.up = tap("up", l, "matmul", F, D, 3);
    ft.act = tap("act", l, "swiglu", F, 1, 3);
    // s.down is the norm's scratch: s.xn stays the experts' input.
    be.rmsnorm_glu(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.down, lw(kMlpGate),
                   lw(kMlpUp), GluAct::SiLU, s.gate, s.up, s.act, ft);
    be.matmul(s.act, lw(kMlpOut), nullptr, T, s.o);
  } else {
    be.matmul(s.xn, lw(kShUp), nullptr, T, s.up);
    be.apply_tap(tap("up", l, "matmul", F, D, 3), s.up, T, F);
    be.relu2(s.up, int64_t(T) * F, s.act);
    be.apply_tap(tap("act", l, "relu2", F, 1, 3), s.act, T, F);
    be.matmul(s.act, lw(kShDown), nullptr, T, s.o);
  }
  be.apply_tap(tap("down", l, "matmul", D, F, 3), s.o, T, D);
}

// x += residual_multiplier * (shared expert(xn) + the routed sum), xn = rmsnorm(x); the
// routed sum and the residual update are Backend::moe_add, the op every MoE family calls
// (experts in ascending index per token, HF's index_add over the experts hit).
// Granite's experts are the loader's views into its 3-D stacks (TensorSpec::hf_stack,
// gguf_stack).
void moe(const Model& m, Backend& be, HybridState& s, int l, int T, const Block& in,
         const Stages& tap) {
  const ModelConfig& c = m.config;
  auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
  const int D = c.d_model, E = c.moe_experts, Fe = c.moe_ff;
  // The norm with the router's GEMV, xn kept: the experts read it.
  const Backend::MatmulTarget router = {&lw(kRouter), nullptr, &s.router,
                                        tap("router", l, "matmul", E, D, 3)};  // [T, E]
  be.rmsnorm_matmul(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.xn, /*keep_xn=*/true,
                    tap(in.norm, l, "rmsnorm", D, D, 3), &router, 1);
  shared_expert(m, be, s, l, T, in, tap);  // s.o
  const Backend::MoeExperts& ex = s.experts(m, l);
  Backend::MoeResidual r;
  r.shared = &s.o;
  r.scale = c.residual_mult;
  r.routed = tap("moe", l, "moe", D, int64_t(c.moe_top_k) * Fe, 4);
  r.sum = tap("ffn_out", l, "add", D, 1, 3);
  r.res = residual_tap(c, in, l, tap);
  std::vector<Route> routes;
  be.moe_add(s.router, s.xn, ex, T, s.moe, tap.wants_routes() ? &routes : nullptr, s.x, r);
  for (int t = 0; t < int(routes.size()); ++t)
    tap.route(l, t, routes[size_t(t)].ids, routes[size_t(t)].margin, E,
              router_score_name(ex.spec));
}


}  // namespace

RouterSpec router_spec(const ModelConfig& c) {
  RouterSpec r;
  r.n_experts = c.moe_experts;
  r.top_k = c.moe_top_k;
  if (granite(c)) {  // GraniteMoeHybridTopKGating: top-k of the logits, softmax over the k
    r.scoring = RouterScoring::Softmax;
    r.order = RouterOrder::TopKThenScore;
  } else {  // NemotronHTopkRouter (DeepSeek-V3's noaux_tc)
    r.scoring = RouterScoring::Sigmoid;
    r.order = RouterOrder::ScoreThenTopK;
    r.norm_topk_prob = c.moe_norm_topk;
    r.norm_eps = 1e-20;
    r.routed_scaling_factor = c.moe_scaling;
    r.n_group = c.moe_n_group;
    r.topk_group = c.moe_topk_group;
  }
  return r;
}

/// DecoderState's KV caches (attention layers only) and scratch, plus each Mamba2 layer's

// HF names from transformers' modules; GGUF names and shapes as llama.cpp's converter writes
// them (conversion/mamba.py, granite.py, nemotron.py; gguf-py tensor_mapping.py): conv1d
// [C, 1, K] as [C, K], A and D as [nh, 1], the gated norm as [G, I / G], A = -exp(A_log),
// Granite's input_linear split into gate and up (ffn_gate/ffn_up, the shared expert's
// _shexp when there are experts, the experts' ffn_{gate,up}_exps).
std::vector<TensorSpec> Hybrid::tensors(const ModelConfig& c) const {
  const bool g = granite(c);
  const int64_t D = c.d_model, Dh = c.head_dim, V = c.vocab, F = c.d_ff;
  const int64_t Hq = int64_t(c.n_head) * Dh, Hk = int64_t(c.n_head_kv) * Dh;
  const int64_t nh = c.ssm_heads, I = nh * c.ssm_head_dim, G = c.ssm_groups;
  const int64_t C = I + 2 * G * c.ssm_state;
  const std::string root = g ? "model." : "backbone.";
  std::vector<TensorSpec> t;
  auto global = [&](const char* role, int slot, const std::string& hf, const char* gguf,
                    std::vector<int64_t> shape, TensorKind kind, const char* family) {
    TensorSpec s;
    s.role = role, s.slot = slot, s.hf = hf, s.gguf = gguf, s.shape = std::move(shape);
    s.kind = kind, s.family = family;
    t.push_back(std::move(s));
    return &t.back();
  };
  global("embed", kEmbed, root + (g ? "embed_tokens.weight" : "embeddings.weight"),
         "token_embd.weight", {V, D}, TensorKind::Matrix, "embed");
  global("out_norm", kOutNorm, root + (g ? "norm.weight" : "norm_f.weight"),
         "output_norm.weight", {D}, TensorKind::Norm, "norm");
  global("lm_head", kLmHead, "lm_head.weight", "output.weight", {V, D}, TensorKind::Matrix,
         "logits")
      ->tie_to = "embed";
  for (int l = 0; l < c.n_layer; ++l) {
    const char b = c.layer_blocks[size_t(l)];
    const std::string hf = root + "layers." + std::to_string(l) + ".";
    const std::string gg = "blk." + std::to_string(l) + ".";
    auto layer = [&](const std::string& role, int slot, const std::string& name,
                     const std::string& gguf, std::vector<int64_t> shape, TensorKind kind,
                     const char* family) -> TensorSpec& {
      TensorSpec s;
      s.role = role, s.slot = slot, s.layer = l, s.hf = name.empty() ? "" : hf + name;
      s.gguf = gguf.empty() ? "" : gg + gguf, s.shape = std::move(shape);
      s.kind = kind, s.family = family;
      t.push_back(std::move(s));
      return t.back();
    };
    layer("norm", kNorm, g ? "input_layernorm.weight" : "norm.weight", "attn_norm.weight", {D},
          TensorKind::Norm, "norm");
    const std::string mixer = g ? (b == 'M' ? "mamba." : "self_attn.") : "mixer.";
    if (b == 'M') {
      layer("ssm_in", kInProj, mixer + "in_proj.weight", "ssm_in.weight", {I + C + nh, D},
            TensorKind::Matrix, "ssm");
      layer("ssm_conv1d", kConvW, mixer + "conv1d.weight", "ssm_conv1d.weight",
            {C, 1, c.ssm_conv}, TensorKind::Bias, "ssm")
          .gguf_shape = {C, c.ssm_conv};
      if (c.ssm_conv_bias)
        layer("ssm_conv1d_b", kConvB, mixer + "conv1d.bias", "ssm_conv1d.bias", {C},
              TensorKind::Bias, "ssm");
      TensorSpec& a = layer("ssm_a_log", kALog, mixer + "A_log", "ssm_a", {nh}, TensorKind::Bias,
                            "ssm");
      a.gguf_shape = {nh, 1};
      a.gguf_value = TensorSpec::GgufValue::NegExp;
      layer("ssm_d", kD, mixer + "D", "ssm_d", {nh}, TensorKind::Norm, "ssm").gguf_shape = {nh, 1};
      layer("ssm_dt_bias", kDtBias, mixer + "dt_bias", "ssm_dt.bias", {nh}, TensorKind::Bias,
            "ssm");
      layer("ssm_norm", kSsmNorm, mixer + "norm.weight", "ssm_norm.weight", {I},
            TensorKind::Norm, "norm")
          .gguf_shape = {G, I / G};
      layer("ssm_out", kOutProj, mixer + "out_proj.weight", "ssm_out.weight", {D, I},
            TensorKind::Matrix, "ssm");
    } else if (b == '*') {
      layer("wq", kWq, mixer + "q_proj.weight", "attn_q.weight", {Hq, D}, TensorKind::Matrix,
            "attn");
      layer("wk", kWk, mixer + "k_proj.weight", "attn_k.weight", {Hk, D}, TensorKind::Matrix,
            "attn");
      layer("wv", kWv, mixer + "v_proj.weight", "attn_v.weight", {Hk, D}, TensorKind::Matrix,
            "attn");
      layer("wo", kWo, mixer + "o_proj.weight", "attn_output.weight", {D, Hq},
            TensorKind::Matrix, "attn");
    } else if (b == '-') {
      layer("w_up", kUp, "mixer.up_proj.weight", "ffn_up.weight", {F, D}, TensorKind::Matrix,
            "mlp");
      layer("w_down", kDown, "mixer.down_proj.weight", "ffn_down.weight", {D, F},
            TensorKind::Matrix, "mlp");
    } else if (b == 'E') {
      const int64_t E = c.moe_experts, Fe = c.moe_ff, Fs = c.moe_shared_ff;
      layer("router", kRouter, "mixer.gate.weight", "ffn_gate_inp.weight", {E, D},
            TensorKind::Matrix, "mlp");
      layer("router_bias", kRouterBias, "mixer.gate.e_score_correction_bias",
            "exp_probs_b.bias", {E}, TensorKind::Bias, "mlp");
      for (int e = 0; e < E; ++e) {
        const std::string x = "mixer.experts." + std::to_string(e) + ".";
        const std::string n = std::to_string(e);
        layer("expert_up." + n, kExpert0 + 3 * e + 1, x + "up_proj.weight", "", {Fe, D},
              TensorKind::Matrix, "mlp")
            .gguf_stack = {gg + "ffn_up_exps.weight", E, Fe, e, 0};
        layer("expert_down." + n, kExpert0 + 3 * e + 2, x + "down_proj.weight", "", {D, Fe},
              TensorKind::Matrix, "mlp")
            .gguf_stack = {gg + "ffn_down_exps.weight", E, D, e, 0};
      }
      layer("shared_up", kShUp, "mixer.shared_experts.up_proj.weight", "ffn_up_shexp.weight",
            {Fs, D}, TensorKind::Matrix, "mlp");
      layer("shared_down", kShDown, "mixer.shared_experts.down_proj.weight",
            "ffn_down_shexp.weight", {D, Fs}, TensorKind::Matrix, "mlp");
    }
    if (g) {
      const bool moe = c.moe_experts > 0;
      layer("ffn_norm", kFfnNorm, "post_attention_layernorm.weight", "ffn_norm.weight", {D},
            TensorKind::Norm, "norm");
      // shared_mlp.input_linear [2F, D]: HF's chunk(2), gate rows first, then up.
      const std::string in = hf + "shared_mlp.input_linear.weight";
      layer("mlp_gate", kMlpGate, "", moe ? "ffn_gate_shexp.weight" : "ffn_gate.weight", {F, D},
            TensorKind::Matrix, "mlp")
          .hf_stack = {in, 0, 2 * F, 0, 0};
      layer("mlp_up", kMlpUp, "", moe ? "ffn_up_shexp.weight" : "ffn_up.weight", {F, D},
            TensorKind::Matrix, "mlp")
          .hf_stack = {in, 0, 2 * F, 0, F};
      layer("mlp_out", kMlpOut, "shared_mlp.output_linear.weight",
            moe ? "ffn_down_shexp.weight" : "ffn_down.weight", {D, F}, TensorKind::Matrix, "mlp");
      if (moe) {
        const int64_t E = c.moe_experts, Fe = c.moe_ff;
        layer("router", kRouter, "block_sparse_moe.router.layer.weight", "ffn_gate_inp.weight",
              {E, D}, TensorKind::Matrix, "mlp");
        const std::string ein = hf + "block_sparse_moe.input_linear.weight";
        const std::string eout = hf + "block_sparse_moe.output_linear.weight";
        for (int e = 0; e < E; ++e) {
          const std::string n = std::to_string(e);
          TensorSpec& wg = layer("expert_gate." + n, kExpert0 + 3 * e, "", "", {Fe, D},
                                 TensorKind::Matrix, "mlp");
          wg.hf_stack = {ein, E, 2 * Fe, e, 0};
          wg.gguf_stack = {gg + "ffn_gate_exps.weight", E, Fe, e, 0};
          TensorSpec& wu = layer("expert_up." + n, kExpert0 + 3 * e + 1, "", "", {Fe, D},
                                 TensorKind::Matrix, "mlp");
          wu.hf_stack = {ein, E, 2 * Fe, e, Fe};
          wu.gguf_stack = {gg + "ffn_up_exps.weight", E, Fe, e, 0};
          TensorSpec& wd = layer("expert_down." + n, kExpert0 + 3 * e + 2, "", "", {D, Fe},
                                 TensorKind::Matrix, "mlp");
          wd.hf_stack = {eout, E, D, e, 0};
          wd.gguf_stack = {gg + "ffn_down_exps.weight", E, D, e, 0};
        }
      }
    }
  }
  return t;
}

std::unique_ptr<ForwardState> Hybrid::make_state(const Model& m, Backend& be, int max_ctx,
                                                 int max_T) const {
  return std::make_unique<HybridState>(be, m.config, max_ctx, max_T);
}

// The attention layers' caches are the paged pool; each Mamba2 layer keeps seqs recurrent
// states, one per slot.
std::unique_ptr<ForwardState> Hybrid::make_batch_state(const Model& m, Backend& be, int pool_rows,
                                                       int max_T, int seqs) const {
  return std::make_unique<HybridState>(be, m.config, pool_rows, max_T, seqs);
}

void Hybrid::forward(const Model& m, Backend& be, ForwardState& state,
                     const ForwardArgs& a) const {
  HybridState& s = static_cast<HybridState&>(state);
  const ModelConfig& c = m.config;
  const Weights& w = m.weights;
  const int T = a.T, pos0 = a.pos0, D = c.d_model;
  ARB_CHECK(T >= 1 && T <= s.max_T, "[model] forward of %d tokens exceeds scratch width %d", T,
            s.max_T);
  ARB_CHECK(a.batch || pos0 + T <= s.max_ctx,
            "[model] position %d exceeds the KV cache (%d rows)", pos0 + T, s.max_ctx);
  ARB_CHECK(a.ids || T == 1, "[model] a forward of %d picked tokens (only one is kept)", T);
  // The recurrent states hold a summary of every token before pos0: they continue a
  // sequence or start one, and cannot rewind.
  std::vector<BatchSeq> one(1);  // without a batch: the one sequence, in slot 0
  one[0].T = T, one[0].pos0 = pos0;
  if (a.batch) check_batch(a, s.seqs);
  const std::vector<BatchSeq>& seqs = a.batch ? *a.batch : one;
  std::vector<bool> taken(size_t(s.seqs), false);
  for (const BatchSeq& q : seqs) {
    ARB_CHECK(!taken[size_t(q.slot)], "[model] two batch sequences in state slot %d", q.slot);
    taken[size_t(q.slot)] = true;
    if (q.pos0 == 0) s.clear_slot(q.slot);
    const int held = s.slot_pos[size_t(q.slot)];
    ARB_CHECK(q.pos0 == held,
              "[model] %s: a forward at position %d, but the Mamba2 states hold %d tokens (they "
              "cannot rewind; start again at 0)",
              c.arch.c_str(), q.pos0, held);
  }
  const Stages tap = a.batch ? batch_stages(a) : Stages(a.hook, pos0, T, a.routes);

  const Tensor& embed = w.global(kEmbed);
  if (a.ids) be.embed(embed, a.ids, T, s.x);  // x [T, D]
  else be.embed_picked(embed, s.x);
  if (c.embed_mult != 1) be.scale(s.x, int64_t(T) * D, c.embed_mult);
  be.apply_tap(tap("embed", -1, "embed", D, 1, 3), s.x, T, D);

  for (int l = 0; l < c.n_layer; ++l) {
    const char b = c.layer_blocks[size_t(l)];
    const bool ffn_block = b == '-' || b == 'E';  // Nemotron-H's MLP and MoE blocks
    // Each block: x += residual_multiplier * block(rmsnorm(x)), the norm and the residual
    // add fused into the block's first and last matmuls (Backend's fused ops).
    const Block in{w.layer(l, kNorm), ffn_block ? "ffn_norm" : "attn_norm",
                   ffn_block ? "ffn_res" : "attn_res"};
    if (b == 'M') mamba(m, be, s, l, T, pos0, in, a.batch, tap);
    else if (b == '*') attention(m, be, s, l, T, pos0, in, a.batch, tap);
    else if (b == '-') mlp(m, be, s, l, T, in, tap);
    else moe(m, be, s, l, T, in, tap);
    if (!granite(c)) continue;
    const Block ffn{w.layer(l, kFfnNorm), "ffn_norm", "ffn_res"};
    if (c.moe_experts > 0) moe(m, be, s, l, T, ffn, tap);
    else mlp(m, be, s, l, T, ffn, tap);
  }
  for (const BatchSeq& q : seqs) s.slot_pos[size_t(q.slot)] = q.pos0 + q.T;
  int rows = T;  // logits rows
  if (a.batch) {
    rows = batch_logits(be, *a.batch, s.x, w.global(kOutNorm), NormWeight::Plain, D, c.norm_eps,
                        s.xn, w.global(kLmHead), s.logits);
  } else {
    if (!a.logits) return;
    const Buffer x = logit_rows(a, s.x, T, D, rows);
    const Backend::MatmulTarget head = {&w.global(kLmHead), nullptr, &s.logits, nullptr};
    be.rmsnorm_matmul(x, w.global(kOutNorm), NormWeight::Plain, rows, D, c.norm_eps, s.xn, false,
                      tap("final_norm", -1, "rmsnorm", D, D, 3), &head, 1);  // [rows, V]
  }
  if (c.logits_scaling != 1 && rows > 0)
    be.scale(s.logits, int64_t(rows) * c.vocab, 1.0 / c.logits_scaling);
  be.apply_tap(tap("logits", -1, "matmul", c.vocab, D, c.logits_scaling != 1 ? 4 : 3),
               s.logits, rows, c.vocab);
}

// Arch's default (every distinct tensor once), but a decode step reads only the routed
// experts its rows picked.
double Hybrid::weight_bytes_per_step(const Model& m, int rows) const {
  return routed_weight_bytes(m, rows, m.config.moe_top_k, m.config.moe_experts);
}

// K and V of the attention layers over ctx keys, plus each Mamba2 layer's recurrent state,
// which a step reads whole and writes back whole whatever the context: the conv window
// [K-1, C] at elem_bytes and the SSM state [nh, hd, N] in the tier's logits type (HybridState:
// f32 where the cache is bf16, f16 or f32; f64 on ref, whose cache is f64).
double Hybrid::state_bytes_per_token(const ModelConfig& c, double ctx, int elem_bytes) const {
  double attn = 0, mamba = 0;
  const double I = double(c.ssm_heads) * c.ssm_head_dim;
  const double C = I + 2.0 * c.ssm_groups * c.ssm_state;
  for (char b : c.layer_blocks) {
    if (b == '*') attn += 1;
    if (b == 'M') mamba += 1;
  }
  const int ssm_bytes = std::max(elem_bytes, 4);
  return 2.0 * attn * ctx * c.n_head_kv * c.head_dim * elem_bytes +
         2.0 * mamba * ((c.ssm_conv - 1) * C * elem_bytes + I * c.ssm_state * ssm_bytes);
}

// 2 x (matmul weights; the output matrix once per forward) + 4 H Dh keys per attention
// layer + the scan's ~6 flops per state element per token.
double Hybrid::flops_per_token(const ModelConfig& c, int T, int pos0) const {
  const double D = c.d_model, F = c.d_ff, Hq = double(c.n_head) * c.head_dim;
  const double Hk = double(c.n_head_kv) * c.head_dim;
  const double nh = c.ssm_heads, I = nh * c.ssm_head_dim;
  const double C = I + 2.0 * c.ssm_groups * c.ssm_state;
  double matmul = double(c.vocab) * D / std::max(T, 1), scan = 0, attn_layers = 0;
  for (char b : c.layer_blocks) {
    if (b == 'M') matmul += D * (I + C + nh) + I * D, scan += 6 * I * c.ssm_state;
    if (b == '*') matmul += 2 * D * Hq + 2 * D * Hk, attn_layers += 1;
    if (b == '-') matmul += 2 * D * F;
    if (granite(c)) matmul += 3 * D * F;
    const bool moe = b == 'E' || (granite(c) && c.moe_experts > 0);
    if (moe)  // router + k experts (+ Nemotron-H's shared expert; Granite's is counted above)
      matmul += D * c.moe_experts + double(c.moe_top_k) * (granite(c) ? 3 : 2) * D * c.moe_ff +
                (granite(c) ? 0 : 2 * D * c.moe_shared_ff);
  }
  const double keys = double(pos0) + (T + 1) / 2.0;  // mean keys attended per token
  return 2.0 * matmul + scan + 4.0 * Hq * keys * attn_layers;
}

}  // namespace hybrid

const Arch& hybrid_family() {
  static const hybrid::Hybrid arch;
  return arch;
}

}  // namespace arbiter
