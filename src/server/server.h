// `arbiter serve`: an OpenAI-compatible HTTP server (cpp-httplib) over a Scheduler
// (engine/scheduler.h). Endpoints and parameters: docs/serve.md. The server binds first and
// answers GET /health with 503 until set_ready() hands it the loaded model; errors are
// OpenAI's error JSON. Nothing here prints to stdout.
#pragma once
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "engine/scheduler.h"
#include "model/model.h"
#include "server/metrics.h"
#include "tokenizer/chat_template.h"

namespace httplib {
class Server;
}

namespace arbiter::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (see Server::port())
  std::string api_key;  // empty: no authentication
  std::string model_name;  // what /v1/models lists and requests must name
  size_t max_body = size_t(1) << 20;  // bytes; larger bodies get 413
  int max_logprobs = 20;              // the largest top-N a request may ask for
  int http_threads = 0;               // 0: enough for every slot and queue place, + 8
};

class Server {
 public:
  explicit Server(ServerOptions opt);
  ~Server();
  /// Binds host:port and starts answering (health 503 until set_ready). Throws arbiter::Error
  /// when the address cannot be bound.
  void start();
  /// The model is loaded: serve it. The objects must outlive the server; tpl may be null
  /// (chat requests then get 400 naming the missing template).
  void set_ready(const Model& m, Scheduler& sched, const ChatTemplate* tpl);
  /// Stops accepting, finishes the listener thread. Idempotent.
  void stop();
  int port() const { return port_; }

  struct Impl;

 private:
  ServerOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<Impl> impl_;
  std::thread listener_;
  std::atomic<bool> listener_done_{false};
  int port_ = 0;
};

}  // namespace arbiter::server
