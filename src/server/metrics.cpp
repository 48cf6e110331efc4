#include "server/metrics.h"

#include <cstdio>

namespace arbiter::server {

void Metrics::Histogram::observe(double v) {
  if (counts.empty()) counts.assign(bounds.size() + 1, 0);
  size_t k = 0;
  while (k < bounds.size() && v > bounds[k]) ++k;
  ++counts[k];
  sum += v;
  ++n;
}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lk(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::time_to_first_token(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  ttft_.observe(s);
}

void Metrics::inter_token_latency(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  itl_.observe(s);
}

static std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

std::string Metrics::render(int queued, int active, int slots, int last_batch) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string o;
  o += "# HELP arbiter_requests_total HTTP requests by endpoint and status.\n# TYPE arbiter_requests_total counter\n";
  for (const auto& [k, v] : requests_)
    o += "arbiter_requests_total{endpoint=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"} " +
         std::to_string(v) + "\n";
  o += "# HELP arbiter_prompt_tokens_total Prompt tokens of accepted requests.\n# TYPE arbiter_prompt_tokens_total counter\n";
  o += "arbiter_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
  o += "# HELP arbiter_generation_tokens_total Tokens generated.\n# TYPE arbiter_generation_tokens_total counter\n";
  o += "arbiter_generation_tokens_total " + std::to_string(generated_tokens_) + "\n";
  o += "# HELP arbiter_queue_depth Sequences waiting for a slot.\n# TYPE arbiter_queue_depth gauge\n";
  o += "arbiter_queue_depth " + std::to_string(queued) + "\n";
  o += "# HELP arbiter_active_sequences Sequences holding a slot.\n# TYPE arbiter_active_sequences gauge\n";
  o += "arbiter_active_sequences " + std::to_string(active) + "\n";
  o += "# HELP arbiter_slots Slots (--parallel).\n# TYPE arbiter_slots gauge\n";
  o += "arbiter_slots " + std::to_string(slots) + "\n";
  o += "# HELP arbiter_batch_size Sequences advanced by the last engine round.\n# TYPE arbiter_batch_size gauge\n";
  o += "arbiter_batch_size " + std::to_string(last_batch) + "\n";
  auto hist = [&](const char* name, const char* help, const Histogram& h) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
    int64_t cum = 0;
    for (size_t k = 0; k < h.bounds.size(); ++k) {
      cum += h.counts.empty() ? 0 : h.counts[k];
      o += std::string(name) + "_bucket{le=\"" + num(h.bounds[k]) + "\"} " + std::to_string(cum) + "\n";
    }
    o += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(h.n) + "\n";
    o += std::string(name) + "_sum " + num(h.sum) + "\n";
    o += std::string(name) + "_count " + std::to_string(h.n) + "\n";
  };
  hist("arbiter_time_to_first_token_seconds", "From request arrival to the first generated token.", ttft_);
  hist("arbiter_inter_token_latency_seconds", "Between consecutive tokens of one sequence.", itl_);
  return o;
}

}  // namespace arbiter::server
