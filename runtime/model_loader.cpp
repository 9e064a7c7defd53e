#include "runtime/model_loader.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "loader/weight_table.h"
#include "runtime/weights.h"

namespace linnet {

ModelFiles open_model(const std::filesystem::path& dir) {
  if (!std::filesystem::is_directory(dir)) {
    throw Error("model directory not found", dir.string());
  }
  ModelConfig config = ModelConfig::load(dir / "config.json");
  GenerationConfig generation = GenerationConfig::load(dir / "generation_config.json");
  Checkpoint checkpoint = Checkpoint::open(dir);
  const std::vector<WeightEntry> table = weight_table(config);
  std::vector<std::string> unused;
  try {
    unused = checkpoint.validate(tensor_specs(table, config));
  } catch (const Error& e) {
    // The expected shapes come from config.json: say so, since a wrong config makes
    // every tensor look wrong.
    throw Error(std::string(e.what()) + "\n(expected shapes follow " + (dir / "config.json").string() +
                    ": hidden_size " + std::to_string(config.hidden_size) + ", intermediate_size " +
                    std::to_string(config.intermediate_size) + ", num_attention_heads " +
                    std::to_string(config.num_attention_heads) + ", num_key_value_heads " +
                    std::to_string(config.num_key_value_heads) + ", head_dim " +
                    std::to_string(config.head_dim) + ", vocab_size " + std::to_string(config.vocab_size) +
                    ", num_hidden_layers " + std::to_string(config.num_hidden_layers) + ")");
  }
  check_unused_quantized_parts(unused, table, config, dir.string());
  return ModelFiles{dir, std::move(config), std::move(generation), std::move(checkpoint), std::move(unused)};
}

int64_t resolve_max_seq_len(const ModelConfig& config, int64_t requested) {
  if (requested <= 0) return std::min<int64_t>(config.max_position_embeddings, 8192);
  if (requested > config.max_position_embeddings) {
    throw Error("longer than the model's context", "--max-seq-len",
                "<= max_position_embeddings = " + std::to_string(config.max_position_embeddings),
                std::to_string(requested));
  }
  return requested;
}

RankMemory rank_memory(const ModelConfig& config, const ShardPlan& plan, int64_t max_seq_len,
                       int64_t batch_rows, DType weight_dtype, DType kv_cache_dtype, int64_t weight_group_size) {
  int64_t positions = 0;
  return RankMemory{weight_bytes_local(config, plan, weight_dtype, weight_group_size),
                    KvCache::bytes_for(config.num_hidden_layers,
                                       __builtin_mul_overflow(max_seq_len, batch_rows, &positions) ? INT64_MAX : positions,
                                       plan.num_kv_heads_local, config.head_dim, kv_cache_dtype),
                    weight_dtype, kv_cache_dtype};
}

int64_t resolve_kv_cache_tokens(const ModelConfig& config, const ShardPlan& plan, int64_t max_seq_len,
                                int64_t batch_rows, std::optional<int64_t> tokens,
                                std::optional<double> memory_fraction, int64_t node_available_bytes,
                                int ranks_on_node, DType weight_dtype, DType kv_cache_dtype,
                                int64_t weight_group_size, std::optional<double> default_cap_fraction) {
  const int64_t page = kKvPageSize;
  if (max_seq_len < 1 || max_seq_len > kMaxSeqLenLimit) {
    throw Error("invalid value", "--max-seq-len", "in [1, " + std::to_string(kMaxSeqLenLimit) + "]",
                std::to_string(max_seq_len));
  }
  const int64_t row_tokens = (max_seq_len + page - 1) / page * page;
  int64_t pool = 0;
  const char* option = "--max-batch";
  if (batch_rows < 1 || __builtin_mul_overflow(batch_rows, row_tokens, &pool) || pool > kMaxKvCacheTokens) {
    throw Error("the KV pool of --max-batch requests of --max-seq-len positions is out of range", option,
                "batch rows x " + std::to_string(row_tokens) + " positions in [1, " +
                    std::to_string(kMaxKvCacheTokens) + "]",
                std::to_string(batch_rows) + " rows");
  }
  if (tokens) {
    option = "--kv-cache-tokens";
    if (*tokens < 1 || *tokens > kMaxKvCacheTokens) {
      throw Error("invalid value", option, "in [1, " + std::to_string(kMaxKvCacheTokens) + "]",
                  std::to_string(*tokens));
    }
    pool = (*tokens + page - 1) / page * page;
  } else if (memory_fraction || (default_cap_fraction && node_available_bytes >= 0)) {
    // This rank's share of the memory, what its weights leave of it, and the whole pages
    // of positions `fraction` of that holds.
    const int64_t share = node_available_bytes / std::max(1, ranks_on_node);
    const int64_t weights = weight_bytes_local(config, plan, weight_dtype, weight_group_size);
    const int64_t left = share - weights;
    const int64_t per_token =
        KvCache::bytes_for(config.num_hidden_layers, 1, plan.num_kv_heads_local, config.head_dim, kv_cache_dtype);
    const auto positions = [&](double fraction) {
      return static_cast<int64_t>(static_cast<double>(std::max<int64_t>(0, left)) * fraction) / per_token / page * page;
    };
    if (memory_fraction) {
      option = "--kv-cache-memory-fraction";
      if (!(*memory_fraction > 0.0 && *memory_fraction <= 1.0)) {
        throw Error("invalid value", option, "in (0, 1]", std::to_string(*memory_fraction));
      }
      if (node_available_bytes < 0) throw Error("the available memory cannot be read (/proc/meminfo)", option);
      if (left <= 0) {
        throw Error("no memory is left for the KV cache after the weights (" + format_bytes(share) +
                        " per rank, weights " + format_bytes(weights) + ")",
                    option);
      }
      pool = positions(*memory_fraction);
    } else if (const int64_t cap = positions(*default_cap_fraction); cap < pool) {
      if (cap < row_tokens) {
        throw Error("the device memory the weights leave (" + format_bytes(std::max<int64_t>(0, left)) + " of " +
                        format_bytes(share) + " per rank, weights " + format_bytes(weights) + ") holds " +
                        std::to_string(cap) + " KV positions, fewer than one request of --max-seq-len",
                    "--max-seq-len", "<= " + std::to_string(cap) + " positions, or more ranks over more GPUs",
                    std::to_string(max_seq_len));
      }
      info("KV pool: " + std::to_string(cap) + " positions (" + std::to_string(cap / row_tokens) +
           " full-length requests), not " + std::to_string(pool) + ": " + std::to_string(*default_cap_fraction) +
           " of the " + format_bytes(left) + " the weights leave");
      pool = cap;
    }
  }
  if (pool < row_tokens) {
    const std::string got = tokens ? std::to_string(*tokens) + " positions" : std::to_string(pool) + " positions";
    throw Error("the KV pool holds fewer positions than one request of --max-seq-len; it could never run", option,
                ">= " + std::to_string(row_tokens) + " positions (--max-seq-len " + std::to_string(max_seq_len) +
                    " rounded up to pages of " + std::to_string(page) + ")",
                got);
  }
  return pool;
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
  }
  return buf;
}

int64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

void check_memory(const RankMemory& need, int64_t node_available_bytes, int ranks_on_node,
                  const std::string& source) {
  if (node_available_bytes < 0) return;
  const int64_t available_bytes = node_available_bytes / std::max(1, ranks_on_node);
  if (need.total() <= available_bytes) return;
  throw Error("not enough memory for this rank: it needs " + format_bytes(need.total()) + " (weights " +
                  format_bytes(need.weight_bytes) + " in " + dtype_name(need.weight_dtype) + ", KV cache " + format_bytes(need.kv_cache_bytes) +
                  ") but has " + format_bytes(available_bytes) + " (" + source + " / " +
                  std::to_string(ranks_on_node) +
                  " ranks on it); use more ranks over more nodes, or a shorter --max-seq-len",
              "memory preflight");
}

std::unique_ptr<Engine> make_engine(const ModelFiles& files, const ShardPlan& plan, Backend& backend,
                                    Communicator& tp_comm, int64_t max_seq_len, int64_t max_batch,
                                    int64_t page_size, int64_t num_pages, bool cuda_graphs) {
  ModelWeights weights = load_weights(files.checkpoint, files.config, plan,
                                       backend.host_weight_dtype(files.checkpoint.dominant_dtype()));
  return std::make_unique<Engine>(files.config, plan, std::move(weights), backend, tp_comm, max_seq_len, max_batch,
                                  page_size, num_pages, cuda_graphs);
}

}  // namespace linnet
