// Command-line options of linnet-tp's subcommands (parsed with cxxopts).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launch/bench_command.h"
#include "launch/info_command.h"
#include "launch/loss_command.h"
#include "launch/request_settings.h"
#include "launch/template_command.h"
#include "launch/tokenize_command.h"
#include "runtime/sampler.h"

namespace cxxopts {
class Options;
class ParseResult;
}  // namespace cxxopts

namespace linnet {

/// Options of `linnet-tp [generate]`.
struct GenerateOptions {
  std::string model;                 // --model: a model directory
  std::optional<std::string> prompt; // --prompt
  std::string input;                 // --input: JSONL, one {"prompt": ...} or {"messages": [...]} per line
  bool chat = false;                 // --chat: a prompt is one user message, put in the chat template
  std::string output;                // --output: JSONL results (written atomically at the end; a journal beside it meanwhile)
  bool resume = false;               // --resume: keep the lines already in --output and its journal, run the rest
  std::optional<int64_t> max_new_tokens;  // default: generation_config.json, else 256
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::vector<std::string> stop;     // --stop (repeatable): stop strings
  std::vector<int64_t> stop_token_ids;  // --stop-token-ids, on top of the model's EOS ids
  bool logprobs = false;             // --logprobs: each new token's log-probability
  int64_t top_logprobs = 0;          // --top-logprobs N (<= kMaxTopLogprobs; implies --logprobs)
  std::optional<uint64_t> seed;
  int tp = 0;                        // --tp: ranks per tensor-parallel group (0: all ranks)
  double comm_timeout = 600;         // --comm-timeout: seconds without progress of a wait (0: none)
  int64_t max_seq_len = 0;           // 0: min(max_position_embeddings, 8192)
  int threads = 0;                   // Kernel (OpenMP) threads per rank; 0: cores / ranks on the node
  int64_t max_batch = 16;            // --max-batch: prompts of --input decoded together
  std::optional<int64_t> kv_cache_tokens;          // --kv-cache-tokens: positions of the paged KV pool
  std::optional<double> kv_cache_memory_fraction;  // --kv-cache-memory-fraction: of the memory left after weights
  bool prefix_caching = true;        // off with --no-prefix-caching
  bool progress = false;             // --progress: draw the bar even when stderr is not a terminal (mpirun)
  bool cuda_graphs = false;          // --cuda-graphs: replay decode steps as CUDA graphs (untested on a GPU yet)
  std::string backend;               // --backend cpu|cuda; empty: cuda when a device is visible, else cpu
  std::string weight_dtype = "auto"; // --weight-dtype auto|f32|bf16|f16 (held_weight_dtype)
  std::string kv_cache_dtype = "f32";  // --kv-cache-dtype f32|bf16 (held_kv_cache_dtype)
  bool verbose = false;
};

/// Options of `linnet-tp serve`.
struct ServeOptions {
  GenerateOptions engine;            // the engine flags (add_engine_options): --model, --tp, --max-batch, ...
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

/// Most requests --max-batch decodes together: far above what fits a step, low enough
/// that --max-batch x --max-seq-len never overflows.
inline constexpr int64_t kMaxBatchLimit = 65536;

/// Declares the flags that load a model and size its engine, shared by generate and
/// serve: --model, --tp, --max-seq-len, --max-batch (help `max_batch_help`),
/// --kv-cache-tokens, --kv-cache-memory-fraction, --no-prefix-caching, --cuda-graphs,
/// --threads, --backend, --weight-dtype, --verbose. `dp_note` ends --tp's help (what
/// the dp groups split).
void add_engine_options(cxxopts::Options& opts, const std::string& dp_note, const std::string& max_batch_help);

/// Reads the flags of add_engine_options into `g`.
/// @throws Error naming the option on a missing --model or a value out of range.
void read_engine_options(const cxxopts::ParseResult& r, GenerateOptions& g);

/// What the command line asked for.
struct CommandLine {
  enum class Kind { kGenerate, kTokenize, kInfo, kLoss, kTemplate, kBench, kServe, kHelp, kVersion } kind = Kind::kGenerate;
  std::string help_text;  // for kHelp
  GenerateOptions generate;
  TokenizeOptions tokenize;  // for kTokenize
  InfoOptions info;          // for kInfo
  LossOptions loss;          // for kLoss
  TemplateOptions chat_template;  // for kTemplate
  BenchOptions bench;             // for kBench
  ServeOptions serve;             // for kServe
};

/// Parses argv. A first argument "generate" selects that subcommand (also the default),
/// "tokenize" the tokenize subcommand (launch/tokenize_command.h), "template" the chat
/// template subcommand (launch/template_command.h).
/// @throws Error naming the option on unknown options, bad values, or a missing
///   --model / --prompt|--input.
CommandLine parse_command_line(int argc, char** argv);

}  // namespace linnet
