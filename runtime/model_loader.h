// From a model directory to a ready Engine: config.json, generation_config.json, the
// checkpoint validated against the weight table, then this rank's slices.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/generation_config.h"
#include "loader/model_config.h"
#include "runtime/engine.h"

namespace linnet {

/// The parsed, validated files of a model directory (weights still unread).
struct ModelFiles {
  std::filesystem::path dir;
  ModelConfig config;
  GenerationConfig generation;
  Checkpoint checkpoint;
  std::vector<std::string> unused_tensors;  // in the checkpoint, not read by the model
};

/// Parses config.json and generation_config.json in `dir`, opens the checkpoint and
/// validates every tensor of weight_table(config) (presence, shape, dtype).
/// @throws Error naming the file / field / tensor (all tensor problems in one message).
ModelFiles open_model(const std::filesystem::path& dir);

/// The KV cache length to use: `requested` when > 0, else
/// min(max_position_embeddings, 8192).
/// @throws Error naming --max-seq-len when requested exceeds max_position_embeddings.
int64_t resolve_max_seq_len(const ModelConfig& config, int64_t requested);

/// What one rank will hold: the weights of its slices (matrices in weight_dtype, vectors
/// f32) and its KV cache.
struct RankMemory {
  int64_t weight_bytes = 0;
  int64_t kv_cache_bytes = 0;
  DType weight_dtype = DType::kF32;
  DType kv_cache_dtype = DType::kF32;
  /// weight_bytes + kv_cache_bytes, INT64_MAX when the sum does not fit.
  int64_t total() const {
    int64_t t = 0;
    return __builtin_add_overflow(weight_bytes, kv_cache_bytes, &t) ? INT64_MAX : t;
  }
};

/// The bytes a rank under `plan` will allocate for a `max_seq_len` KV cache in
/// `kv_cache_dtype` and weight matrices in `weight_dtype` (int8: with groups of
/// `weight_group_size`, weight_bytes_local).
RankMemory rank_memory(const ModelConfig& config, const ShardPlan& plan, int64_t max_seq_len,
                       int64_t batch_rows = 1, DType weight_dtype = DType::kF32,
                       DType kv_cache_dtype = DType::kF32, int64_t weight_group_size = 64);

/// Most positions of a paged KV pool (--kv-cache-tokens): 2^48, far above any memory
/// (a position takes kilobytes), low enough that no size computed from it overflows int64.
inline constexpr int64_t kMaxKvCacheTokens = int64_t{1} << 48;

/// Longest --max-seq-len accepted before the model's max_position_embeddings is even
/// looked at: token ids and positions are int32.
inline constexpr int64_t kMaxSeqLenLimit = INT32_MAX;

/// Positions of the paged KV pool (a multiple of kKvPageSize) for up to `batch_rows`
/// requests of `max_seq_len` positions each:
/// - `tokens` when given (rounded up to whole pages; --kv-cache-tokens, as
///   TensorRT-LLM's KvCacheConfig.max_tokens),
/// - else `memory_fraction` of what this rank's share of `node_available_bytes` keeps
///   after its weights (--kv-cache-memory-fraction, TensorRT-LLM's
///   free_gpu_memory_fraction; a position takes its bytes in `kv_cache_dtype`), rounded down to pages,
/// - else batch_rows full-length requests; with `default_cap_fraction` (the CUDA backend:
///   kDefaultDeviceKvFraction of the GPU's free memory) no more than that fraction of what
///   the weights leave, so the default never asks a 40 GB GPU for a 32 GiB pool it cannot
///   hold (vLLM sizes its pool from gpu_memory_utilization the same way); a cap below one
///   request of max_seq_len is an error naming --max-seq-len.
/// @throws Error naming the option when `tokens` is outside [1, kMaxKvCacheTokens],
///   max_seq_len outside [1, kMaxSeqLenLimit], or batch_rows x max_seq_len over
///   kMaxKvCacheTokens (checked before any size is multiplied); when the pool would hold fewer positions than one
///   request of max_seq_len (it could never run; vLLM refuses the same), when the
///   fraction is not in (0, 1], or when the memory is unknown or already taken by weights.
int64_t resolve_kv_cache_tokens(const ModelConfig& config, const ShardPlan& plan, int64_t max_seq_len,
                                int64_t batch_rows, std::optional<int64_t> tokens,
                                std::optional<double> memory_fraction, int64_t node_available_bytes,
                                int ranks_on_node, DType weight_dtype = DType::kF32,
                                DType kv_cache_dtype = DType::kF32, int64_t weight_group_size = 64,
                                std::optional<double> default_cap_fraction = std::nullopt);

/// The share of the memory the weights leave on a GPU that the default KV pool may take
/// (the rest: activations, cuBLASLt and NCCL buffers, CUDA graphs).
inline constexpr double kDefaultDeviceKvFraction = 0.9;

/// Memory preflight: refuses, before anything is loaded, when `need` exceeds this rank's
/// share of `node_available_bytes` (the node's available memory, split evenly over its
/// `ranks_on_node` ranks; on CUDA the GPU's free memory over the ranks that share it).
/// `source` names the memory in the message ("available memory", "free memory of GPU 0").
/// A negative `node_available_bytes` (unknown) never refuses.
/// @throws Error with both numbers and what to change (more ranks, a shorter --max-seq-len).
void check_memory(const RankMemory& need, int64_t node_available_bytes, int ranks_on_node,
                  const std::string& source = "available memory");

/// MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read.
int64_t available_host_memory();

/// "1.23 GiB" / "4.00 MiB" for messages.
std::string format_bytes(int64_t bytes);

/// Loads this rank's slices per `plan` (matrices in backend.host_weight_dtype(), given the checkpoint's dtype) and builds the Engine over them (page_size,
/// num_pages and cuda_graphs as in Engine's constructor: 0, 0 is a contiguous cache of
/// max_batch rows).
std::unique_ptr<Engine> make_engine(const ModelFiles& files, const ShardPlan& plan, Backend& backend,
                                    Communicator& tp_comm, int64_t max_seq_len, int64_t max_batch = 1,
                                    int64_t page_size = 0, int64_t num_pages = 0, bool cuda_graphs = false);

}  // namespace linnet
