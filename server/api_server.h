// The HTTP side of `linnet-tp serve` (world rank 0 only): cpp-httplib's server on its own
// threads behind the connection layer of server/http/http_front.h (which owns the sockets,
// frames each request and bounds connections and the time each part of a request may
// take), routes of OpenAI's API, /health, /metrics. Handlers parse and tokenize on
// their own thread (Tokenizer and ChatTemplate are safe to share), submit the choices to
// the RequestQueue and write what their ServeChannel brings, as one JSON body or as
// Server-Sent Events; they never call MPI or the engine. A client that goes away (a
// failed write, or a closed socket seen while waiting) abandons its channel, and the
// engine cancels its choices at the next step.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/openai_api.h"
#include "requests/request_queue.h"
#include "requests/serve_metrics.h"

namespace linnet {

class FrontedServer;

/// Settings of the HTTP server.
struct HttpConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port (ApiServer::bind returns it)
  std::string api_key;             // empty: no authentication
  int64_t max_body_bytes = 8 << 20;  // larger bodies get 413
  int64_t threads = 64;            // handler threads of POST requests: answered at once
  int64_t timeout_s = 30;          // a body within this of its head; one write of a response;
                                   // the wait for the engine to take a request in
  int64_t header_timeout_s = 10;   // a request's first byte to the end of its head
  int64_t keep_alive_timeout_s = 5;  // idle between requests (and before the first)
  int64_t max_open_connections = 1024;  // the idle longest makes room; none idle: 503
};

/// The model facts the routes need once it is loaded.
struct ServedModel {
  ApiModel api;
  ApiLimits limits;
  std::vector<int64_t> eos;        // the model's EOS ids
};

struct ApiServerState;  // the routes' shared state (server/api_server.cpp)

/// cpp-httplib's server with linnet-tp's routes.
class ApiServer {
 public:
  /// `health` (may be null) adds the engine's stall check to /health.
  ApiServer(HttpConfig config, RequestQueue& queue, ServeMetrics& metrics, const ServeHealth* health = nullptr);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  /// Binds the listening socket. Returns the port (the chosen one for port 0).
  /// @throws Error naming host:port when it cannot bind.
  int bind();
  /// Starts answering on a thread of its own (SIGINT / SIGTERM blocked there, so the
  /// main thread gets them). Until ready(), /health and the API answer 503.
  void start();
  /// The model is loaded: the API answers from now on.
  void ready(ServedModel model);
  /// A stop signal arrived: new generation requests get 503 from now on (they do once
  /// any stop handler of driver/job.h has caught one), responses say Connection: close.
  void drain();
  /// Waits up to `timeout` for the responses still being written (their requests have
  /// ended in the engine), then stops listening and joins the server's threads.
  void stop(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

 private:
  std::unique_ptr<ApiServerState> state_;
  std::unique_ptr<FrontedServer> server_;
  std::thread thread_;
  std::atomic<bool> draining_{false};
  int listen_fd_ = -1;
};

}  // namespace linnet
