// The connections of `serve`'s HTTP server, in front of cpp-httplib (Debian's 0.11).
//
// httplib gives every connection a thread of its pool for as long as it is open, reading
// the request's head with a per-read timeout, so a few hundred clients that connect and
// send nothing (or a header byte every few seconds) hold every thread and real requests
// wait. Here httplib's accept loop hands each connection over at once (its task queue
// runs the hand-over inline, and process_and_close_socket is overridden), and one
// reactor thread (epoll) owns every connection that is not being answered: it reads the
// bytes as they come and frames each request (server/http/http_framing.h), with a deadline
// for the head (--header-timeout, from its first byte), one for the body
// (--timeout, from the end of the head) and one for the wait between requests
// (--keep-alive-timeout); a framing error or a passed deadline is answered (400, 408,
// 413, 431, ...) and the connection closed. Only a complete request takes a handler
// thread: POST requests one of `api_threads`, the others (GET /health, /metrics,
// /v1/models) one of `light_threads`, so a full pool of streams never delays /health.
// httplib's process_request answers it from a stream over the framed bytes, then the
// connection goes back to the reactor, whose buffer may already hold the next request
// (pipelining: answered in order).
//
// At most `max_open` connections are open; when a new one would pass that, the
// connection idle longest (no byte of a request yet, or lingering after its close) is
// closed to make room, and when none is idle the new one is answered 503 and closed at
// once: a connection never waits unseen in a queue.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <httplib.h>

#include "server/http/http_framing.h"

namespace linnet {

/// Limits of the connection layer.
struct FrontConfig {
  int64_t max_open = 1024;           // connections open at once
  double header_timeout_s = 10;      // a request's first byte to the end of its head
  double body_timeout_s = 30;        // the end of the head to the end of the body
  double keep_alive_timeout_s = 5;   // idle before a request (also a new connection's first)
  int64_t keep_alive_max = 1000;     // requests per connection; the last says Connection: close
  double write_timeout_s = 30;       // one write of a response may wait this long
  int64_t api_threads = 64;          // POST requests answered at once
  int64_t light_threads = 4;         // other requests answered at once
  FramingLimits framing;
  /// The JSON body of an error the front answers itself (status, message).
  std::function<std::string(int status, const std::string& message)> error_body;
  /// A connection was refused or a request answered by the front with an error: reason
  /// "capacity", "timeout", "framing" or "too_large" (metrics; may be empty).
  std::function<void(const char* reason)> on_refused;
};

/// httplib's Server with the connection layer of the file header in front of it.
class FrontedServer : public httplib::Server {
 public:
  explicit FrontedServer(FrontConfig config);
  ~FrontedServer() override;

  /// Starts the reactor and the handler threads (before listen_after_bind; the threads
  /// inherit the caller's signal mask).
  void start_front();
  /// Responses carry "Connection: close" from now on (a drain).
  void drain_front();
  /// After stop(): lets the requests being answered finish for up to `grace`, then
  /// closes the connections not being answered, waits for the answers in progress
  /// (httplib ends chunked responses once stop() was called), joins the threads.
  void stop_front(std::chrono::milliseconds grace = std::chrono::milliseconds(0));
  /// Connections open now.
  int64_t open_connections() const;

 private:
  bool process_and_close_socket(socket_t sock) override;
  struct Front;
  std::unique_ptr<Front> front_;
};

}  // namespace linnet
