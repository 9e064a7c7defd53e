// Random weights of a model's full size, for `linnet-tp bench --random-weights`: the
// shapes of load_weights (runtime/weights.h) for this rank's ShardPlan, made directly in
// the backend's memory and weight dtype (bf16 on the device for CUDA), so benchmarking
// a Llama-3.1-8B shape needs neither a checkpoint nor a host buffer of its size.
#pragma once

#include <cstdint>

#include "loader/model_config.h"
#include "parallel/shard_plan.h"
#include "runtime/backend.h"
#include "runtime/weights.h"

namespace linnet {

/// This rank's slices filled with N(0, stddev^2) (matrices; each tensor its own stream
/// of random_normal derived from `seed`) and ones (norm weights, as transformers
/// initializes LlamaRMSNorm). Matrices are in `backend`'s memory (Engine's upload of
/// them is then a no-op); norm vectors in host f32. The lm_head is the embedding when
/// tie_word_embeddings.
ModelWeights random_weights(Backend& backend, const ModelConfig& config, const ShardPlan& plan, uint64_t seed,
                            float stddev = 0.02f);

}  // namespace linnet
