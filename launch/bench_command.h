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

namespace linnet {

class Job;

/// Options of `linnet-tp bench`.
struct BenchOptions {
  std::string model;          // --model: directory or name (its weights, or its shapes with --random-weights)
  std::string config;         // --config: a config.json (needs --random-weights)
  bool random_weights = false;  // --random-weights: N(0, 0.02) matrices, unit norms
  std::string backend;        // --backend cpu|cuda; empty: cuda when a device is visible
  std::string weight_dtype = "auto";  // --weight-dtype auto|f32|bf16|f16 (held_weight_dtype)
  std::string kv_cache_dtype = "f32";  // --kv-cache-dtype f32|bf16 (held_kv_cache_dtype)
  int64_t batch = 1;          // --batch: sequences (KV cache rows)
  int64_t prompt_len = 128;   // --prompt-len: tokens per prompt
  int64_t new_tokens = 32;    // --new-tokens: decode steps
  int64_t max_seq_len = 0;    // --max-seq-len: KV cache length per row (0: prompt-len + new-tokens)
  int tp = 0;                 // --tp: ranks per tensor-parallel group (0: all ranks)
  double comm_timeout = 600;  // --comm-timeout: seconds without progress of a collective (0: none)
  int threads = 0;            // --threads: kernel (OpenMP) threads per rank (CPU backend)
  uint64_t seed = 1;          // --seed: random weights and prompt tokens
  bool cuda_graphs = false;   // --cuda-graphs: decode steps replay CUDA graphs (Engine::cuda_graphs)
  bool limits = false;        // --limits: also measure DRAM read bandwidth and fma peak (CPU)
};

/// Parses `argv` after the word "bench". Sets `help_text` and returns nullopt for --help.
/// @throws Error naming the option on unknown options, bad values, or a missing or
///   contradictory --model / --config / --random-weights.
std::optional<BenchOptions> parse_bench_options(int argc, char** argv, std::string& help_text);

/// Runs the benchmark; rank 0 prints the results to stdout. Returns the exit code.
int run_bench(const BenchOptions& options, Job& job);

}  // namespace linnet
