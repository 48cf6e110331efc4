// What server.cpp (HTTP plumbing) and openai_api.cpp (the two generation endpoints) share.
// Private to src/server/.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "server/requests.h"
#include "server/server.h"

namespace httplib {
struct Request;
struct Response;
}

namespace arbiter::server {

using Clock = std::chrono::steady_clock;

/// OpenAI's error object for e.
json error_json(const ApiError& e);

struct Server::Impl {
  ServerOptions opt;
  Metrics metrics;
  std::atomic<bool> ready{false}, stopping{false};
  const Model* model = nullptr;
  Scheduler* sched = nullptr;
  const ChatTemplate* tpl = nullptr;
  std::atomic<int64_t> next_id{1};

  void completions(const json& body, const httplib::Request& req, httplib::Response& res, Clock::time_point t0);
  void chat(const json& body, const httplib::Request& req, httplib::Response& res, Clock::time_point t0);
  /// What this server checks requests against.
  RequestLimits limits() const;
};

}  // namespace arbiter::server
