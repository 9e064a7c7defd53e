// From a model directory to a ready Engine: config.json, generation_config.json, the
// checkpoint validated against the weight table, then this rank's slices.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "loader/checkpoint.h"
#include "loader/generation_config.h"
#include "loader/model_config.h"
#include "runtime/engine.h"

namespace linnet {

/// The parsed, validated files of a model directory (weights still unread).
struct ModelFiles {
  std::filesystem::path dir;
  ModelConfig config;
  GenerationConfig generation;
  Checkpoint checkpoint;
  std::vector<std::string> unused_tensors;  // in the checkpoint, not read by the model
};

/// Parses config.json and generation_config.json in `dir`, opens the checkpoint and
/// validates every tensor of weight_table(config) (presence, shape, dtype).
/// @throws Error naming the file / field / tensor (all tensor problems in one message).
ModelFiles open_model(const std::filesystem::path& dir);

/// The KV cache length to use: `requested` when > 0, else
/// min(max_position_embeddings, 8192).
/// @throws Error naming --max-seq-len when requested exceeds max_position_embeddings.
int64_t resolve_max_seq_len(const ModelConfig& config, int64_t requested);

/// Loads this rank's slices per `plan` and builds the Engine over them.
std::unique_ptr<Engine> make_engine(const ModelFiles& files, const ShardPlan& plan, Backend& backend,
                                    Communicator& tp_comm, int64_t max_seq_len);

}  // namespace linnet
