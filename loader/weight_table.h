// The per-architecture weight table: for every checkpoint tensor the model needs, its
// Hugging Face name, logical role, global shape and how it is sharded under tensor
// parallelism (Megatron's terms). The runtime loads weights by walking this table, and
// the checkpoint is validated against it before anything runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/model_config.h"

namespace linnet {

/// What a tensor is in the decoder.
enum class WeightRole {
  kEmbedding,       // model.embed_tokens.weight       [vocab_size, hidden_size]
  kLmHead,          // lm_head.weight                  [vocab_size, hidden_size] (absent when tied)
  kFinalNorm,       // model.norm.weight               [hidden_size]
  kInputNorm,       // layers.i.input_layernorm        [hidden_size]
  kPostAttnNorm,    // layers.i.post_attention_layernorm [hidden_size]
  kQProj,           // [num_attention_heads * head_dim, hidden_size]
  kKProj,           // [num_key_value_heads * head_dim, hidden_size]
  kVProj,           // [num_key_value_heads * head_dim, hidden_size]
  kOProj,           // [hidden_size, num_attention_heads * head_dim]
  kGateProj,        // [intermediate_size, hidden_size]
  kUpProj,          // [intermediate_size, hidden_size]
  kDownProj,        // [hidden_size, intermediate_size]
};

/// How a tensor is split over the tp ranks.
enum class ShardStyle {
  kReplicated,      // every rank holds all of it (norm weights)
  kColumnParallel,  // output rows split by head / inner unit: rank holds rows of dim 0
  kRowParallel,     // input columns split: rank holds columns of dim 1; all_reduce after
  kVocabParallel,   // vocabulary rows split (embedding, lm_head)
};

/// One checkpoint tensor of the model.
struct WeightEntry {
  std::string name;           // Hugging Face tensor name
  WeightRole role;
  int layer = -1;             // decoder layer, -1 for model-level tensors
  std::vector<int64_t> shape; // global (unsharded) shape
  ShardStyle shard;
};

/// Every tensor a `config` model reads from its checkpoint, in load order.
/// Source of the names: transformers' modeling_llama.py (LlamaForCausalLM state dict).
std::vector<WeightEntry> weight_table(const ModelConfig& config);

/// The table as presence/shape specs for Checkpoint::validate.
std::vector<TensorSpec> tensor_specs(const std::vector<WeightEntry>& table);

}  // namespace linnet
