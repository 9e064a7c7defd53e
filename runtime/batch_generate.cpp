#include "runtime/batch_generate.h"

#include <utility>

#include "runtime/batch_session.h"

namespace linnet {

std::vector<GenerationResult> generate_batch(Engine& engine, const std::vector<BatchRequest>& requests,
                                             const RequestDone& on_done, int64_t step_token_budget) {
  BatchOptions options;
  options.on_done = on_done;
  options.step_token_budget = step_token_budget;
  return generate_batch(engine, requests, options);
}

std::vector<GenerationResult> generate_batch(Engine& engine, const std::vector<BatchRequest>& requests,
                                             const BatchOptions& options) {
  std::vector<GenerationResult> results(requests.size());
  SessionOptions so;
  so.step_token_budget = options.step_token_budget;
  so.prefix_caching = options.prefix_caching;
  so.speculative = options.speculative;
  so.draft = options.draft;
  if (options.stop_check) {
    so.stop_check = [&](int64_t id, int32_t token) { return options.stop_check(static_cast<size_t>(id), token); };
  }
  so.on_done = [&](int64_t id, GenerationResult& g) {
    const size_t i = static_cast<size_t>(id);
    results[i] = std::move(g);
    if (options.on_done) options.on_done(i, results[i]);
  };
  BatchSession session(engine, std::move(so));
  for (size_t i = 0; i < requests.size(); ++i) session.add(static_cast<int64_t>(i), requests[i]);
  while (!session.idle()) {
    if (options.stop_requested && options.stop_requested()) break;
    if (!session.step()) break;
  }
  // Stopped early: the unfinished keep what they generated, with no finish_reason.
  for (size_t i = 0; i < requests.size(); ++i) {
    if (const GenerationResult* g = session.result(static_cast<int64_t>(i))) results[i] = *g;
  }
  if (options.kv_stats) *options.kv_stats = session.pool_stats();
  if (options.speculative_stats) *options.speculative_stats = session.speculative_stats();
  return results;
}

}  // namespace linnet
