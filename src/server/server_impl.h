// What server.cpp (HTTP plumbing) and openai_api.cpp (the two generation endpoints) share.
// Private to src/server/.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "server/server.h"

namespace httplib {
struct Request;
struct Response;
}

namespace arbiter::server {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

/// A request the server refuses: the status and OpenAI's error fields.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the offending field, or ""
  std::string code;   // e.g. "context_length_exceeded", or ""
};

/// OpenAI's error object for e.
json error_json(const ApiError& e);
/// json::dump that never throws on invalid UTF-8 (token pieces may hold partial characters).
std::string dump(const json& j);

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
};

}  // namespace arbiter::server
