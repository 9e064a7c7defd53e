// ModelWeights: this rank's slices of the checkpoint, laid out for the forward pass.
// q/k/v rows of the rank's heads are stacked into one column-parallel wqkv and gate/up
// into one w_gate_up, so each is a single GEMM.
#pragma once

#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/model_config.h"
#include "parallel/shard_plan.h"
#include "runtime/tensor.h"

namespace linnet {

/// One decoder layer on one rank.
struct LayerWeights {
  Tensor input_norm;      // [hidden_size], replicated
  Tensor wqkv;            // [(num_heads_local + 2 * num_kv_heads_local) * head_dim, hidden_size], column-parallel
  Tensor q_norm;          // [head_dim], replicated (Qwen3 QK-norm; empty otherwise)
  Tensor k_norm;          // [head_dim], replicated (Qwen3 QK-norm; empty otherwise)
  Tensor wo;              // [hidden_size, num_heads_local * head_dim], row-parallel
  Tensor post_attn_norm;  // [hidden_size], replicated
  Tensor w_gate_up;       // [2 * intermediate_local, hidden_size], column-parallel ([gate | up])
  Tensor w_down;          // [hidden_size, intermediate_local], row-parallel
};

/// The whole model on one rank.
struct ModelWeights {
  Tensor embed_tokens;    // [vocab_local, hidden_size], vocab-parallel; padded rows are zero
  Tensor lm_head;         // [vocab_local, hidden_size], vocab-parallel (embed_tokens when tied)
  Tensor final_norm;      // [hidden_size], replicated
  std::vector<LayerWeights> layers;
  bool on_backend = false;  // matrices already in a backend's memory and layout (random_weights)
};

/// Reads this rank's slices (and only those bytes) from `ckpt`, walking
/// weight_table(config): weight matrices (embedding, lm_head, wqkv, wo, w_gate_up,
/// w_down) as `matrix_dtype` (kF32, kBF16 or kF16: the file's dtype copied as stored,
/// another converted, narrowing rounded to nearest even), norm weights as f32. With
/// config.quantization (a pre-quantized checkpoint) the layers' matrices come packed
/// instead, in kI4 / kI8 (kernels/cpu/gemm.h: pack_quantized_weight; groups of the
/// checkpoint's group size, or one a row per channel), and only the embedding and the
/// lm_head are read as `matrix_dtype`. Fused
/// tensors (Phi-3 qkv_proj, gate_up_proj) are split into their segments first and each
/// segment is sharded. The checkpoint must already be validated against the table.
/// @throws Error from the loader on read failures, from check_quantized_checkpoint
///   (first), or naming a quantized matrix whose weight_shape is not the table's.
ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& config, const ShardPlan& plan,
                          DType matrix_dtype = DType::kF32);

/// Elements of the weight matrices one decode step reads on this rank (every layer
/// matrix and the lm_head; the embedding table only its looked-up rows, which are left
/// out): 2 flops each per token in `bench`.
int64_t decode_weight_elements(const ModelConfig& config, const ShardPlan& plan);

/// Bytes of those matrices with the layers' in `matrix_dtype` (a pre-quantized
/// checkpoint's: their packed int4 / int8 form, whatever `matrix_dtype`) and the lm_head in
/// vocab_weight_dtype(matrix_dtype): int8 / int4 ones count their packed form (values,
/// f32 scales and offsets per `group_size` inputs of each output, padding;
/// kernels/cpu/gemm.h: quantized_matrix_bytes). The numerator of achieved bandwidth in
/// `bench`.
int64_t decode_weight_bytes(const ModelConfig& config, const ShardPlan& plan, DType matrix_dtype,
                            int64_t group_size = 64);

/// Bytes of weights this rank holds under `plan`: decode_weight_bytes, plus the
/// embedding table when it is not the lm_head (tied ones count once), plus the norm
/// vectors in f32 (for the memory preflight, `linnet-tp info` and the start-up line).
int64_t weight_bytes_local(const ModelConfig& config, const ShardPlan& plan,
                           DType matrix_dtype = DType::kF32, int64_t group_size = 64);

/// The dtype the embedding table and the lm_head are held in when the layers' matrices
/// are `matrix_dtype`: the same, except int8 for int4 (the vocabulary tables are the
/// most sensitive to 4 bits, as llama.cpp's Q4_K_M keeps token_embd / output at Q6_K;
/// SmolLM2-135M's perplexity on real text: +37% with them in int4 at groups of 64).
DType vocab_weight_dtype(DType matrix_dtype);

/// Checks that `group_size` (even for int4 `dtype`) divides the input width of every weight matrix this rank
/// holds under `plan` (hidden_size for the column-parallel and vocab-parallel ones, the
/// rank's attention width for o_proj and its intermediate slice for down_proj), so
/// every group of an int8 matrix lies in one rank's slice and the quantized weights
/// are the same at every tp size.
/// @throws Error naming --weight-group-size, the matrix, its width at this tp size and
/// the group sizes that would work (or that none does); `is_default`: the size was not
/// given, so the message says it is the default.
void check_weight_groups(const ModelConfig& config, const ShardPlan& plan, int64_t group_size,
                         DType dtype = DType::kI8, bool is_default = false);

/// Checks that this rank's slices of a pre-quantized checkpoint's matrices
/// (config.quantization) hold whole groups: the group size divides hidden_size, the
/// rank's o_proj width and its down_proj slice (per channel int4: each even). Nothing
/// to check without config.quantization.
/// @throws Error naming the scheme, the matrix, its width at this tp size, and the tp
/// sizes (up to 16) that work.
void check_quantized_checkpoint(const ModelConfig& config, const ShardPlan& plan);

/// Checks that --activation-dtype int8 (kernels/cpu/gemm.h: int8 activations for int4
/// weights) fits: the layers' matrices are int4 (`held` kI4 quantized at load with
/// `group_size`, or a pre-quantized int4 checkpoint) and every group this rank holds is
/// a multiple of cpu::kActBlock (32) inputs.
/// @throws Error naming --activation-dtype and what does not fit (the layers' dtype, or
/// the matrix and its group size at this tp size).
void check_int8_activations(const ModelConfig& config, const ShardPlan& plan, DType held, int64_t group_size);

/// The tp sizes up to 16 at which ShardPlan::make and check_quantized_checkpoint accept
/// every rank, e.g. "1, 2, 4" (empty when none does).
std::string quantized_tp_sizes(const ModelConfig& config);

/// The weight dtype config.json's torch_dtype names ("bfloat16" -> kBF16, "float16" ->
/// kF16, else kF32): what auto means for random weights.
DType config_weight_dtype(const ModelConfig& config);

}  // namespace linnet
