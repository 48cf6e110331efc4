// The mixture-of-experts ops' default compositions (backend.h "mixture of experts"): what the
// ref and cpu tiers run, made of matmul, swiglu and relu2 with the routing and the weighted
// sum on the host in f64. The CUDA tier has its own (backend/cuda/moe.cu).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"

namespace arbiter {

void moe_check_experts(const Backend& be, const Backend::MoeExperts& ex, int& D, int& F) {
  const int E = ex.spec.n_experts;
  const char* problem = router_spec_problem(ex.spec);
  ARB_CHECK(!problem, "[%s] moe: %s", be.device_name().c_str(), problem ? problem : "");
  ARB_CHECK(int(ex.up.size()) == E && int(ex.down.size()) == E &&
                int(ex.gate.size()) == (ex.relu2 ? 0 : E),
            "[%s] moe: %zu gate, %zu up and %zu down matrices for %d %s experts",
            be.device_name().c_str(), ex.gate.size(), ex.up.size(), ex.down.size(), E,
            ex.relu2 ? "relu2" : "swiglu");
  F = int(ex.up[0]->rows());
  D = int(ex.up[0]->cols());
  for (int e = 0; e < E; ++e) {
    const Tensor& u = *ex.up[size_t(e)];
    const Tensor& d = *ex.down[size_t(e)];
    const bool gate_ok = ex.relu2 || (ex.gate[size_t(e)]->rows() == F &&
                                      ex.gate[size_t(e)]->cols() == D);
    ARB_CHECK(u.rows() == F && u.cols() == D && d.rows() == D && d.cols() == F && gate_ok,
              "[%s] moe: expert %d's matrices ('%s', '%s') are not [%d, %d] and [%d, %d]",
              be.device_name().c_str(), e, u.name.c_str(), d.name.c_str(), F, D, D, F);
  }
  ARB_CHECK(!ex.bias || ex.bias->numel() == E, "[%s] moe: router bias '%s' has %lld values, %d "
            "experts", be.device_name().c_str(), ex.bias ? ex.bias->name.c_str() : "",
            (long long)(ex.bias ? ex.bias->numel() : 0), E);
}

namespace {

// The squared error one expert's input roundings add to the routed sum (Backend::moe while
// measuring): to first order, its up/gate errors (eu, eg per [n, F] element) pass through the
// activation, h = silu(g) u (or relu2(u)), as |silu'(g) u| sqrt(eg) + |silu(g)| sqrt(eu)
// (both come from the same rounded x, so their magnitudes add), then through down as
// sum_f down_if^2 eh_f (independent over f, as the matmul's own term); down's own rounding of
// h (ed, [n, D]) adds. Each row's total, times its routing weight squared, goes to its token.
void expert_rounding(Backend& be, const Buffer& up, const Buffer* gate, const std::vector<double>& eu,
                     const std::vector<double>& eg, const std::vector<double>& ed,
                     const Tensor& down, const std::vector<int>& tok, const std::vector<double>& wt,
                     int D, int F, std::vector<double>& err) {
  const int n = int(tok.size());
  std::vector<double> u(size_t(n) * F), g(gate ? size_t(n) * F : 0), eh(size_t(n) * F, 0.0);
  be.read(up, 0, int64_t(n) * F, u.data());
  if (gate) be.read(*gate, 0, int64_t(n) * F, g.data());
  for (size_t i = 0; i < eh.size(); ++i) {
    const double su = eu.empty() ? 0 : std::sqrt(eu[i]), sg = eg.empty() ? 0 : std::sqrt(eg[i]);
    if (!gate) {
      eh[i] = (2 * std::max(u[i], 0.0) * su) * (2 * std::max(u[i], 0.0) * su);
      continue;
    }
    const double sig = 1 / (1 + std::exp(-g[i])), silu = g[i] * sig;
    const double dsilu = sig * (1 + g[i] * (1 - sig));
    const double a = std::fabs(dsilu * u[i]) * sg + std::fabs(silu) * su;
    eh[i] = a * a;
  }
  std::vector<double> w(static_cast<size_t>(F));
  for (int d = 0; d < D; ++d) {
    row_to_f64(down.dtype, down.row(d), w.data(), F);
    for (int r = 0; r < n; ++r) {
      double e = ed.empty() ? 0 : ed[size_t(r) * D + d];
      for (int f = 0; f < F; ++f) e += w[size_t(f)] * w[size_t(f)] * eh[size_t(r) * F + f];
      err[size_t(tok[size_t(r)]) * D + d] += wt[size_t(r)] * wt[size_t(r)] * e;
    }
  }
}

}  // namespace

void Backend::moe(const Buffer& logits, const Buffer& x, const MoeExperts& ex, int T, Buffer& out,
                  std::vector<Route>* routes_out) {
  int D = 0, F = 0;
  moe_check_experts(*this, ex, D, F);
  const RouterSpec& rs = ex.spec;
  const int E = rs.n_experts, k = rs.top_k;
  std::vector<double> lg(size_t(T) * E), xh(size_t(T) * D), bias;
  read(logits, 0, int64_t(T) * E, lg.data());
  read(x, 0, int64_t(T) * D, xh.data());
  if (ex.bias) {
    bias.resize(size_t(E));
    row_to_f64(ex.bias->dtype, ex.bias->data, bias.data(), E);
  }
  std::vector<Route> routes;
  for (int t = 0; t < T; ++t)
    routes.push_back(route(rs, &lg[size_t(t) * E], ex.bias ? bias.data() : nullptr));

  // Each expert on the rows routed to it (in token order), its output weighted and summed
  // per token in f64, experts in ascending index (HF's index_add_ order over the experts hit).
  Buffer xs = alloc(int64_t(T) * D), up = alloc(int64_t(T) * F), act = alloc(int64_t(T) * F),
         ys = alloc(int64_t(T) * D), gate = ex.relu2 ? Buffer{} : alloc(int64_t(T) * F);
  std::vector<double> sum(size_t(T) * D, 0.0), rows, y;
  // While measuring (measure_input_rounding), the squared error the experts' own input
  // roundings add to each output element; a matmul that quantized leaves its rounding in
  // input_rounding_ (cpu: the T == 1 GEMVs of ggml blocks, an expert with one row).
  std::vector<double> err(measure_input_rounding_ ? size_t(T) * D : 0, 0.0);
  bool rounded = false;
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
      std::copy_n(&xh[size_t(tok[size_t(r)]) * D], D, &rows[size_t(r) * D]);
    write(xs, 0, int64_t(n) * D, rows.data());
    matmul(xs, *ex.up[size_t(e)], nullptr, n, up);  // [n, F]
    const std::vector<double> e_up = take_input_rounding();
    std::vector<double> e_gate;
    if (ex.relu2) {
      relu2(up, int64_t(n) * F, act);
    } else {
      matmul(xs, *ex.gate[size_t(e)], nullptr, n, gate);
      e_gate = take_input_rounding();
      swiglu(gate, up, int64_t(n) * F, act);
    }
    matmul(act, *ex.down[size_t(e)], nullptr, n, ys);  // [n, D]
    const std::vector<double> e_down = take_input_rounding();
    y.resize(size_t(n) * D);
    read(ys, 0, int64_t(n) * D, y.data());
    for (int r = 0; r < n; ++r)
      for (int d = 0; d < D; ++d)
        sum[size_t(tok[size_t(r)]) * D + d] += wt[size_t(r)] * y[size_t(r) * D + d];
    if (!e_up.empty() || !e_gate.empty() || !e_down.empty()) {
      rounded = true;
      expert_rounding(*this, up, ex.relu2 ? nullptr : &gate, e_up, e_gate, e_down, *ex.down[size_t(e)],
                      tok, wt, D, F, err);
    }
  }
  if (rounded) input_rounding_ = std::move(err);
  for (Buffer* b : {&xs, &up, &act, &ys, &gate})
    if (b->ptr) free(*b);
  write(out, 0, int64_t(T) * D, sum.data());
  if (routes_out) *routes_out = std::move(routes);
}

void Backend::sigmoid_gate(Buffer& y, const Buffer& g, int T, int D) {
  std::vector<double> gh(static_cast<size_t>(T)), yh(size_t(T) * D);
  read(g, 0, T, gh.data());
  read(y, 0, int64_t(T) * D, yh.data());
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < D; ++d) yh[size_t(t) * D + d] *= 1.0 / (1.0 + std::exp(-gh[size_t(t)]));
  write(y, 0, int64_t(T) * D, yh.data());
}

}  // namespace arbiter
