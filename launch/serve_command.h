// `linnet-tp serve`: an OpenAI-compatible HTTP server over the tensor-parallel engine.
// World rank 0 listens (launch/serve_http.h); the ranks of the tp group run one
// continuous-batching session together (launch/serve_engine.h). The socket is bound
// before the model loads, so /health answers 503 while loading and 200 once ready.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "launch/cli_options.h"

namespace linnet {

class Job;

/// (ServeOptions is declared in launch/cli_options.h, beside GenerateOptions.)

/// Parses `argv` after the word "serve". Sets `help_text` and returns nullopt for --help.
/// @throws Error naming the option on unknown options, bad values or a missing --model.
std::optional<ServeOptions> parse_serve_options(int argc, char** argv, std::string& help_text);

/// Runs the server until SIGINT / SIGTERM has drained it. Returns the exit code (0 on a
/// clean shutdown, every rank alike).
int run_serve(const ServeOptions& options, Job& job);

}  // namespace linnet
