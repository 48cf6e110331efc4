// The mixture-of-experts feed-forward block (moe_ffn.h).
#include "model/archs/moe_ffn.h"

#include <algorithm>
#include <cmath>

#include "backend/moe_routing.h"
#include "model/model.h"

namespace arbiter {

namespace {

enum MoeSlot { kRouter, kSharedGateVec, kSharedGate, kSharedUp, kSharedDown, kExperts };

int ffn_width(const ModelConfig& c) { return std::max(c.d_ff_expert, c.d_ff_shared); }

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
  router = be.alloc(int64_t(T) * c.router.n_experts);
  x = be.alloc(int64_t(T) * c.d_model);
  y = be.alloc(int64_t(T) * c.d_model);
  gate = be.alloc(int64_t(T) * ffn_width(c));
  up = be.alloc(int64_t(T) * ffn_width(c));
  act = be.alloc(int64_t(T) * ffn_width(c));
  shared_gate = be.alloc(T);
}

MoeScratch::~MoeScratch() {
  for (Buffer* b : {&router, &x, &y, &gate, &up, &act, &shared_gate}) be.free(*b);
}

std::vector<std::string> moe_stages() { return {"router", "moe", "shared_expert"}; }

void moe_ffn(const Model& m, Backend& be, int l, int first_slot, const Buffer& xn, int T,
             const Stages& tap, MoeScratch& s, Buffer& out) {
  const ModelConfig& c = m.config;
  const RouterSpec& rs = c.router;
  const int D = c.d_model, E = rs.n_experts, k = rs.top_k, Fe = c.d_ff_expert;
  const int Fs = c.d_ff_shared;
  auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, first_slot + slot); };

  be.matmul(xn, lw(kRouter), nullptr, T, s.router);  // [T, E]
  be.apply_tap(tap("router", l, "matmul", E, D, 3), s.router, T, E);
  std::vector<double> logits(size_t(T) * E), x(size_t(T) * D);
  be.read(s.router, 0, int64_t(T) * E, logits.data());
  be.read(xn, 0, int64_t(T) * D, x.data());
  std::vector<Route> routes;
  for (int t = 0; t < T; ++t) {
    routes.push_back(route(rs, &logits[size_t(t) * E]));
    tap.route(l, t, routes.back().ids, routes.back().margin, E, router_score_name(rs));
  }

  // Each expert on the rows routed to it (rows in token order), its output weighted and
  // summed per token in f64 on the host, in expert order (HF's index_add_ order).
  std::vector<double> sum(size_t(T) * D, 0.0), rows, y;
  for (int e = 0; e < E; ++e) {
    std::vector<int> tok;
    std::vector<double> wt;
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i)
        if (routes[size_t(t)].ids[size_t(i)] == e) {
          tok.push_back(t);
          wt.push_back(routes[size_t(t)].weights[size_t(i)]);
        }
    if (tok.empty()) continue;
    const int n = int(tok.size());
    rows.resize(size_t(n) * D);
    for (int r = 0; r < n; ++r)
      std::copy_n(&x[size_t(tok[size_t(r)]) * D], D, &rows[size_t(r) * D]);
    be.write(s.x, 0, int64_t(n) * D, rows.data());
    be.matmul(s.x, lw(kExperts + 3 * e), nullptr, n, s.gate);  // [n, Fe]
    be.matmul(s.x, lw(kExperts + 3 * e + 1), nullptr, n, s.up);
    be.swiglu(s.gate, s.up, int64_t(n) * Fe, s.act);
    be.matmul(s.act, lw(kExperts + 3 * e + 2), nullptr, n, s.y);  // [n, D]
    y.resize(size_t(n) * D);
    be.read(s.y, 0, int64_t(n) * D, y.data());
    for (int r = 0; r < n; ++r)
      for (int d = 0; d < D; ++d)
        sum[size_t(tok[size_t(r)]) * D + d] += wt[size_t(r)] * y[size_t(r) * D + d];
  }
  be.write(out, 0, int64_t(T) * D, sum.data());
  // Terms per element: up to k experts' down projections of Fe each.
  be.apply_tap(tap("moe", l, "moe", D, int64_t(k) * Fe, 4), out, T, D);
  if (Fs == 0) return;

  // Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(x)) * shared_expert(x), added to the
  // routed sum.
  be.matmul(xn, lw(kSharedGate), nullptr, T, s.gate);  // [T, Fs]
  be.matmul(xn, lw(kSharedUp), nullptr, T, s.up);
  be.swiglu(s.gate, s.up, int64_t(T) * Fs, s.act);
  be.matmul(s.act, lw(kSharedDown), nullptr, T, s.y);              // [T, D]
  be.matmul(xn, lw(kSharedGateVec), nullptr, T, s.shared_gate);  // [T, 1]
  std::vector<double> g(static_cast<size_t>(T));
  be.read(s.shared_gate, 0, T, g.data());
  y.resize(size_t(T) * D);
  be.read(s.y, 0, int64_t(T) * D, y.data());
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < D; ++d) y[size_t(t) * D + d] *= 1.0 / (1.0 + std::exp(-g[size_t(t)]));
  be.write(s.y, 0, int64_t(T) * D, y.data());
  be.apply_tap(tap("shared_expert", l, "moe", D, Fs, 4), s.y, T, D);
  be.read(out, 0, int64_t(T) * D, sum.data());
  be.read(s.y, 0, int64_t(T) * D, y.data());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += y[i];
  be.write(out, 0, int64_t(T) * D, sum.data());
}

}  // namespace arbiter
