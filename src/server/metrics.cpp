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

std::string Metrics::render(const Scheduler::Stats& st) const {
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
  auto line = [&](const char* name, const char* type, const char* help, int64_t v) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    o += std::string(name) + " " + std::to_string(v) + "\n";
  };
  line("arbiter_queue_depth", "gauge",
       "Sequences waiting for a slot (continuous batching: preempted ones included).", st.queued);
  line("arbiter_active_sequences", "gauge", "Sequences holding a slot (running).", st.active);
  line("arbiter_slots", "gauge", "Slots (--parallel).", st.slots);
  line("arbiter_batch_size", "gauge", "Sequences advanced by the last engine round.", st.last_batch);
  if (st.kv_blocks > 0) {  // continuous batching: the paged KV pool and the batched forwards
    line("arbiter_kv_blocks", "gauge", "Blocks of the paged KV pool (--kv-blocks), 16 positions each.",
         st.kv_blocks);
    line("arbiter_kv_blocks_used", "gauge", "KV blocks held by sequences.", st.kv_blocks - st.kv_free);
    line("arbiter_kv_blocks_free", "gauge", "KV blocks free.", st.kv_free);
    line("arbiter_preemptions_total", "counter",
         "Sequences preempted for KV blocks (freed, to be recomputed), so far.", st.preempted);
    line("arbiter_batch_rows", "gauge", "Token rows of the last batched forward (decode rows and prefill chunks).",
         st.last_rows);
    line("arbiter_batched_forwards_total", "counter", "Batched forwards run so far.", st.steps);
  }
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
