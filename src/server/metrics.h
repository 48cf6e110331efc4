// Counters, gauges and histograms of the server in Prometheus' text exposition format
// (GET /metrics). Thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/scheduler.h"

namespace arbiter::server {

class Metrics {
 public:
  void request(const std::string& endpoint, int status);
  void tokens(int64_t prompt, int64_t generated);
  void time_to_first_token(double seconds);
  void inter_token_latency(double seconds);
  /// The whole exposition; the scheduler's gauges (queue, sequences, and under continuous
  /// batching the paged KV pool, preemptions, batched forwards) come from st at scrape time.
  std::string render(const Scheduler::Stats& st) const;

 private:
  struct Histogram {
    std::vector<double> bounds;
    std::vector<int64_t> counts;  // per bound, not cumulative; one more for +Inf
    double sum = 0;
    int64_t n = 0;
    void observe(double v);
  };
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}, {}, 0, 0};
  Histogram itl_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}, {}, 0, 0};
};

}  // namespace arbiter::server
