// The CUDA tier's Backend: activations in bf16/f16/f32 on one device, f32 accumulation
// everywhere, logits in f32. Weights are uploaded once in the compute dtype (weights.h); the
// KV cache lives on the device; only token ids and positions go up, and only summaries (or
// logits asked for by read()) come back. Single-token steps run as CUDA graphs
// (step_graph.h). Defined in cuda_backend.cpp (memory, the plain ops, summaries, the
// factory), fused.cpp (the fused decode ops and their stage taps), moe_backend.cpp (the MoE
// ops) and quant_ops.cpp (matrices in ggml's block formats).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/host_common.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/step_graph.h"
#include "backend/cuda/weights.h"

namespace arbiter {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, DType ct);
  ~CudaBackend() override;

  std::string device_name() const override { return name_; }
  DType compute() const override { return ct_; }
  void prepare(const Prepare& p) override;

  Buffer alloc(int64_t n, bool logits) override;
  void free(Buffer& b) override;
  void read(const Buffer& b, int64_t off, int64_t n, double* dst) override;
  void write(Buffer& b, int64_t off, int64_t n, const double* src) override;
  void sync() override;

  void embed(const Tensor& table, const int32_t* ids, int T, Buffer& out) override;
  void rmsnorm(const Buffer& x, const Tensor& w, int R, int N, double eps, Buffer& out) override;
  void matmul(const Buffer& x, const Tensor& W, const Tensor* bias, int T, Buffer& out) override;
  void rope(Buffer& x, int T, int nh, int Dh, int pos0, const RopeSpec& rope) override;
  void kv_store(const Buffer& k, const Buffer& v, Buffer& k_cache, Buffer& v_cache, int T,
                int pos0, int kv_dim) override;
  void attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T, int pos0,
                 int H, int Hkv, int Dh, int window, Buffer& out) override;
  void swiglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) override;
  void add(Buffer& x, const Buffer& y, int64_t n) override;
  void summarize(const Buffer& logits, int T, int V, int K, const int32_t* targets,
                 std::vector<LogitsSummary>& out) override;
  // The gemma and hybrid families' ops (cuda_backend.cpp; the Mamba2 kernels in ssm.cu).
  void rmsnorm_1p(const Buffer& x, const Tensor& w, int R, int N, double eps,
                  Buffer& out) override;
  void geglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) override;
  void scale(Buffer& x, int64_t n, double s) override;
  void softcap(Buffer& x, int64_t n, double cap) override;
  void scaled_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                        int pos0, int H, int Hkv, int Dh, int window, double scale,
                        double softcap, Buffer& out) override;
  void relu2(const Buffer& x, int64_t n, Buffer& out) override;
  void ssm_conv(const Buffer& x, const Tensor& w, const Tensor* bias, int T, int C, int K,
                Buffer& state, Buffer& out) override;
  /// The state is f32 (alloc(n, true)), as on cpu: see ssm.cu. T > 1 runs the chunked form
  /// with chunk states in scan_.
  void ssm_scan(const Buffer& xbc, const Buffer& dt_raw, const Tensor& A_log, const Tensor& D,
                const Tensor& dt_bias, double dt_min, double dt_max, int T, int nh, int hd, int G,
                int N, int chunk, Buffer& state, Buffer& y) override;
  void rmsnorm_gated(const Buffer& y, const Buffer& z, const Tensor& w, int R, int W, int group,
                     double eps, Buffer& out) override;

  // Mixture of experts (moe_backend.cpp, kernels in moe.cu): the router, the experts and
  // their sum on the device; the host learns the routing only when asked for it (routes).
  void moe(const Buffer& logits, const Buffer& x, const MoeExperts& ex, int T, Buffer& out,
           std::vector<Route>* routes) override;
  void moe_add(const Buffer& logits, const Buffer& x, const MoeExperts& ex, int T, Buffer& out,
               std::vector<Route>* routes, Buffer& residual, const MoeResidual& r) override;
  void sigmoid_gate(Buffer& y, const Buffer& g, int T, int D) override;

  // fused.cpp: one kernel each for T == 1, with the stage taps inside; otherwise the default
  // composition. Each fused kernel computes the bits of the op-by-op path (same reduction
  // orders, same roundings), so a decode does not depend on whether a stage is tapped.
  void rmsnorm_matmul(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D, double eps,
                      Buffer& xn, bool keep_xn, const StageTap* norm_tap,
                      const MatmulTarget* outs, int n_outs, const NormAdd* pre = nullptr) override;
  void rmsnorm_matmul_conv(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D,
                           double eps, Buffer& xn, const StageTap* norm_tap,
                           const MatmulTarget* outs, int n_outs, const ConvTarget& conv) override;
  void rmsnorm_glu(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D, double eps,
                   Buffer& xn, const Tensor& w_gate, const Tensor& w_up, GluAct act_fn,
                   Buffer& gate, Buffer& up, Buffer& act, const GluTaps& taps,
                   const NormAdd* pre = nullptr) override;
  void matmul_add(const Buffer& x, const Tensor& W, int T, Buffer& tmp, Buffer& residual,
                  double scale, const StageTap* product, const StageTap* sum) override;
  void rmsnorm_add(Buffer& y, const Tensor& w, NormWeight nw, int T, int D, double eps,
                   Buffer& residual, const StageTap* norm_tap, const StageTap* sum) override;
  void qk_rope_store(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                     const Tensor* k_norm, NormWeight qk_nw, double eps, int T, int H, int Hkv,
                     int Dh, int pos0, const RopeSpec& rope, Buffer& k_cache, Buffer& v_cache,
                     const AttentionTaps& taps) override;
  void qk_rope_attention(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                         const Tensor* k_norm, NormWeight qk_nw, double eps, int T, int H,
                         int Hkv, int Dh, int pos0, const RopeSpec& rope, Buffer& k_cache,
                         Buffer& v_cache, int window, const AttentionScores& scores,
                         Buffer& out, const AttentionTaps& taps) override;

  // Continuous batching (paged.cpp): the paged pool's store and attention, and every
  // sequence of a batched forward in one launch per stage. Row invariance turns off the
  // single-token paths (GEMV, fused decode kernels, step graphs): a lone decoding sequence
  // then runs the batch's kernels.
  void kv_store_paged(const Buffer& k, const Buffer& v, Buffer& k_pool, Buffer& v_pool,
                      const KvPages& pages, int T, int pos0, int kv_dim) override;
  void attention_paged(const Buffer& q, const Buffer& k_pool, const Buffer& v_pool,
                       const KvPages& pages, int T, int pos0, int H, int Hkv, int Dh, int window,
                       const AttentionScores& scores, Buffer& out) override;
  void attention_batch(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                       const Tensor* k_norm, NormWeight nw, double eps, int H, int Hkv, int Dh,
                       const RopeSpec* rope, Buffer& k_pool, Buffer& v_pool,
                       const std::vector<PagedSeq>& seqs, int window,
                       const AttentionScores& scores, Buffer& out) override;
  void set_row_invariant(bool on) override;

  // Greedy decode with the token kept on the device (cuda_backend.cpp).
  void pick_greedy(const Buffer& logits, int row, int V) override;
  void embed_picked(const Tensor& table, Buffer& out) override;
  int32_t take_pick() override;

  std::vector<double> read_bandwidth_gbs(int passes) override;

  // Tuning and counters (cuda_backend.h).
  CudaGraphStats graph_stats() const { return graph_->stats(); }
  CudaTuning tuning() const { return tuning_; }
  void set_tuning(const CudaTuning& t);

 private:
  static constexpr size_t kLtWorkspace = size_t(32) << 20;
  static constexpr int kMaxSplitKeys = 1 << 20;  // keeps the kernel's split count in int range
  static constexpr int64_t kTagNormGlu = 21;  // rmsnorm_glu's signature tag
  static constexpr int kPickSlots = 64;

  struct GemmPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  struct TapRecord {
    std::vector<double>* dst;
    const void* dev;
    int64_t n;
  };

  /// Runs a launch now or queues it in the open step (StepGraph::submit).
  void submit(std::vector<int64_t> sig, bool pos_dep, int pos0,
              std::function<void(const cuda::StepCtx&)> run, bool advances_pos = false) {
    graph_->submit(std::move(sig), pos_dep, pos0, std::move(run), advances_pos,
                   tuning_.graph_segment_ops);
  }
  void flush() { graph_->flush(); }
  /// Whether a forward of T rows takes the single-token kernels (GEMV, the fused decode ops,
  /// a step graph): T == 1, unless row invariance asks for the batch's kernels.
  bool single_token(int T) const { return T == 1 && !row_invariant_; }
  /// Grows a workspace. Queued launches may point at the old block: run them first.
  void ensure(cuda::DevBuf& b, size_t bytes);

  /// The embedding gather of host ids, or (ids == nullptr, T == 1) of the latest pick, which
  /// pick_greedy left in the device token slot.
  void embed_ids(const Tensor& table, const int32_t* ids, int T, Buffer& out);
  /// attention() and scaled_attention(): scores scaled by `scale`, capped when softcap > 0.
  void attend(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T, int pos0,
              int H, int Hkv, int Dh, int window, float scale, float softcap, Buffer& out,
              const char* op);
  /// A weight vector of n elements on the device (f32; plus_one: 1 + t), checked.
  const float* vec(const Tensor& t, int64_t n, const char* op, bool plus_one = false);
  /// rmsnorm and rmsnorm_1p: out[R, N] = x / rms(x) * w, w on the device.
  void norm_rows(const Buffer& x, const float* w, int R, int N, double eps, Buffer& out);
  /// x (the compute type or f32 logits) in place: scale (tag 34) or softcap (tag 35).
  void in_place(Buffer& x, int64_t n, float v, int tag, const char* op);
  /// Checks attention's arguments; returns the cache's rows (a ring's fewer rows than
  /// positions when they hold every key the queries see: attention_cache_rows).
  int check_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                      int pos0, int H, int Hkv, int Dh, int window, const Buffer& out) const;
  /// The kernels' arguments: scores scaled by `scale`, then capped when softcap > 0.
  cuda::AttnArgs attn_args(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                           int H, int Hkv, int Dh, int window, float scale, float softcap,
                           Buffer& out, int n_splits, float* part) const;
  void check_act(const Buffer& b, int64_t n, const char* what) const;
  void check_summarize(const Buffer& logits, int T, int V, int K) const;
  /// Queues summarize's kernel for logits rows [T, V] (targets: host ids, or nullptr for
  /// none) into sum_out_: lse f64[T], nonfinite u64[T], target f32[T], top ids i32[T*K], top
  /// values f32[T*K]; returns those device pointers.
  cuda::SummaryOut summarize_on_device(const Buffer& logits, int T, int V, int K,
                                       const int32_t* targets);
  /// The (cos, sin) of pos * inv_freq[i] for positions [0, P >= positions) of one RoPE, on the
  /// device: built at its first use and rebuilt (doubling) when a position passes its end.
  const float2* rope_table(const RopeSpec& rope, int positions);
  /// cuBLASLt plan for out[T, N] = x[T, K] @ W[N, K]^T, out's rows ldc apart (0: N).
  const GemmPlan& gemm_plan(int T, int N, int K, int64_t ld, DType out_t, int64_t ldc = 0);

  // quant_ops.cpp: matrices kept in ggml's block formats (weights.h, gemv_quant.cu).
  /// matmul of a packed W: the packed GEMV (T == 1), else tiles of W's rows dequantized into
  /// qw_ and multiplied by cuBLASLt.
  void matmul_packed(const Buffer& x, const cuda::DevMat& m, const float* bias, int T, DType ot,
                     Buffer& out);
  /// rmsnorm_matmul (T == 1, the matrices looked up by the caller) as a packed GEMV per run of
  /// matrices of one format (q, k, v stacked), the norm inside them or as its own op; false
  /// when it does not apply.
  bool packed_rmsnorm_matmul(const Buffer& x, const Tensor& w, NormWeight nw, int D, double eps,
                             Buffer& xn, bool keep_xn, const StageTap* norm_tap,
                             const MatmulTarget* outs, int n_outs,
                             const cuda::DevMat* const* mats);
  /// matmul_add (T == 1, m looked up by the caller) as one packed GEMV with the add in its
  /// epilogue; false when it does not apply (too-long rows, a tapped product): the caller's path.
  bool packed_matmul_add(const Buffer& x, const cuda::DevMat& m, Buffer& residual,
                         const StageTap* product, const StageTap* sum);
  /// rmsnorm_glu with SwiGLU (T == 1) as one packed GEMV over the gate and up rows with
  /// SwiGLU in its epilogue, the norm inside it or as its own op; false when it does not
  /// apply (tapped gate or up, ...).
  bool packed_rmsnorm_swiglu(const Buffer& x, const Tensor& w, NormWeight nw, int D, double eps,
                             Buffer& xn, const cuda::DevMat& g, const cuda::DevMat& u, Buffer& act,
                             const GluTaps& taps);
  const void* packed_norm_input(const Buffer& x, const Tensor& w, NormWeight nw, int D,
                                double eps, Buffer& xn, const StageTap* tap, bool inside,
                                const float*& norm_w);
  /// `prefix` + the block format's name (a provider of --stats), built once per format.
  const std::string& packed_provider(const char* prefix, DType qt);

  // fused.cpp
  /// rmsnorm_matmul (conv null) or rmsnorm_matmul_conv as the norm + GEMV kernel (the conv
  /// in its rows of xBC), or the packed GEMV (no conv); false when neither takes the step.
  /// Either way pre has run (inside the kernel, or before it as its own op).
  bool norm_gemv(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D, double eps,
                 Buffer& xn, bool keep_xn, const StageTap* norm_tap, const MatmulTarget* outs,
                 int n_outs, const ConvTarget* conv, const NormAdd* pre);
  /// Whether a norm GEMV on x that takes the step can run pre inside: pre untapped and on x,
  /// the GEMV untapped (`tapped`: its stages are; gemv.cu has no tapped NormAdd variant).
  bool pre_fusable(const NormAdd* pre, const Buffer& x, int D, bool tapped) const;
  /// The norm GEMV's fields for pre inside it, and their part of the step's signature.
  void gemv_pre(const NormAdd& pre, NormWeight nw, int D, cuda::GemvArgs& a,
                std::vector<int64_t>& sig);
  /// A rmsnorm_matmul output's device bias (null without one), checked with its room.
  const float* target_bias(const MatmulTarget& o, int64_t rows);
  /// Whether the fused q/k norm + RoPE + KV store kernels take this step.
  bool qk_fusable(int T, int Hkv, int Dh, int pos0, const RopeSpec& rope, const Buffer& k_cache,
                  const Buffer& v_cache) const;
  /// The direct decode attention (T == 1), with the step's q/k norm + RoPE + KV store folded
  /// in when qk is given.
  void submit_decode_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache,
                               int H, int Hkv, int Dh, int window, float scale, float softcap,
                               Buffer& out, int cap, int pos0, const cuda::QkRopeArgs* qk);
  /// qk_rope_store's arguments (device norm weights and RoPE table looked up and checked).
  cuda::QkRopeArgs qk_args(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                           const Tensor* k_norm, NormWeight qk_nw, double eps, int H, int Hkv,
                           int Dh, int pos0, const RopeSpec& rope, Buffer& k_cache,
                           Buffer& v_cache);
  static void append_qk_sig(std::vector<int64_t>& sig, const cuda::QkRopeArgs& a);
  /// Device copies of the stage taps of one fused launch, each for an output of n elements.
  void stage_taps(std::initializer_list<std::pair<const StageTap*, int64_t>> taps, bool& tapped,
                  cuda::Tap* dev);
  /// stage_taps of the fused q/k norm + RoPE (+ attention): true when any is tapped.
  bool stage_qk_taps(const AttentionTaps& t, int H, int Hkv, int Dh, cuda::QkRopeArgs& a);
  /// The records of the latest stage_taps, as f64 into their StageTaps' vectors.
  void collect_taps();

  // paged.cpp
  /// A batched attention's rows and sequences on the device (one array, batch_meta).
  struct BatchMeta {
    int rows = 0, max_T = 0, positions = 0, n_seqs = 0, block_rows = 0;
    int n_multi = 0;              // sequences of more than one row: the first descriptors
    const int* pos = nullptr;     // [rows] each row's position
    const int* dst = nullptr;     // [rows] each row's pool row
    const int* seqs = nullptr;    // [n_seqs x cuda::kSeqWords] (cuda::AttnArgs::seqs)
    const int* blocks = nullptr;  // the sequences' block tables, one after the other
  };
  /// Checks the sequences against the pool and uploads their array when it differs from the
  /// latest upload (the layers of one forward share it); fills m.
  const int* batch_meta(const std::vector<PagedSeq>& seqs, const Buffer& k_pool,
                        const Buffer& v_pool, int kv_dim, BatchMeta& m);
  /// k, v [m.rows, kv_dim] to their pool rows.
  void store_paged(const Buffer& k, const Buffer& v, Buffer& k_pool, Buffer& v_pool,
                   const BatchMeta& m, int kv_dim);
  /// Every sequence's attention over its pages: one launch, or two when the direct decode
  /// kernel takes the sequences of one row (the flash kernel the others).
  void attend_paged(const Buffer& q, const Buffer& k_pool, const Buffer& v_pool,
                    const BatchMeta& m, int H, int Hkv, int Dh, int window,
                    const AttentionScores& scores, Buffer& out);

  /// A MoE layer's device tables of expert weight pointers (built at the layer's first call,
  /// uploading every expert, and kept until the next prepare()).
  const cuda::MoeTables& moe_tables(const MoeExperts& ex, int D, int F);
  /// moe(), and with a residual (decode only) moe_add's update folded into the down GEMV.
  void run_moe(const Buffer& logits, const Buffer& x, const MoeExperts& ex, int T, Buffer& out,
               std::vector<Route>* routes, Buffer* residual, const MoeResidual* r);

  int device_;
  DType ct_;
  std::string name_;
  // provider names of --stats, built once (ops run ~170 times per decode step)
  std::string prov_gemv_, prov_gemm_, prov_norm_gemv_, prov_norm_glu_, prov_gemv_add_;
  int sm_count_ = 1, sm_ = 1;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_ws_ = nullptr;
  unsigned* counters_ = nullptr;  // decode attention's tickets (kDecodeCounterWords)
  CudaTuning tuning_;
  std::unique_ptr<cuda::WeightCache> weights_;
  std::unique_ptr<cuda::StepGraph> graph_;

  std::map<std::tuple<int, int, int, int64_t, int, int64_t>, GemmPlan> plans_;
  std::map<std::pair<std::string, DType>, std::string> packed_providers_;
  cuda::DevBuf qw_;  // a tile of a packed matrix's rows dequantized for the GEMM (T > 1)
  cuda::DevBuf ids_, part_, acc_, sum_out_, sum_scratch_, targets_, tap_mem_;
  cuda::DevBuf pre_done_;  // the norm GEMVs' last-block counter (cuda::GemvArgs::pre_done)
  cuda::DevBuf scan_;  // the chunked ssm_scan's chunk states (cuda::ScanArgs::scratch)
  cuda::DevBuf meta_;  // the latest batch_meta array, and its host copy
  std::vector<int> meta_host_, meta_next_;
  bool row_invariant_ = false;
  std::vector<TapRecord> records_;  // of the latest stage_taps
  // One table per RoPE the models use: gemma's local and global layers alternate two, and a
  // single cached table was rebuilt on the host at every switch (gemma3-1b decoded at 52 tok/s).
  struct RopeTable {
    RopeSpec spec;
    cuda::DevBuf cs;
    int positions = 0;
  };
  std::vector<RopeTable> rope_tables_;
  // Per MoE layer, keyed by its first expert's up and down weights' host addresses.
  struct MoeLayer {
    cuda::DevBuf ptrs;  // [3, E] device pointers: gate (relu2: unused), up, down
    cuda::MoeTables tables;
    const void *first = nullptr, *last = nullptr;  // expert 0's up, expert E-1's down copies
  };
  std::map<std::tuple<const void*, const void*, int, bool>, MoeLayer> moe_layers_;
  cuda::DevBuf moe_ws_;  // routing, sort and expert scratch of the latest moe()

  int32_t* h_picks_ = nullptr;  // pinned and mapped, a slot per pick not taken
  int32_t* d_picks_ = nullptr;  // h_picks_ as the device sees it
  cuda::PickState* pick_state_ = nullptr;
  cudaEvent_t pick_ev_[kPickSlots] = {};
  std::deque<int> pending_picks_;  // slots, oldest first
  int next_pick_slot_ = 0;
  bool has_pick_ = false;
};

}  // namespace arbiter
