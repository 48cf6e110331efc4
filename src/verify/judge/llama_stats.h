// The statistics `llama-perplexity --kl-divergence` prints for a candidate against a base
// (tools/perplexity/perplexity.cpp of llama.cpp), computed as it defines them, so that
// users of llama.cpp read the numbers they know: PPL of each side and their ratio, mean KLD
// with its standard error and percentiles, the target token's probability difference Δp,
// and how often the two sides' top tokens agree.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace arbiter::verify {

struct ValueUnc {
  double value = 0, unc = 0;
};

struct LlamaKldStats {
  int64_t count = 0;
  ValueUnc ppl, ppl_base, ln_ppl_ratio, ppl_ratio, ppl_diff;
  double cor_ln_ppl = 0;  // correlation of the two sides' ln PPL
  ValueUnc kld;           // mean KLD(base || candidate), nats
  ValueUnc dp;            // mean Δp = p(target) - p_base(target)
  ValueUnc rms_dp;
  ValueUnc same_top;      // fraction of rows whose argmax agrees
  // {fraction, value}: maximum, 99.9 %, 99 %, ... 0.1 %, minimum as llama.cpp lists them
  std::vector<std::pair<double, double>> kld_percentiles, dp_percentiles;
};

/// Accumulates rows: base log-probabilities (a KLD file's row, or a log-softmax of logits)
/// against the candidate's logits (normalised here, as llama.cpp does). Base entries below
/// -16 take no part in the KLD sum, as in llama.cpp.
class LlamaKld {
 public:
  void add(const float* base_logprobs, const float* logits, int n_vocab, int32_t target);
  /// Needs at least one row; llama.cpp prints the summary only from 100 rows.
  LlamaKldStats finish() const;

 private:
  double sum_nll_ = 0, sum_nll2_ = 0, sum_nll_base_ = 0, sum_nll_base2_ = 0, sum_nll_nll_base_ = 0;
  double sum_kld_ = 0, sum_kld2_ = 0, sum_dp_ = 0, sum_dp2_ = 0, sum_dp4_ = 0;
  int64_t same_top_ = 0, count_ = 0;
  std::vector<float> kld_values_, dp_values_;
};

/// The summary in llama-perplexity's wording and units.
std::string format_llama_kld(const LlamaKldStats& s);
nlohmann::json to_json(const LlamaKldStats& s);

}  // namespace arbiter::verify
