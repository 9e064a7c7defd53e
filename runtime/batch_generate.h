// Batch generation with continuous batching over the Engine's KV pages: a BatchSession
// (runtime/batch_session.h) over a fixed list of requests, stepped until every one is
// done. Requests join as others finish (PagedScheduler: up to engine.max_batch()
// running, each with its whole length's pages reserved, prompt prefixes shared through
// the PagePool); each step is one step_paged pass with a decode token of every running
// request and prompt chunks of the others (chunked prefill, no padding). Each request
// samples with its own Sampler (its own seed), so its tokens do not depend on which
// other requests share the batch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/batch_session.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/page_pool.h"
#include "runtime/sampler.h"

namespace linnet {

/// Called on every rank as request `index` finishes.
using RequestDone = std::function<void(size_t index, const GenerationResult& result)>;

/// Called on tp rank 0 only with each new token of request `index`, in order (before
/// the token is appended to the result). Returning true finishes the request with finish_reason "stop" (e.g. its text now
/// holds a stop string); the decision reaches the other ranks with the token.
using StopCheck = std::function<bool(size_t index, int32_t token)>;

/// Called once per scheduler step on every rank of the tp group; true stops the run.
/// It must return the same value on every rank of the group (agree with a collective).
using StopRequested = std::function<bool()>;

/// Callbacks and limits of generate_batch; all optional.
struct BatchOptions {
  RequestDone on_done;
  StopCheck stop_check;
  StopRequested stop_requested;
  int64_t step_token_budget = 4096;  // most tokens in one pass (decode tokens and prompt
                                     // chunks; a longer prompt is prefilled over several steps)
  bool prefix_caching = true;         // share the KV pages of common prompt prefixes
  PagePoolStats* kv_stats = nullptr;  // when set, receives the KV pool's counters at the end
  SpeculativeConfig speculative;      // speculative decoding (SessionOptions::speculative)
  Engine* draft = nullptr;            // method "draft_model": the draft (SessionOptions::draft)
  SpeculativeStats* speculative_stats = nullptr;  // when set, receives its counters at the end
};

/// Generates every request, up to engine.max_batch() at a time, and returns the results
/// in request order. A request with an `error` of its own, whose prompt is empty, is longer than max_seq_len, whose
/// length (prompt + max_new_tokens, capped at max_seq_len) can never fit in the KV pool,
/// or which holds an id outside [0, vocab_size) finishes with finish_reason "error" and a
/// message before any step; one whose logits row holds a NaN or inf finishes with
/// "error" at that step. The others go on. Every rank of the tp group must call it with
/// the same requests. When options.stop_requested returns true the run ends at once:
/// requests not yet finished keep an empty finish_reason (and were never passed to
/// on_done). GenerationResult::token_ms counts from this call.
/// @throws Error from the engine (a collective or backend failure).
std::vector<GenerationResult> generate_batch(Engine& engine, const std::vector<BatchRequest>& requests,
                                             const BatchOptions& options);

/// generate_batch with only an on_done callback and a step token budget.
std::vector<GenerationResult> generate_batch(Engine& engine, const std::vector<BatchRequest>& requests,
                                             const RequestDone& on_done = {}, int64_t step_token_budget = 4096);

}  // namespace linnet
