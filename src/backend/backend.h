// The op interface every tier implements, and the registry that names and counts providers.
//
// Model code (src/model/) is written once against Backend. A tier (ref, cpu, cuda) owns
// its activation buffers; model code only passes Buffer handles around. Shapes in the
// comments use B (unused, batch 1), T (tokens in this forward), D, H, Hkv, Dh, F, V, L.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "backend/moe_routing.h"
#include "backend/rope.h"
#include "backend/tap.h"
#include "core/tensor.h"

namespace arbiter {

/// An activation buffer owned by a backend. `dtype` is the element type the tier stores
/// (ref: f64, cpu: f32, cuda: bf16/f16/f32; logits are f64 on ref and f32 elsewhere).
struct Buffer {
  void* ptr = nullptr;
  int64_t n = 0;  // elements
  DType dtype = DType::F32;
};

/// Per-(op, provider) call counts and fallbacks. A fallback is a call served by a provider
/// other than the one the tier promises for that op (e.g. a generic loop instead of the
/// SIMD kernel); the trace header records the count and gates may refuse non-zero.
class OpStats {
 public:
  // Called for every op of every forward (about 170 per decode step of a 28-layer model):
  // the lookups take string views and allocate only on an op's first call.
  using ProviderCounts = std::map<std::string, int64_t, std::less<>>;
  using Calls = std::map<std::string, ProviderCounts, std::less<>>;
  void record(std::string_view op, std::string_view provider) { ++count(op, provider); }
  void record_fallback(std::string_view op, std::string_view provider) {
    ++count(op, provider);
    ++fallbacks_;
  }
  /// Notes that a call ran on activations quantized on the fly (kind: "q8_0", "q8_K").
  void record_act_quant(std::string_view kind) {
    if (act_quant_.find(kind) == act_quant_.end()) act_quant_.emplace(kind);
  }
  void reset() {
    calls_.clear();
    fallbacks_ = 0;
    act_quant_.clear();
  }
  const Calls& calls() const { return calls_; }
  int64_t fallbacks() const { return fallbacks_; }
  /// "op=provider:calls,..." in op order (the trace header's providers field).
  std::string summary() const;
  /// A human table, one line per (op, provider).
  std::string table() const;
  /// The activation quantizations noted since reset, comma-separated in name order, "" when
  /// none (the trace header's act_quant line).
  std::string act_quant() const;

 private:
  int64_t& count(std::string_view op, std::string_view provider) {
    auto o = calls_.find(op);
    if (o == calls_.end()) o = calls_.emplace(std::string(op), ProviderCounts{}).first;
    auto p = o->second.find(provider);
    if (p == o->second.end()) p = o->second.emplace(std::string(provider), 0).first;
    return p->second;
  }

  Calls calls_;
  int64_t fallbacks_ = 0;
  std::set<std::string, std::less<>> act_quant_;
};

/// The largest K that every tier's summarize() takes (the CUDA tier's radix select).
constexpr int kMaxSummaryTopK = 1024;

/// Top-k, logsumexp and target logit of one logits row, computed on the device and
/// brought back small (the full row only when asked).
struct LogitsSummary {
  double lse = 0;            // log-sum-exp over the whole vocabulary
  double target_logit = 0;   // logit of the target id (NaN when no target)
  std::vector<int32_t> top_ids;     // K largest, descending, ties to lower id
  std::vector<double> top_logits;
  int64_t n_nonfinite = 0;   // NaN/Inf count in the row
};

/// How an RMSNorm applies its weight: x / rms(x) * w (rmsnorm, HF LlamaRMSNorm) or
/// x / rms(x) * (1 + w) (rmsnorm_1p, HF Gemma3RMSNorm).
enum class NormWeight { Plain, OnePlus };
/// The activation of a gated MLP: silu(gate) * up (swiglu) or gelu_tanh(gate) * up (geglu).
enum class GluAct { SiLU, GeluTanh };

class Backend {
 public:
  virtual ~Backend() = default;

  /// "ref", "cpu", "cuda:0 NVIDIA H200".
  virtual std::string device_name() const = 0;
  /// Compute type of activations: f64, f32, bf16 or f16.
  virtual DType compute() const = 0;

  /// What a model will run, told once before any op: its weights (each with the --mix family
  /// of the ops that read it), its RoPEs and its positions. A tier may upload or convert
  /// the weights and precompute tables.
  struct WeightUse {
    const Tensor* tensor = nullptr;
    const char* family = "";
  };
  struct Prepare {
    std::vector<WeightUse> weights;
    std::vector<RopeSpec> ropes;
    int max_pos = 0;
  };
  virtual void prepare(const Prepare& p) { (void)p; }

  // --- memory --------------------------------------------------------------------------
  /// n activation elements (logits: true gives the tier's logits type).
  virtual Buffer alloc(int64_t n, bool logits = false) = 0;
  virtual void free(Buffer& b) = 0;
  /// Copies elements [off, off + n) to/from the host as f64 (for capture, drift, tests).
  virtual void read(const Buffer& b, int64_t off, int64_t n, double* dst) = 0;
  virtual void write(Buffer& b, int64_t off, int64_t n, const double* src) = 0;
  /// Waits for queued work (a no-op on CPU tiers).
  virtual void sync() {}

  // --- ops (each records its provider in stats()) --------------------------------------
  /// out[T, D] = table[ids[t], :]
  virtual void embed(const Tensor& table, const int32_t* ids, int T, Buffer& out) = 0;
  /// out[R, N] = x[R, N] / rms(x) * w[N]; rms over N with eps inside the sqrt (HF LlamaRMSNorm).
  /// Used for the block norms (R = T, N = D) and qwen3's per-head q/k norm (R = T*H, N = Dh).
  /// out may alias x (the q/k norm runs in place).
  virtual void rmsnorm(const Buffer& x, const Tensor& w, int R, int N, double eps,
                       Buffer& out) = 0;
  /// out[T, N] = x[T, K] @ W[N, K]^T (+ bias[N]). out may be a logits buffer.
  virtual void matmul(const Buffer& x, const Tensor& W, const Tensor* bias, int T,
                      Buffer& out) = 0;
  /// In place on x[T, nh, Dh], token t at position pos0 + t (rope.dims == Dh).
  virtual void rope(Buffer& x, int T, int nh, int Dh, int pos0, const RopeSpec& rope) = 0;
  /// Stores k, v [T, Hkv*Dh] of positions pos0.. in the layer's cache [rows, Hkv*Dh], position
  /// p at row p % rows (rows = kv_cache_rows()): a cache of max_ctx rows holds each position at
  /// its own row; a smaller one is a ring that keeps the latest `rows` positions (gemma's
  /// sliding layers: window + max_T - 1 rows, what their attention can still see). T <= rows.
  virtual void kv_store(const Buffer& k, const Buffer& v, Buffer& k_cache, Buffer& v_cache,
                        int T, int pos0, int kv_dim) = 0;
  /// Causal GQA attention of q [T, H, Dh] (token t at pos0 + t) over the cached positions
  /// [0, pos0 + T), position p at row p % rows as kv_store put it; window > 0 limits a query at
  /// i to keys in (i - window, i]. The cache must hold every key a query sees
  /// (attention_cache_rows). out [T, H*Dh]. Scale 1/sqrt(Dh).
  virtual void attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache,
                         int T, int pos0, int H, int Hkv, int Dh, int window, Buffer& out) = 0;
  /// A sequence's rows of a paged KV pool [blocks * block_rows, kv_dim] (continuous batching,
  /// engine/kv_pool.h): position p sits at pool row pages.row(p).
  struct KvPages {
    const int32_t* blocks = nullptr;  // [n_blocks] the sequence's block ids, in position order
    int n_blocks = 0;
    int block_rows = 0;  // rows per block
    int64_t row(int p) const { return int64_t(blocks[p / block_rows]) * block_rows + p % block_rows; }
  };
  /// kv_store into a paged pool: k, v [T, kv_dim] of positions pos0.. to pool rows
  /// pages.row(pos0 + t). The pages must cover pos0 + T positions. A tier without it refuses
  /// (backend/fused_ops.cpp) with one line: continuous batching is not on that tier.
  virtual void kv_store_paged(const Buffer& k, const Buffer& v, Buffer& k_pool, Buffer& v_pool,
                              const KvPages& pages, int T, int pos0, int kv_dim);
  /// The score scaling of attention over a cache or pool: scale 0 is attention()'s
  /// 1/sqrt(Dh); otherwise scaled_attention()'s, with this scale and softcap.
  struct AttentionScores {
    double scale = 0;
    double softcap = 0;
  };
  /// attention() (scores {}) or scaled_attention() over a paged pool: key p at pool row
  /// pages.row(p); the same arithmetic, in the same order, as over a cache holding the same
  /// rows. window > 0 limits a query at i to keys in (i - window, i], as there (gemma's
  /// sliding layers; the pool keeps every position, so no ring is needed).
  virtual void attention_paged(const Buffer& q, const Buffer& k_pool, const Buffer& v_pool,
                               const KvPages& pages, int T, int pos0, int H, int Hkv, int Dh,
                               int window, const AttentionScores& scores, Buffer& out);
  /// Asks for matmuls whose every output row is bitwise a function of its input row alone,
  /// whatever T and the row's place among the T (continuous batching's batch invariance).
  /// ref's always are; cpu then runs its own GEMM at every T, T == 1 included, where it
  /// otherwise runs the GEMV (whose sums are ordered otherwise), and ssm_scan's recurrence at
  /// every T (its chunked form's sums depend on where a forward starts a chunk, which the
  /// batch decides). cuda takes the same steps (GEMM at T == 1, no single-token kernels or
  /// step graphs) but cannot promise the bits: cuBLASLt picks its GEMM per row count, so a
  /// row's reduction order may move with the batch (tests/cuda measures the effect,
  /// docs/serve.md). The default refuses `on`.
  virtual void set_row_invariant(bool on);

  /// out[n] = silu(gate[n]) * up[n]
  virtual void swiglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) = 0;
  /// x[n] += y[n]
  virtual void add(Buffer& x, const Buffer& y, int64_t n) = 0;
  /// Summaries of logits rows [T, V]; targets[t] < 0 means no target.
  virtual void summarize(const Buffer& logits, int T, int V, int K, const int32_t* targets,
                         std::vector<LogitsSummary>& out) = 0;

  // --- ops of the gemma family (Gemma 2, Gemma 3) -----------------------------------------
  // A tier without a kernel for one of these keeps the default (backend/fused_ops.cpp), which
  // refuses with one line naming the tier and the op: a gemma model never runs half-computed.

  /// out[R, N] = x[R, N] / rms(x) * (1 + w[N]): HF Gemma3RMSNorm / Gemma2RMSNorm, the 1 added
  /// to the weight widened to the compute type. out may alias x.
  virtual void rmsnorm_1p(const Buffer& x, const Tensor& w, int R, int N, double eps,
                          Buffer& out);
  /// out[n] = gelu_tanh(gate[n]) * up[n], HF gelu_pytorch_tanh:
  /// gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
  virtual void geglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out);
  /// x[n] *= s (gemma's embedding scale).
  virtual void scale(Buffer& x, int64_t n, double s);
  /// x[n] = tanh(x[n] / cap) * cap (HF final_logit_softcapping); x may be a logits buffer.
  virtual void softcap(Buffer& x, int64_t n, double cap);
  /// attention() with the score scale given (gemma: query_pre_attn_scalar^-0.5) and, when
  /// softcap > 0, each scaled score s replaced by tanh(s / softcap) * softcap before the
  /// causal/window mask and the softmax (HF Gemma2 eager attention, attn_logit_softcapping).
  virtual void scaled_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache,
                                int T, int pos0, int H, int Hkv, int Dh, int window,
                                double scale, double softcap, Buffer& out);

  // --- ops of the Mamba2 hybrids (Granite 4.0-H, Nemotron-H) ------------------------------
  // Semantics of HF's Mamba2 mixers (GraniteMoeHybridMambaLayer / NemotronHMamba2Mixer
  // torch_forward, v5.17). A tier without a kernel keeps the default, which refuses with one
  // line naming the tier and the op, as for the gemma ops.

  /// Mamba2's causal depthwise conv1d (width K) with its rolling state, then SiLU. With
  /// seq = [state (K-1 rows); x (T rows)]: out[t, c] = silu(sum_k w[c, k] seq[t + k, c] + b[c]),
  /// then state = the last K-1 rows of seq. x, out [T, C] (out may not alias x), state
  /// [K-1, C] (zeros for a fresh sequence), w [C, (1,) K] (HF conv1d.weight), bias [C] or null.
  virtual void ssm_conv(const Buffer& x, const Tensor& w, const Tensor* bias, int T, int C, int K,
                        Buffer& state, Buffer& out);
  /// Mamba2's selective scan over T tokens from state [nh, hd, N] (updated in place); head h
  /// reads group g = h / (nh / G) of B and C. Its definition, the recurrence token by token:
  ///   dt = clamp(softplus(dt_raw[t, h] + dt_bias[h]), dt_min, dt_max)  (softplus(v) = v above 20)
  ///   state[h, p, n] = exp(dt * -exp(A_log[h])) state[h, p, n] + dt B[t, g, n] x[t, h, p]
  ///   y[t, h, p] = sum_n state[h, p, n] C[t, g, n] + D[h] x[t, h, p]
  /// xbc [T, nh*hd + 2*G*N] holds x, B, C side by side (ssm_conv's output); dt_raw [T, nh];
  /// y [T, nh*hd]. T == 1 is the decode step.
  /// Two algorithms give it. The recurrence above (ref always; cpu and cuda at T == 1), and
  /// for a prefill (T > 1) on cpu and cuda the chunked form HF's torch_forward and mamba_ssm
  /// compute (SSD: per chunk of `chunk` tokens, the intra-chunk outputs as a masked
  /// C B^T product, the entering state's share, the state handed to the next chunk), which
  /// equals the recurrence in exact arithmetic for any chunk but rounds otherwise. The oracle
  /// keeps the recurrence: it is the definition, with one rounding per operation in a fixed
  /// order, and it makes a prefill of N tokens the same bits as N steps on ref.
  virtual void ssm_scan(const Buffer& xbc, const Buffer& dt_raw, const Tensor& A_log,
                        const Tensor& D, const Tensor& dt_bias, double dt_min, double dt_max,
                        int T, int nh, int hd, int G, int N, int chunk, Buffer& state,
                        Buffer& y);
  /// out[R, W] = w * (v / rms(v)) with v = y * silu(z), the RMS taken over each group of
  /// `group` consecutive columns (eps inside the sqrt): HF GraniteMoeHybridRMSNormGated
  /// (group = W) and Zamba2RMSNormGated as Nemotron-H uses it (group = W / n_groups).
  virtual void rmsnorm_gated(const Buffer& y, const Buffer& z, const Tensor& w, int R, int W,
                             int group, double eps, Buffer& out);
  /// out[n] = max(x[n], 0)^2 (Nemotron-H's relu2 MLP activation).
  virtual void relu2(const Buffer& x, int64_t n, Buffer& out);

  // --- mixture of experts (backend/moe_ops.cpp) -----------------------------------------
  // One op for every MoE family (llama's qwen2_moe / qwen3_moe / mixtral, the Granite and
  // Nemotron-H hybrids): the router's matmul stays in the model (stage "router"), the routing
  // and the routed experts are below it, so a tier can keep them on its device. The default
  // reads the logits to the host, routes each token with route() in f64, runs each selected
  // expert with matmul and swiglu/relu2 on the rows routed to it (so it reads only the
  // selected experts), and sums on the host in f64: what ref and cpu run.

  /// One MoE layer's routed experts, E = spec.n_experts of them, each of width F:
  ///   swiglu: y = down[e] @ (silu(gate[e] @ x) * (up[e] @ x))   gate, up [F, D]; down [D, F]
  ///   relu2:  y = down[e] @ relu2(up[e] @ x)                      (gate empty)
  /// The tensors may be row slices of a 3-D stack (Granite); a tier may keep per-layer tables
  /// of their device copies, keyed by the host addresses.
  struct MoeExperts {
    RouterSpec spec;               // E, k and the scoring (passed router_spec_problem)
    const Tensor* bias = nullptr;  // [E] selection-only bias (Nemotron-H), or null
    bool relu2 = false;
    std::vector<const Tensor*> gate, up, down;  // [E] each
  };
  /// The routed sum of one MoE layer: token t goes to the k experts that route() picks from
  /// its row of the router logits [T, E] (as the router matmul stored them; ties to the lower
  /// index), and out[t, :] = sum over those experts e, in ascending e, of weight_e * y_e(x[t])
  /// for x, out [T, D]. The projections, the activation and each y_e are rounded to the
  /// compute type as matmul, swiglu and relu2 round them; the sum is taken in f64 (default)
  /// or f32 (cuda) and rounded once. routes: when not null, receives each token's Route (ids
  /// by descending selection score, weights, margin) on the host (for the route log of
  /// traces); null lets a tier keep the whole block on its device.
  virtual void moe(const Buffer& logits, const Buffer& x, const MoeExperts& ex, int T,
                   Buffer& out, std::vector<Route>* routes);
  /// y[t, :] *= sigmoid(g[t]) for y [T, D], g [T] (Qwen2-MoE's shared-expert gate). The
  /// default computes in f64 on the host and rounds once.
  virtual void sigmoid_gate(Buffer& y, const Buffer& g, int T, int D);

  // --- stage taps and fused ops (backend/fused_ops.cpp) -----------------------------------
  // Each fused op has a default made of the ops above, called one by one with the stage taps
  // (backend/tap.h) applied between them, so a tier without a fused kernel (ref, cpu)
  // computes exactly the op-by-op path; a tier with one (cuda, for T == 1) must give the bits
  // of its own op-by-op path, and apply every tap where the value is (inside the kernel for
  // the stages a kernel never writes out). A null tap leaves its stage alone.

  /// Applies a tap to out [rows, cols] through read()/write(): the host path of every tier.
  /// It hands the input rounding of the op just run (measure_input_rounding) to the tap's
  /// record and forgets it, so it never reaches another stage.
  void apply_tap(const StageTap* tap, Buffer& out, int rows, int cols);

  /// drift and opcheck turn this on for their runs: an op that rounds its inputs beyond the
  /// activations' storage type (the cpu tier's T == 1 matmuls of ggml block formats, which
  /// quantize x to 8-bit codes) then notes, per output element, the squared error that
  /// rounding can add (input_rounding_), for the stage bound of docs/localize.md. Off, the
  /// ops pay nothing for it.
  void measure_input_rounding(bool on) {
    measure_input_rounding_ = on;
    input_rounding_.clear();
    input_rounding_lost_ = false;
  }

  /// norm(x; w, eps) as nw says: rmsnorm() or rmsnorm_1p().
  void norm(const Buffer& x, const Tensor& w, NormWeight nw, int R, int N, double eps,
            Buffer& out);

  /// One output of rmsnorm_matmul: out[T, N] = xn @ W[N, K]^T (+ bias[N]), then tap.
  struct MatmulTarget {
    const Tensor* W = nullptr;
    const Tensor* bias = nullptr;  // may be null or empty
    Buffer* out = nullptr;
    const StageTap* tap = nullptr;
  };
  /// A residual update that the next norm runs first: rmsnorm_add(*y, *w, nw, T, D, eps,
  /// *residual, norm, sum) with that op's nw, T, D and eps, where residual is that op's x.
  /// Gemma's post norms: the block's output normalised and added where the next block's norm
  /// reads the residual anyway (cuda, T == 1: inside that GEMV, instead of a pass of its own
  /// after the output's GEMV).
  struct NormAdd {
    Buffer* y = nullptr;
    const Tensor* w = nullptr;
    Buffer* residual = nullptr;
    const StageTap *norm = nullptr, *sum = nullptr;
  };
  /// rmsnorm_add as pre says, when given.
  void norm_add(const NormAdd* pre, NormWeight nw, int T, int D, double eps);
  /// With pre, its residual update first (x += norm(pre's y)). xn[T, D] = norm(x; w, nw, eps)
  /// (tap norm_tap), then outs[i].out = xn @ outs[i].W^T (+ bias) for each i. Afterwards xn
  /// holds norm(x) if keep_xn (a MoE block's router: the experts read xn next), else its
  /// contents are unspecified (a fused kernel need not write it).
  virtual void rmsnorm_matmul(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D,
                              double eps, Buffer& xn, bool keep_xn, const StageTap* norm_tap,
                              const MatmulTarget* outs, int n_outs,
                              const NormAdd* pre = nullptr);
  /// outs[i].out = x @ outs[i].W^T (+ bias), then outs[i].tap, for each i: rmsnorm_matmul's
  /// and rmsnorm_glu's projections of one input, which a tier may run together (cpu, T == 1:
  /// one parallel region).
  virtual void matmuls(const Buffer& x, int T, const MatmulTarget* outs, int n_outs);
  /// Mamba2's causal conv of one rmsnorm_matmul output (xBC): ssm_conv of outs[of]'s T rows
  /// (W's rows wide) with these weights into act, continuing state, then the taps on act
  /// (stage ssm_conv) and on the state.
  struct ConvTarget {
    int of = 0;
    const Tensor* w = nullptr;
    const Tensor* bias = nullptr;  // may be null
    int K = 0;
    Buffer* state = nullptr;
    Buffer* act = nullptr;
    const StageTap *tap = nullptr, *state_tap = nullptr;
  };
  /// ssm_conv of x [T, C] as `conv` says, with its taps: the conv of rmsnorm_matmul_conv and
  /// of a batched forward's sequences, one way.
  void apply_conv(const Buffer& x, int T, int C, const ConvTarget& conv);
  /// rmsnorm_matmul (keep_xn false), then ssm_conv(*outs[conv.of].out, ...): Mamba2's in_proj
  /// and its conv, which a tier may run as one launch (cuda, T == 1: the conv in the GEMV's
  /// rows of xBC).
  virtual void rmsnorm_matmul_conv(const Buffer& x, const Tensor& w, NormWeight nw, int T,
                                   int D, double eps, Buffer& xn, const StageTap* norm_tap,
                                   const MatmulTarget* outs, int n_outs, const ConvTarget& conv);
  /// The stages of rmsnorm_glu: the norm, the two projections and their product.
  struct GluTaps {
    const StageTap *norm = nullptr, *gate = nullptr, *up = nullptr, *act = nullptr;
  };
  /// With pre, its residual update first (x += norm(pre's y)). xn = norm(x; w, nw, eps);
  /// act[T, F] = swiglu or geglu (as `act_fn` says) of xn @ w_gate^T and xn @ w_up^T.
  /// Afterwards the contents of xn, gate and up are unspecified.
  virtual void rmsnorm_glu(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D,
                           double eps, Buffer& xn, const Tensor& w_gate, const Tensor& w_up,
                           GluAct act_fn, Buffer& gate, Buffer& up, Buffer& act,
                           const GluTaps& taps, const NormAdd* pre = nullptr);
  /// tmp[T, N] = x @ W^T (tap product); tmp *= scale unless scale is 1 (Granite's
  /// residual_multiplier: scale()); then residual[T, N] += tmp (tap sum). Afterwards tmp's
  /// contents are unspecified.
  virtual void matmul_add(const Buffer& x, const Tensor& W, int T, Buffer& tmp,
                          Buffer& residual, double scale, const StageTap* product,
                          const StageTap* sum);
  /// What moe_add does around moe()'s routed sum y [T, D]: o = y + shared (the block's shared
  /// expert's output, when given), o *= scale unless it is 1 (Granite's residual_multiplier),
  /// then residual += o, each as add() and scale() compute it. Taps: routed on y, sum on o
  /// after the shared add, res on the residual.
  struct MoeResidual {
    const Buffer* shared = nullptr;
    double scale = 1;
    const StageTap *routed = nullptr, *sum = nullptr, *res = nullptr;
  };
  /// moe() into out, then residual [T, D] += the block's output as r says: a MoE block's whole
  /// residual update. Afterwards out's contents are unspecified.
  virtual void moe_add(const Buffer& logits, const Buffer& x, const MoeExperts& ex, int T,
                       Buffer& out, std::vector<Route>* routes, Buffer& residual,
                       const MoeResidual& r);
  /// y[T, D] = norm(y; w, nw, eps) (tap norm_tap), then residual[T, D] += y (tap sum): Gemma's
  /// post-attention and post-feedforward norms. Afterwards y's contents are unspecified.
  virtual void rmsnorm_add(Buffer& y, const Tensor& w, NormWeight nw, int T, int D, double eps,
                           Buffer& residual, const StageTap* norm_tap, const StageTap* sum);
  /// The stages of qk_rope_attention, in order.
  struct AttentionTaps {
    const StageTap *q_norm = nullptr, *k_norm = nullptr, *q_rope = nullptr, *k_rope = nullptr,
                   *out = nullptr;
  };
  /// q [T, H, Dh], k [T, Hkv, Dh]: per-head norm (as qk_nw says) when q_norm/k_norm are given
  /// (qwen3, gemma3), RoPE at positions pos0 + t, then k and v stored at rows pos0.. of the
  /// layer's cache (taps q_norm, k_norm, q_rope, k_rope).
  virtual void qk_rope_store(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                             const Tensor* k_norm, NormWeight qk_nw, double eps, int T, int H,
                             int Hkv, int Dh, int pos0, const RopeSpec& rope, Buffer& k_cache,
                             Buffer& v_cache, const AttentionTaps& taps);
  /// qk_rope_store, then attention of the roped q over the cache into out (see attention()
  /// and scaled_attention(); tap out).
  virtual void qk_rope_attention(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                                 const Tensor* k_norm, NormWeight qk_nw, double eps, int T,
                                 int H, int Hkv, int Dh, int pos0, const RopeSpec& rope,
                                 Buffer& k_cache, Buffer& v_cache, int window,
                                 const AttentionScores& scores, Buffer& out,
                                 const AttentionTaps& taps);
  /// One sequence of attention_batch: its rows [row0, row0 + T) of q, k, v and out, at
  /// positions pos0.., its K/V rows in the pool at pages.
  struct PagedSeq {
    int row0 = 0, T = 0, pos0 = 0;
    KvPages pages;
  };
  /// Each sequence's attention on its own rows of q [rows, H*Dh], k, v [rows, Hkv*Dh] (the
  /// sequences' rows one after the other), against its own pages of the layer's pool, into
  /// out [rows, H*Dh]: the per-head q/k norm when given (as nw says), RoPE at the sequence's
  /// positions when rope is given (without: K/V stored as they are, the hybrids' NoPE
  /// layers), the K/V store, then attention with `scores` and `window`. The default runs
  /// each sequence by qk_rope_attention_paged (or kv_store_paged + attention_paged), the
  /// bits of that sequence alone (ref, cpu); a tier may run the whole batch in one launch per
  /// stage instead (cuda: each sequence's rows still a function of that sequence alone).
  virtual void attention_batch(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                               const Tensor* k_norm, NormWeight nw, double eps, int H, int Hkv,
                               int Dh, const RopeSpec* rope, Buffer& k_pool, Buffer& v_pool,
                               const std::vector<PagedSeq>& seqs, int window,
                               const AttentionScores& scores, Buffer& out);
  /// qk_rope_attention over a paged pool (kv_store_paged, attention_paged), without taps:
  /// the batched forward of continuous batching runs no stage hooks.
  void qk_rope_attention_paged(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                               const Tensor* k_norm, NormWeight qk_nw, double eps, int T, int H,
                               int Hkv, int Dh, int pos0, const RopeSpec& rope, Buffer& k_pool,
                               Buffer& v_pool, const KvPages& pages, int window,
                               const AttentionScores& scores, Buffer& out);

  // --- greedy decode with the token kept on the tier (backend/fused_ops.cpp) -------------
  // A greedy generation loop needs each token only to embed it next; a tier that keeps it
  // where the logits live can queue the next step without waiting for the host. The
  // defaults go through summarize() and embed(), so every tier picks the same token.

  /// Picks the next token from logits row `row` of [row + 1, V]: summarize's top-1 (the
  /// largest logit, +Inf above every number, ties to the lower id, NaN last; a row of NaN
  /// only picks id 0).
  virtual void pick_greedy(const Buffer& logits, int row, int V);
  /// out[1, D] = table[the token of the latest pick_greedy].
  virtual void embed_picked(const Tensor& table, Buffer& out);
  /// The oldest pick not yet taken (waits for it when the tier is still computing it).
  virtual int32_t take_pick();

  /// Device memory read bandwidth in GB/s (1e9 bytes/s) of each of `passes` timed reads of a
  /// large buffer, for bench's decode limit; empty when the tier has no such probe (bench
  /// then measures its own lower bound).
  virtual std::vector<double> read_bandwidth_gbs(int passes) {
    (void)passes;
    return {};
  }
  /// The tier's arithmetic peak in GFLOP/s of each of `passes` timed probes, for bench's
  /// prefill limit, and in *source one line saying what was measured; empty when the tier
  /// has no such probe (bench then times the tier's matmul on the model's shapes).
  virtual std::vector<double> peak_gflops(int passes, std::string* source) {
    (void)passes;
    (void)source;
    return {};
  }

  OpStats& stats() { return stats_; }
  const OpStats& stats() const { return stats_; }

 protected:
  OpStats stats_;
  bool measure_input_rounding_ = false;
  /// Per output element of the latest op that rounded its inputs beyond the storage type
  /// (while measure_input_rounding_): sum_k (|w_k| r_k)^2, r_k the largest rounding of input
  /// k; empty otherwise. apply_tap consumes it.
  std::vector<double> input_rounding_;
  /// Set when an op's input_rounding_ was replaced before a tap or a composite took it
  /// (a composite that does not account for its inner matmuls: Qwen2-MoE's shared expert).
  bool input_rounding_lost_ = false;
  /// An op that may round its inputs calls this first: the rounding left by the op before
  /// it, if nobody took it, is lost.
  void begin_input_rounding() {
    if (!input_rounding_.empty()) input_rounding_lost_ = true;
    input_rounding_.clear();
  }
  /// input_rounding_, emptied (a composite op takes each inner matmul's).
  std::vector<double> take_input_rounding() {
    std::vector<double> r = std::move(input_rounding_);
    input_rounding_.clear();
    return r;
  }
  /// qk_rope_store's norms and RoPEs (with their taps), before the store.
  void qk_norm_rope(Buffer& q, Buffer& k, const Tensor* q_norm, const Tensor* k_norm,
                    NormWeight qk_nw, double eps, int T, int H, int Hkv, int Dh, int pos0,
                    const RopeSpec& rope, const AttentionTaps& taps);
  /// A pick kept on the host, as the default pick_greedy keeps it: the latest, and queued.
  void push_pick(int32_t id);

 private:
  int32_t last_pick_ = -1;         // the defaults' picks: latest, and those not yet taken
  std::deque<int32_t> picks_;
};

/// Checks moe()'s expert list (counts, shapes, the spec, the bias) with one line naming the
/// tier and the tensor; sets D and F.
void moe_check_experts(const Backend& be, const Backend::MoeExperts& ex, int& D, int& F);

/// Parses "ref", "cpu", "cuda", "cuda:N" (+ dtype for cuda: "bf16", "f16", "f32") and
/// makes the tier. threads <= 0 means all cores. Throws arbiter::Error for unknown devices
/// or "cuda tier not built" when compiled without CUDA.
struct DeviceSpec {
  std::string device = "cpu";  // as given
  std::string dtype;           // empty: the tier's default
  int threads = 0;
  /// --mix ablation (backend/mix.h): "family=dtype,..." or empty. Only the cuda tier may
  /// accept it; make_backend refuses it elsewhere rather than ignore it.
  std::string mix;
};
std::unique_ptr<Backend> make_backend(const DeviceSpec& spec);

/// Elements [off, off + n) of b as a buffer of its own (the same memory): one sequence's rows
/// of a batched forward's activations.
Buffer buffer_view(const Buffer& b, int64_t off, int64_t n);

/// Rows of a layer's KV cache pair (k_cache.n / kv_dim, both alike): position p is at row
/// p % rows (kv_store).
int kv_cache_rows(const Buffer& k_cache, const Buffer& v_cache, int kv_dim);
/// kv_cache_rows, refused with one line naming the tier when the cache cannot hold every key
/// that attention of T queries at pos0 sees: pos0 + T rows, or with a window, the
/// min(pos0 + T, window + T - 1) latest positions (a ring's oldest row still in the window).
int attention_cache_rows(const Buffer& k_cache, const Buffer& v_cache, int kv_dim, int T,
                         int pos0, int window, const char* tier);

/// Refuses, with one line naming the tier, pages that do not cover `positions` positions or
/// name a block outside the pool [blocks * pages.block_rows, kv_dim].
void check_kv_pages(const Buffer& k_pool, const Buffer& v_pool, int kv_dim,
                    const Backend::KvPages& pages, int positions, const char* tier);

}  // namespace arbiter
