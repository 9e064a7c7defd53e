// `linnet-tp bench`: throughput of the decoder on a backend. B prompts of P random
// tokens go through one packed prefill pass (Engine::prefill_packed), then N decode
// steps of one token per row (Engine::decode_rows), timed with steady_clock after a
// warm-up pass and a device sync. Reports prefill and decode tokens/s, ms per decode
// step, the weight bytes one decode step reads and the bandwidth that implies (decode
// at small batch is bound by reading the weights once per step). --random-weights
// builds a model of the config's full size directly in the backend's memory, so an
// 8B-shaped run needs no checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <array>
#include <vector>

#include "launch/engine_options.h"

namespace linnet {

class Job;

/// Options of `linnet-tp bench`.
struct BenchOptions {
  EngineOptions engine;       // --model (its weights, or its shapes with --random-weights), --tp, ... (launch/engine_options.h)
  std::string config;         // --config: a config.json (needs --random-weights)
  bool random_weights = false;  // --random-weights: N(0, 0.02) matrices, unit norms
  int64_t batch = 1;          // --batch: sequences (KV cache rows)
  int64_t prompt_len = 128;   // --prompt-len: tokens per prompt
  int64_t new_tokens = 32;    // --new-tokens: decode steps
  uint64_t seed = 1;          // --seed: random weights and prompt tokens
  bool limits = false;        // --limits: also measure DRAM read bandwidth and fma peak (CPU)
  bool loss = false;          // --loss: also time loss_packed over the prompts as documents
  std::vector<std::array<int64_t, 3>> gemm;  // --gemm MxKxN,...: the GEMM microbenchmark instead
};

/// Parses `argv` after the word "bench". Sets `help_text` and returns nullopt for --help.
/// @throws Error naming the option on unknown options, bad values, or a missing or
///   contradictory --model / --config / --random-weights.
std::optional<BenchOptions> parse_bench_options(int argc, char** argv, std::string& help_text);

/// Runs the benchmark; rank 0 prints the results to stdout. Returns the exit code.
int run_bench(const BenchOptions& options, Job& job);

}  // namespace linnet
