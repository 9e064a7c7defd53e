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
  ///   hidden_act other than "silu", Qwen3's use_sliding_window.
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
