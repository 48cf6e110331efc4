// The mixture-of-experts feed-forward block (moe_ffn.h).
#include "model/archs/moe_ffn.h"

#include <algorithm>

#include "backend/moe_routing.h"
#include "model/model.h"

namespace arbiter {

namespace {

enum MoeSlot { kRouter, kSharedGateVec, kSharedGate, kSharedUp, kSharedDown, kExperts };

}  // namespace

int moe_layer_slots(const ModelConfig& c) { return kExperts + 3 * c.router.n_experts; }

void moe_tensors(const ModelConfig& c, const MoeNames& n, int l, int first_slot,
                 std::vector<TensorSpec>& t) {
  const int64_t D = c.d_model, E = c.router.n_experts, Fe = c.d_ff_expert, Fs = c.d_ff_shared;
  const std::string hf = "model.layers." + std::to_string(l) + "." + n.block + ".";
  const std::string gg = "blk." + std::to_string(l) + ".";
  auto add = [&](std::string role, int slot, std::string hf_name, std::string gguf_name,
                 std::vector<int64_t> shape) {
    TensorSpec s;
    s.role = std::move(role), s.slot = first_slot + slot, s.layer = l;
    s.hf = hf + hf_name, s.gguf = gg + gguf_name, s.shape = std::move(shape);
    s.kind = TensorKind::Matrix, s.family = "mlp";
    t.push_back(std::move(s));
  };
  add("router", kRouter, "gate.weight", "ffn_gate_inp.weight", {E, D});
  if (Fs > 0) {
    add("shared_gate_vec", kSharedGateVec, "shared_expert_gate.weight",
        "ffn_gate_inp_shexp.weight", {1, D});
    add("shared_gate", kSharedGate, "shared_expert.gate_proj.weight", "ffn_gate_shexp.weight",
        {Fs, D});
    add("shared_up", kSharedUp, "shared_expert.up_proj.weight", "ffn_up_shexp.weight", {Fs, D});
    add("shared_down", kSharedDown, "shared_expert.down_proj.weight", "ffn_down_shexp.weight",
        {D, Fs});
  }
  // Each expert's three matrices. HF: one module per expert (the Hub's checkpoints, and what
  // transformers 5 saves), or transformers 5's fused stacks mlp.experts.gate_up_proj
  // [E, 2 Fe, D] (gate rows, then up: conversion_mapping.py's MergeModulelist + Concatenate(dim=1))
  // and mlp.experts.down_proj [E, D, Fe]. GGUF: llama.cpp's ffn_{gate,up}_exps [E, Fe, D] and
  // ffn_down_exps [E, D, Fe], one tensor per layer.
  const std::string fused = "model.layers." + std::to_string(l) + ".mlp.experts.";
  for (int e = 0; e < E; ++e) {
    const std::string x = "experts." + std::to_string(e) + ".", xs = std::to_string(e);
    add("expert" + xs + "_gate", kExperts + 3 * e, x + n.gate + ".weight", "", {Fe, D});
    t.back().hf_stack = {fused + "gate_up_proj", E, 2 * Fe, e, 0};
    t.back().gguf_stack = {gg + "ffn_gate_exps.weight", E, Fe, e, 0};
    add("expert" + xs + "_up", kExperts + 3 * e + 1, x + n.up + ".weight", "", {Fe, D});
    t.back().hf_stack = {fused + "gate_up_proj", E, 2 * Fe, e, Fe};
    t.back().gguf_stack = {gg + "ffn_up_exps.weight", E, Fe, e, 0};
    add("expert" + xs + "_down", kExperts + 3 * e + 2, x + n.down + ".weight", "", {D, Fe});
    t.back().hf_stack = {fused + "down_proj", E, D, e, 0};
    t.back().gguf_stack = {gg + "ffn_down_exps.weight", E, D, e, 0};
  }
}

MoeScratch::MoeScratch(Backend& be_, const ModelConfig& c, int T) : be(be_) {
  const int64_t Fs = std::max(c.d_ff_shared, 1);
  router = be.alloc(int64_t(T) * c.router.n_experts);
  y = be.alloc(int64_t(T) * c.d_model);
  gate = be.alloc(T * Fs);
  up = be.alloc(T * Fs);
  act = be.alloc(T * Fs);
  shared_gate = be.alloc(T);
}

MoeScratch::~MoeScratch() {
  for (Buffer* b : {&router, &y, &gate, &up, &act, &shared_gate}) be.free(*b);
}

std::vector<std::string> moe_stages() { return {"router", "moe", "shared_expert"}; }

void moe_ffn(const Model& m, Backend& be, int l, int first_slot, const Tensor& norm_w,
             const StageTap* norm_tap, int T, const Stages& tap, MoeScratch& s, Buffer& x,
             Buffer& xn, Buffer& out, const StageTap* res_tap) {
  const ModelConfig& c = m.config;
  const RouterSpec& rs = c.router;
  const int D = c.d_model, E = rs.n_experts, k = rs.top_k, Fe = c.d_ff_expert;
  const int Fs = c.d_ff_shared;
  auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, first_slot + slot); };

  // The norm with the router's GEMV, xn kept: the experts read it.
  const Backend::MatmulTarget router = {&lw(kRouter), nullptr, &s.router,
                                        tap("router", l, "matmul", E, D, 3)};  // [T, E]
  be.rmsnorm_matmul(x, norm_w, NormWeight::Plain, T, D, c.norm_eps, xn, /*keep_xn=*/true,
                    norm_tap, &router, 1);
  Backend::MoeResidual r;
  if (Fs > 0) {
    // Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(x)) * shared_expert(x), added to the
    // routed sum (by moe_add, which then adds the block's output to the residual). The shared
    // gate/up through rmsnorm_glu, its norm computed again (inside the fused gate/up GEMV on
    // cuda; s.y the norm's scratch until the down projection writes it).
    be.rmsnorm_glu(x, norm_w, NormWeight::Plain, T, D, c.norm_eps, s.y, lw(kSharedGate),
                   lw(kSharedUp), GluAct::SiLU, s.gate, s.up, s.act, {});  // [T, Fs]
    be.matmul(s.act, lw(kSharedDown), nullptr, T, s.y);              // [T, D]
    be.matmul(xn, lw(kSharedGateVec), nullptr, T, s.shared_gate);  // [T, 1]
    be.sigmoid_gate(s.y, s.shared_gate, T, D);
    be.apply_tap(tap("shared_expert", l, "moe", D, Fs, 4), s.y, T, D);
    r.shared = &s.y;
  }
  // Routing, the selected experts and their weighted sum: Backend::moe (backend.h). The
  // expert list is built at the layer's first forward (a decode step would otherwise
  // rebuild 3E pointers per layer).
  if (s.experts.empty()) s.experts.resize(size_t(c.n_layer));
  Backend::MoeExperts& ex = s.experts[size_t(l)];
  if (ex.up.empty()) {
    ex.spec = rs;
    for (int e = 0; e < E; ++e) {
      ex.gate.push_back(&lw(kExperts + 3 * e));
      ex.up.push_back(&lw(kExperts + 3 * e + 1));
      ex.down.push_back(&lw(kExperts + 3 * e + 2));
    }
  }
  // Terms per element: up to k experts' down projections of Fe each.
  r.routed = tap("moe", l, "moe", D, int64_t(k) * Fe, 4);
  r.res = res_tap;
  std::vector<Route> routes;
  be.moe_add(s.router, xn, ex, T, out, tap.wants_routes() ? &routes : nullptr, x, r);
  for (int t = 0; t < int(routes.size()); ++t)
    tap.route(l, t, routes[size_t(t)].ids, routes[size_t(t)].margin, E, router_score_name(rs));
}

}  // namespace arbiter
