// generation_config.json: special token ids and the model's sampling defaults.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace linnet {

/// The fields of generation_config.json linnet-tp uses. Absent fields stay empty;
/// the caller falls back to ModelConfig (bos/eos) or to greedy decoding.
struct GenerationConfig {
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;   // eos_token_id: an int or a list
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<double> min_p;               // transformers' MinPLogitsWarper
  std::optional<double> repetition_penalty;  // transformers' RepetitionPenaltyLogitsProcessor
  std::optional<int64_t> max_new_tokens;

  /// @throws Error naming `source` and the field when it has the wrong JSON type or an
  ///   impossible value: a token id < 0 or > 2^63-1, temperature not finite or < 0,
  ///   top_k < 0 or > 2^63-1, top_p outside (0, 1], min_p outside [0, 1],
  ///   repetition_penalty not finite or <= 0, max_new_tokens < 0.
  static GenerationConfig from_json(const nlohmann::json& j, const std::string& source);
  /// Parses the text of a generation_config.json. `source` names the file in errors.
  /// @throws Error naming `source` when `text` is not valid JSON, then as from_json.
  static GenerationConfig from_text(std::string_view text, const std::string& source);
  /// Reads `path`; a missing file gives an empty GenerationConfig (it is optional).
  /// @throws Error naming the file when it exists but is not a regular file or not valid
  ///   JSON, then as from_json.
  static GenerationConfig load(const std::filesystem::path& path);
};

}  // namespace linnet
