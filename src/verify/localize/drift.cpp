#include "verify/localize/drift.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "verify/localize/svg.h"

namespace arbiter::verify {

std::string fmt_g(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

std::string stage_id_name(const StageId& id) {
  std::string s = stage_name(id.stage);
  return id.layer >= 0 ? s + "@L" + std::to_string(id.layer) : s;
}

std::vector<StageId> forward_stages(const ModelConfig& c) {
  std::vector<StageId> out = {{Stage::Embed, -1}};
  for (int l = 0; l < c.n_layer; ++l)
    for (Stage s : all_stages()) {
      if (s == Stage::Embed || s == Stage::FinalNorm || s == Stage::Logits) continue;
      if (!c.qk_norm && (s == Stage::QNorm || s == Stage::KNorm)) continue;
      out.push_back({s, l});
    }
  out.push_back({Stage::FinalNorm, -1});
  out.push_back({Stage::Logits, -1});
  return out;
}

const char* stage_op(Stage s) {
  switch (s) {
    case Stage::Embed:
      return "embed";
    case Stage::AttnNorm:
    case Stage::FfnNorm:
    case Stage::QNorm:
    case Stage::KNorm:
    case Stage::FinalNorm:
      return "rmsnorm";
    case Stage::Q:
    case Stage::K:
    case Stage::V:
    case Stage::O:
    case Stage::Gate:
    case Stage::Up:
    case Stage::Down:
    case Stage::Logits:
      return "matmul";
    case Stage::QRope:
    case Stage::KRope:
      return "rope";
    case Stage::Attn:
      return "attention";
    case Stage::Act:
      return "swiglu";
    case Stage::AttnRes:
    case Stage::FfnRes:
      return "add";
  }
  return "?";
}

const std::vector<double>& CapturedForward::at(const StageId& id) const {
  auto it = out.find(id);
  ARB_CHECK(it != out.end(), "[drift] stage %s was not captured (forward at position %d)",
            stage_id_name(id).c_str(), pos0);
  return it->second;
}

Capture capture_forwards(Session& s, const std::vector<int32_t>& tokens, int width) {
  ARB_CHECK(width >= 1, "[drift] forward width %d must be >= 1", width);
  ARB_CHECK(!tokens.empty(), "[drift] no tokens to run");
  Capture cap;
  Backend& be = s.backend();
  s.reset();
  CapturedForward* cur = nullptr;
  s.set_capture([&](Stage st, int layer, Buffer& b, int rows, int cols) {
    StageId id{st, layer};
    std::vector<double>& v = cur->out[id];
    v.resize(size_t(rows) * cols);
    be.read(b, 0, int64_t(rows) * cols, v.data());
    cur->cols[id] = cols;
  });
  try {
    for (size_t i = 0; i < tokens.size(); i += size_t(width)) {
      size_t n = std::min(tokens.size() - i, size_t(width));
      cap.emplace_back();
      cur = &cap.back();
      cur->pos0 = s.pos();
      cur->T = int(n);
      cur->ids.assign(tokens.begin() + i, tokens.begin() + i + n);
      s.forward(cur->ids);
    }
  } catch (...) {
    s.set_capture(nullptr);
    throw;
  }
  s.set_capture(nullptr);
  return cap;
}

// --- error statistics ---------------------------------------------------------------------

void ErrAccum::add(const double* ref, const double* cand, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    double r = ref[i], c = cand[i];
    if (!std::isfinite(r) || !std::isfinite(c)) {
      ++nonfinite;
      continue;
    }
    double d = c - r;
    ++n;
    sum_d2 += d * d;
    sum_r2 += r * r;
    sum_c2 += c * c;
    sum_rc += r * c;
    sum_abs += std::fabs(d);
    max_abs = std::max(max_abs, std::fabs(d));
  }
}

double ErrAccum::rel_l2() const {
  if (nonfinite > 0) return INFINITY;
  if (sum_r2 == 0) return sum_d2 == 0 ? 0.0 : INFINITY;
  return std::sqrt(sum_d2 / sum_r2);
}
double ErrAccum::nmse() const {
  double r = rel_l2();
  return r * r;
}
double ErrAccum::mean_abs() const { return n ? sum_abs / double(n) : 0.0; }
double ErrAccum::cosine() const {
  if (sum_r2 == 0 && sum_c2 == 0) return 1.0;
  if (sum_r2 == 0 || sum_c2 == 0) return NAN;
  return sum_rc / std::sqrt(sum_r2 * sum_c2);
}

// --- bounds -------------------------------------------------------------------------------

StageBound stage_bound(const StageId& id, const ModelConfig& c, int64_t ctx, double score_scale,
                       const Roundoff& u) {
  StageBound b;
  switch (id.stage) {
    case Stage::Embed:  // a copy: the table's and the output's rounding
      b.reduction = 1, b.roundings = 2;
      break;
    case Stage::AttnNorm:
    case Stage::FfnNorm:
    case Stage::FinalNorm:
      b.reduction = c.d_model, b.roundings = 3;  // x, weight, out; sum of squares over D
      break;
    case Stage::QNorm:
    case Stage::KNorm:
      b.reduction = c.head_dim, b.roundings = 3;
      break;
    case Stage::Q:
    case Stage::K:
    case Stage::V:
    case Stage::Gate:
    case Stage::Up:
    case Stage::Logits:
      b.reduction = c.d_model, b.roundings = 3;  // x, W, out; dot products over D
      break;
    case Stage::O:
      b.reduction = int64_t(c.n_head) * c.head_dim, b.roundings = 3;
      break;
    case Stage::Down:
      b.reduction = c.d_ff, b.roundings = 3;
      break;
    case Stage::QRope:
    case Stage::KRope:  // x_a cos - x_b sin: two terms, cos/sin rounded
      b.reduction = 2, b.roundings = 3;
      break;
    case Stage::Attn:  // q, k, v, out; scores over Dh, weighted sum over the context
      b.reduction = std::max<int64_t>(c.head_dim, ctx), b.roundings = 4;
      b.amp = 2 * score_scale;
      break;
    case Stage::Act:  // gate, up, out; silu is elementwise
      b.reduction = 1, b.roundings = 3;
      break;
    case Stage::AttnRes:
    case Stage::FfnRes:  // x, y, out
      b.reduction = 1, b.roundings = 3;
      break;
  }
  b.value = kBoundSafety * (u.storage * (std::sqrt(double(b.roundings)) + b.amp) +
                            u.accum * std::sqrt(double(b.reduction)));
  return b;
}

double attention_score_scale(const Capture& cap, int layer, const ModelConfig& c) {
  // First-order effect of rounding q and k on out = sum_j p_j v_j: a score shift ds_j moves
  // the output by sum_j p_j ds_j (v_j - out) (the common part of the shifts cancels, since
  // sum_j p_j (v_j - out) = 0). Rounding moves score j by about u * r_j,
  // r_j^2 = sum_i (q_i k_ji)^2 / Dh (a random walk over the Dh products), independently per
  // key, so |d out|^2 ~ u^2 sum_j p_j^2 r_j^2 |v_j - out|^2. S is that, summed over queries
  // and heads, relative to sum |out|^2: the relative L2 of the output per unit roundoff,
  // measured the way drift and opcheck measure errors.
  const int H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, group = H / std::max(Hkv, 1);
  const int q_dim = H * Dh, kv_dim = Hkv * Dh, W = c.sliding_window;
  const double scale = 1.0 / std::sqrt(double(Dh));
  std::vector<double> keys, vals;  // k_rope and v rows of every forward so far, [pos, kv_dim]
  std::vector<double> p, r2, out(static_cast<size_t>(Dh), 0.0);
  double num = 0, den = 0;
  for (const CapturedForward& f : cap) {
    const std::vector<double>& k = f.at({Stage::KRope, layer});
    const std::vector<double>& v = f.at({Stage::V, layer});
    keys.insert(keys.end(), k.begin(), k.end());
    vals.insert(vals.end(), v.begin(), v.end());
    const std::vector<double>& q = f.at({Stage::QRope, layer});
    for (int t = 0; t < f.T; ++t) {
      const int i_pos = f.pos0 + t;
      const int j0 = W > 0 ? std::max(0, i_pos - W + 1) : 0;  // the op's window (i-W, i]
      for (int h = 0; h < H; ++h) {
        const double* qh = q.data() + size_t(t) * q_dim + size_t(h) * Dh;
        const size_t off = size_t(h / group) * Dh;
        p.clear(), r2.clear();
        double smax = -INFINITY;
        for (int j = j0; j <= i_pos; ++j) {
          const double* kh = keys.data() + size_t(j) * kv_dim + off;
          double dot = 0, ss = 0;
          for (int i = 0; i < Dh; ++i)
            dot += qh[i] * kh[i], ss += (qh[i] * kh[i]) * (qh[i] * kh[i]);
          p.push_back(dot * scale);
          r2.push_back(ss / Dh);
          smax = std::max(smax, dot * scale);
        }
        double z = 0;
        for (double& x : p) z += (x = std::exp(x - smax));
        std::fill(out.begin(), out.end(), 0.0);
        for (size_t j = 0; j < p.size(); ++j) {
          p[j] /= z;
          const double* vj = vals.data() + size_t(j0 + int(j)) * kv_dim + off;
          for (int i = 0; i < Dh; ++i) out[size_t(i)] += p[j] * vj[i];
        }
        for (size_t j = 0; j < p.size(); ++j) {
          const double* vj = vals.data() + size_t(j0 + int(j)) * kv_dim + off;
          double d2 = 0;
          for (int i = 0; i < Dh; ++i) d2 += (vj[i] - out[size_t(i)]) * (vj[i] - out[size_t(i)]);
          num += p[j] * p[j] * r2[j] * d2;
        }
        for (double o : out) den += o * o;
      }
    }
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

// --- replay -------------------------------------------------------------------------------

StageReplayer::StageReplayer(const Model& m, Backend& be, const InjectSpec& inject)
    : m_(m), be_(be), inject_(inject) {}

StageReplayer::~StageReplayer() {
  for (auto& [i, b] : bufs_) be_.free(b);
}

Buffer& StageReplayer::slot(int i, int64_t n, bool logits) {
  auto it = bufs_.find(i);
  if (it != bufs_.end() && it->second.n >= n) return it->second;
  if (it != bufs_.end()) be_.free(it->second);
  Buffer& b = bufs_[i];
  b = be_.alloc(std::max<int64_t>(n, 1), logits);
  return b;
}

void StageReplayer::put(int i, const std::vector<double>& v, int64_t n, bool logits) {
  ARB_ASSERT(int64_t(v.size()) >= n);
  be_.write(slot(i, n, logits), 0, n, v.data());
}

std::vector<double> StageReplayer::replay(const Capture& cap, size_t f, const StageId& id) {
  ARB_CHECK(f < cap.size(), "[drift] replay of forward %zu of %zu", f, cap.size());
  const CapturedForward& cf = cap[f];
  const ModelConfig& c = m_.config;
  const Weights& w = m_.weights;
  const int T = cf.T, D = c.d_model, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim;
  const int F = c.d_ff, V = c.vocab, q_dim = H * Dh, kv_dim = Hkv * Dh, l = id.layer;
  ARB_CHECK(l < c.n_layer, "[drift] layer %d of %d", l, c.n_layer);
  const LayerWeights* lw = l >= 0 ? &w.layers[size_t(l)] : nullptr;
  auto in = [&](Stage s, int layer) -> const std::vector<double>& { return cf.at({s, layer}); };
  auto resid_in = [&]() -> const std::vector<double>& {
    return l == 0 ? in(Stage::Embed, -1) : in(Stage::FfnRes, l - 1);
  };
  auto bias = [](const Tensor& t) { return t.empty() ? nullptr : &t; };
  const int64_t TD = int64_t(T) * D, TF = int64_t(T) * F;
  const int64_t TQ = int64_t(T) * q_dim, TK = int64_t(T) * kv_dim;
  Buffer* out = nullptr;
  int cols = 0;
  auto norm = [&](const std::vector<double>& x, const Tensor& wt, int R, int N, int64_t n) {
    put(1, x, n);
    out = &slot(0, n);
    be_.rmsnorm(slot(1, n), wt, R, N, c.norm_eps, *out);
  };
  auto mm = [&](const std::vector<double>& x, int64_t nx, const Tensor& W, const Tensor* b,
                int64_t nout) {
    put(1, x, nx);
    out = &slot(0, nout);
    be_.matmul(slot(1, nx), W, b, T, *out);
  };
  switch (id.stage) {
    case Stage::Embed:
      out = &slot(0, TD);
      be_.embed(w.embed, cf.ids.data(), T, *out);
      cols = D;
      break;
    case Stage::AttnNorm:
      norm(resid_in(), lw->attn_norm, T, D, TD);
      cols = D;
      break;
    case Stage::FfnNorm:
      norm(in(Stage::AttnRes, l), lw->ffn_norm, T, D, TD);
      cols = D;
      break;
    case Stage::FinalNorm:
      norm(in(Stage::FfnRes, c.n_layer - 1), w.out_norm, T, D, TD);
      cols = D;
      break;
    case Stage::QNorm:
      norm(in(Stage::Q, l), lw->q_norm, T * H, Dh, TQ);
      cols = q_dim;
      break;
    case Stage::KNorm:
      norm(in(Stage::K, l), lw->k_norm, T * Hkv, Dh, TK);
      cols = kv_dim;
      break;
    case Stage::Q:
      mm(in(Stage::AttnNorm, l), TD, lw->wq, bias(lw->bq), TQ);
      cols = q_dim;
      break;
    case Stage::K:
      mm(in(Stage::AttnNorm, l), TD, lw->wk, bias(lw->bk), TK);
      cols = kv_dim;
      break;
    case Stage::V:
      mm(in(Stage::AttnNorm, l), TD, lw->wv, bias(lw->bv), TK);
      cols = kv_dim;
      break;
    case Stage::O:
      mm(in(Stage::Attn, l), TQ, lw->wo, nullptr, TD);
      cols = D;
      break;
    case Stage::Gate:
      mm(in(Stage::FfnNorm, l), TD, lw->w_gate, nullptr, TF);
      cols = F;
      break;
    case Stage::Up:
      mm(in(Stage::FfnNorm, l), TD, lw->w_up, nullptr, TF);
      cols = F;
      break;
    case Stage::Down:
      mm(in(Stage::Act, l), TF, lw->w_down, nullptr, TD);
      cols = D;
      break;
    case Stage::Logits: {
      put(1, in(Stage::FinalNorm, -1), TD);
      out = &slot(9, int64_t(T) * V, /*logits=*/true);
      be_.matmul(slot(1, TD), w.lm_head, nullptr, T, *out);
      cols = V;
      break;
    }
    case Stage::QRope:
    case Stage::KRope: {
      const bool is_q = id.stage == Stage::QRope;
      Stage src = c.qk_norm ? (is_q ? Stage::QNorm : Stage::KNorm) : (is_q ? Stage::Q : Stage::K);
      const int64_t n = is_q ? TQ : TK;
      put(0, in(src, l), n);
      out = &slot(0, n);
      be_.rope(*out, T, is_q ? H : Hkv, Dh, cf.pos0, c);
      cols = is_q ? q_dim : kv_dim;
      break;
    }
    case Stage::Attn: {
      // The cache rows [0, pos0 + T) are the k_rope / v outputs of forwards 0..f (the
      // forward stores exactly those); they go in through the tier's own kv_store.
      const int64_t P = int64_t(cf.pos0) + T;
      std::vector<double> ka, va;
      ka.reserve(size_t(P * kv_dim));
      va.reserve(size_t(P * kv_dim));
      int64_t expect = 0;
      for (size_t j = 0; j <= f; ++j) {
        ARB_CHECK(cap[j].pos0 == expect, "[drift] captured forwards are not contiguous from 0");
        const auto& k = cap[j].at({Stage::KRope, l});
        const auto& v = cap[j].at({Stage::V, l});
        ka.insert(ka.end(), k.begin(), k.end());
        va.insert(va.end(), v.begin(), v.end());
        expect += cap[j].T;
      }
      put(1, ka, P * kv_dim);
      put(2, va, P * kv_dim);
      Buffer& kc = slot(3, P * kv_dim);
      Buffer& vc = slot(4, P * kv_dim);
      be_.kv_store(slot(1, P * kv_dim), slot(2, P * kv_dim), kc, vc, int(P), 0, kv_dim);
      put(5, in(Stage::QRope, l), TQ);
      out = &slot(0, TQ);
      be_.attention(slot(5, TQ), kc, vc, T, cf.pos0, H, Hkv, Dh, c.sliding_window, *out);
      cols = q_dim;
      break;
    }
    case Stage::Act:
      put(1, in(Stage::Gate, l), TF);
      put(2, in(Stage::Up, l), TF);
      out = &slot(0, TF);
      be_.swiglu(slot(1, TF), slot(2, TF), TF, *out);
      cols = F;
      break;
    case Stage::AttnRes:
    case Stage::FfnRes: {
      const bool attn = id.stage == Stage::AttnRes;
      put(0, attn ? resid_in() : in(Stage::AttnRes, l), TD);
      put(1, attn ? in(Stage::O, l) : in(Stage::Down, l), TD);
      out = &slot(0, TD);
      be_.add(*out, slot(1, TD), TD);
      cols = D;
      break;
    }
  }
  inject_.apply(be_, id.stage, id.layer, *out, T, cols, cf.pos0);
  std::vector<double> res(size_t(T) * cols);
  be_.read(*out, 0, int64_t(T) * cols, res.data());
  return res;
}

// --- drift --------------------------------------------------------------------------------

DriftReport drift_compare(const Model& m, const Capture& a, const Capture& b,
                          StageReplayer& replay_b, const Roundoff& u) {
  const ModelConfig& c = m.config;
  ARB_CHECK(a.size() == b.size(), "[drift] sides ran %zu and %zu forwards", a.size(), b.size());
  DriftReport r;
  r.u = u;
  r.forwards = int(a.size());
  int64_t ctx = 0;
  for (size_t f = 0; f < a.size(); ++f) {
    ARB_CHECK(a[f].pos0 == b[f].pos0 && a[f].T == b[f].T && a[f].ids == b[f].ids,
              "[drift] forward %zu differs between the sides (tokens or positions)", f);
    r.positions += a[f].T;
    r.width = std::max(r.width, a[f].T);
    ctx = std::max<int64_t>(ctx, int64_t(a[f].pos0) + a[f].T);
  }
  for (const StageId& id : forward_stages(c)) {
    DriftRow row;
    row.id = id;
    for (size_t f = 0; f < a.size(); ++f) {
      const std::vector<double>& ra = a[f].at(id);
      const std::vector<double>& rb = b[f].at(id);
      ARB_CHECK(ra.size() == rb.size(), "[drift] %s: %zu vs %zu values", stage_id_name(id).c_str(),
                ra.size(), rb.size());
      row.rows += a[f].T;
      row.cols = a[f].cols.at(id);
      row.acc.add(ra.data(), rb.data(), int64_t(ra.size()));
      std::vector<double> loc = replay_b.replay(a, f, id);
      row.local.add(ra.data(), loc.data(), int64_t(ra.size()));
    }
    double S = id.stage == Stage::Attn ? attention_score_scale(a, id.layer, c) : 0.0;
    row.bound = stage_bound(id, c, ctx, S, u);
    row.flagged = !(row.local.rel_l2() <= row.bound.value);
    if (row.flagged) {
      ++r.n_flagged;
      if (r.first_flagged < 0) r.first_flagged = int(r.rows.size());
    }
    r.rows.push_back(row);
  }
  return r;
}

std::string drift_text(const DriftReport& r) {
  std::string o;
  char b[512];
  std::snprintf(b, sizeof b,
                "drift: a = %s (%s, %s, inject %s)   b = %s (%s, %s, inject %s)\n"
                "tokens: %d positions (BOS + corpus) in %d forward(s) of up to %d\n"
                "bound: %.0f * (u_s * (sqrt(m) + amp) + u_a * sqrt(n)),  u_s = %s, u_a = %s\n\n",
                r.a_label.c_str(), r.a_device.c_str(), r.a_compute.c_str(), r.a_inject.c_str(),
                r.b_label.c_str(), r.b_device.c_str(), r.b_compute.c_str(), r.b_inject.c_str(),
                r.positions, r.forwards, r.width, kBoundSafety, fmt_g(r.u.storage).c_str(),
                fmt_g(r.u.accum).c_str());
  o += b;
  std::snprintf(b, sizeof b, "%-5s %-10s | %-28s | %-38s | %-9s %s\n", "layer", "stage",
                "accumulated (b chain vs a)", "local (b op on a's inputs vs a)", "bound", "");
  o += b;
  std::snprintf(b, sizeof b, "%-5s %-10s | %9s %9s %8s | %9s %9s %9s %8s | %-9s %s\n", "", "",
                "rel_l2", "max_abs", "cosine", "rel_l2", "max_abs", "mean_abs", "cosine", "rel_l2",
                "flag");
  o += b;
  int last_layer = -2;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const DriftRow& w = r.rows[i];
    if (w.id.layer != last_layer && i > 0) o += "\n";
    last_layer = w.id.layer;
    std::string flag = w.flagged ? (int(i) == r.first_flagged ? "FIRST" : "over") : "";
    if (w.flagged && w.local.rel_l2() > 0 && std::isfinite(w.local.rel_l2()))
      flag += " x" + fmt_g(w.local.rel_l2() / w.bound.value);
    std::snprintf(b, sizeof b, "%-5s %-10s | %9s %9s %8.6f | %9s %9s %9s %8.6f | %-9s %s\n",
                  w.id.layer >= 0 ? std::to_string(w.id.layer).c_str() : "-",
                  stage_name(w.id.stage), fmt_g(w.acc.rel_l2()).c_str(),
                  fmt_g(w.acc.max_abs).c_str(), w.acc.cosine(), fmt_g(w.local.rel_l2()).c_str(),
                  fmt_g(w.local.max_abs).c_str(), fmt_g(w.local.mean_abs()).c_str(),
                  w.local.cosine(), fmt_g(w.bound.value).c_str(), flag.c_str());
    o += b;
  }
  // Per layer: the hidden state leaving the layer (accumulated) and the worst local stage.
  o += "\nper layer: hidden state after the layer (accumulated) and worst local error / bound\n";
  std::snprintf(b, sizeof b, "%-6s %12s %12s  %-12s %s\n", "layer", "acc_rel_l2", "local/bound",
                "worst_stage", "flagged");
  o += b;
  auto layer_line = [&](int layer, const std::string& name, Stage hidden) {
    double acc = NAN, worst = -1;
    std::string ws;
    int nflag = 0;
    for (const DriftRow& w : r.rows) {
      bool in_layer = layer >= 0
                          ? w.id.layer == layer
                          : (name == "embed" ? w.id.stage == Stage::Embed
                                             : (w.id.layer < 0 && w.id.stage != Stage::Embed));
      if (!in_layer) continue;
      if (w.id.stage == hidden) acc = w.acc.rel_l2();
      double ratio = w.local.rel_l2() / w.bound.value;
      if (!(ratio <= worst)) worst = ratio, ws = stage_name(w.id.stage);
      nflag += w.flagged;
    }
    std::snprintf(b, sizeof b, "%-6s %12s %12s  %-12s %d\n", name.c_str(), fmt_g(acc).c_str(),
                  fmt_g(worst).c_str(), ws.c_str(), nflag);
    o += b;
  };
  layer_line(-1, "embed", Stage::Embed);
  int L = 0;
  for (const DriftRow& w : r.rows) L = std::max(L, w.id.layer + 1);
  for (int l = 0; l < L; ++l) layer_line(l, std::to_string(l), Stage::FfnRes);
  layer_line(-1, "head", Stage::Logits);
  o += "\n";
  if (r.first_flagged >= 0) {
    const DriftRow& w = r.rows[size_t(r.first_flagged)];
    std::snprintf(b, sizeof b,
                  "FIRST FLAGGED: %s (op %s%s): local rel_l2 %s > bound %s; %d stage(s) over "
                  "their bound\n",
                  stage_name(w.id.stage), stage_op(w.id.stage),
                  w.id.layer >= 0 ? (", layer " + std::to_string(w.id.layer)).c_str() : "",
                  fmt_g(w.local.rel_l2()).c_str(), fmt_g(w.bound.value).c_str(), r.n_flagged);
    o += b;
  } else {
    o += "no stage over its bound: every op of b reproduces a's outputs within rounding\n";
  }
  return o;
}

std::string drift_tsv(const DriftReport& r) {
  std::string o =
      "stage\tlayer\top\trows\tcols\tacc_rel_l2\tacc_max_abs\tacc_cosine\tlocal_rel_l2\t"
      "local_max_abs\tlocal_mean_abs\tlocal_cosine\tlocal_nmse\tbound_rel_l2\treduction\t"
      "roundings\tamp\tflagged\n";
  char b[64];
  auto g = [&](double v) {
    if (!std::isfinite(v)) return fmt_g(v);
    std::snprintf(b, sizeof b, "%.6g", v);
    return std::string(b);
  };
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const DriftRow& w = r.rows[i];
    o += std::string(stage_name(w.id.stage)) + "\t" + std::to_string(w.id.layer) + "\t" +
         stage_op(w.id.stage) + "\t" + std::to_string(w.rows) + "\t" + std::to_string(w.cols) +
         "\t" + g(w.acc.rel_l2()) + "\t" + g(w.acc.max_abs) + "\t" + g(w.acc.cosine()) + "\t" +
         g(w.local.rel_l2()) + "\t" + g(w.local.max_abs) + "\t" + g(w.local.mean_abs()) + "\t" +
         g(w.local.cosine()) + "\t" + g(w.local.nmse()) + "\t" + g(w.bound.value) + "\t" +
         std::to_string(w.bound.reduction) + "\t" + std::to_string(w.bound.roundings) + "\t" +
         g(w.bound.amp) + "\t" +
         (w.flagged ? (int(i) == r.first_flagged ? "first" : "yes") : "no") + "\n";
  }
  return o;
}

std::string drift_svg(const DriftReport& r) {
  SvgChart c;
  c.title = "drift: " + r.b_label + " vs " + r.a_label + " (relative L2 per stage)";
  c.x_label = "stage along the forward (ticks: first stage of each layer)";
  c.y_label = "relative L2 error";
  c.log_y = true;
  SvgSeries acc{"accumulated", {}, {}, "#1f77b4", false, true};
  SvgSeries loc{"local", {}, {}, "#d62728", false, true};
  SvgSeries bnd{"bound (local)", {}, {}, "#555555", true, false};
  SvgSeries flg{"flagged", {}, {}, "#000000", false, true};
  int last = -2;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const DriftRow& w = r.rows[i];
    double x = double(i);
    // Exact zeros cannot sit on a log axis; they are gaps in the line.
    acc.x.push_back(x), acc.y.push_back(w.acc.rel_l2());
    loc.x.push_back(x), loc.y.push_back(w.local.rel_l2());
    bnd.x.push_back(x), bnd.y.push_back(w.bound.value);
    if (w.flagged)
      flg.x.push_back(x), flg.y.push_back(std::isfinite(w.local.rel_l2()) ? w.local.rel_l2() : NAN);
    if (w.id.layer != last) {
      std::string lab = w.id.layer >= 0 ? "L" + std::to_string(w.id.layer)
                                        : (w.id.stage == Stage::Embed ? "emb" : "head");
      c.x_ticks.emplace_back(x, lab);
      last = w.id.layer;
    }
  }
  c.series = {acc, loc, bnd};
  if (!flg.x.empty()) c.series.push_back(flg);
  if (r.first_flagged >= 0)
    c.title += "; first flagged: " + stage_id_name(r.rows[size_t(r.first_flagged)].id);
  return render_svg(c);
}

nlohmann::json drift_json(const DriftReport& r) {
  nlohmann::json j;
  auto num = [](double v) -> nlohmann::json {
    if (std::isfinite(v)) return v;
    return fmt_g(v);
  };
  j["model"] = r.model_path;
  j["corpus"] = r.corpus_path;
  j["a"] = {{"side", r.a_label},
            {"device", r.a_device},
            {"compute", r.a_compute},
            {"inject", r.a_inject}};
  j["b"] = {{"side", r.b_label},
            {"device", r.b_device},
            {"compute", r.b_compute},
            {"inject", r.b_inject}};
  j["positions"] = r.positions;
  j["forwards"] = r.forwards;
  j["width"] = r.width;
  j["roundoff"] = {{"storage", r.u.storage}, {"accum", r.u.accum}, {"safety", kBoundSafety}};
  j["stages"] = nlohmann::json::array();
  for (const DriftRow& w : r.rows)
    j["stages"].push_back({{"stage", stage_name(w.id.stage)},
                           {"layer", w.id.layer},
                           {"op", stage_op(w.id.stage)},
                           {"rows", w.rows},
                           {"cols", w.cols},
                           {"acc",
                            {{"rel_l2", num(w.acc.rel_l2())},
                             {"max_abs", num(w.acc.max_abs)},
                             {"cosine", num(w.acc.cosine())},
                             {"nonfinite", w.acc.nonfinite}}},
                           {"local",
                            {{"rel_l2", num(w.local.rel_l2())},
                             {"max_abs", num(w.local.max_abs)},
                             {"mean_abs", num(w.local.mean_abs())},
                             {"cosine", num(w.local.cosine())},
                             {"nmse", num(w.local.nmse())},
                             {"nonfinite", w.local.nonfinite}}},
                           {"bound", num(w.bound.value)},
                           {"flagged", w.flagged}});
  j["n_flagged"] = r.n_flagged;
  if (r.first_flagged >= 0) {
    const StageId& id = r.rows[size_t(r.first_flagged)].id;
    j["first_flagged"] = {
        {"stage", stage_name(id.stage)}, {"layer", id.layer}, {"op", stage_op(id.stage)}};
  } else {
    j["first_flagged"] = nullptr;
  }
  return j;
}

}  // namespace arbiter::verify
