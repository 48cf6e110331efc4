// HTTP plumbing of `arbiter serve`: routes, authentication, readiness, OpenAI error JSON for
// every failure httplib itself detects (unknown path, oversized body), /v1/models, /health,
// /metrics. The generation endpoints are in openai_api.cpp.
#include <httplib.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "server/server_impl.h"
#include "tokenizer/jinja.h"

namespace arbiter::server {

json error_json(const ApiError& e) {
  const char* type = e.status == 401   ? "authentication_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 503 ? "unavailable_error"
                     : e.status >= 500 ? "server_error"
                                       : "invalid_request_error";
  json err = {{"message", e.message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

static void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_json(e)), "application/json");
}

Server::Server(ServerOptions opt) : opt_(std::move(opt)), http_(std::make_unique<httplib::Server>()), impl_(std::make_unique<Impl>()) {
  impl_->opt = opt_;
}

Server::~Server() { stop(); }

void Server::set_ready(const Model& m, Scheduler& sched, const ChatTemplate* tpl) {
  impl_->model = &m;
  impl_->sched = &sched;
  impl_->tpl = tpl;
  impl_->ready = true;
}

void Server::stop() {
  impl_->stopping = true;
  if (!listener_.joinable()) return;
  // httplib's stop() does nothing before listen has begun, and the listener would then run
  // forever: a bad --ctx refused right after start() hit that race on a loaded machine.
  while (!listener_done_ && !http_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();
  listener_.join();
}

void Server::start() {
  Impl& I = *impl_;
  int threads = opt_.http_threads;
  if (threads <= 0) threads = 64;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_->set_payload_max_length(opt_.max_body);
  http_->set_keep_alive_max_count(100);
  // Tokens stream as small writes: TCP_NODELAY sends each at once instead of holding it
  // until the client acknowledges the previous one (Nagle's algorithm).
  http_->set_tcp_nodelay(true);

  // Every status >= 400 without a body (httplib's own 404 and 413) gets OpenAI's error JSON.
  http_->set_error_handler([&I](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e{res.status, "", "", ""};
    if (res.status == 404) e.message = "no route for " + req.method + " " + req.path;
    else if (res.status == 413)
      e.message = "request body larger than the server's limit of " + std::to_string(I.opt.max_body) + " bytes";
    else e.message = "HTTP error " + std::to_string(res.status);
    send_error(res, e);
    I.metrics.request(req.path, res.status);
  });
  http_->set_exception_handler([&I](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    send_error(res, {500, "internal error: " + what, "", ""});
    I.metrics.request(req.path, 500);
  });

  http_->Get("/health", [&I](const httplib::Request& req, httplib::Response& res) {
    if (!I.ready) {
      send_error(res, {503, "loading model", "", ""});
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
    I.metrics.request(req.path, res.status == -1 ? 200 : res.status);
  });
  http_->Get("/metrics", [&I](const httplib::Request& req, httplib::Response& res) {
    Scheduler::Stats st = I.sched && I.ready ? I.sched->stats() : Scheduler::Stats{};
    res.set_content(I.metrics.render(st), "text/plain; version=0.0.4");
    I.metrics.request(req.path, 200);
  });

  // The guard every /v1 endpoint passes: the key, readiness; errors become OpenAI's JSON.
  using Body = std::function<void(const httplib::Request&, httplib::Response&, Clock::time_point)>;
  auto api = [&I](Body body) {
    return [&I, body](const httplib::Request& req, httplib::Response& res) {
      const auto t0 = Clock::now();
      try {
        if (!I.opt.api_key.empty() && req.get_header_value("Authorization") != "Bearer " + I.opt.api_key)
          throw ApiError{401, "invalid or missing API key (Authorization: Bearer KEY)", "", "invalid_api_key"};
        if (!I.ready) throw ApiError{503, "loading model", "", ""};
        body(req, res, t0);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const jinja::RaiseError& e) {
        send_error(res, {400, std::string("chat template: ") + e.what(), "messages", ""});
      } catch (const Error& e) {
        send_error(res, {400, e.what(), "", ""});
      }
      I.metrics.request(req.path, res.status == -1 ? 200 : res.status);  // httplib sets 200 later
    };
  };
  // The generation endpoints take a JSON object.
  using Generate = void (Impl::*)(const json&, const httplib::Request&, httplib::Response&, Clock::time_point);
  auto with_json = [&I](Generate g) {
    return [&I, g](const httplib::Request& req, httplib::Response& res, Clock::time_point t0) {
      const json body = parse_request_body(req.body);
      (I.*g)(body, req, res, t0);
    };
  };
  http_->Get("/v1/models", api([&I](const httplib::Request&, httplib::Response& res, Clock::time_point) {
    json data = json::array();
    data.push_back({{"id", I.opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "arbiter"},
                    {"max_model_len", I.sched->max_ctx()}});
    res.set_content(dump({{"object", "list"}, {"data", data}}), "application/json");
  }));
  http_->Post("/v1/completions", api(with_json(&Impl::completions)));
  http_->Post("/v1/chat/completions", api(with_json(&Impl::chat)));

  port_ = opt_.port == 0 ? http_->bind_to_any_port(opt_.host) : (http_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  ARB_CHECK(port_ > 0, "[serve] cannot listen on %s:%d (in use, or not an address of this machine)", opt_.host.c_str(),
            opt_.port);
  listener_ = std::thread([this] {
    http_->listen_after_bind();
    listener_done_ = true;
  });
}

}  // namespace arbiter::server
