// arbiter bench: see bench.h for the method.
#include "engine/bench.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "backend/cpu/probes.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/text_table.h"
#include "engine/scheduler.h"
#include "engine/session.h"

namespace arbiter {

namespace {

using Clock = std::chrono::steady_clock;

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int resolve_threads(int t) { return t > 0 ? t : int(std::max(1u, std::thread::hardware_concurrency())); }

// --- memory high-water mark ------------------------------------------------------------

// VmHWM of this process in bytes (-1 when /proc is unavailable).
int64_t read_vm_hwm() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return int64_t(std::atoll(line.c_str() + 6)) * 1024;
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0: "5" > /proc/PID/clear_refs), so the
// probe buffers, freed before this call, do not count as the model's memory.
bool reset_vm_hwm() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return bool(f);
}

// --- tier probes (non-host devices) -----------------------------------------------------

// The tier's add op over two buffers of 256 MiB-worth of elements: 3 n elem bytes moved.
std::vector<double> tier_add_bandwidth(Backend& be, int passes) {
  Buffer probe = be.alloc(1);
  const size_t elem = dtype_bytes(probe.dtype, 1);
  be.free(probe);
  const int64_t n = int64_t((size_t(256) << 20) / elem);
  Buffer x = be.alloc(n), y = be.alloc(n);
  std::vector<double> out;
  try {
    be.add(x, y, n);  // warm-up (and first touch)
    be.sync();
    for (int p = 0; p < passes; ++p) {
      const int k = 4;
      const auto t0 = Clock::now();
      for (int i = 0; i < k; ++i) be.add(x, y, n);
      be.sync();
      out.push_back(3.0 * double(n) * double(elem) * k / secs(t0, Clock::now()) / 1e9);
    }
  } catch (...) {
    be.free(x);
    be.free(y);
    throw;
  }
  be.free(x);
  be.free(y);
  return out;
}

// The tier's matmul on every distinct weight shape of one layer plus the output matrix, at
// M = T rows, weighted by how often a forward runs each: GFLOP/s over a forward's matmuls.
double tier_matmul_gflops(const Model& m, Backend& be, int T) {
  std::vector<const Tensor*> per_layer;  // layer 0's matrices
  for (const TensorSpec& s : m.weights.specs)
    if (s.layer == 0 && s.kind == TensorKind::Matrix) per_layer.push_back(&m.weights.at(s));
  const Tensor& lm_head = *m.weights.find("lm_head");
  int64_t max_k = 0, max_n = 0;
  for (const Tensor* t : per_layer) {
    max_k = std::max(max_k, t->cols());
    max_n = std::max(max_n, t->rows());
  }
  max_k = std::max<int64_t>(max_k, lm_head.cols());
  Buffer x = be.alloc(int64_t(T) * max_k), y = be.alloc(int64_t(T) * max_n);
  Buffer lg = be.alloc(int64_t(T) * lm_head.rows(), true);
  double flops = 0, time = 0;
  try {
    std::vector<double> init(size_t(T) * size_t(max_k));
    for (size_t i = 0; i < init.size(); ++i) init[i] = 0.01 * double(int(i % 17) - 8);
    be.write(x, 0, int64_t(init.size()), init.data());
    auto one = [&](const Tensor& w, Buffer& out, double count) {
      be.matmul(x, w, nullptr, T, out);  // warm-up
      be.sync();
      const int k = 3;
      const auto t0 = Clock::now();
      for (int i = 0; i < k; ++i) be.matmul(x, w, nullptr, T, out);
      be.sync();
      time += secs(t0, Clock::now()) / k * count;
      flops += 2.0 * T * double(w.rows()) * double(w.cols()) * count;
    };
    for (const Tensor* t : per_layer) one(*t, y, m.config.n_layer);
    one(lm_head, lg, 1);
  } catch (...) {
    be.free(x);
    be.free(y);
    be.free(lg);
    throw;
  }
  be.free(x);
  be.free(y);
  be.free(lg);
  return flops / time / 1e9;
}

// The limit probes, run once per repetition (interleaved with the timed tests: the host is
// noisy), their samples kept for the run's medians (docs/performance.md).
struct LimitProbes {
  LimitProbes(const Model& m, Backend& be, bool host_tier, int threads, int T)
      : m(m), be(be), host_tier(host_tier), threads(threads), T(T) {}
  const Model& m;
  Backend& be;
  const bool host_tier;
  const int threads, T;  // probe threads (host tiers); the rows of a tier's matmul probe
  std::vector<double> bw, mm;  // GB/s, GFLOP/s
  bool bw_from_add = false;    // a tier without a read probe: the add op's lower bound
  std::string peak_source;     // set when a peak probe (tier or host) served the limit

  // One round; returns its medians (bandwidth, peak).
  std::pair<double, double> run() {
    const size_t bw0 = bw.size(), mm0 = mm.size();
    // Compute peak: the tier's own probe (cpu: the f32 FMA peak of its ISA on its threads);
    // the ref tier has none and is held to the host's widest f32 FMA peak on -t threads;
    // a device tier without one gets its matmul on the model's shapes.
    auto g = be.peak_gflops(2, &peak_source);
    if (g.empty() && host_tier) {
      g = cpu::measure_fma_gflops(cpu::best_isa(), threads, 2);
      peak_source = cpu::fma_probe_source(cpu::best_isa(), threads, 2);
    }
    if (!g.empty()) mm.insert(mm.end(), g.begin(), g.end());
    if (host_tier) {
      auto b = cpu::measure_host_read_bandwidth(size_t(1) << 30, threads, 3);
      bw.insert(bw.end(), b.begin(), b.end());
    } else {
      // The tier's own device read probe when it has one (cuda: a 2 GiB streaming read);
      // otherwise the add op's lower bound.
      auto b = be.read_bandwidth_gbs(3);
      if (b.empty()) {
        b = tier_add_bandwidth(be, 3);
        bw_from_add = true;
      }
      bw.insert(bw.end(), b.begin(), b.end());
      if (g.empty()) mm.push_back(tier_matmul_gflops(m, be, T));
    }
    return {bench_stat(std::vector<double>(bw.begin() + long(bw0), bw.end())).median,
            bench_stat(std::vector<double>(mm.begin() + long(mm0), mm.end())).median};
  }
  std::string bandwidth_source() const {
    if (host_tier)
      return strformat("host streaming read of 1 GiB (MADV_HUGEPAGE), %d threads, 3 passes per rep", threads);
    return bw_from_add ? "the tier's add op over 2 x 256 MiB buffers (3 bytes moved per byte added; lower bound)"
                       : "the tier's device read probe: 2 GiB streamed with 16-byte loads, 3 passes per rep "
                         "(CUDA events)";
  }
  std::string matmul_source() const {
    return !peak_source.empty()
               ? peak_source
               : strformat("the tier's matmul on the model's weight shapes at M = %d, weighted per forward", T);
  }
};

// Bytes of one element of the tier's KV cache (its compute type).
int kv_elem_bytes(Backend& be) {
  Buffer b = be.alloc(1);
  const int e = int(dtype_bytes(b.dtype, 1));
  be.free(b);
  return e;
}

bool is_host_tier(const std::string& device) { return device.rfind("cpu", 0) == 0 || device.rfind("ref", 0) == 0; }

// --- host facts ---------------------------------------------------------------------------

std::string host_cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      size_t c = line.find(':');
      if (c != std::string::npos) {
        std::string s = line.substr(c + 1);
        s.erase(0, s.find_first_not_of(" \t"));
        return s;
      }
    }
  return "unknown";
}

std::vector<std::pair<std::string, uint64_t>> model_weight_types(const Model& m) {
  std::map<std::string, uint64_t> by;
  m.weights.for_each_distinct([&](const TensorSpec&, const Tensor& t) { by[dtype_name(t.dtype)] += t.nbytes(); });
  std::vector<std::pair<std::string, uint64_t>> out(by.begin(), by.end());
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

// Deterministic token ids in [0, V) for prompts (their values do not change the work).
std::vector<int32_t> bench_ids(uint64_t seed, int n, int vocab) {
  std::vector<int32_t> ids(size_t(std::max(n, 0)));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int32_t& id : ids) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    id = int32_t(x % uint64_t(vocab));
  }
  return ids;
}

}  // namespace

// ---------------------------------------------------------------------------------------

void bench_note_peak_rss(BenchReport& r) { r.peak_rss_bytes = std::max(r.peak_rss_bytes, read_vm_hwm()); }

BenchStat bench_stat(const std::vector<double>& xs) {
  BenchStat s;
  s.samples = xs;
  if (xs.empty()) return s;
  std::vector<double> v = xs;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.min = v.front();
  s.max = v.back();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(n);
  if (n >= 2) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / double(n - 1));
  }
  return s;
}

double decode_bytes_per_token(const Model& m, double ctx, int kv_elem_bytes, double* weights) {
  const double w = m.arch->weight_bytes_per_step(m);
  if (weights) *weights = w;
  return w + m.arch->state_bytes_per_token(m.config, ctx, kv_elem_bytes);
}

BenchReport run_bench(const Model& m, Backend& be, const BenchOptions& opt) {
  ARB_CHECK(opt.n_prompt >= 1 && opt.n_gen >= 1, "[bench] -p %d and -n %d must be >= 1", opt.n_prompt, opt.n_gen);
  ARB_CHECK(opt.reps >= 1, "[bench] -r %d must be >= 1", opt.reps);
  ARB_CHECK(opt.depth >= 0, "[bench] --depth %d must be >= 0", opt.depth);
    auto say = [&](const std::string& s) {
    if (opt.progress) progress_note("bench", s);
  };
  const ModelConfig& c = m.config;
  BenchReport r;
  r.opt = opt;
  r.model_path = opt.model_path.empty() ? m.path : opt.model_path;
  r.arch = c.arch;
  r.format = m.format;
  r.weight_dtype = dtype_name(m.weight_dtype);
  r.n_layer = c.n_layer;
  r.d_model = c.d_model;
  r.vocab = c.vocab;
  r.n_params = m.n_params;
  r.weight_types = model_weight_types(m);
  for (const auto& [type, bytes] : r.weight_types) r.weight_bytes += bytes;
  r.device = be.device_name();
  r.compute = dtype_name(be.compute());
  r.threads = resolve_threads(opt.threads);
  r.host_cpu = host_cpu_name();
  r.host_cores = int(std::thread::hardware_concurrency());
  r.build = std::string(kVersion) + " " + kGitCommit;

  const int P = opt.n_prompt, N = opt.n_gen, Dp = opt.depth;
  const bool host_tier = is_host_tier(r.device);
  Session s(m, be, Dp + std::max(P, N) + 1, std::min(P, 512));
  r.state_bytes = s.state_bytes();
  r.state_ctx = s.max_ctx();
  const int kv_elem = kv_elem_bytes(be);
  const std::vector<int32_t> prompt = bench_ids(opt.seed, P, c.vocab);
  const std::vector<int32_t> context = bench_ids(opt.seed + 1, Dp, c.vocab);

  bool hwm_resettable = true;
  int64_t hwm = -1;
  auto note_hwm = [&] { hwm = std::max(hwm, read_vm_hwm()); };
  auto after_probe = [&] {
    if (!reset_vm_hwm()) hwm_resettable = false;
  };
  auto with_context = [&] {
    s.reset();
    if (Dp > 0) s.prefill(context);
    be.sync();
  };
  auto run_pp = [&](double& tok_s, double& ttft_ms) {
    // One untimed decode step first: after a probe the tier's workers may be parked, and
    // waking them would be charged to this prefill.
    s.reset();
    s.forward({prompt[0]});
    (void)s.summarize(1, {-1});
    with_context();
    const auto t0 = Clock::now();
    s.prefill(prompt);
    be.sync();
    const auto t1 = Clock::now();
    std::vector<int32_t> none(size_t(s.last_T()), -1);
    (void)s.summarize(1, none);  // the argmax that picks the first new token
    const auto t2 = Clock::now();
    tok_s = P / secs(t0, t1);
    ttft_ms = 1e3 * secs(t0, t2);
  };
  // Greedy generation as `arbiter generate` runs it: each token is picked where the logits
  // live and embedded by the next step, which is queued before the host takes the token.
  auto run_tg = [&](int n) {
    with_context();
    const auto t0 = Clock::now();
    s.forward({prompt[0]});
    s.pick();
    for (int i = 1; i < n; ++i) {
      s.forward_picked();
      s.pick();
      (void)s.take_pick();
    }
    (void)s.take_pick();
    return n / secs(t0, Clock::now());
  };
  std::vector<double> pp, tg, ttft;
  LimitProbes probes(m, be, host_tier, r.threads, P);
  double rep_bw = 0, rep_mm = 0;  // this repetition's probe medians
  auto probe = [&] {
    if (!opt.probes) return;
    std::tie(rep_bw, rep_mm) = probes.run();
    after_probe();
  };

  const double dbytes = decode_bytes_per_token(m, Dp + (N + 1) / 2.0, kv_elem);
  const double pflops = m.arch->flops_per_token(c, P, Dp);
  std::vector<double> dfrac, pfrac;

  // The warm-up is one prefill and a few decode steps; on a large model or the ref tier each
  // part can take long, so each says when it is done.
  {
    const Clock::time_point t0 = Clock::now();
    say(strformat("warm-up: pp%d ...", P));
    double a, b;
    run_pp(a, b);
    say(strformat("warm-up: pp%d done (%.1f s); tg%d ...", P, secs(t0, Clock::now()), std::min(N, 8)));
    (void)run_tg(std::min(N, 8));
    say(strformat("warm-up: done (%.1f s)", secs(t0, Clock::now())));
    note_hwm();
    r.act_quant = be.stats().act_quant();
  }
  for (int rep = 0; rep < opt.reps; ++rep) {
    probe();
    double t, f;
    run_pp(t, f);
    pp.push_back(t);
    ttft.push_back(f);
    note_hwm();
    tg.push_back(run_tg(N));
    note_hwm();
    if (opt.probes) {
      dfrac.push_back(tg.back() * dbytes / (rep_bw * 1e9));
      pfrac.push_back(t * pflops / (rep_mm * 1e9));
    }
    say(strformat("rep %d/%d: pp%d %.2f tok/s, tg%d %.2f tok/s%s", rep + 1, opt.reps, P, t, N, tg.back(),
                  probes.bw.empty() ? "" : strformat(", bandwidth %.1f GB/s", probes.bw.back()).c_str()));
  }
  r.pp_tok_s = bench_stat(pp);
  r.tg_tok_s = bench_stat(tg);
  r.ttft_ms = bench_stat(ttft);
  r.bandwidth_gbs = bench_stat(probes.bw);
  r.matmul_gflops = bench_stat(probes.mm);
  r.decode_fraction_per_rep = bench_stat(dfrac);
  r.prefill_fraction_per_rep = bench_stat(pfrac);
  if (opt.probes) {
    r.bandwidth_source = probes.bandwidth_source();
    r.matmul_source = probes.matmul_source();
  }

  // Limits.
  double wbytes = 0;
  r.decode_bytes_per_token = decode_bytes_per_token(m, Dp + (N + 1) / 2.0, kv_elem, &wbytes);
  r.decode_weight_bytes = wbytes;
  r.decode_kv_bytes = r.decode_bytes_per_token - wbytes;
  r.decode_achieved_gbs = r.tg_tok_s.median * r.decode_bytes_per_token / 1e9;
  r.prefill_flops_per_token = m.arch->flops_per_token(c, P, Dp);
  r.prefill_achieved_gflops = r.pp_tok_s.median * r.prefill_flops_per_token / 1e9;
  if (!r.bandwidth_gbs.empty()) {
    r.decode_limit_tok_s = r.bandwidth_gbs.median * 1e9 / r.decode_bytes_per_token;
    r.decode_fraction = r.tg_tok_s.median / r.decode_limit_tok_s;
  }
  if (!r.matmul_gflops.empty()) {
    r.prefill_limit_tok_s = r.matmul_gflops.median * 1e9 / r.prefill_flops_per_token;
    r.prefill_fraction = r.pp_tok_s.median / r.prefill_limit_tok_s;
  }

  note_hwm();
  r.peak_rss_bytes = hwm;
  r.peak_rss_includes_probes = opt.probes && !hwm_resettable;
  return r;
}

// --- output ------------------------------------------------------------------------------

namespace {

std::string pm(const BenchStat& s, const char* fmt) {
  if (s.empty()) return "-";
  return strformat(fmt, s.mean) + " ± " + strformat(fmt, s.sd);
}

nlohmann::ordered_json stat_json(const BenchStat& s) {
  nlohmann::ordered_json j;
  j["mean"] = s.mean;
  j["sd"] = s.sd;
  j["median"] = s.median;
  j["min"] = s.min;
  j["max"] = s.max;
  j["samples"] = s.samples;
  return j;
}

}  // namespace

std::string bench_report_text(const BenchReport& r) {
  const BenchOptions& o = r.opt;
  std::ostringstream s;
  std::string types;  // each storage type's share of the bytes, when there are several
  for (const auto& [type, bytes] : r.weight_types) {
    if (r.weight_types.size() < 2) break;
    const double pct = 100.0 * double(bytes) / double(r.weight_bytes);  // norms: a sliver, not "0.0%"
    types += strformat("%s%s %s", types.empty() ? " (" : ", ", type.c_str(),
                       pct < 0.05 ? "<0.1%" : strformat("%.1f%%", pct).c_str());
  }
  if (!types.empty()) types += ")";
  s << strformat("model   %s (%s, %s, %.3f G params, %.3f GB of weights in %s%s)\n", r.model_path.c_str(),
                 r.arch.c_str(), r.format.c_str(), r.n_params / 1e9, r.weight_bytes / 1e9, r.weight_dtype.c_str(),
                 types.c_str());
  const std::string act = r.act_quant.empty() ? "" : ", activations rounded to " + r.act_quant;
  s << strformat("device  %s (compute %s%s), %d probe threads; host %s, %d cores; build %s\n",
                 r.device.c_str(), r.compute.c_str(), act.c_str(), r.threads, r.host_cpu.c_str(),
                 r.host_cores, r.build.c_str());
  s << strformat("state   %.2f MB on the device for %d positions (KV caches and scratch)\n", r.state_bytes / 1e6,
                 r.state_ctx);
  s << strformat("method  %d repetitions after 1 warm-up, interleaved with the limit probes; limits from medians\n\n",
                 o.reps);
  const std::string dsuf = o.depth > 0 ? strformat(" @ d%d", o.depth) : "";
  TextTable table({{"test", TextTable::Left}, {"mean ± sd"}, {"median"}, {"limit"}, {"fraction"}});
  auto row = [&](const std::string& name, const BenchStat& st, const char* unit, double limit, double frac) {
    table.row({name, pm(st, "%.2f") + " " + unit, strformat("%.2f", st.median),
               limit > 0 ? strformat("%.2f", limit) : "-", frac > 0 ? strformat("%.3f", frac) : "-"});
  };
  row(strformat("pp%d", o.n_prompt) + dsuf, r.pp_tok_s, "t/s", r.prefill_limit_tok_s, r.prefill_fraction);
  row(strformat("tg%d", o.n_gen) + dsuf, r.tg_tok_s, "t/s", r.decode_limit_tok_s, r.decode_fraction);
  row("first token", r.ttft_ms, "ms", 0, 0);
  // A trace's row holds its rate; what does not fit a column (rows, time, forward tokens, or
  // the error) follows the table, one line per trace.
  std::string trace_notes;
  for (const BenchTrace& t : r.traces) {
    const std::string name = "trace " + t.shape;
    if (!t.error.empty()) {
      table.row({name, "-", "-", "-", "-"});
      trace_notes += name + ": " + t.error + "\n";
      continue;
    }
    table.row({name, strformat("%.1f ± %.1f pos/s", t.positions_per_s_reps.mean, t.positions_per_s_reps.sd),
               strformat("%.1f", t.positions_per_s), "-", "-"});
    trace_notes += strformat("%s: %lld rows in %.3f s (median); forwards %.1f tok/s (%lld tokens)\n", name.c_str(),
                             (long long)t.rows, t.elapsed_s, t.forward_tokens_per_s, (long long)t.forward_tokens);
  }
  s << table.markdown() << trace_notes;
  s << "\nlimits measured in this run\n";
  if (!r.bandwidth_gbs.empty()) {
    s << strformat("  read bandwidth  %.2f GB/s median (min %.2f, max %.2f, %zu samples): %s\n",
                   r.bandwidth_gbs.median, r.bandwidth_gbs.min, r.bandwidth_gbs.max, r.bandwidth_gbs.samples.size(),
                   r.bandwidth_source.c_str());
    s << strformat("  matmul peak     %.1f GFLOP/s median (min %.1f, max %.1f): %s\n", r.matmul_gflops.median,
                   r.matmul_gflops.min, r.matmul_gflops.max, r.matmul_source.c_str());
  } else {
    s << "  (probes off)\n";
  }
  s << strformat("  decode   %.4f GB read per token (weights %.4f + KV cache %.4f at mean context %.1f)", r.decode_bytes_per_token / 1e9,
                 r.decode_weight_bytes / 1e9, r.decode_kv_bytes / 1e9, o.depth + (o.n_gen + 1) / 2.0);
  if (r.decode_limit_tok_s > 0)
    s << strformat(" -> limit %.2f tok/s; achieved %.2f tok/s = %.2f GB/s = %.3f of the limit\n", r.decode_limit_tok_s,
                   r.tg_tok_s.median, r.decode_achieved_gbs, r.decode_fraction);
  else
    s << strformat("; achieved %.2f GB/s\n", r.decode_achieved_gbs);
  s << strformat("  prefill  %.4f GFLOP per token (matmuls incl. the last position's logits + attention)",
                 r.prefill_flops_per_token / 1e9);
  if (r.prefill_limit_tok_s > 0)
    s << strformat(" -> limit %.2f tok/s; achieved %.2f tok/s = %.1f GFLOP/s = %.3f of the peak\n", r.prefill_limit_tok_s,
                   r.pp_tok_s.median, r.prefill_achieved_gflops, r.prefill_fraction);
  else
    s << strformat("; achieved %.1f GFLOP/s\n", r.prefill_achieved_gflops);
  if (!r.decode_fraction_per_rep.empty())
    s << strformat("  per repetition, against its own probes: decode fraction median %.3f (min %.3f, max %.3f), "
                   "prefill %.3f (min %.3f, max %.3f)\n",
                   r.decode_fraction_per_rep.median, r.decode_fraction_per_rep.min, r.decode_fraction_per_rep.max,
                   r.prefill_fraction_per_rep.median, r.prefill_fraction_per_rep.min,
                   r.prefill_fraction_per_rep.max);
  if (r.peak_rss_bytes >= 0)
    s << strformat("memory  peak RSS %.3f GB (VmHWM%s); device memory: not reported\n", r.peak_rss_bytes / 1e9,
                   r.peak_rss_includes_probes ? ", INCLUDES the 1 GiB bandwidth probe buffer" : ", probes excluded");
  return s.str();
}

std::string bench_report_json(const BenchReport& r) {
  using json = nlohmann::ordered_json;
  const BenchOptions& o = r.opt;
  json j;
  j["arbiter_bench"] = 1;
  j["build"] = r.build;
  j["model"] = {{"path", r.model_path}, {"arch", r.arch},           {"format", r.format},
                {"weight_dtype", r.weight_dtype}, {"params", r.n_params}, {"weight_bytes", r.weight_bytes},
                {"weight_type_bytes", json(std::map<std::string, uint64_t>(r.weight_types.begin(), r.weight_types.end()))},
                {"n_layer", r.n_layer}, {"d_model", r.d_model},    {"vocab", r.vocab}};
  j["device"] = {{"name", r.device}, {"compute", r.compute}, {"act_quant", r.act_quant},
                 {"threads", r.threads}, {"host_cpu", r.host_cpu}, {"host_cores", r.host_cores}};
  j["state"] = {{"bytes", r.state_bytes}, {"positions", r.state_ctx}};
  j["params"] = {{"n_prompt", o.n_prompt}, {"n_gen", o.n_gen}, {"reps", o.reps}, {"depth", o.depth}, {"warmup", 1}};
  j["pp"] = {{"tokens", o.n_prompt}, {"tok_s", stat_json(r.pp_tok_s)}};
  j["tg"] = {{"tokens", o.n_gen}, {"tok_s", stat_json(r.tg_tok_s)}};
  j["first_token_ms"] = stat_json(r.ttft_ms);
  j["memory"] = {{"peak_rss_bytes", r.peak_rss_bytes},
                 {"peak_rss_includes_probes", r.peak_rss_includes_probes},
                 {"device_bytes", nullptr}};
  json lim;
  lim["bandwidth_gbs"] = r.bandwidth_gbs.empty() ? json(nullptr) : stat_json(r.bandwidth_gbs);
  lim["bandwidth_source"] = r.bandwidth_source;
  lim["matmul_gflops"] = r.matmul_gflops.empty() ? json(nullptr) : stat_json(r.matmul_gflops);
  lim["matmul_source"] = r.matmul_source;
  lim["decode"] = {{"bytes_per_token", r.decode_bytes_per_token}, {"weight_bytes_per_token", r.decode_weight_bytes},
                   {"kv_bytes_per_token", r.decode_kv_bytes},    {"limit_tok_s", r.decode_limit_tok_s},
                   {"achieved_gbs", r.decode_achieved_gbs},     {"fraction", r.decode_fraction},
                   {"fraction_per_rep", r.decode_fraction_per_rep.empty() ? json(nullptr)
                                                                          : stat_json(r.decode_fraction_per_rep)}};
  lim["prefill"] = {{"flops_per_token", r.prefill_flops_per_token}, {"limit_tok_s", r.prefill_limit_tok_s},
                    {"achieved_gflops", r.prefill_achieved_gflops}, {"fraction", r.prefill_fraction},
                    {"fraction_per_rep", r.prefill_fraction_per_rep.empty() ? json(nullptr)
                                                                            : stat_json(r.prefill_fraction_per_rep)}};
  j["limits"] = lim;
  json tr = json::array();
  for (const BenchTrace& t : r.traces) {
    json x = {{"shape", t.shape},
              {"rows", t.rows},
              {"elapsed_s", t.elapsed_s},
              {"positions_per_s", t.positions_per_s},
              {"positions_per_s_reps", t.positions_per_s_reps.empty() ? json(nullptr) : stat_json(t.positions_per_s_reps)},
              {"forward_tokens", t.forward_tokens},
              {"forward_tokens_per_s", t.forward_tokens_per_s}};
    if (!t.error.empty()) x["error"] = t.error;
    tr.push_back(x);
  }
  j["traces"] = tr;
  return j.dump(2) + "\n";
}

BatchBenchResult run_batch_bench(const Model& m, Backend& be, int streams, const BenchOptions& opt) {
  ARB_CHECK(streams >= 1 && opt.n_prompt >= 1 && opt.n_gen >= 2 && opt.reps >= 1,
            "[bench] --concurrency %d with -p %d, -n %d, -r %d (need >= 1, >= 1, >= 2, >= 1)", streams, opt.n_prompt,
            opt.n_gen, opt.reps);
  using Clock = std::chrono::steady_clock;
  BatchingOptions bo;
  bo.slots = streams;
  bo.ctx = opt.n_prompt + opt.n_gen + 1;
  bo.queue_max = streams;
  bo.step_tokens = std::max(streams, 256);
  auto sched = make_batching_scheduler(m, be, bo);
  BatchBenchResult r;
  r.streams = streams;
  r.context = opt.n_prompt + opt.n_gen / 2.0;
  r.step_bytes = m.arch->weight_bytes_per_step(m, streams) +
                 streams * m.arch->state_bytes_per_token(m.config, r.context, kv_elem_bytes(be));
  r.flops_per_token = m.arch->flops_per_token(m.config, 1, int(r.context));
  // The compute peak of a device tier is its matmul at kPeakRows rows or more, not at S or
  // P: at a few rows the matmul is bound by the weights' bytes, and its rate there (cuda at
  // one row: ~0.4 TFLOP/s; qwen3-8b at 64: ~150 TFLOP/s) is no compute limit.
  constexpr int kPeakRows = 1024;
  LimitProbes probes(m, be, is_host_tier(be.device_name()), resolve_threads(opt.threads),
                     std::max({streams, opt.n_prompt, kPeakRows}));
  auto limits = [&](double bw_gbs, double peak_gflops) {
    return std::make_pair(streams * bw_gbs * 1e9 / r.step_bytes, peak_gflops * 1e9 / r.flops_per_token);
  };
  std::vector<double> ttft, decode, fraction;
  for (int rep = 0; rep <= opt.reps; ++rep) {
    double rep_bw = 0, rep_peak = 0;
    if (opt.probes && rep > 0) std::tie(rep_bw, rep_peak) = probes.run();
    std::vector<std::shared_ptr<SeqStream>> ss;
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < streams; ++i) {
      SeqRequest r;
      r.prompt = bench_ids(opt.seed + uint64_t(i) * 7919, opt.n_prompt, m.config.vocab);
      r.max_tokens = opt.n_gen;
      r.sampling.temperature = 0;
      ss.push_back(sched->submit(std::move(r)));
      ARB_CHECK(ss.back() != nullptr, "[bench] the scheduler refused stream %d", i);
    }
    // Each stream's token arrival times, read by a thread of its own.
    std::vector<std::vector<Clock::time_point>> at(static_cast<size_t>(streams));
    std::vector<std::string> errors(static_cast<size_t>(streams));
    std::vector<std::thread> readers;
    for (int i = 0; i < streams; ++i)
      readers.emplace_back([&, i] {
        while (true) {
          std::optional<SeqEvent> e = ss[size_t(i)]->next(std::chrono::seconds(600));
          if (!e) {
            errors[size_t(i)] = "no event in 600 s";
            return;
          }
          if (e->kind == SeqEvent::Kind::Token) at[size_t(i)].push_back(Clock::now());
          if (e->kind == SeqEvent::Kind::Finished) {
            if (e->finish == FinishReason::Error) errors[size_t(i)] = e->error;
            return;
          }
        }
      });
    for (std::thread& t : readers) t.join();
    for (const std::string& e : errors) ARB_CHECK(e.empty(), "[bench] a stream failed: %s", e.c_str());
    Clock::time_point all_first = t0, last = t0;
    double ttft_sum = 0;
    for (const auto& a : at) {
      ARB_CHECK(int(a.size()) == opt.n_gen, "[bench] a stream gave %zu of %d tokens", a.size(), opt.n_gen);
      all_first = std::max(all_first, a.front());
      last = std::max(last, a.back());
      ttft_sum += std::chrono::duration<double, std::milli>(a.front() - t0).count();
    }
    int64_t after = 0;
    for (const auto& a : at)
      for (const Clock::time_point& t : a) after += t > all_first;
    const double span = std::chrono::duration<double>(last - all_first).count();
    if (rep == 0) continue;  // warm-up
    ttft.push_back(ttft_sum / streams);
    decode.push_back(span > 0 ? double(after) / span : 0);
    if (opt.probes) {
      const auto [bw_limit, compute_limit] = limits(rep_bw, rep_peak);
      fraction.push_back(decode.back() / std::min(bw_limit, compute_limit));
    }
  }
  r.ttft_ms = bench_stat(ttft);
  r.decode_tok_s = bench_stat(decode);
  if (opt.probes) {
    r.bandwidth_gbs = bench_stat(probes.bw);
    r.peak_gflops = bench_stat(probes.mm);
    r.bandwidth_source = probes.bandwidth_source();
    r.peak_source = probes.matmul_source();
    std::tie(r.bandwidth_limit_tok_s, r.compute_limit_tok_s) = limits(r.bandwidth_gbs.median, r.peak_gflops.median);
    const bool bw_binds = r.bandwidth_limit_tok_s <= r.compute_limit_tok_s;
    r.bound = bw_binds ? "bandwidth" : "compute";
    r.fraction = r.decode_tok_s.median / (bw_binds ? r.bandwidth_limit_tok_s : r.compute_limit_tok_s);
    r.fraction_per_rep = bench_stat(fraction);
  }
  return r;
}

std::string batch_bench_json(const std::vector<BatchBenchResult>& levels, const BenchOptions& opt,
                             const std::string& device) {
  using json = nlohmann::ordered_json;
  json lv = json::array();
  for (const BatchBenchResult& r : levels) {
    json x = {{"streams", r.streams},
              {"ttft_ms", stat_json(r.ttft_ms)},
              {"decode_tok_s", stat_json(r.decode_tok_s)},
              {"context", r.context},
              {"step_bytes", r.step_bytes},
              {"flops_per_token", r.flops_per_token}};
    if (!r.bound.empty()) {
      x["limits"] = {{"bandwidth_gbs", stat_json(r.bandwidth_gbs)},
                     {"bandwidth_source", r.bandwidth_source},
                     {"peak_gflops", stat_json(r.peak_gflops)},
                     {"peak_source", r.peak_source},
                     {"bandwidth_limit_tok_s", r.bandwidth_limit_tok_s},
                     {"compute_limit_tok_s", r.compute_limit_tok_s},
                     {"bound", r.bound},
                     {"fraction", r.fraction},
                     {"fraction_per_rep", stat_json(r.fraction_per_rep)}};
    }
    lv.push_back(x);
  }
  return json{{"schema", "arbiter-bench-concurrency"},
              {"version", 1},
              {"model", opt.model_path},
              {"device", device},
              {"n_prompt", opt.n_prompt},
              {"n_gen", opt.n_gen},
              {"reps", opt.reps},
              {"levels", lv}}
             .dump(2) + "\n";
}

}  // namespace arbiter
