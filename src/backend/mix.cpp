#include "backend/mix.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "core/error.h"

namespace arbiter {

const std::vector<std::string>& mix_families() {
  static const std::vector<std::string> f = {"embed", "norm", "attn", "mlp", "ssm", "residual", "logits"};
  return f;
}

std::string MixSpec::text() const {
  if (entries.empty()) return "none";
  std::string out;
  for (const auto& [fam, dt] : entries) out += (out.empty() ? "" : ",") + fam + "=" + dt;
  return out;
}

std::string MixSpec::dtype_of(const std::string& family) const {
  for (const auto& [fam, dt] : entries)
    if (fam == family) return dt;
  return "";
}

MixSpec parse_mix(const std::string& spec) {
  MixSpec m;
  if (spec.empty() || spec == "none") return m;
  ARB_CHECK(spec.back() != ',', "[mix] '%s': trailing ','", spec.c_str());
  std::stringstream ss(spec);
  std::string field;
  const auto& fams = mix_families();
  while (std::getline(ss, field, ',')) {
    size_t eq = field.find('=');
    ARB_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < field.size(),
              "[mix] '%s': entry '%s' is not family=dtype", spec.c_str(), field.c_str());
    std::string fam = field.substr(0, eq), dt = field.substr(eq + 1);
    if (std::find(fams.begin(), fams.end(), fam) == fams.end()) {
      std::string valid;
      for (const auto& f : fams) valid += (valid.empty() ? "" : ", ") + f;
      throw Error("[mix] '" + spec + "': unknown op family '" + fam + "' (expected " + valid + ")");
    }
    ARB_CHECK(dt == "f32" || dt == "bf16" || dt == "f16",
              "[mix] '%s': family %s: dtype '%s' (expected f32, bf16 or f16)", spec.c_str(),
              fam.c_str(), dt.c_str());
    ARB_CHECK(m.dtype_of(fam).empty(), "[mix] '%s': family %s given twice", spec.c_str(),
              fam.c_str());
    m.entries.emplace_back(fam, dt);
  }
  ARB_CHECK(!m.entries.empty(), "[mix] '%s': no family=dtype entry", spec.c_str());
  return m;
}

}  // namespace arbiter

// --- the mixed-precision tier -------------------------------------------------------------

namespace arbiter {

namespace {

class MixBackend final : public Backend {
 public:
  MixBackend(std::vector<std::pair<std::string, std::unique_ptr<Backend>>> tiers, const std::string& base,
             const MixSpec& mix)
      : mix_(mix) {
    ARB_CHECK(!tiers.empty(), "[mix] no tier");
    for (auto& [name, be] : tiers) {
      ARB_CHECK(be != nullptr, "[mix] tier %s missing", name.c_str());
      names_.push_back(name);
      tiers_.push_back(std::move(be));
    }
    base_ = index_of(base);
    for (const std::string& f : mix_families()) {
      const std::string dt = mix_.dtype_of(f);
      fam_[f] = dt.empty() ? base_ : index_of(dt);
    }
  }

  ~MixBackend() override {
    for (Home* h : homes_) {
      for (size_t t = 0; t < h->b.size(); ++t)
        if (h->b[t].ptr) tiers_[t]->free(h->b[t]);
      delete h;
    }
  }

  std::string device_name() const override { return tiers_[base_]->device_name(); }
  DType compute() const override { return tiers_[base_]->compute(); }

  void prepare(const Prepare& p) override {
    // A matmul's family is that of its weight (q/k/v/o: attn; gate/up/down: mlp; in_proj /
    // out_proj: ssm; lm_head: logits), as the architecture named it, found by address range:
    // a forward may multiply by rows of a weight (hybrid's in_proj parts, Granite's stacked
    // gate/up and its [E, 2F, D] experts). The embedding table is read by embed alone (routed
    // by op), even when lm_head is the same matrix.
    weight_fam_.clear();
    for (const WeightUse& u : p.weights)
      if (u.tensor->shape.size() >= 2 && std::string(u.family) != "embed") {
        const char* begin = static_cast<const char*>(u.tensor->data);
        weight_fam_[begin] = {begin + u.tensor->nbytes(), u.family};
      }
    for (auto& t : tiers_) t->prepare(p);
  }

  Buffer alloc(int64_t n, bool logits) override {
    Buffer probe = tiers_[base_]->alloc(0, logits);
    const DType dt = probe.dtype;
    tiers_[base_]->free(probe);
    auto* h = new Home;
    h->n = n;
    h->logits = logits;
    h->b.resize(tiers_.size());
    homes_.push_back(h);
    Buffer b;
    b.ptr = h;
    b.n = n;
    b.dtype = dt;
    return b;
  }

  void free(Buffer& b) override {
    Home* h = home(b);
    if (h) {
      for (size_t t = 0; t < h->b.size(); ++t)
        if (h->b[t].ptr) tiers_[t]->free(h->b[t]);
      homes_.erase(std::find(homes_.begin(), homes_.end(), h));
      delete h;
    }
    b = Buffer{};
  }

  void read(const Buffer& b, int64_t off, int64_t n, double* dst) override {
    Home* h = home(b);
    int t = first_valid(*h);
    if (t < 0) t = base_;
    tiers_[size_t(t)]->read(at(*h, t, false), off, n, dst);
  }

  void write(Buffer& b, int64_t off, int64_t n, const double* src) override {
    // A partial write must keep the rest: bring the data to the base tier first.
    Home* h = home(b);
    Buffer& x = at(*h, base_, !(off == 0 && n == h->n));
    tiers_[size_t(base_)]->write(x, off, n, src);
    h->valid = 1u << base_;
  }

  void sync() override {
    for (auto& t : tiers_) t->sync();
  }

  void embed(const Tensor& table, const int32_t* ids, int T, Buffer& out) override {
    const int t = tier("embed", "embed");
    tiers_[size_t(t)]->embed(table, ids, T, out_on(out, t, false));
  }

  void rmsnorm(const Buffer& x, const Tensor& w, int R, int N, double eps, Buffer& out) override {
    const int t = tier("norm", "rmsnorm");
    Buffer& xi = in(x, t);
    Buffer& oi = home(out) == home(x) ? xi : at(*home(out), t, false);
    tiers_[size_t(t)]->rmsnorm(xi, w, R, N, eps, oi);
    home(out)->valid = 1u << t;
  }

  void matmul(const Buffer& x, const Tensor& W, const Tensor* bias, int T, Buffer& out) override {
    const int t = tier(weight_family(W.data), "matmul");
    Buffer& xi = in(x, t);
    tiers_[size_t(t)]->matmul(xi, W, bias, T, out_on(out, t, false));
  }

  void rope(Buffer& x, int T, int nh, int Dh, int pos0, const RopeSpec& rope) override {
    const int t = tier("attn", "rope");
    tiers_[size_t(t)]->rope(out_on(x, t, true), T, nh, Dh, pos0, rope);
  }

  void kv_store(const Buffer& k, const Buffer& v, Buffer& k_cache, Buffer& v_cache, int T, int pos0,
                int kv_dim) override {
    const int t = tier("attn", "kv_store");
    Buffer& ki = in(k, t);
    Buffer& vi = in(v, t);
    tiers_[size_t(t)]->kv_store(ki, vi, out_on(k_cache, t, true), out_on(v_cache, t, true), T, pos0, kv_dim);
  }

  void attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T, int pos0, int H, int Hkv,
                 int Dh, int window, Buffer& out) override {
    const int t = tier("attn", "attention");
    Buffer& qi = in(q, t);
    Buffer& ki = in(k_cache, t);
    Buffer& vi = in(v_cache, t);
    tiers_[size_t(t)]->attention(qi, ki, vi, T, pos0, H, Hkv, Dh, window, out_on(out, t, false));
  }

  void swiglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) override {
    const int t = tier("mlp", "swiglu");
    Buffer& gi = in(gate, t);
    Buffer& ui = in(up, t);
    tiers_[size_t(t)]->swiglu(gi, ui, n, out_on(out, t, false));
  }

  void scaled_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T, int pos0, int H,
                        int Hkv, int Dh, int window, double scale, double softcap, Buffer& out) override {
    const int t = tier("attn", "scaled_attention");
    Buffer& qi = in(q, t);
    Buffer& ki = in(k_cache, t);
    Buffer& vi = in(v_cache, t);
    tiers_[size_t(t)]->scaled_attention(qi, ki, vi, T, pos0, H, Hkv, Dh, window, scale, softcap,
                                        out_on(out, t, false));
  }

  void relu2(const Buffer& x, int64_t n, Buffer& out) override {
    const int t = tier("mlp", "relu2");
    Buffer& xi = in(x, t);
    tiers_[size_t(t)]->relu2(xi, n, out_on(out, t, false));
  }

  void rmsnorm_1p(const Buffer& x, const Tensor& w, int R, int N, double eps, Buffer& out) override {
    const int t = tier("norm", "rmsnorm_1p");
    Buffer& xi = in(x, t);
    Buffer& oi = home(out) == home(x) ? xi : at(*home(out), t, false);
    tiers_[size_t(t)]->rmsnorm_1p(xi, w, R, N, eps, oi);
    home(out)->valid = 1u << t;
  }

  void geglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) override {
    const int t = tier("mlp", "geglu");
    Buffer& gi = in(gate, t);
    Buffer& ui = in(up, t);
    tiers_[size_t(t)]->geglu(gi, ui, n, out_on(out, t, false));
  }

  // A scale or a soft cap finishes the op before it (an embedding, a residual branch, the
  // logits: Granite's multipliers, gemma's embedding scale and final cap), so it runs where
  // that op left its output, in that op's precision.
  void scale(Buffer& x, int64_t n, double s) override {
    const int t = follow(x, "scale");
    tiers_[size_t(t)]->scale(out_on(x, t, true), n, s);
  }
  void softcap(Buffer& x, int64_t n, double cap) override {
    const int t = follow(x, "softcap");
    tiers_[size_t(t)]->softcap(out_on(x, t, true), n, cap);
  }

  void ssm_conv(const Buffer& x, const Tensor& w, const Tensor* bias, int T, int C, int K, Buffer& state,
                Buffer& out) override {
    const int t = tier("ssm", "ssm_conv");
    Buffer& xi = in(x, t);
    tiers_[size_t(t)]->ssm_conv(xi, w, bias, T, C, K, out_on(state, t, true), out_on(out, t, false));
  }

  void ssm_scan(const Buffer& xbc, const Buffer& dt_raw, const Tensor& A_log, const Tensor& D, const Tensor& dt_bias,
                double dt_min, double dt_max, int T, int nh, int hd, int G, int N, int chunk, Buffer& state,
                Buffer& y) override {
    const int t = tier("ssm", "ssm_scan");
    Buffer& xi = in(xbc, t);
    Buffer& di = in(dt_raw, t);
    tiers_[size_t(t)]->ssm_scan(xi, di, A_log, D, dt_bias, dt_min, dt_max, T, nh, hd, G, N, chunk, out_on(state, t, true),
                                out_on(y, t, false));
  }

  void rmsnorm_gated(const Buffer& y, const Buffer& z, const Tensor& w, int R, int W, int group, double eps,
                     Buffer& out) override {
    const int t = tier("ssm", "rmsnorm_gated");
    Buffer& yi = in(y, t);
    Buffer& zi = in(z, t);
    tiers_[size_t(t)]->rmsnorm_gated(yi, zi, w, R, W, group, eps, out_on(out, t, false));
  }

  void add(Buffer& x, const Buffer& y, int64_t n) override {
    const int t = tier("residual", "add");
    Buffer& yi = in(y, t);
    tiers_[size_t(t)]->add(out_on(x, t, true), yi, n);
  }

  void summarize(const Buffer& logits, int T, int V, int K, const int32_t* targets,
                 std::vector<LogitsSummary>& out) override {
    const int t = tier("logits", "summarize");
    tiers_[size_t(t)]->summarize(in(logits, t), T, V, K, targets, out);
  }

  std::vector<double> read_bandwidth_gbs(int passes) override { return tiers_[size_t(base_)]->read_bandwidth_gbs(passes); }
  std::vector<double> peak_gflops(int passes, std::string* source) override {
    return tiers_[size_t(base_)]->peak_gflops(passes, source);
  }

 private:
  struct Home {
    int64_t n = 0;
    bool logits = false;
    unsigned valid = 0;       // bit t: tier t holds the current values
    std::vector<Buffer> b;    // per tier, allocated on first use
  };

  int index_of(const std::string& dt) const {
    for (size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == dt) return int(i);
    throw Error("[mix] no tier for dtype '" + dt + "'");
  }
  static Home* home(const Buffer& b) { return static_cast<Home*>(b.ptr); }
  static int first_valid(const Home& h) {
    for (size_t t = 0; t < h.b.size(); ++t)
      if (h.valid & (1u << t)) return int(t);
    return -1;
  }

  /// The family of the weight holding address p ("" when none does).
  std::string weight_family(const void* p) const {
    const char* c = static_cast<const char*>(p);
    auto it = weight_fam_.upper_bound(c);
    if (it == weight_fam_.begin()) return "";
    --it;
    return c < it->second.first ? it->second.second : "";
  }

  /// The tier holding x's current values (the base when none does); counts the call as
  /// "mix.follow.<tier dtype>".
  int follow(const Buffer& x, const char* op) {
    const int from = first_valid(*home(x)), t = from < 0 ? base_ : from;
    stats_.record(op, "mix.follow." + names_[size_t(t)]);
    return t;
  }

  /// Tier of a family ("" = base); counts the call as "mix.<family>.<tier dtype>".
  int tier(const std::string& family, const char* op) {
    const int t = family.empty() ? base_ : fam_.at(family);
    stats_.record(op, "mix." + (family.empty() ? std::string("base") : family) + "." + names_[size_t(t)]);
    return t;
  }

  /// The buffer on tier t, allocated if needed; with data: the current values moved there.
  Buffer& at(Home& h, int t, bool data) {
    Buffer& b = h.b[size_t(t)];
    if (!b.ptr && h.n > 0) b = tiers_[size_t(t)]->alloc(h.n, h.logits);
    if (data && !(h.valid & (1u << t))) {
      const int from = first_valid(h);
      if (from >= 0 && h.n > 0) {
        std::vector<double> host(size_t(h.n));
        tiers_[size_t(from)]->read(h.b[size_t(from)], 0, h.n, host.data());
        tiers_[size_t(t)]->write(b, 0, h.n, host.data());
      }
      if (from >= 0) h.valid |= 1u << t;
    }
    return b;
  }
  /// An input of an op on tier t.
  Buffer& in(const Buffer& x, int t) { return at(*home(x), t, true); }
  /// An output on tier t (keep: the op also reads it or writes only part); only t is current.
  Buffer& out_on(Buffer& x, int t, bool keep) {
    Home& h = *home(x);
    Buffer& b = at(h, t, keep);
    h.valid = 1u << t;
    return b;
  }

  MixSpec mix_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Backend>> tiers_;
  int base_ = 0;
  std::map<std::string, int> fam_;
  std::map<const char*, std::pair<const char*, std::string>> weight_fam_;  // begin -> (end, family)
  std::vector<Home*> homes_;
};

}  // namespace

std::unique_ptr<Backend> make_mix_backend(std::vector<std::pair<std::string, std::unique_ptr<Backend>>> tiers,
                                          const std::string& base, const MixSpec& mix) {
  return std::make_unique<MixBackend>(std::move(tiers), base, mix);
}

}  // namespace arbiter
