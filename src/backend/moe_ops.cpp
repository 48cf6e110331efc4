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
    if (ex.relu2) {
      relu2(up, int64_t(n) * F, act);
    } else {
      matmul(xs, *ex.gate[size_t(e)], nullptr, n, gate);
      swiglu(gate, up, int64_t(n) * F, act);
    }
    matmul(act, *ex.down[size_t(e)], nullptr, n, ys);  // [n, D]
    y.resize(size_t(n) * D);
    read(ys, 0, int64_t(n) * D, y.data());
    for (int r = 0; r < n; ++r)
      for (int d = 0; d < D; ++d)
        sum[size_t(tok[size_t(r)]) * D + d] += wt[size_t(r)] * y[size_t(r) * D + d];
  }
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
