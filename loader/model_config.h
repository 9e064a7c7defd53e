// config.json -> ModelConfig. Global model dimensions, named as Hugging Face names
// them; they never change after load (per-rank sizes live in ShardPlan).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace linnet {

/// rope_scaling with rope_type "llama3" (Llama 3.1): inverse frequencies are divided
/// by `factor` below the low-frequency wavelength bound and smoothly blended between the
/// bounds (transformers' _compute_llama3_parameters).
struct RopeScaling {
  std::string rope_type;                      // "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

/// The weights of a pre-quantized checkpoint, from config.json's "quantization_config":
/// compressed-tensors' "pack-quantized" format (what llm-compressor writes and vLLM
/// reads, e.g. the published "quantized.w4a16" / "quantized.w8a16" checkpoints), weight
/// only. Every nn.Linear of the decoder layers (q/k/v/o_proj, gate/up/down_proj; Phi-3's
/// fused qkv_proj / gate_up_proj) is stored as `<name>.weight_packed` (I32: num_bits-bit
/// values q + 2^(num_bits-1), packed densely along the input dimension, value c of a row
/// at bit c * num_bits of the row's words, low bits first), `<name>.weight_scale`
/// ([out, in / group_size], or [out, 1] per channel; a float dtype), `<name>.weight_shape`
/// (the [out, in] it stands for) and, when asymmetric, `<name>.weight_zero_point` (I32:
/// the zero points z + 2^(num_bits-1) packed along the output dimension, [ceil(out *
/// num_bits / 32), groups]). The weight is w = (q - z) * scale (z = 0 when symmetric):
/// compressed-tensors' dequantize(). The embedding and the lm_head (in "ignore") stay
/// dense.
/// FP8 (`fp8`; formats "naive-quantized" and "float-quantized", weights type "float",
/// 8 bits, e4m3): each projection is `<name>.weight` (F8_E4M3, [out, in]) and
/// `<name>.weight_scale` ([out, 1] per channel, [1] per tensor); w = fp8 * scale, widened
/// to the held float dtype at load. Dynamic per-token FP8 input activations (the
/// "FP8_DYNAMIC" scheme) are not applied (`activations_ignored`): the result is the
/// weight-only computation.
struct WeightQuantization {
  int64_t num_bits = 4;     // 4 or 8
  bool symmetric = true;    // false: zero points (int4 only)
  int64_t group_size = 0;   // strategy "group": inputs per scale; 0: "channel" (one per output row) or FP8's "tensor"
  bool fp8 = false;         // FP8 e4m3 weights (widened at load) instead of packed integers
  bool per_tensor = false;  // FP8 strategy "tensor": one scale for the matrix
  bool activations_ignored = false;  // FP8 with dynamic FP8 input activations, not applied

  /// E.g. 'compressed-tensors pack-quantized int4, groups of 32, symmetric', or
  /// 'compressed-tensors FP8 e4m3 weights, per channel, widened at load (dynamic FP8
  /// input activations not applied)'.
  std::string describe() const;
};

/// The architecture of a Llama-family decoder, from config.json.
struct ModelConfig {
  std::string model_type;                 // "llama", "mistral", "qwen3", "phi3"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;        // defaults to num_attention_heads
  int64_t head_dim = 0;                   // defaults to hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // null / "default": plain RoPE
  std::optional<int64_t> sliding_window;    // a query sees itself and the window-1 keys before it
  bool qk_norm = false;                   // Qwen3: RMSNorm per head on q and k before RoPE
  bool fused_projections = false;         // Phi-3: qkv_proj and gate_up_proj in the checkpoint
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;     // eos_token_id: an int or a list
  std::string torch_dtype;                // informational ("float32", "bfloat16", ...)
  std::optional<WeightQuantization> quantization;  // a pre-quantized checkpoint's layer matrices

  /// Parses a config.json object. `source` (usually the file path) names the file in
  /// errors.
  /// Accepts rope settings both as transformers 4 writes them (rope_theta,
  /// rope_scaling) and as transformers 5 does (rope_parameters).
  /// @throws Error naming the field when a required field is missing, has the wrong
  ///   JSON type or an impossible value (<= 0, an odd head_dim, num_attention_heads not a
  ///   multiple of num_key_value_heads), or a size larger than this build supports
  ///   (num_hidden_layers > 2^20; hidden_size, intermediate_size, vocab_size, head counts
  ///   or head_dim > 2^26), or when the config uses something this
  ///   build does not implement: model_type other than llama / mistral / qwen3 / phi3,
  ///   a rope_scaling or rope_parameters type (rope_type, or the older "type") other than
  ///   default / llama3 in either field, even when both are given (rope_parameters is
  ///   the one used), attention_bias or mlp_bias true,
  ///   hidden_act other than "silu", Qwen3's use_sliding_window, or a quantization_config
  ///   other than compressed-tensors "dense" (float weights, loaded as they are) or the
  ///   "pack-quantized" schemes WeightQuantization describes (the error names the method,
  ///   format and scheme, and the field of the scheme that is not supported).
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);

  /// Parses the text of a config.json. `source` names the file in errors.
  /// @throws Error naming `source` when `text` is not valid JSON, then as from_json.
  static ModelConfig from_text(std::string_view text, const std::string& source);

  /// Reads and parses `path` (config.json).
  /// @throws Error naming the file when it is missing, not a regular file or not valid
  ///   JSON, then as from_json.
  static ModelConfig load(const std::filesystem::path& path);
};

}  // namespace linnet
