#include "runtime/weights.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "common/error.h"
#include "kernels/cpu/gemm.h"
#include "loader/weight_table.h"

namespace linnet {
namespace {

// Where one role's rows of this rank go inside the stacked per-rank tensors.
struct ColumnTarget {
  int64_t shard_begin;  // first global row of this rank's shard within the role's rows
  int64_t rows;         // rows on this rank
  int64_t dst_row;      // first row in the destination tensor
};

ColumnTarget column_target(WeightRole role, const ModelConfig& c, const ShardPlan& p) {
  const int64_t hd = c.head_dim;
  const int64_t q_rows = p.num_heads_local * hd;
  const int64_t kv_rows = p.num_kv_heads_local * hd;
  switch (role) {
    case WeightRole::kQProj: return {p.head_begin * hd, q_rows, 0};
    case WeightRole::kKProj: return {p.kv_head_begin * hd, kv_rows, q_rows};
    case WeightRole::kVProj: return {p.kv_head_begin * hd, kv_rows, q_rows + kv_rows};
    case WeightRole::kGateProj: return {p.intermediate_begin, p.intermediate_local, 0};
    case WeightRole::kUpProj: return {p.intermediate_begin, p.intermediate_local, p.intermediate_local};
    default: break;
  }
  LINNET_CHECK(false, "not a column-parallel role");
  return {};
}

Tensor read_vector(const Checkpoint& ckpt, const std::string& name, int64_t n) {
  Tensor t = Tensor::zeros({n});
  ckpt.read_f32(name, Slice2D{0, 1, 0, n}, t.data());
  return t;
}

// Vocab-parallel rows [vocab_begin, vocab_begin + vocab_local), those past vocab_size
// left zero (padding).
Tensor read_vocab_rows(const Checkpoint& ckpt, const std::string& name, const ModelConfig& c,
                       const ShardPlan& p, DType dtype) {
  Tensor t = Tensor::zeros({p.vocab_local, c.hidden_size}, dtype);
  const int64_t end = std::min(p.vocab_begin + p.vocab_local, c.vocab_size);
  if (end > p.vocab_begin) {
    ckpt.read(name, Slice2D{p.vocab_begin, end, 0, c.hidden_size}, dtype, t.raw());
  }
  return t;
}

}  // namespace

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& c, const ShardPlan& p, DType dt) {
  const DType file_dt = dt;
  const int64_t elem = element_size(dt);
  const int64_t h = c.hidden_size;
  const int64_t hd = c.head_dim;
  const int64_t q_rows = p.num_heads_local * hd;
  const int64_t kv_rows = p.num_kv_heads_local * hd;
  const int64_t inter = p.intermediate_local;

  ModelWeights w;
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (LayerWeights& L : w.layers) {
    L.wqkv = Tensor::zeros({q_rows + 2 * kv_rows, h}, dt);
    L.w_gate_up = Tensor::zeros({2 * inter, h}, dt);
  }

  for (const WeightEntry& e : weight_table(c)) {
    LayerWeights* L = e.layer >= 0 ? &w.layers[static_cast<size_t>(e.layer)] : nullptr;
    // Column-parallel tensors, plain or fused: each segment's shard goes to its rows of
    // the stacked wqkv / w_gate_up.
    std::vector<WeightSegment> segments = e.segments;
    if (segments.empty()) segments.push_back({e.role, 0, e.shape[0]});
    switch (e.role) {
      case WeightRole::kEmbedding:
        w.embed_tokens = read_vocab_rows(ckpt, e.name, c, p, dt);
        break;
      case WeightRole::kLmHead:
        w.lm_head = read_vocab_rows(ckpt, e.name, c, p, dt);
        break;
      case WeightRole::kFinalNorm:
        w.final_norm = read_vector(ckpt, e.name, h);
        break;
      case WeightRole::kInputNorm:
        L->input_norm = read_vector(ckpt, e.name, h);
        break;
      case WeightRole::kPostAttnNorm:
        L->post_attn_norm = read_vector(ckpt, e.name, h);
        break;
      case WeightRole::kQNorm:
        L->q_norm = read_vector(ckpt, e.name, hd);
        break;
      case WeightRole::kKNorm:
        L->k_norm = read_vector(ckpt, e.name, hd);
        break;
      case WeightRole::kQProj:
      case WeightRole::kKProj:
      case WeightRole::kVProj:
      case WeightRole::kQkvProj:
      case WeightRole::kGateProj:
      case WeightRole::kUpProj:
      case WeightRole::kGateUpProj:
        for (const WeightSegment& s : segments) {
          const ColumnTarget t = column_target(s.role, c, p);
          const bool attn = s.role == WeightRole::kQProj || s.role == WeightRole::kKProj ||
                            s.role == WeightRole::kVProj;
          auto* dst = static_cast<char*>((attn ? L->wqkv : L->w_gate_up).raw()) + t.dst_row * h * elem;
          const int64_t first = s.row_offset + t.shard_begin;
          ckpt.read(e.name, Slice2D{first, first + t.rows, 0, h}, file_dt, dst);
        }
        break;
      case WeightRole::kOProj:
        // Row-parallel: the input columns that meet this rank's heads.
        L->wo = Tensor::zeros({h, q_rows}, dt);
        ckpt.read(e.name, Slice2D{0, h, p.head_begin * hd, p.head_begin * hd + q_rows}, file_dt, L->wo.raw());
        break;
      case WeightRole::kDownProj:
        L->w_down = Tensor::zeros({h, inter}, dt);
        ckpt.read(e.name, Slice2D{0, h, p.intermediate_begin, p.intermediate_begin + inter}, file_dt,
                  L->w_down.raw());
        break;
    }
  }
  if (c.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return w;
}

DType vocab_weight_dtype(DType matrix_dtype) { return matrix_dtype == DType::kI4 ? DType::kI8 : matrix_dtype; }

namespace {

// Bytes of one [n, k] matrix held in `dtype` (quantized ones packed, with groups of `group_size`).
int64_t matrix_bytes(int64_t n, int64_t k, DType dtype, int64_t group_size) {
  if (is_quantized(dtype)) return cpu::quantized_matrix_bytes(n, k, std::max<int64_t>(1, group_size), dtype);
  return element_size(dtype) * n * k;
}

}  // namespace

int64_t decode_weight_elements(const ModelConfig& c, const ShardPlan& p) {
  const int64_t h = c.hidden_size, hd = c.head_dim;
  const int64_t per_layer = (p.num_heads_local + 2 * p.num_kv_heads_local) * hd * h + h * p.num_heads_local * hd +
                            3 * p.intermediate_local * h;
  return per_layer * c.num_hidden_layers + p.vocab_local * h;
}

int64_t decode_weight_bytes(const ModelConfig& c, const ShardPlan& p, DType dt, int64_t group_size) {
  const int64_t h = c.hidden_size, hd = c.head_dim;
  auto bytes = [&](int64_t n, int64_t k) { return matrix_bytes(n, k, dt, group_size); };
  const int64_t per_layer = bytes((p.num_heads_local + 2 * p.num_kv_heads_local) * hd, h)  // wqkv
                            + bytes(h, p.num_heads_local * hd)                              // wo
                            + bytes(2 * p.intermediate_local, h)                            // gate, up
                            + bytes(h, p.intermediate_local);                               // down
  return per_layer * c.num_hidden_layers + matrix_bytes(p.vocab_local, h, vocab_weight_dtype(dt), group_size);
}

int64_t weight_bytes_local(const ModelConfig& c, const ShardPlan& p, DType dt, int64_t group_size) {
  const int64_t h = c.hidden_size, hd = c.head_dim;
  const int64_t vectors = (2 * h + (c.qk_norm ? 2 * hd : 0)) * c.num_hidden_layers + h;  // norms
  const int64_t embedding = c.tie_word_embeddings ? 0 : matrix_bytes(p.vocab_local, h, vocab_weight_dtype(dt), group_size);
  return decode_weight_bytes(c, p, dt, group_size) + embedding + static_cast<int64_t>(sizeof(float)) * vectors;
}

DType config_weight_dtype(const ModelConfig& c) {
  if (c.torch_dtype == "bfloat16") return DType::kBF16;
  if (c.torch_dtype == "float16") return DType::kF16;
  return DType::kF32;
}

void check_weight_groups(const ModelConfig& c, const ShardPlan& p, int64_t group_size, DType dtype, bool is_default) {
  if (dtype == DType::kI4 && (group_size % 2 != 0 || group_size > 1024)) {
    throw Error("int4 packs two inputs a byte: its groups are even, at most 1024", "--weight-group-size",
                "an even size in [2, 1024]", std::to_string(group_size));
  }
  const int64_t attn = p.num_heads_local * c.head_dim;
  const std::pair<const char*, int64_t> widths[] = {
      {"q/k/v_proj, gate/up_proj, embed_tokens and lm_head (hidden_size)", c.hidden_size},
      {"o_proj (this rank's heads x head_dim)", attn},
      {"down_proj (this rank's intermediate slice)", p.intermediate_local}};
  int64_t all = 0;
  for (const auto& w : widths) all = std::gcd(all, w.second);
  std::string work;
  for (int64_t g = 1; g <= all && g <= 1024; ++g) {
    if (all % g == 0 && (dtype != DType::kI4 || g % 2 == 0)) work += (work.empty() ? "" : ", ") + std::to_string(g);
  }
  const std::string got = std::to_string(group_size) + (is_default ? " (the default)" : "");
  for (const auto& [what, width] : widths) {
    if (group_size >= 1 && width % group_size == 0) continue;
    const std::string why = std::string(dtype_name(dtype)) +
                            " groups must not straddle a matrix's input width or a rank's slice: " + what + " is " +
                            std::to_string(width) + " wide at tp " + std::to_string(p.tp_size);
    if (work.empty()) {  // e.g. int4 with an odd slice: no group size fits this tp size
      throw Error(why + "; no " + dtype_name(dtype) + " group size fits at this tp size (use int8, or another --tp)",
                  "--weight-group-size", "", got);
    }
    throw Error(why, "--weight-group-size", "one of " + work, got);
  }
}

}  // namespace linnet
