// `linnet-tp serve`: an OpenAI-compatible HTTP server over the tensor-parallel engine.
// World rank 0 listens (server/api_server.h); the ranks of the tp group run one
// continuous-batching session together (requests/request_queue.h). The socket is bound
// before the model loads, so /health answers 503 while loading and 200 once ready.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "launch/engine_options.h"

namespace linnet {

class Job;

/// Options of `linnet-tp serve`.
struct ServeOptions {
  EngineOptions engine;              // the engine flags (launch/engine_options.h): --model, --tp, --max-batch, ...
  std::string host = "127.0.0.1";    // --host
  int port = 8000;                   // --port (0: any free port, printed)
  std::string api_key;               // --api-key, else LINNET_API_KEY; empty: no authentication
  std::string served_model_name;     // --served-model-name (default: the model folder's name)
  int64_t max_queue = 256;           // --max-queue: choices waiting beyond --max-batch before 429
  int64_t max_n = 16;                // --max-n: most choices per prompt
  int64_t max_body_bytes = 8 << 20;  // --max-body-bytes (413 above)
  int64_t max_connections = 64;      // --max-connections: handler threads of POST requests
  int64_t max_open_connections = 1024;  // --max-open-connections: connections open at once
  int64_t timeout_s = 30;            // --timeout: a body's arrival, a response write, seconds
  int64_t header_timeout_s = 10;     // --header-timeout: a request's first byte to its head's end
  int64_t keep_alive_timeout_s = 5;  // --keep-alive-timeout: idle between requests
  double health_timeout_s = 10.0;    // --health-timeout: no loop turn / heartbeat that long: /health 503
  double shutdown_grace_s = 10.0;    // --shutdown-grace SECONDS
};

/// Parses `argv` after the word "serve". Sets `help_text` and returns nullopt for --help.
/// @throws Error naming the option on unknown options, bad values or a missing --model.
std::optional<ServeOptions> parse_serve_options(int argc, char** argv, std::string& help_text);

/// Runs the server until SIGINT / SIGTERM has drained it. Returns the exit code (0 on a
/// clean shutdown, every rank alike).
int run_serve(const ServeOptions& options, Job& job);

}  // namespace linnet
