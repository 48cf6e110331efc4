// Launchers of the CUDA tier's kernels (defined in the .cu files next to this header, called
// by cuda_backend.cpp). Plain C++ types only, so the host side compiles without nvcc flags.
// Every launcher queues work on stream s and checks the launch (ARB_LAUNCHED).
//
// Element types: activations and weight matrices are in the compute type (DType); norm
// weights and biases are kept in f32 (they are tiny, and f32 keeps them exact for every
// storage dtype); logits rows are f32. All arithmetic is f32 (f64 for the logsumexp).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace arbiter::cuda {

/// The compute types are arbiter::DType's F32, F16 and BF16 (core/dtype.h); weights being
/// uploaded may also be Q8_0 (F64 is widened on the host first).
using arbiter::DType;
inline size_t ctype_size(DType t) { return t == DType::F32 ? 4 : 2; }


/// A position either passed by value (eager launches) or read on the device from a scalar
/// that is written before each replay of a captured decode graph (dev != nullptr). Row t of
/// an op is at position pos + t, or, with `rows` (a batched forward's rows, each sequence at
/// its own positions), at rows[t].
struct PosRef {
  const int* dev = nullptr;
  int host = 0;
  const int* rows = nullptr;
};

/// A stage tap inside a fused kernel (backend/tap.h), in device memory: at element i of the
/// stage's output, already rounded to the compute type T: with fault, v = T(v * scale + bias
/// + noise[i]) (f32 arithmetic; noise may be null); then record[i] = v (written by one block
/// when several compute the value); then v = overwrite[i] when given. record and overwrite
/// hold T. A kernel variant with taps exists for each fused form; the others never read them.
struct Tap {
  bool fault = false;
  float scale = 1.f, bias = 0.f;
  const float* noise = nullptr;
  void* record = nullptr;
  const void* overwrite = nullptr;
};

// --- weights and gathers ------------------------------------------------------------------
/// dst[r, c] (row stride ld >= cols, pad columns zeroed) = src[r, c] converted to ct.
/// Q8_0 rows are cols/32 blocks of 34 bytes.
void launch_convert_matrix(DType st, const void* src, int64_t rows, int64_t cols, DType ct,
                           void* dst, int64_t ld, cudaStream_t s);
/// dst[n] (f32) = src[n] widened (plus_one: 1 + src[n] in f32, gemma's RMSNorm weights).
void launch_convert_vector(DType st, const void* src, int64_t n, bool plus_one, float* dst,
                           cudaStream_t s);
/// out[t, :D] = table[ids[t], :D] (table row stride ld); ids on the device.
void launch_embed(DType ct, const void* table, int64_t ld, int64_t D, const int32_t* ids, int T,
                  void* out, cudaStream_t s);

// --- elementwise and row ops --------------------------------------------------------------
/// out[R, N] = x / sqrt(mean(x^2) + eps) * w; out may alias x. One warp per row.
void launch_rmsnorm(DType ct, const void* x, const float* w, int R, int N, float eps, void* out,
                    cudaStream_t s);
/// In place on x[T, nh, Dh]: rotates pairs (a, b) of each head by the angle of row t's
/// position p (PosRef) and frequency i, read from cs[p * Dh/2 + i] = (cos, sin).
void launch_rope(DType ct, void* x, int T, int nh, int Dh, PosRef pos, const float2* cs,
                 bool adjacent, cudaStream_t s);
/// k_cache[((pos + t) % rows) * kv_dim + j] = k[t * kv_dim + j], same for v (a cache of
/// `rows` rows; a ring when rows < pos + T); with dst, row t goes to cache row dst[t] (a
/// paged pool) and pos and rows are not read.
void launch_kv_store(DType ct, const void* k, const void* v, void* k_cache, void* v_cache, int T,
                     PosRef pos, int kv_dim, int rows, cudaStream_t s, const int* dst = nullptr);
/// out[n] = silu(gate[n]) * up[n]
void launch_swiglu(DType ct, const void* gate, const void* up, int64_t n, void* out,
                   cudaStream_t s);
/// x[n] += y[n]
void launch_add(DType ct, void* x, const void* y, int64_t n, cudaStream_t s);
/// out[n] = gelu_tanh(gate[n]) * up[n] (HF gelu_pytorch_tanh)
void launch_geglu(DType ct, const void* gate, const void* up, int64_t n, void* out,
                  cudaStream_t s);
/// out[n] = max(x[n], 0)^2
void launch_relu2(DType ct, const void* x, int64_t n, void* out, cudaStream_t s);
/// x[n] *= s in place; t is the buffer's type (the compute type, or f32 for logits).
void launch_scale(DType t, void* x, int64_t n, float s, cudaStream_t st);
/// x[n] = tanh(x[n] / cap) * cap in place; t as for launch_scale.
void launch_softcap(DType t, void* x, int64_t n, float cap, cudaStream_t st);
/// out[T, N] (type ot) = acc[T, N] (f32) + bias[N] (f32): one rounding after the bias.
void launch_bias_out(const float* acc, const float* bias, int T, int N, DType ot, void* out,
                     cudaStream_t s);

// --- Mamba2 mixer (ssm.cu) ------------------------------------------------------------------
/// Backend::ssm_conv: x, out [T, C] and state [K-1, C] in the compute type (the state holds
/// rows of x, so keeping it in that type is exact); w [C, K] and b [C] (may be null) in f32.
/// A thread per (channel, tile of at least 16 tokens).
void launch_ssm_conv(DType ct, const void* x, const float* w, const float* b, int T, int C, int K,
                     void* state, void* out, cudaStream_t s);
/// Largest ssm_scan state size N (a warp per state row keeps N / 32 values per lane).
constexpr int kMaxScanState = 256;
/// Largest chunk of the chunked scan (an f64 and an f32 per token of a chunk in shared memory).
constexpr int kMaxScanChunk = 4096;
/// Backend::ssm_scan's arguments: xbc [T, nh*hd + 2*G*N], dt_raw [T, nh], y [T, nh*hd] in the
/// compute type; a_log, d, dt_bias [nh] and the state [nh, hd, N] in f32.
struct ScanArgs {
  const void* xbc = nullptr;
  const void* dt_raw = nullptr;
  const float *a_log = nullptr, *d = nullptr, *dt_bias = nullptr;
  float dt_min = 0.f, dt_max = 0.f;
  int T = 0, nh = 0, hd = 0, G = 0, N = 0;
  int chunk = 0;  // Q, tokens per chunk of the chunked form (T > 1)
  float* state = nullptr;
  void* y = nullptr;
  /// The chunked form's workspace (T > 1), ssm_scan_scratch_floats(...) floats: each chunk's
  /// state [ceil(T / Q), nh, hd, N], each chunk's decay [ceil(T / Q), nh], then C_t . B_s of
  /// the chunk's tokens s for each group and token t [G, T, Q].
  float* scratch = nullptr;
  /// The recurrence at every T (row invariance: the chunked form's sums depend on where a
  /// forward starts a chunk, which a batch decides).
  bool recurrence = false;
};
/// f32 elements of the chunked scan's workspace for these arguments.
int64_t ssm_scan_scratch_floats(const ScanArgs& a);
/// T == 1 (the decode step) or `recurrence`: a warp per state row (h, p), its N values in
/// registers, token by token. T > 1: the chunked form (SSD) in four kernels, parallel over
/// chunks but for one pass over the chunk states in order (ssm.cu).
void launch_ssm_scan(DType ct, const ScanArgs& a, cudaStream_t s);
/// Lets the chunked scan's kernels take the shared memory of kMaxScanChunk and kMaxScanState
/// (once, at the backend's start).
void ssm_init();
/// Backend::rmsnorm_gated: out[R, W] = w * v / rms(v), v = y * silu(z), the RMS over each
/// group of `group` columns (W % group == 0); a block per (row, group).
void launch_rmsnorm_gated(DType ct, const void* y, const void* z, const float* w, int R, int W,
                          int group, float eps, void* out, cudaStream_t s);

// --- mixture of experts (moe.cu) -------------------------------------------------------------
/// Largest E and k the device router takes (a warp per token, scores staged in shared memory).
constexpr int kMoeMaxExperts = 512, kMoeMaxTopK = 32, kMoeMaxGroups = 32;
/// Backend::moe's routing (route(), backend/moe_routing.h) of logits [T, E] in the compute
/// type, scored in f64 like the host: ids [T, k] by descending selection score (ties to the
/// lower index, NaN last), weights [T, k] (f32) and margin [T] (f64) in device memory.
struct MoeRouteArgs {
  const void* logits = nullptr;
  const float* bias = nullptr;  // [E] selection-only bias, or null
  int T = 0, E = 0, k = 0;
  bool sigmoid = false, topk_first = false, norm = false;
  double norm_eps = 0, scale = 1;
  int n_group = 1, topk_group = 1;
  int* ids = nullptr;
  float* weights = nullptr;
  double* margin = nullptr;
};
void launch_moe_route(DType ct, const MoeRouteArgs& a, cudaStream_t s);
/// The expert weights of one MoE layer as the kernels read them: device tables of E row
/// pointers (each matrix's rows at stride ld_in / ld_down elements), gate null for relu2.
struct MoeTables {
  const void* const* gate = nullptr;  // [E] -> [F, D]
  const void* const* up = nullptr;    // [E] -> [F, D]
  const void* const* down = nullptr;  // [E] -> [D, F]
  int64_t ld_in = 0, ld_down = 0;
  int D = 0, F = 0, E = 0, k = 0;
  bool relu2 = false;
};
/// Decode (T == 1): act[k, F] = act(x @ gate_e^T, x @ up_e^T) for each slot's expert
/// e = ids[slot], read on the device; then out[D] = sum over the slots in ascending expert
/// id of weights[slot] * (act[slot] @ down_e^T) rounded to the compute type, in f32. A warp
/// per output row; nothing goes to the host.
///
/// With res.residual (Backend::moe_add) the rows are not stored in out but added to the
/// residual [D]: o = y + res.shared[d] (when not null), o *= res.scale (unless 1), then
/// residual[d] += o, each rounded to the compute type as add_kernel and scale_kernel round.
struct MoeResidualArgs {
  const void* shared = nullptr;
  float scale = 1.f;
  void* residual = nullptr;
};
void launch_moe_decode(DType ct, const MoeTables& w, const void* x, const int* ids,
                       const float* weights, void* act, void* out, const MoeResidualArgs& res,
                       cudaStream_t s);
/// Prefill (T > 1): the T*k (token, slot) pairs sorted by expert on the device (a counting
/// sort; group starts `offsets` [E+1], tile starts `tiles` [E+1] in units of kMoeTileRows,
/// tok_of [T*k] the token of each sorted row, row_of [T*k] the sorted row of each pair), a
/// grouped tiled GEMM over the groups for gate/up and the activation (act [T*k, F]) and for
/// down (y [T*k, D]), then out[t] = sum over t's slots in ascending expert id of
/// weights * y in f32. The grids are sized for the worst grouping (no host sync): tiles past
/// the last group return at once. mma (CudaTuning::moe_mma): the grouped GEMMs of bf16/f16 on
/// tensor cores; f32 always runs them on CUDA cores.
struct MoeSortBufs {
  int* offsets = nullptr;
  int* tiles = nullptr;
  int* tok_of = nullptr;
  int* row_of = nullptr;
};
constexpr int kMoeTileRows = 32;
void launch_moe_prefill(DType ct, const MoeTables& w, const void* x, int T, const int* ids,
                        const float* weights, const MoeSortBufs& sb, void* act, void* y,
                        void* out, bool mma, cudaStream_t s);
/// y[t, :D] *= sigmoid(g[t]) (f32, one rounding): Qwen2-MoE's shared-expert gate.
void launch_sigmoid_gate(DType ct, void* y, const void* g, int T, int D, cudaStream_t s);

// --- matrix-vector (T == 1) ---------------------------------------------------------------
/// out[N] (type ot) = W[N, K] (row stride ld, 16-byte aligned rows) @ x[K] (+ bias[N]).
/// One warp per row, 16-byte loads, f32 accumulation (gemv.cu).
void launch_gemv(DType ct, const void* x, const void* W, int64_t ld, const float* bias, int N,
                 int K, DType ot, void* out, int sm_count, cudaStream_t s);

// --- packed block formats (gemv_quant.cu) -------------------------------------------------
/// Whether a matrix in block format t stays packed on the device (the ggml block formats,
/// Q8_0 to MXFP4; MLX's blocks and F64 are widened at upload).
bool packed_on_device(DType t);
/// The packed GEMV's forms (launch_qgemv's mode):
///   kQGemvPlain   seg[i].out[rows_i] (f32 when out_f32, else ct) = W_i @ x (+ bias_i, f32),
///                 up to 3 matrices of one format and row length in one launch (q, k, v)
///   kQGemvAdd     seg[0].out (the residual, ct) += W @ x rounded to ct (matmul then add)
///   kQGemvSwiglu  seg[0].out (ct) = silu(W @ x) * (W2 @ x), both rounded to ct first (matmul,
///                 matmul, swiglu's bits); W2 the up rows, seg[0].W the gate rows
enum QGemvMode : int { kQGemvPlain = 0, kQGemvAdd = 1, kQGemvSwiglu = 2 };
struct QGemvSeg {
  const void* W = nullptr;
  const float* bias = nullptr;
  void* out = nullptr;
  int rows = 0;
  int out_f32 = 0;
};
/// Whether the packed GEMV takes rows of K values of format qt in that form (the tensor-core
/// kernel, when `mma`: Q4_K/Q5_K/Q6_K in bf16/f16, any K of whole super-blocks; else x and the
/// rows' pieces must fit shared memory); otherwise the rows are dequantized and multiplied
/// densely.
bool qgemv_fits(DType ct, DType qt, int K, int mode, bool mma);
/// Whether launch_qgemv takes a norm_w in that form: the tensor-core kernel, plain or SwiGLU,
/// rows the fused bf16/f16 GEMV could take (gemv_fusable).
bool qgemv_norm_fits(DType ct, DType qt, int K, int mode, bool mma);
/// Every W packed blocks of format qt, rb bytes from one row to the next (a multiple of 16);
/// x[K] in ct, never quantized: each weight is dequantized in registers, f32 accumulation (on
/// tensor cores when `mma` and qgemv_fits says so: the quants exact in ct, f32 accumulators).
/// norm_w (f32, qgemv_norm_fits): the products take rmsnorm(x; norm_w, eps) instead of x, the
/// bits the rmsnorm op gives, computed by every block into shared memory.
void launch_qgemv(DType ct, DType qt, int mode, const void* x, const QGemvSeg* seg, int n_seg,
                  const void* W2, int64_t rb, int K, bool mma, int sm_count, cudaStream_t s,
                  const float* norm_w = nullptr, float eps = 0.f);
/// dst[r, :K] (ct, row stride ld elements) = the values of row (ids ? ids[r] : row0 + r) of
/// the packed W, r < rows, each the exact value rounded once to ct (ids: device memory).
void launch_dequant_rows(DType ct, DType qt, const void* W, int64_t rb, const int32_t* ids,
                         int64_t row0, int rows, int K, void* dst, int64_t ld, cudaStream_t s);

/// One matrix of a fused GEMV: rows [0, rows) of W (row stride ld) into out (f32 when
/// out_f32, else the compute type), + bias (f32, may be null).
struct GemvSeg {
  const void* W = nullptr;
  int64_t ld = 0;
  const float* bias = nullptr;
  void* out = nullptr;
  int rows = 0;
  int out_f32 = 0;
};
/// Mamba2's conv behind the xBC rows of a kGemvNorm launch (rmsnorm_matmul_conv): for channel
/// c, row c of segment `seg` (stored there as matmul stores it), act[c] = ssm_conv's output
/// of one token with the channel's state [K-1, C] (shifted a row). w [C, K], b [C] (may be
/// null) in f32; act and state in the compute type. Off while seg < 0.
struct GemvConv {
  int seg = -1;
  const float* w = nullptr;
  const float* b = nullptr;
  int K = 0;
  void* state = nullptr;
  void* act = nullptr;
};
/// Fused GEMV forms (launch_gemv_fused's mode):
///   kGemvPlain       seg[i].out = W_i @ x (rows of the segments stacked)
///   kGemvNorm        seg[i].out = W_i @ rmsnorm(x; norm_w, eps) (xn rounded to the compute type)
///   kGemvNormGlu  res = silu(W_0 @ xn) * (W_1 @ xn), xn = rmsnorm(x); N rows of each
///   kGemvAdd         res += W_0 @ x (the product rounded, then the add rounded)
enum GemvMode : int { kGemvPlain = 0, kGemvNorm = 1, kGemvNormGlu = 2, kGemvAdd = 3 };
struct GemvArgs {
  const void* x = nullptr;
  const float* norm_w = nullptr;
  float eps = 0.f;
  int K = 0;
  int N = 0;  // rows (sum over segments; kGemvNormGlu: rows of one matrix)
  int n_seg = 1;
  GemvSeg seg[3];
  void* res = nullptr;
  /// kGemvAdd with x in shared memory (rows of 8+ chunks): let the next kernel in at the start
  /// (launch_dependents before the wait) instead of after the wait (gemv.cu says when).
  bool launch_early = false;
  /// kGemvNormGlu: gelu_tanh(gate) * up (GeGLU) instead of silu(gate) * up.
  bool gelu = false;
  /// kGemvNorm: when not null, the first block stores the normalised x [K] here (rmsnorm_matmul's
  /// keep_xn).
  void* xn = nullptr;
  /// kGemvAdd: the product times res_scale (rounded, as scale() rounds it) before the add,
  /// unless it is 1 (Granite's residual_multiplier).
  float res_scale = 1.f;
  /// kGemvNorm: the conv behind one segment's rows.
  GemvConv conv;
  /// kGemvNorm and kGemvNormGlu: x += rmsnorm(pre_y; pre_w, eps) first, with rmsnorm_add's
  /// arithmetic (Backend::NormAdd: Gemma's post norm of the block before, run inside this
  /// one's norm), when pre_y is set. Every block computes the sum; the grid's last block to
  /// finish its rows stores it into x (found with the counter pre_done, which that block
  /// resets), after every block has read x. pre_x is x, writable.
  const void* pre_y = nullptr;
  const float* pre_w = nullptr;
  void* pre_x = nullptr;
  unsigned* pre_done = nullptr;
  /// The stages inside the fused forms, when `tapped`: kGemvNorm and kGemvNormGlu
  /// taps[0] on the normalised x [K]; kGemvNorm with the conv taps[1] on its segment's
  /// product, which the conv reads; kGemvNormGlu taps[1], taps[2] on gate and up [N];
  /// kGemvAdd taps[0] on the product [N] before the add. Null entries are left alone.
  bool tapped = false;
  Tap taps[3];
};
/// Whether the register GEMV (and so the fused forms) takes rows of K elements.
bool gemv_fusable(DType ct, int K);
void launch_gemv_fused(DType ct, int mode, const GemvArgs& a, int sm_count, cudaStream_t s);

/// residual[R, N] += rmsnorm(y; w) (w: f32, 1 + the weight for gemma): rmsnorm() then add()
/// in one launch, with the same sum of squares and roundings as those two kernels.
bool rmsnorm_add_fusable(DType ct, int N);
void launch_rmsnorm_add(DType ct, const void* y, const float* w, int R, int N, float eps,
                        void* residual, cudaStream_t s);

/// Decode-step (T == 1) q/k RMSNorm (when qn/kn are non-null), RoPE of q [H, Dh] and
/// k [Hkv, Dh] in place, and the store of k and v [Hkv * Dh] at row pos of the caches: the
/// same arithmetic as rmsnorm + rope + kv_store one by one (elementwise.cu).
struct QkRopeArgs {
  void* q = nullptr;
  void* k = nullptr;
  const void* v = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const float* qn = nullptr;
  const float* kn = nullptr;
  float eps = 0.f;
  int H = 0, Hkv = 0, Dh = 0;
  bool adjacent = false;
  const float2* cs = nullptr;
  PosRef pos;
  /// The stages inside, when `tapped`: q_norm [H*Dh], k_norm [Hkv*Dh] (with qn/kn), q_rope,
  /// k_rope. The roped k is tapped before it is stored in the cache.
  bool tapped = false;
  Tap q_norm, k_norm, q_rope, k_rope;
};
/// Whether launch_qk_rope_store takes heads of Dh elements.
bool qk_rope_fusable(DType ct, int Dh);
void launch_qk_rope_store(DType ct, const QkRopeArgs& a, cudaStream_t s);

/// Device read bandwidth probe: reads n bytes (a multiple of 16) of src with 16-byte loads
/// and writes one word per block into sink. For bench's decode limit.
void launch_read_probe(const void* src, size_t n, unsigned* sink, int sm_count, cudaStream_t s);

// --- attention ----------------------------------------------------------------------------
struct AttnArgs {
  const void* q = nullptr;        // [T, H, Dh]
  const void* k_cache = nullptr;  // [ctx, Hkv * Dh]
  const void* v_cache = nullptr;
  void* out = nullptr;            // [T, H * Dh]
  float* part = nullptr;          // n_splits > 1: [T * H, n_splits, Dh + 2] (o..., m, l)
  int T = 0, H = 0, Hkv = 0, Dh = 0, window = 0, n_splits = 1;
  int split_keys = 256;  // decode: the first ceil(keys / split_keys) of the n_splits are used
  int heads_per_block = 0;  // decode: query heads per block, a divisor of H / Hkv (required)
  PosRef pos;
  float scale = 1.f;
  /// > 0: each scaled score s becomes tanh(s / softcap) * softcap (Gemma 2) before the mask.
  /// launch_attention only: the tuned decode and tensor-core kernels take no cap (a tanh per
  /// score in their loops is a cost every model would pay).
  float softcap = 0.f;
  /// Cache rows: position p is at row p % rows (a ring when rows < the positions; kv_store).
  int rows = 0;
  /// A batched forward's sequences (attention_batch), with n_splits 1 only: launch_attention,
  /// and launch_attention_decode when every sequence has one query row (without qk):
  /// n_seqs descriptors of kSeqWords ints in device memory, (row0, T, pos0, first): the
  /// sequence's query rows start at row0 of q and out, its key p sits at pool row
  /// blocks[first + p / block_rows] * block_rows + p % block_rows. T is then the most rows of
  /// one sequence; pos and rows are not read.
  const int* seqs = nullptr;
  int n_seqs = 0;
  const int* blocks = nullptr;
  int block_rows = 0;
};
constexpr int kSeqWords = 4;
/// Largest head size the attention kernels take.
constexpr int kMaxHeadDim = 256;
/// Sets the dynamic shared-memory limits of the attention kernels (once per device).
void attention_init();
/// The decode kernels' part of attention_init (attention_decode.cu).
void attention_decode_init();
/// Flash-style causal GQA attention: blocks of 16 (query, head) rows of one KV head, tiles
/// of 32 keys in shared memory, online softmax in f32; never materialises a [T, T] matrix.
/// With n_splits > 1 the key range is split across blocks and a combine kernel merges the
/// partial (max, sum, output) triples in a fixed order.
void launch_attention(DType ct, const AttnArgs& a, cudaStream_t s);
/// Prefill attention on tensor cores (mma.sync, f32 accumulation; attention.cu): T > 1,
/// bf16/f16, Dh 64 or 128, n_splits == 1. Blocks of 64 (query, head) rows of one KV head,
/// tiles of 64 keys; P is rounded to the compute type before the P V product.
bool attention_mma_fits(DType ct, int T, int Dh);
void launch_attention_mma(DType ct, const AttnArgs& a, cudaStream_t s);
/// Decode attention (T == 1): grid (H / heads_per_block, n_splits), keys read straight from
/// global memory, splits merged by the last block of each column (counters:
/// kDecodeCounterWords zeroed words, left zeroed). Takes Dh in {32, 64, 128, 256}, groups
/// H / Hkv <= 8, H <= kMaxDecodeHeads, n_splits <= 32.
constexpr int kMaxDecodeHeads = 1024;
/// Most KV heads whose groups the decode attention splits into several columns of blocks.
constexpr int kMaxSplitColumnsKvHeads = 64;
constexpr int kDecodeCounterWords = 2 * kMaxDecodeHeads;
bool attention_decode_fits(int H, int Hkv, int Dh);
/// qk (may be null): the decode step's q/k norm + RoPE + KV store (launch_qk_rope_store's
/// work, same bits) done inside the attention kernel (q/k heads of Dh <= 64 x V elements);
/// its q, k, caches and position must be the attention's.
void launch_attention_decode(DType ct, const AttnArgs& a, unsigned* counters,
                             const QkRopeArgs* qk, cudaStream_t s);
/// Number of blocks the attention grid has before splitting (for choosing n_splits).
int attention_blocks(int T, int H, int Hkv);

// --- logits summary -----------------------------------------------------------------------
struct SummaryOut {
  double* lse = nullptr;           // [T]
  float* target = nullptr;         // [T] (NaN when no target)
  unsigned long long* nonfinite = nullptr;  // [T]
  int32_t* top_ids = nullptr;      // [T, K]
  float* top_vals = nullptr;       // [T, K]
};
/// Per-slice partials of summarize: [T * S] each.
struct SummaryScratch {
  unsigned long long* nonfinite = nullptr;
  unsigned long long* best = nullptr;  // (order key << 32) | ~id of the slice's largest logit
  float* max = nullptr;                // largest finite logit of the slice
  double* sum = nullptr;               // sum of exp(x - row max) over the slice
};
/// Largest K summarize takes, and most slices per row.
constexpr int kMaxTopK = 1024;
constexpr int kMaxSlices = 128;
/// Slices per row so that T x S blocks fill the device.
int summarize_slices(int T, int V, int sm_count);
/// Per row of logits [T, V] (f32): non-finite count, f64 logsumexp (NaN when any non-finite),
/// target logit, top-K by radix select (descending, ties to the lower id, NaN last).
/// w holds T * S partials of each kind.
void launch_summarize(const float* logits, int T, int V, int K, const int32_t* targets, int S,
                      const SummaryScratch& w, const SummaryOut& o, cudaStream_t s);

/// Greedy pick (launch_pick): the device state, zeroed once; each launch leaves best and
/// ticket zeroed and advances seq.
struct PickState {
  unsigned long long best;  // summarize's packed (order key, ~id) of the best slice so far
  unsigned ticket;          // blocks done
  unsigned seq;             // picks done: the host-ring slot of the next one is seq % n_ring
};
struct PickArgs {
  PickState* state = nullptr;
  int32_t* token = nullptr;  // device slot the next step embeds
  int32_t* ring = nullptr;   // host-mapped ring of n_ring slots: ring[seq % n_ring] = token
  int n_ring = 1;
  int* pos = nullptr;  // non-null: *pos += 1, the next step's position (a step's device slot)
};
/// Summarize's top-1 of one f32 logits row [V] (the largest logit, ties to the lower id,
/// NaN last) in one PDL-chained kernel: slices of the row reduce to packed (key, id) and
/// meet in one atomicMax, which is order-free, so the result is deterministic.
void launch_pick(const float* row, int V, const PickArgs& p, int sm_count, cudaStream_t s);

}  // namespace arbiter::cuda
