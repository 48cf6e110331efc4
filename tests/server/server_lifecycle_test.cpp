// Server start and stop (src/server/server.h) without a model: a stop right after start, as
// when serve refuses a bad option after binding, must return rather than leave the listener
// running forever.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <thread>
#include <unistd.h>

#include "server/server.h"

namespace arbiter::server {
namespace {

TEST(ServerLifecycle, StopRightAfterStartReturns) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread([&done] {
    for (int i = 0; i < 200; ++i) {
      ServerOptions o;
      o.port = 0;
      o.http_threads = 2;
      Server s(o);
      s.start();
      s.stop();
    }
    done.set_value();
  }).detach();
  if (finished.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    // The hung listener cannot be joined: report and leave without unwinding into it.
    std::fprintf(stderr, "FAILED: Server::stop() right after start() did not return within 60 s\n");
    std::fflush(stderr);
    ::_exit(1);
  }
}

}  // namespace
}  // namespace arbiter::server
