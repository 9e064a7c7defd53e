#include "runtime/weights.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

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

// A matrix of this rank being assembled from a pre-quantized checkpoint
// (WeightQuantization), row by row: one code byte per value (kernels/cpu/gemm.h:
// pack_quantized_weight), f32 scales and int4 offsets per group of `group` inputs.
struct QuantStage {
  int64_t n = 0, k = 0, group = 0;
  DType dtype = DType::kI4;
  std::vector<uint8_t> codes;
  std::vector<float> scales, offsets;

  bool empty() const { return n == 0; }
  void init(int64_t rows, int64_t cols, int64_t group_size, DType dt) {
    n = rows, k = cols, group = group_size, dtype = dt;
    codes.assign(static_cast<size_t>(n * k), 0);
    scales.assign(static_cast<size_t>(n * (k / group)), 0.0f);
    if (dt == DType::kI4) offsets.assign(scales.size(), 0.0f);
  }
  // The packed form the CPU kernels run (a host tensor in `dtype`, [n, k]); frees the stage.
  Tensor pack() {
    const int64_t bytes = cpu::quantized_matrix_bytes(n, k, group, dtype);
    auto storage = std::make_shared<std::vector<uint64_t>>(static_cast<size_t>((bytes + 7) / 8));
    cpu::pack_quantized_weight(codes.data(), scales.data(), dtype == DType::kI4 ? offsets.data() : nullptr, n, k, group,
                               storage->data(), dtype);
    void* data = storage->data();
    Tensor t = Tensor::wrap({n, k}, dtype, Device::kCpu, std::move(storage), data);
    *this = QuantStage();
    return t;
  }
};

// The group size of a quantized matrix on this rank: the checkpoint's, or per channel
// the rank's input width (one group a row).
int64_t local_group(const WeightQuantization& q, int64_t local_in) { return q.group_size > 0 ? q.group_size : local_in; }

DType quantized_dtype(const WeightQuantization& q) { return q.num_bits == 4 ? DType::kI4 : DType::kI8; }

// Checks that the quantized checkpoint matrix `e`'s weight_shape is the [out, in] the
// model needs.
void check_weight_shape(const Checkpoint& ckpt, const WeightEntry& e) {
  const std::string name = quantized_part_name(e, "weight_shape");
  const auto [info, file] = ckpt.find(name);
  std::vector<int64_t> shape(2);
  if (info && info->dtype == DType::kI32) {
    int32_t v[2];
    ckpt.read(name, Slice2D{0, 1, 0, 2}, DType::kI32, v);
    shape = {v[0], v[1]};
  } else {
    ckpt.read(name, Slice2D{0, 1, 0, 2}, DType::kI64, shape.data());
  }
  if (shape != e.shape) {
    throw Error("tensor '" + name + "': a quantized matrix's weight_shape is not the shape the model needs",
                file ? file->path().string() : name, shape_str(e.shape), shape_str(shape));
  }
}

// Rows [r0, r1) and input columns [c0, c1) of the quantized checkpoint matrix `e` into
// `st` from its row dst_row: values unpacked from weight_packed, scales, and int4
// offsets m' = -z s from the zero points (so that w = (q - 8) s + m', which is
// compressed-tensors' (q_signed - z) s with q_signed = q - 8).
void read_quantized(const Checkpoint& ckpt, const WeightEntry& e, const WeightQuantization& q, int64_t r0, int64_t r1,
                    int64_t c0, int64_t c1, QuantStage& st, int64_t dst_row) {
  const int64_t bits = q.num_bits;
  const int64_t rows = r1 - r0, cols = c1 - c0;
  const int64_t G = local_group(q, cols);
  const int64_t g0 = q.group_size > 0 ? c0 / G : 0, ng = cols / G;
  const uint32_t mask = (1u << bits) - 1, half = 1u << (bits - 1);
  // Values: the words that hold columns [c0, c1) of each row.
  const int64_t w0 = c0 * bits / 32, w1 = (c1 * bits + 31) / 32, nw = w1 - w0;
  std::vector<int32_t> words(static_cast<size_t>(rows * nw));
  ckpt.read(quantized_part_name(e, "weight_packed"), Slice2D{r0, r1, w0, w1}, DType::kI32, words.data());
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = st.codes.data() + (dst_row + r) * st.k;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t bit = (c0 + c) * bits - w0 * 32;
      const uint32_t u = (static_cast<uint32_t>(words[static_cast<size_t>(r * nw + bit / 32)]) >> (bit % 32)) & mask;
      dst[c] = static_cast<uint8_t>(bits == 8 ? u ^ 0x80u : u);  // int8: u - 128 as two's complement
    }
  }
  std::vector<float> scale(static_cast<size_t>(rows * ng));
  ckpt.read(quantized_part_name(e, "weight_scale"), Slice2D{r0, r1, g0, g0 + ng}, DType::kF32, scale.data());
  std::vector<int32_t> zp_words;
  int64_t zw0 = 0;
  if (!q.symmetric) {  // zero points packed along the output rows: [ceil(out b / 32), groups]
    zw0 = r0 * bits / 32;
    const int64_t zw1 = (r1 * bits + 31) / 32;
    zp_words.resize(static_cast<size_t>((zw1 - zw0) * ng));
    ckpt.read(quantized_part_name(e, "weight_zero_point"), Slice2D{zw0, zw1, g0, g0 + ng}, DType::kI32,
              zp_words.data());
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < ng; ++g) {
      const float s = scale[static_cast<size_t>(r * ng + g)];
      const size_t at = static_cast<size_t>((dst_row + r) * (st.k / st.group) + g);
      st.scales[at] = s;
      if (st.dtype != DType::kI4) continue;
      float m = 0.0f;
      if (!q.symmetric) {
        const int64_t bit = (r0 + r) * bits - zw0 * 32;
        const uint32_t u =
            (static_cast<uint32_t>(zp_words[static_cast<size_t>((bit / 32) * ng + g)]) >> (bit % 32)) & mask;
        m = -(static_cast<float>(static_cast<int32_t>(u) - static_cast<int32_t>(half)) * s);
      }
      st.offsets[at] = m;
    }
  }
}

// Rows [r0, r1) and input columns [c0, c1) of an FP8 checkpoint matrix `e` into `dst`
// ([rows, cols] in `dt`): w = fp8 * scale in f32 (compressed-tensors' dequantize with an
// f32 scale; the e4m3 value widens exactly), then narrowed to `dt` (nearest even).
void read_fp8(const Checkpoint& ckpt, const WeightEntry& e, const WeightQuantization& q, int64_t r0, int64_t r1,
              int64_t c0, int64_t c1, DType dt, void* dst) {
  const int64_t rows = r1 - r0, cols = c1 - c0;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  ckpt.read(e.name, Slice2D{r0, r1, c0, c1}, DType::kF32, w.data());
  std::vector<float> scale(static_cast<size_t>(q.per_tensor ? 1 : rows));
  const std::string scale_name = quantized_part_name(e, "weight_scale");
  ckpt.read(scale_name, q.per_tensor ? Slice2D{0, 1, 0, 1} : Slice2D{r0, r1, 0, 1}, DType::kF32, scale.data());
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scale[static_cast<size_t>(q.per_tensor ? 0 : r)];
    for (int64_t c = 0; c < cols; ++c) w[static_cast<size_t>(r * cols + c)] *= s;
  }
  if (dt == DType::kF32) {
    std::memcpy(dst, w.data(), w.size() * sizeof(float));
  } else {
    narrow_f32(w.data(), rows * cols, dt, static_cast<uint16_t*>(dst));
  }
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

  check_quantized_checkpoint(c, p);
  ModelWeights w;
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  const WeightQuantization* quant = c.quantization ? &*c.quantization : nullptr;
  if (!quant || quant->fp8) {
    for (LayerWeights& L : w.layers) {
      L.wqkv = Tensor::zeros({q_rows + 2 * kv_rows, h}, dt);
      L.w_gate_up = Tensor::zeros({2 * inter, h}, dt);
    }
  }
  // A pre-quantized checkpoint: a layer's stacked wqkv and w_gate_up are assembled from
  // their entries, then packed once the table moves past the layer.
  QuantStage qkv_stage, gate_up_stage;
  int prev_layer = -1;
  auto finish_layer = [&](int layer) {
    if (layer < 0) return;
    LayerWeights& L = w.layers[static_cast<size_t>(layer)];
    if (!qkv_stage.empty()) L.wqkv = qkv_stage.pack();
    if (!gate_up_stage.empty()) L.w_gate_up = gate_up_stage.pack();
  };

  for (const WeightEntry& e : weight_table(c)) {
    if (e.layer != prev_layer) finish_layer(prev_layer);
    prev_layer = e.layer;
    LayerWeights* L = e.layer >= 0 ? &w.layers[static_cast<size_t>(e.layer)] : nullptr;
    const bool packed = quant && !quant->fp8 && stored_quantized(e, c);
    const bool fp8 = quant && quant->fp8 && stored_quantized(e, c);
    if (packed) check_weight_shape(ckpt, e);
    // Row-parallel: all h rows, this rank's input columns [c0, c0 + width), in the
    // checkpoint's form (packed int4 / int8, FP8 widened to dt, or dt).
    auto row_parallel = [&](int64_t c0, int64_t width) {
      if (packed) {
        QuantStage st;
        st.init(h, width, local_group(*quant, width), quantized_dtype(*quant));
        read_quantized(ckpt, e, *quant, 0, h, c0, c0 + width, st, 0);
        return st.pack();
      }
      Tensor t = Tensor::zeros({h, width}, dt);
      if (fp8) {
        read_fp8(ckpt, e, *quant, 0, h, c0, c0 + width, dt, t.raw());
      } else {
        ckpt.read(e.name, Slice2D{0, h, c0, c0 + width}, file_dt, t.raw());
      }
      return t;
    };
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
          if (packed) {
            QuantStage& st = attn ? qkv_stage : gate_up_stage;
            if (st.empty()) st.init(attn ? q_rows + 2 * kv_rows : 2 * inter, h, local_group(*quant, h), quantized_dtype(*quant));
            const int64_t first = s.row_offset + t.shard_begin;
            read_quantized(ckpt, e, *quant, first, first + t.rows, 0, h, st, t.dst_row);
            continue;
          }
          auto* dst = static_cast<char*>((attn ? L->wqkv : L->w_gate_up).raw()) + t.dst_row * h * elem;
          const int64_t first = s.row_offset + t.shard_begin;
          if (fp8) {
            read_fp8(ckpt, e, *quant, first, first + t.rows, 0, h, dt, dst);
            continue;
          }
          ckpt.read(e.name, Slice2D{first, first + t.rows, 0, h}, file_dt, dst);
        }
        break;
      case WeightRole::kOProj:  // the input columns that meet this rank's heads
        L->wo = row_parallel(p.head_begin * hd, q_rows);
        break;
      case WeightRole::kDownProj:
        L->w_down = row_parallel(p.intermediate_begin, inter);
        break;
    }
  }
  finish_layer(prev_layer);
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
  auto bytes = [&](int64_t n, int64_t k) {
    if (c.quantization && !c.quantization->fp8) {  // packed as they are; FP8 is widened to dt
      return matrix_bytes(n, k, quantized_dtype(*c.quantization), local_group(*c.quantization, k));
    }
    return matrix_bytes(n, k, dt, group_size);
  };
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

namespace {

// The input widths of a rank's quantized matrices, named for messages: hidden_size (the
// column-parallel ones, and the vocabulary tables when quantized at load: `with_vocab`),
// its heads' width (o_proj) and its intermediate slice (down_proj).
std::vector<std::pair<const char*, int64_t>> input_widths(const ModelConfig& c, const ShardPlan& s, bool with_vocab) {
  return {{with_vocab ? "q/k/v_proj, gate/up_proj, embed_tokens and lm_head (hidden_size)"
                      : "q/k/v_proj and gate/up_proj (hidden_size)",
           c.hidden_size},
          {"o_proj (this rank's heads x head_dim)", s.num_heads_local * c.head_dim},
          {"down_proj (this rank's intermediate slice)", s.intermediate_local}};
}

}  // namespace

void check_weight_groups(const ModelConfig& c, const ShardPlan& p, int64_t group_size, DType dtype, bool is_default) {
  if (dtype == DType::kI4 && (group_size % 2 != 0 || group_size > 1024)) {
    throw Error("int4 packs two inputs a byte: its groups are even, at most 1024", "--weight-group-size",
                "an even size in [2, 1024]", std::to_string(group_size));
  }
  const auto widths = input_widths(c, p, /*with_vocab=*/true);
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

namespace {

// Whether a `width`-wide slice holds whole groups of `q` (int4: even ones).
bool holds_whole_groups(const WeightQuantization& q, int64_t width) {
  const int64_t g = local_group(q, width);
  return width % g == 0 && (q.num_bits != 4 || g % 2 == 0);
}

}  // namespace

std::string quantized_tp_sizes(const ModelConfig& c) {
  std::string work;
  for (int tp = 1; tp <= 16; ++tp) {
    bool ok = true;
    try {
      for (int r = 0; r < tp && ok; ++r) {
        const ShardPlan s = ShardPlan::make(c, r, tp);
        if (c.quantization && !c.quantization->fp8)
          for (const auto& w : input_widths(c, s, false)) ok = ok && holds_whole_groups(*c.quantization, w.second);
      }
    } catch (const Error&) {
      ok = false;
    }
    if (ok) work += (work.empty() ? "" : ", ") + std::to_string(tp);
  }
  return work;
}

void check_quantized_checkpoint(const ModelConfig& c, const ShardPlan& p) {
  if (!c.quantization || c.quantization->fp8) return;  // FP8 scales are per row or per matrix: any slice
  const WeightQuantization& q = *c.quantization;
  for (const auto& [what, width] : input_widths(c, p, false)) {
    if (holds_whole_groups(q, width)) continue;
    const std::string work = quantized_tp_sizes(c);
    throw Error(q.describe() + ": a rank's slice would split a quantization group: " + what + " is " +
                    std::to_string(width) + " wide at tp " + std::to_string(p.tp_size) +
                    (q.group_size > 0 ? ", not a multiple of the group size " + std::to_string(q.group_size)
                                      : std::string(", odd (int4 packs two inputs a byte)")),
                "--tp", work.empty() ? "no tp size up to 16" : "one of " + work, std::to_string(p.tp_size));
  }
}

}  // namespace linnet

namespace linnet {

void check_int8_activations(const ModelConfig& c, const ShardPlan& p, DType held, int64_t group_size) {
  const auto& q = c.quantization;
  const bool int4 = q ? (!q->fp8 && q->num_bits == 4) : held == DType::kI4;
  if (!int4) {
    throw Error("int8 activations are a mode of the int4 kernels; the layers here are " +
                    (q ? q->describe() : std::string(dtype_name(held))),
                "--activation-dtype", "f32 (or int8 with --weight-dtype int4 or an int4 checkpoint)", "int8");
  }
  for (const auto& [what, width] : input_widths(c, p, false)) {
    const int64_t g = q ? local_group(*q, width) : group_size;
    if (g % cpu::kActBlock == 0) continue;
    throw Error("int8 activations are scaled per " + std::to_string(cpu::kActBlock) +
                    " inputs, inside the int4 groups: " + what + " has groups of " + std::to_string(g) +
                    " at tp " + std::to_string(p.tp_size),
                "--activation-dtype", "f32, or int4 groups of a multiple of " + std::to_string(cpu::kActBlock), "int8");
  }
}

}  // namespace linnet
