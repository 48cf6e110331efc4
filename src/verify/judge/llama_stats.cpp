#include "verify/judge/llama_stats.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace arbiter::verify {

namespace {

// llama.cpp's mean_and_uncertainty: the mean and its standard error (0 below 11 rows).
ValueUnc mean_unc(double sum, double sum2, int64_t n) {
  if (n < 1) return {};
  const double f = sum / double(n);
  const double d = sum2 / double(n) - f * f;
  return {f, d > 0 && n > 10 ? std::sqrt(d / double(n - 1)) : 0.0};
}

// llama.cpp's covariance of two sums' means (0 below 10 rows).
double covariance(double a, double b, double ab, int64_t n) {
  if (n < 10) return 0;
  return (ab / double(n) - (a / double(n)) * (b / double(n))) / double(n - 1);
}

// Linear interpolation between the sorted values, as llama.cpp's percentile().
double percentile(const std::vector<float>& v, double fraction) {
  if (fraction <= 0) return v.front();
  if (fraction >= 1) return v.back();
  double p = fraction * double(v.size() - 1);
  const size_t ip = size_t(p);
  p -= double(ip);
  return (1 - p) * v[ip] + p * v[std::min(ip + 1, v.size() - 1)];
}

double median(const std::vector<float>& v) {
  const size_t n = v.size();
  return n % 2 == 0 ? 0.5 * (double(v[n / 2]) + double(v[n / 2 - 1])) : double(v[n / 2]);
}

std::vector<std::pair<double, double>> summary(std::vector<float> v, const std::vector<double>& fractions) {
  std::sort(v.begin(), v.end());
  std::vector<std::pair<double, double>> out;
  for (double f : fractions) out.emplace_back(f, f == 0.5 ? median(v) : percentile(v, f));
  return out;
}

}  // namespace

void LlamaKld::add(const float* base, const float* logits, int n_vocab, int32_t target) {
  ARB_CHECK(n_vocab > 0 && target >= 0 && target < n_vocab, "[kld] target %d outside [0, %d)", target, n_vocab);
  double max_logit = logits[0];
  int imax = 0;
  for (int i = 1; i < n_vocab; ++i)
    if (logits[i] > max_logit) {
      max_logit = logits[i];
      imax = i;
    }
  double sum_exp = 0;
  for (int i = 0; i < n_vocab; ++i) sum_exp += std::exp(double(logits[i]) - max_logit);
  const double lse = max_logit + std::log(sum_exp);
  const double nll = lse - logits[target];
  const double nll_base = -double(base[target]);
  int imax_base = 0;
  double kld = 0;
  for (int i = 0; i < n_vocab; ++i) {
    if (base[i] > base[imax_base]) imax_base = i;
    if (base[i] > -16.f) kld += std::exp(double(base[i])) * (double(base[i]) - (double(logits[i]) - lse));
  }
  const double dp = std::exp(-nll) - std::exp(-nll_base);
  sum_nll_ += nll;
  sum_nll2_ += nll * nll;
  sum_nll_base_ += nll_base;
  sum_nll_base2_ += nll_base * nll_base;
  sum_nll_nll_base_ += nll * nll_base;
  sum_kld_ += kld;
  sum_kld2_ += kld * kld;
  sum_dp_ += dp;
  sum_dp2_ += dp * dp;
  sum_dp4_ += dp * dp * dp * dp;
  same_top_ += imax == imax_base;
  ++count_;
  kld_values_.push_back(float(kld));
  dp_values_.push_back(float(dp));
}

LlamaKldStats LlamaKld::finish() const {
  ARB_CHECK(count_ > 0, "[kld] no rows to summarise");
  LlamaKldStats s;
  const int64_t n = count_;
  s.count = n;
  const ValueUnc lp = mean_unc(sum_nll_, sum_nll2_, n), lb = mean_unc(sum_nll_base_, sum_nll_base2_, n);
  s.ppl = {std::exp(lp.value), std::exp(lp.value) * lp.unc};
  s.ppl_base = {std::exp(lb.value), std::exp(lb.value) * lb.unc};
  const double cov = covariance(sum_nll_, sum_nll_base_, sum_nll_nll_base_, n);
  s.cor_ln_ppl = lp.unc > 0 && lb.unc > 0 ? cov / (lp.unc * lb.unc) : 0;
  const double ratio_var = lp.unc * lp.unc + lb.unc * lb.unc - 2 * cov;
  s.ln_ppl_ratio = {lp.value - lb.value, std::sqrt(std::max(ratio_var, 0.0))};
  s.ppl_ratio = {std::exp(s.ln_ppl_ratio.value), std::exp(s.ln_ppl_ratio.value) * s.ln_ppl_ratio.unc};
  const double diff_var = s.ppl.unc * s.ppl.unc + s.ppl_base.unc * s.ppl_base.unc - 2 * s.ppl.value * s.ppl_base.value * cov;
  s.ppl_diff = {s.ppl.value - s.ppl_base.value, std::sqrt(std::max(diff_var, 0.0))};
  s.kld = mean_unc(sum_kld_, sum_kld2_, n);
  s.dp = mean_unc(sum_dp_, sum_dp2_, n);
  const ValueUnc mse = mean_unc(sum_dp2_, sum_dp4_, n);
  const double rms = std::sqrt(mse.value);
  s.rms_dp = {rms, rms > 0 ? 0.5 / rms * mse.unc : 0.0};
  const double top = double(same_top_) / double(n);
  s.same_top = {top, n > 1 ? std::sqrt(top * (1 - top) / double(n - 1)) : 0.0};
  s.kld_percentiles = summary(kld_values_, {1, 0.999, 0.99, 0.95, 0.9, 0.5, 0.1, 0.05, 0.01, 0.001, 0});
  s.dp_percentiles = summary(dp_values_, {1, 0.999, 0.99, 0.95, 0.9, 0.75, 0.5, 0.25, 0.1, 0.05, 0.01, 0.001, 0});
  return s;
}

namespace {

std::string label(double f) {
  if (f == 1) return "Maximum";
  if (f == 0) return "Minimum";
  if (f == 0.5) return "Median ";
  return strformat("%4.1f%%  ", 100 * f);
}

}  // namespace

std::string format_llama_kld(const LlamaKldStats& s) {
  std::string o = strformat("llama-perplexity statistics over %lld rows (llama.cpp prints them from 100 rows)\n",
                            (long long)s.count);
  o += strformat("Mean PPL(Q)                   : %10.6f ± %10.6f\n", s.ppl.value, s.ppl.unc);
  o += strformat("Mean PPL(base)                : %10.6f ± %10.6f\n", s.ppl_base.value, s.ppl_base.unc);
  o += strformat("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100 * s.cor_ln_ppl);
  o += strformat("Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f\n", s.ln_ppl_ratio.value, s.ln_ppl_ratio.unc);
  o += strformat("Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f\n", s.ppl_ratio.value, s.ppl_ratio.unc);
  o += strformat("Mean PPL(Q)-PPL(base)         : %10.6f ± %10.6f\n", s.ppl_diff.value, s.ppl_diff.unc);
  o += strformat("Mean    KLD: %10.6f ± %10.6f\n", s.kld.value, s.kld.unc);
  for (const auto& [f, v] : s.kld_percentiles) o += strformat("%s KLD: %10.6f\n", label(f).c_str(), v);
  o += strformat("Mean    Δp: %6.3f ± %5.3f %%\n", 100 * s.dp.value, 100 * s.dp.unc);
  for (const auto& [f, v] : s.dp_percentiles) o += strformat("%s Δp: %6.3f%%\n", label(f).c_str(), 100 * v);
  o += strformat("RMS Δp    : %6.3f ± %5.3f %%\n", 100 * s.rms_dp.value, 100 * s.rms_dp.unc);
  o += strformat("Same top p: %6.3f ± %5.3f %%\n", 100 * s.same_top.value, 100 * s.same_top.unc);
  return o;
}

nlohmann::json to_json(const LlamaKldStats& s) {
  auto vu = [](const ValueUnc& x) { return nlohmann::json{{"value", x.value}, {"se", x.unc}}; };
  auto pct = [](const std::vector<std::pair<double, double>>& p) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& [f, v] : p) j.push_back({{"fraction", f}, {"value", v}});
    return j;
  };
  return {{"rows", s.count},          {"ppl", vu(s.ppl)},
          {"ppl_base", vu(s.ppl_base)}, {"cor_ln_ppl", s.cor_ln_ppl},
          {"ln_ppl_ratio", vu(s.ln_ppl_ratio)}, {"ppl_ratio", vu(s.ppl_ratio)},
          {"ppl_diff", vu(s.ppl_diff)}, {"kld", vu(s.kld)},
          {"kld_percentiles", pct(s.kld_percentiles)}, {"delta_p", vu(s.dp)},
          {"delta_p_percentiles", pct(s.dp_percentiles)}, {"rms_delta_p", vu(s.rms_dp)},
          {"same_top_p", vu(s.same_top)}};
}

}  // namespace arbiter::verify
