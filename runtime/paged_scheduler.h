// PagedScheduler: what each step of paged batch generation runs (vLLM's scheduler, in
// the small). Requests wait in arrival order; one is admitted when a batch slot is free
// and the pool can hold its whole length (prompt + max_new_tokens, capped at
// max_seq_len): its longest cached prompt prefix is shared (PagePool::match_prefix) and
// fresh pages are reserved for the rest, so a running request never runs out of pages
// and nothing is ever preempted (TensorRT-LLM's "guaranteed no evict" policy). Each step
// packs one decode token of every running request that has its prompt in the cache,
// then prompt chunks of the others up to the step's token budget (chunked prefill, as
// Sarathi-Serve / vLLM: a long prompt is spread over several steps while the others
// keep decoding).
//
// The scheduler is deterministic: every rank of a tp group that makes the same calls
// builds the same steps.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/page_pool.h"

namespace linnet {

/// Steps for paged batch generation over one PagePool.
class PagedScheduler {
 public:
  /// @param max_batch     requests running at once (>= 1).
  /// @param max_seq_len   positions one request may reach.
  /// @param token_budget  tokens packed into one step (decode tokens included; >= 1).
  /// @param prefix_caching  share cached prompt prefixes (off: every prompt is computed
  ///                        in full, e.g. to compare against).
  PagedScheduler(PagePool& pool, int64_t max_batch, int64_t max_seq_len, int64_t token_budget,
                 bool prefix_caching = true);

  /// Queues request `id` (unique) with a non-empty prompt and max_new_tokens >= 1.
  /// Returns an error message, and queues nothing, when its length can never fit in the
  /// pool (even empty).
  std::optional<std::string> add(int64_t id, std::vector<int32_t> prompt, int64_t max_new_tokens);

  /// One pass to run: batch.last[k] is the token whose logits belong to request ids[k]
  /// (the last prompt token of a finished prefill, or a decode token). A request with
  /// guesses (append's `draft`) has consecutive rows: its pending token's, then one per
  /// guess (the guess is that row's input token, batch.tokens[batch.last[k]]).
  struct Step {
    Engine::PagedBatch batch;
    std::vector<int64_t> ids;      // per logits row
    std::vector<int64_t> seq_ids;  // per sequence of the batch (batch.page_tables)
  };
  /// The next step, or nullopt when no request is waiting or running. Call done_step()
  /// after the engine ran it.
  std::optional<Step> next_step();
  /// Marks the step's tokens as cached (and registers newly filled prompt pages for
  /// sharing).
  void done_step(const Step& step);
  /// The token request `id` sampled from its logits; it goes through the model in the
  /// next step, followed by the guessed tokens `draft` (speculative decoding: each gets
  /// a logits row), as many of them as fit before the request's reserved length and in
  /// the step's token budget.
  void append(int64_t id, int32_t token, std::span<const int32_t> draft = {});
  /// After a step with guesses: request `id` keeps K/V for its first `cached` positions
  /// only (the pending token and the accepted guesses); the rejected positions' K/V stay
  /// in its pages unread until later tokens overwrite them. cached must lie between the
  /// prompt's length and what the request has cached.
  void rewind(int64_t id, int64_t cached);
  /// Ends request `id` (stop, length, error, cancelled) and releases its pages; a
  /// request still waiting is taken out of the queue. Unknown ids are ignored.
  void finish(int64_t id);

  bool idle() const { return waiting_.empty() && running_.empty(); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  const PagePoolStats& pool_stats() const { return pool_.stats(); }
  /// Pages held by running requests now (the rest are free or cached).
  int64_t pages_in_use() const { return pool_.num_pages() - pool_.available_pages(); }

 private:
  struct Request {
    int64_t id = 0;
    std::vector<int32_t> prompt;
    int64_t length = 0;                    // positions reserved: min(prompt + max_new_tokens, max_seq_len)
    std::vector<int32_t> pages;
    int64_t cached = 0;                    // positions whose K/V are in the pool
    std::optional<int32_t> next_token;     // sampled, not yet run
    std::vector<int32_t> draft;            // guesses run after next_token
  };
  int64_t pages_for(int64_t positions) const;
  bool admit(Request& r);

  PagePool& pool_;
  int64_t max_batch_, max_seq_len_, token_budget_;
  bool prefix_caching_;
  std::deque<Request> waiting_;
  std::map<int64_t, Request> running_;  // by id: steps list requests in id order
};

}  // namespace linnet
