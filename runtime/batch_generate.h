// Batch generation with continuous batching over the Engine's KV cache rows: requests
// join as rows free up; each step runs the newly admitted prompts through one packed
// prefill (prefill_packed, no padding) and then one token for every active row
// (decode_rows). Each request samples with its own Sampler (its own seed), so its
// tokens do not depend on which other requests share the batch.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace linnet {

/// One prompt of a batch run.
struct BatchRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_new_tokens = 256;
  std::vector<int64_t> eos_ids;
};

/// Called on every rank as request `index` finishes.
using RequestDone = std::function<void(size_t index, const GenerationResult& result)>;

/// Generates every request, up to engine.max_batch() at a time, and returns the results
/// in request order. A request whose prompt is empty or does not fit in the KV cache row
/// finishes with finish_reason "error" and a message; the others go on. Every rank of
/// the tp group must call it with the same requests; tokens are drawn on tp rank 0 and
/// broadcast. `prefill_budget` caps the prompt tokens admitted in one packed pass (a
/// longer single prompt still goes alone).
std::vector<GenerationResult> generate_batch(Engine& engine, const std::vector<BatchRequest>& requests,
                                             const RequestDone& on_done = {}, int64_t prefill_budget = 4096);

}  // namespace linnet
