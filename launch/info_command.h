// `linnet-tp info`: a model's configuration and, per tp rank, what it would hold
// (heads, KV heads, MLP units, vocabulary rows, bytes of weights and of KV cache),
// computed from config.json and the safetensors headers only: no weight is read, so it
// also works on a directory with no weights (sizes then come from config.json).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace linnet {

class Job;

/// Options of `linnet-tp info`.
struct InfoOptions {
  std::string model;        // --model: a directory or a model name (loader/model_path.h)
  int tp = 1;               // --tp: tensor-parallel size to plan for
  int64_t max_seq_len = 0;  // --max-seq-len: KV cache length (0: the generate default)
  std::string weight_dtype = "auto";  // --weight-dtype: the dtype the weights column counts (CPU backend)
  int64_t weight_group_size = 0;      // --weight-group-size: int8 / int4 inputs per scale (0: the dtype's default)
};

/// Parses `argv` after the word "info". Sets `help_text` and returns nullopt for --help.
/// @throws Error naming the option on unknown options, bad values or a missing --model.
std::optional<InfoOptions> parse_info_options(int argc, char** argv, std::string& help_text);

/// Prints the summary and the per-rank plan on rank 0. Returns the exit code: 0, or 1
/// after printing why (e.g. a tp size the model cannot be split over, with the sizes
/// that work).
int run_info(const InfoOptions& options, Job& job);

}  // namespace linnet
