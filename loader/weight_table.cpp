#include "loader/weight_table.h"

#include <set>
#include <string_view>

#include "common/error.h"

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

bool stored_quantized(const WeightEntry& e, const ModelConfig& c) {
  return c.quantization && (e.shard == ShardStyle::kColumnParallel || e.shard == ShardStyle::kRowParallel);
}

std::string quantized_part_name(const WeightEntry& e, const char* part) {
  const std::string_view suffix = "weight";
  const std::string_view name = e.name;
  const std::string_view base = name.ends_with(suffix) ? name.substr(0, name.size() - suffix.size()) : name;
  return std::string(base) + part;
}

std::vector<TensorSpec> tensor_specs(const std::vector<WeightEntry>& table, const ModelConfig& c) {
  std::vector<TensorSpec> specs;
  specs.reserve(table.size());
  for (const auto& e : table) {
    if (!stored_quantized(e, c)) {
      specs.push_back({e.name, e.shape, {}});
      continue;
    }
    const WeightQuantization& q = *c.quantization;
    const int64_t out = e.shape[0], in = e.shape[1];
    if (q.fp8) {
      specs.push_back({e.name, e.shape, {DType::kF8E4M3}});
      specs.push_back({quantized_part_name(e, "weight_scale"), q.per_tensor ? std::vector<int64_t>{1} : std::vector<int64_t>{out, 1}, {}});
      continue;
    }
    const int64_t group = q.group_size > 0 ? q.group_size : in;
    const int64_t groups = (in + group - 1) / group;
    specs.push_back({quantized_part_name(e, "weight_packed"), {out, (in * q.num_bits + 31) / 32}, {DType::kI32}});
    specs.push_back({quantized_part_name(e, "weight_scale"), {out, groups}, {}});
    specs.push_back({quantized_part_name(e, "weight_shape"), {2}, {DType::kI64, DType::kI32}});
    if (!q.symmetric) {
      specs.push_back({quantized_part_name(e, "weight_zero_point"), {(out * q.num_bits + 31) / 32, groups}, {DType::kI32}});
    }
  }
  return specs;
}

void check_unused_quantized_parts(const std::vector<std::string>& unused, const std::vector<WeightEntry>& table,
                                  const ModelConfig& c, const std::string& where) {
  if (!c.quantization || unused.empty()) return;
  std::set<std::string, std::less<>> modules;  // "model.layers.0.self_attn.q_proj."
  for (const WeightEntry& e : table)
    if (stored_quantized(e, c)) modules.insert(quantized_part_name(e, ""));
  std::vector<std::string> stray;
  for (const std::string& name : unused) {
    const size_t dot = name.rfind('.');
    if (dot != std::string::npos && modules.contains(std::string_view(name).substr(0, dot + 1))) stray.push_back(name);
  }
  if (stray.empty()) return;
  std::string list;
  for (size_t i = 0; i < stray.size() && i < 5; ++i) list += (i ? ", " : "") + stray[i];
  if (stray.size() > 5) list += ", ... (" + std::to_string(stray.size()) + " in all)";
  throw Error("the checkpoint holds quantization tensors its config.json scheme (" + c.quantization->describe() +
                  ") does not use, so it would be read as another model: " + list,
              where, "only the parts the scheme names (docs/cpu-kernels.md)", std::to_string(stray.size()) + " unused");
}

}  // namespace linnet
