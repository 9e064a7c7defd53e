#include "runtime/weights.h"

#include "common/error.h"
#include "loader/weight_table.h"

namespace linnet {
namespace {

// Rows [row_begin, row_begin + rows) of a 2-D tensor into `dst` (already sized).
void read_rows(const Checkpoint& ckpt, const std::string& name, int64_t row_begin, int64_t rows,
               int64_t cols, float* dst) {
  ckpt.read_f32(name, Slice2D{row_begin, row_begin + rows, 0, cols}, dst);
}

Tensor read_vector(const Checkpoint& ckpt, const std::string& name, int64_t n) {
  Tensor t = Tensor::zeros({n});
  ckpt.read_f32(name, Slice2D{0, 1, 0, n}, t.data());
  return t;
}

}  // namespace

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& c, const ShardPlan& p) {
  const int64_t h = c.hidden_size;
  const int64_t hd = c.head_dim;
  const int64_t q_rows = p.num_heads_local * hd;
  const int64_t kv_rows = p.num_kv_heads_local * hd;
  const int64_t inter = p.intermediate_local;

  ModelWeights w;
  w.embed_tokens = Tensor::zeros({p.vocab_local, h});
  read_rows(ckpt, "model.embed_tokens.weight", p.vocab_begin, p.vocab_local, h, w.embed_tokens.data());
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    w.lm_head = Tensor::zeros({p.vocab_local, h});
    read_rows(ckpt, "lm_head.weight", p.vocab_begin, p.vocab_local, h, w.lm_head.data());
  }
  w.final_norm = read_vector(ckpt, "model.norm.weight", h);

  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string pre = "model.layers." + std::to_string(i) + ".";
    LayerWeights& L = w.layers[static_cast<size_t>(i)];
    L.input_norm = read_vector(ckpt, pre + "input_layernorm.weight", h);
    L.post_attn_norm = read_vector(ckpt, pre + "post_attention_layernorm.weight", h);

    // Column-parallel: this rank's heads are rows [head_begin*hd, ...) of q, likewise k, v.
    L.wqkv = Tensor::zeros({q_rows + 2 * kv_rows, h});
    float* dst = L.wqkv.data();
    read_rows(ckpt, pre + "self_attn.q_proj.weight", p.head_begin * hd, q_rows, h, dst);
    read_rows(ckpt, pre + "self_attn.k_proj.weight", p.kv_head_begin * hd, kv_rows, h, dst + q_rows * h);
    read_rows(ckpt, pre + "self_attn.v_proj.weight", p.kv_head_begin * hd, kv_rows, h,
              dst + (q_rows + kv_rows) * h);

    // Row-parallel: the input columns that meet this rank's heads.
    L.wo = Tensor::zeros({h, q_rows});
    ckpt.read_f32(pre + "self_attn.o_proj.weight",
                  Slice2D{0, h, p.head_begin * hd, p.head_begin * hd + q_rows}, L.wo.data());

    L.w_gate_up = Tensor::zeros({2 * inter, h});
    read_rows(ckpt, pre + "mlp.gate_proj.weight", p.intermediate_begin, inter, h, L.w_gate_up.data());
    read_rows(ckpt, pre + "mlp.up_proj.weight", p.intermediate_begin, inter, h,
              L.w_gate_up.data() + inter * h);

    L.w_down = Tensor::zeros({h, inter});
    ckpt.read_f32(pre + "mlp.down_proj.weight",
                  Slice2D{0, h, p.intermediate_begin, p.intermediate_begin + inter}, L.w_down.data());
  }
  return w;
}

}  // namespace linnet
