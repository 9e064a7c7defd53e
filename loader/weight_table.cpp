#include "loader/weight_table.h"

namespace linnet {

std::vector<WeightEntry> weight_table(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q_out = c.num_attention_heads * c.head_dim;
  const int64_t kv_out = c.num_key_value_heads * c.head_dim;
  std::vector<WeightEntry> t;
  t.push_back({"model.embed_tokens.weight", WeightRole::kEmbedding, -1, {c.vocab_size, h},
               ShardStyle::kVocabParallel});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", WeightRole::kInputNorm, i, {h}, ShardStyle::kReplicated});
    t.push_back({p + "self_attn.q_proj.weight", WeightRole::kQProj, i, {q_out, h}, ShardStyle::kColumnParallel});
    t.push_back({p + "self_attn.k_proj.weight", WeightRole::kKProj, i, {kv_out, h}, ShardStyle::kColumnParallel});
    t.push_back({p + "self_attn.v_proj.weight", WeightRole::kVProj, i, {kv_out, h}, ShardStyle::kColumnParallel});
    t.push_back({p + "self_attn.o_proj.weight", WeightRole::kOProj, i, {h, q_out}, ShardStyle::kRowParallel});
    t.push_back({p + "post_attention_layernorm.weight", WeightRole::kPostAttnNorm, i, {h},
                 ShardStyle::kReplicated});
    t.push_back({p + "mlp.gate_proj.weight", WeightRole::kGateProj, i, {c.intermediate_size, h},
                 ShardStyle::kColumnParallel});
    t.push_back({p + "mlp.up_proj.weight", WeightRole::kUpProj, i, {c.intermediate_size, h},
                 ShardStyle::kColumnParallel});
    t.push_back({p + "mlp.down_proj.weight", WeightRole::kDownProj, i, {h, c.intermediate_size},
                 ShardStyle::kRowParallel});
  }
  t.push_back({"model.norm.weight", WeightRole::kFinalNorm, -1, {h}, ShardStyle::kReplicated});
  if (!c.tie_word_embeddings) {
    t.push_back({"lm_head.weight", WeightRole::kLmHead, -1, {c.vocab_size, h}, ShardStyle::kVocabParallel});
  }
  return t;
}

std::vector<TensorSpec> tensor_specs(const std::vector<WeightEntry>& table) {
  std::vector<TensorSpec> specs;
  specs.reserve(table.size());
  for (const auto& e : table) specs.push_back({e.name, e.shape});
  return specs;
}

}  // namespace linnet
