// The journaled batch of `generate --input`: this dp group's share of the requests
// through generate_batch (continuous batching), each finished request's output line sent
// by tp rank 0 to world rank 0 as it finishes (driver/run_relay.h), which journals it
// (driver/journal.h) and at the end writes stdout and --output in input order. A stop
// signal ends every group at its next step with the finished lines kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "driver/journal.h"
#include "driver/jsonl_output.h"
#include "loader/tokenizer/tokenizer.h"
#include "parallel/mpi_communicator.h"
#include "requests/request.h"
#include "runtime/engine.h"
#include "runtime/speculative.h"

namespace linnet {

/// Everything the batch needs besides the engine.
struct BatchRun {
  MpiGroups& groups;
  const Tokenizer& tok;
  const std::vector<Request>& requests;        // every input line, input order
  const std::map<int64_t, std::string>& kept;  // rank 0: --resume lines by index (--output and journal)
  const std::vector<size_t>& todo;             // positions in `requests` to run, all groups
  bool prefix_caching = true;                  // share KV pages of common prompt prefixes
  bool progress = false;                       // draw the progress bar even when stderr is no terminal
  size_t kept_from_journal = 0;                // rank 0: how many of `kept` came from the journal only
  Journal* journal = nullptr;                  // rank 0 with --output: where finished lines go at once
  SpeculativeConfig speculative{};             // --speculative-config (BatchOptions::speculative)
  Engine* draft = nullptr;                     // its draft model's engine (method draft_model)
};

/// Runs this dp group's share of `b.todo` (round-robin over the dp groups; request k of
/// the input samples with its own seed, else `seed` + its index). World rank 0 writes
/// stdout and `output` in input order (kept lines as they were) and the stats line.
/// Returns the exit code, the same on every rank: 0, 3 when a request failed (its line
/// says why), 130 when a stop signal ended the run (finished lines in --output and the
/// journal). Collective over the world.
/// @throws Error from the engine, MPI or the journal (the caller aborts the job).
int run_batch(Engine& engine, const BatchRun& b, const std::vector<int64_t>& eos, uint64_t seed,
              std::unique_ptr<JsonlOutput>& output);

}  // namespace linnet
