// The serve loop (driver/serve_loop.cpp): every rank of `serve` runs it on its main
// thread. Before each step the tp group's first rank broadcasts the step's plan (new
// requests with their ids and sampling settings, cancellations, shutdown), so every rank
// makes the same BatchSession calls; world rank 0 takes submissions from the
// RequestQueue, hands them to the dp groups' first ranks and gets their tokens back by
// messages (driver/serve_wire.h). Only main threads call MPI or the engine
// (MPI_THREAD_FUNNELED).
#pragma once

#include <functional>

#include "loader/tokenizer/tokenizer.h"
#include "parallel/mpi_communicator.h"
#include "requests/request_queue.h"
#include "requests/serve_metrics.h"
#include "runtime/engine.h"
#include "runtime/speculative.h"

namespace linnet {

/// What the engine loop needs besides the engine.
struct ServeLoopConfig {
  MpiGroups* groups = nullptr;
  const Tokenizer* tokenizer = nullptr;  // tp rank 0: the stop-string check
  RequestQueue* queue = nullptr;           // world rank 0 only
  ServeMetrics* metrics = nullptr;       // world rank 0 only
  ServeHealth* health = nullptr;         // world rank 0 only (may be null)
  std::function<void()> on_drain;        // world rank 0: a stop signal arrived (stop accepting)
  double shutdown_grace_s = 10.0;        // then unfinished requests are cancelled
  bool prefix_caching = true;
  SpeculativeConfig speculative;         // --speculative-config, server-wide
  Engine* draft = nullptr;               // its draft model's engine (method draft_model)
};

/// Runs the serve loop on every rank (driver/serve_loop.cpp) until a SIGINT/SIGTERM (on
/// any rank) has been drained: requests in flight finish, or are cancelled once
/// shutdown_grace_s has passed. World rank 0 admits each submission when it takes it
/// from the queue (ServeChannel::admit), and refuses those it takes once it has caught
/// a stop signal (its own, at once, or another rank's, at the next poll). With several dp groups, world rank 0 hands each
/// submission to the group with the fewest choices in flight.
/// @throws Error from the engine or MPI (the caller aborts the job).
void run_serve_loop(Engine& engine, const ServeLoopConfig& config);

}  // namespace linnet
