#include "loader/weight_table.h"

namespace linnet {

std::vector<WeightEntry> weight_table(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q_out = c.num_attention_heads * c.head_dim;
  const int64_t kv_out = c.num_key_value_heads * c.head_dim;
  const int64_t inter = c.intermediate_size;
  using R = WeightRole;
  using S = ShardStyle;
  std::vector<WeightEntry> t;
  t.push_back({"model.embed_tokens.weight", R::kEmbedding, -1, {c.vocab_size, h}, S::kVocabParallel, {}});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", R::kInputNorm, i, {h}, S::kReplicated, {}});
    if (c.fused_projections) {
      t.push_back({p + "self_attn.qkv_proj.weight", R::kQkvProj, i, {q_out + 2 * kv_out, h}, S::kColumnParallel,
                   {{R::kQProj, 0, q_out}, {R::kKProj, q_out, kv_out}, {R::kVProj, q_out + kv_out, kv_out}}});
    } else {
      t.push_back({p + "self_attn.q_proj.weight", R::kQProj, i, {q_out, h}, S::kColumnParallel, {}});
      t.push_back({p + "self_attn.k_proj.weight", R::kKProj, i, {kv_out, h}, S::kColumnParallel, {}});
      t.push_back({p + "self_attn.v_proj.weight", R::kVProj, i, {kv_out, h}, S::kColumnParallel, {}});
    }
    if (c.qk_norm) {
      t.push_back({p + "self_attn.q_norm.weight", R::kQNorm, i, {c.head_dim}, S::kReplicated, {}});
      t.push_back({p + "self_attn.k_norm.weight", R::kKNorm, i, {c.head_dim}, S::kReplicated, {}});
    }
    t.push_back({p + "self_attn.o_proj.weight", R::kOProj, i, {h, q_out}, S::kRowParallel, {}});
    t.push_back({p + "post_attention_layernorm.weight", R::kPostAttnNorm, i, {h}, S::kReplicated, {}});
    if (c.fused_projections) {
      t.push_back({p + "mlp.gate_up_proj.weight", R::kGateUpProj, i, {2 * inter, h}, S::kColumnParallel,
                   {{R::kGateProj, 0, inter}, {R::kUpProj, inter, inter}}});
    } else {
      t.push_back({p + "mlp.gate_proj.weight", R::kGateProj, i, {inter, h}, S::kColumnParallel, {}});
      t.push_back({p + "mlp.up_proj.weight", R::kUpProj, i, {inter, h}, S::kColumnParallel, {}});
    }
    t.push_back({p + "mlp.down_proj.weight", R::kDownProj, i, {h, inter}, S::kRowParallel, {}});
  }
  t.push_back({"model.norm.weight", R::kFinalNorm, -1, {h}, S::kReplicated, {}});
  if (!c.tie_word_embeddings) {
    t.push_back({"lm_head.weight", R::kLmHead, -1, {c.vocab_size, h}, S::kVocabParallel, {}});
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
