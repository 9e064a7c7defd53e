// The flags every engine command shares (generate, serve, loss, bench; info reads a few),
// declared once: which model, how the world splits into dp x tp groups, the backend and
// its threads, the dtypes held, the context length and, for generate and serve, the
// paged KV pool. Each command's own flags live beside the command (launch/*_command.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <cxxopts.hpp>

#include "runtime/speculative.h"

namespace linnet {

/// The engine flags' values. Defaults are the documented ones (docs/cli.md).
struct EngineOptions {
  std::string model;                  // --model: a directory or a model name (loader/model_path.h)
  int tp = 0;                         // --tp: ranks per tensor-parallel group (0: all ranks); dp = world / tp
  double comm_timeout = 600;          // --comm-timeout: seconds without progress of a wait (0: none)
  int64_t max_seq_len = 0;            // --max-seq-len (0: the command's default)
  int threads = 0;                    // --threads: kernel (OpenMP) threads per rank (0: cores / ranks on the node)
  std::string backend;                // --backend cpu|cuda; empty: cuda when a device is visible, else cpu
  std::string weight_dtype = "auto";  // --weight-dtype auto|f32|bf16|f16|int8|int4 (held_weight_dtype)
  int64_t weight_group_size = 0;      // --weight-group-size: int8 / int4 inputs per scale (0: default_weight_group_size)
  std::string kv_cache_dtype = "f32"; // --kv-cache-dtype f32|bf16 (held_kv_cache_dtype)
  std::string activation_dtype = "f32";  // --activation-dtype f32|int8: what int4 weights multiply (kernels/cpu/gemm.h)
  bool cuda_graphs = false;           // --cuda-graphs: replay decode steps as CUDA graphs
  bool verbose = false;               // --verbose
  // The paged KV pool of generate and serve (EngineFlags::paged_pool):
  int64_t max_batch = 16;             // --max-batch: requests decoded together per dp group
  std::optional<int64_t> kv_cache_tokens;          // --kv-cache-tokens: positions of the pool
  std::optional<double> kv_cache_memory_fraction;  // --kv-cache-memory-fraction: of the memory left after weights
  bool prefix_caching = true;         // off with --no-prefix-caching
  SpeculativeConfig speculative;      // --speculative-config (parse_speculative_config)
};

/// Most guesses --speculative-config's num_speculative_tokens accepts (vLLM's docs use
/// 2 to 5; more only lengthens rejected passes), and the longest n-gram matched.
inline constexpr int64_t kMaxSpeculativeTokens = 16;
inline constexpr int64_t kMaxPromptLookup = 64;

/// --speculative-config: a JSON object with vLLM's keys: "method" ("ngram" or
/// "draft_model"), "num_speculative_tokens" (required, in [1, kMaxSpeculativeTokens]),
/// "prompt_lookup_min" / "prompt_lookup_max" (ngram only; in [1, kMaxPromptLookup], min
/// <= max; defaults 2 and 4, a missing one follows the other within them), "model"
/// (draft_model only, required there: the draft checkpoint, as --model names one),
/// "quantization" (draft_model only: the draft's held weight dtype, f32 / bf16 / f16 /
/// int8 / int4 as --weight-dtype; absent: the target's),
/// "disable_by_batch_size" (>= 1: no guesses while more requests run; absent: never off).
/// @throws Error naming --speculative-config and the key: not JSON, not an object, an
///   unknown key, a value of the wrong type or out of range, a missing method or
///   num_speculative_tokens.
SpeculativeConfig parse_speculative_config(const std::string& text);

/// The int8 / int4 group size `o` asks for (its --weight-group-size, else the dtype's
/// default: 64 for int8, 32 for int4); 0 when --weight-dtype is not int8 or int4. What
/// plan_engine holds and what the journal settings of generate and loss record (a
/// different group size gives other outputs).
int64_t quantized_group_size(const EngineOptions& o);

/// Which engine flags a command declares, and the help lines that differ per command.
struct EngineFlags {
  bool model_required = true;   // --model must be given (bench may take --config instead)
  bool paged_pool = false;      // --max-batch, --kv-cache-tokens, --kv-cache-memory-fraction, --no-prefix-caching
  bool cuda_graphs = true;      // --cuda-graphs
  bool verbose = true;          // --verbose
  int64_t min_max_seq_len = 1;  // the least --max-seq-len accepted
  std::string model_help = "Model directory or name";
  std::string tp_help = "Ranks per tensor-parallel group (default: all ranks)";
  std::string max_seq_len_help = "KV cache length in tokens (default: min(max_position_embeddings, 8192))";
  std::string max_batch_help = "Requests decoded together";
  std::string cuda_graphs_help =
      "With --backend cuda, replay decode steps as CUDA graphs (also LINNET_CUDA_GRAPHS=1; experimental)";
  std::string verbose_help = "Print the shard plan, KV cache size, sampling settings and seed to stderr";
};

/// The engine flags of generate and serve: the paged KV pool, --model a model folder;
/// `dp_groups_take` ends --tp's help (what the dp groups split), `max_batch_help` is
/// --max-batch's.
EngineFlags paged_engine_flags(const std::string& dp_groups_take, const std::string& max_batch_help);

/// Most requests --max-batch decodes together: far above what fits a step, low enough
/// that --max-batch x --max-seq-len never overflows.
inline constexpr int64_t kMaxBatchLimit = 65536;

/// Declares the engine flags `which` selects on `opts`.
void add_engine_options(cxxopts::Options& opts, const EngineFlags& which);

/// Reads the flags of add_engine_options(opts, which) into `o`.
/// @throws Error naming the option on a missing --model or a value out of range.
void read_engine_options(const cxxopts::ParseResult& r, const EngineFlags& which, EngineOptions& o);

/// Declares `which` on `opts`, parses `argv` (parse_options: `subcommand` skipped) and
/// reads the engine flags into `o`. Returns nullopt, `help_text` set, for --help.
/// @throws Error as parse_options and read_engine_options.
std::optional<cxxopts::ParseResult> parse_engine_command(cxxopts::Options& opts, const EngineFlags& which, int argc,
                                                         char** argv, const char* subcommand, std::string& help_text,
                                                         EngineOptions& o);

}  // namespace linnet
