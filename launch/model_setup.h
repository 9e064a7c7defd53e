// Loading a model for generation, shared by `generate` and `serve`: the checkpoint,
// tokenizer, shard plan, context length, sampling defaults and EOS ids first (so the
// caller can read its requests), then the backend and the Engine with a KV pool sized
// for the batch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "launch/cli_options.h"
#include "loader/tokenizer/tokenizer.h"
#include "parallel/mpi_communicator.h"
#include "parallel/shard_plan.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"

namespace linnet {

/// A model opened for generation on one rank, before its engine exists.
struct GenerationModel {
  std::filesystem::path model_dir;
  std::unique_ptr<ModelFiles> files;
  std::unique_ptr<Tokenizer> tokenizer;
  ShardPlan plan;                // this rank's slices
  int64_t max_seq_len = 0;       // positions one request may reach (--max-seq-len)
  RequestSettings defaults;      // generation_config.json overridden by the flags
  std::vector<int64_t> eos;      // the model's EOS ids
};

/// Opens `o.model` (resolve_model_dir) for tp rank `w.tp_rank` of `w.tp_size`.
/// Makes no collective call (run it inside Job::load_phase).
/// @throws Error naming the file when the checkpoint, config or tokenizer is bad, when
///   the tokenizer knows more ids than the model has rows, or when
///   generation_config.json's sampling values are out of range.
GenerationModel open_generation_model(const GenerateOptions& o, const WorldConfig& w);

/// The backend and engine of `files` (sliced by `plan`) for up to `batch_rows` requests at once (KV pool from
/// --kv-cache-tokens / --kv-cache-memory-fraction, else batch_rows x max_seq_len), after
/// the memory preflight; rank 0 prints the per-rank memory. No collective call.
/// @throws Error when the pool or the weights cannot fit in memory, or as make_engine.
void build_generation_engine(const GenerateOptions& o, const ModelFiles& files, const ShardPlan& plan,
                             int64_t max_seq_len, MpiGroups& groups, int64_t batch_rows,
                             std::unique_ptr<Backend>& backend, std::unique_ptr<Engine>& engine);

}  // namespace linnet
