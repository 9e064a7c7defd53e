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
  kQNorm,           // Qwen3 self_attn.q_norm [head_dim], replicated
  kKNorm,           // Qwen3 self_attn.k_norm [head_dim], replicated
  kQkvProj,         // Phi-3 fused [q; k; v] along dim 0, segments kQProj, kKProj, kVProj
  kGateUpProj,      // Phi-3 fused [gate; up] along dim 0, segments kGateProj, kUpProj
};

/// One block of rows of a fused tensor: `rows` rows playing `role`, starting at
/// `row_offset` of the fused tensor. Each segment is sharded on its own.
struct WeightSegment {
  WeightRole role;
  int64_t row_offset = 0;
  int64_t rows = 0;
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
  std::vector<WeightSegment> segments;  // fused tensors only; empty otherwise
};

/// Every tensor a `config` model reads from its checkpoint, in load order.
/// Source of the names: transformers' modeling_llama.py, modeling_qwen3.py (q_norm,
/// k_norm) and modeling_phi3.py (qkv_proj, gate_up_proj) state dicts.
std::vector<WeightEntry> weight_table(const ModelConfig& config);

/// Whether `e` is stored quantized in a checkpoint of `config`: a decoder projection
/// (column- or row-parallel) when config.quantization is set (WeightQuantization).
bool stored_quantized(const WeightEntry& e, const ModelConfig& config);

/// The checkpoint name of one part of a quantized entry: `e.name` with its final
/// "weight" replaced by `part` ("weight_packed", "weight_scale", "weight_zero_point",
/// "weight_shape").
std::string quantized_part_name(const WeightEntry& e, const char* part);

/// The table as presence/shape/dtype specs for Checkpoint::validate. Entries stored
/// quantized (stored_quantized) become their parts, for an [out, in] matrix with b-bit
/// values and groups of G (G = in per channel): weight_packed [out, ceil(in b / 32)]
/// I32, weight_scale [out, ceil(in / G)] float, weight_shape [2] I64 or I32, and when
/// asymmetric weight_zero_point [ceil(out b / 32), ceil(in / G)] I32. FP8: weight
/// [out, in] F8_E4M3 and weight_scale [out, 1] (per tensor [1]) float.
std::vector<TensorSpec> tensor_specs(const std::vector<WeightEntry>& table, const ModelConfig& config);

/// Refuses tensors of a quantized module the scheme does not use, among `unused` (what
/// Checkpoint::validate returned): e.g. a weight_zero_point while config.json says
/// symmetric, a weight_g_idx without actorder, an input_scale; reading the matrix
/// without them would give other numbers than the checkpoint's. Nothing to check
/// without config.quantization.
/// @throws Error naming `where` (the checkpoint folder), the count and the first tensors.
void check_unused_quantized_parts(const std::vector<std::string>& unused, const std::vector<WeightEntry>& table,
                                  const ModelConfig& config, const std::string& where);

}  // namespace linnet
