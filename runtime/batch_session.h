// BatchSession: continuous batching over the Engine's KV pages as an open-ended,
// step-wise session. Requests are added and cancelled between steps (a server's
// arrivals and disconnects); each step() is one step_paged pass with a decode token of
// every running request and prompt chunks of the others (PagedScheduler), and each
// request samples with its own Sampler (its own seed), so its tokens do not depend on
// which other requests share the batch. generate_batch (runtime/batch_generate.h) is
// this session over a fixed list.
//
// Everything that needs the full logits row (sampling, logprobs, the caller's stop
// check) happens on tp rank 0, where Engine already gathered the vocab slices; one
// broadcast per step then gives every rank of the tp group each row's token and its
// outcome (go on, stop, error), so all ranks agree on which rows go on. Every rank of
// the group must make the same add / cancel / step calls in the same order: the
// session is then identical on all of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/draft_proposer.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/page_pool.h"
#include "runtime/paged_scheduler.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"

namespace linnet {

/// One prompt of a batch run.
struct BatchRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_new_tokens = 256;
  std::vector<int64_t> eos_ids;  // EOS and stop token ids: the token ends the request, finish "stop"
  int64_t top_logprobs = -1;     // -1: no logprobs; N >= 0: each new token's logprob and the N
                                 // most probable ids (GenerationResult::logprobs, tp rank 0)
  std::string error;             // non-empty: finishes with "error" and this message, never scheduled
};

/// Callbacks and limits of a BatchSession; all callbacks optional.
struct SessionOptions {
  /// tp rank 0 only: each new token of request `id`, before it is appended to the
  /// result. True finishes the request with finish_reason "stop" (e.g. its text now holds
  /// a stop string); the decision reaches the other ranks with the token.
  std::function<bool(int64_t id, int32_t token)> stop_check;
  /// Every rank: request `id` got a new token (already in `result.ids`, with its
  /// logprobs on tp rank 0 when asked for). Called before on_done when the token ends it.
  std::function<void(int64_t id, const GenerationResult& result)> on_token;
  /// Every rank: request `id` finished (finish_reason stop, length, error or cancelled);
  /// the session forgets it afterwards, so the callee may move from `result`.
  std::function<void(int64_t id, GenerationResult& result)> on_done;
  int64_t step_token_budget = 4096;  // most tokens in one pass (decode tokens and prompt
                                     // chunks; a longer prompt is prefilled over several steps)
  bool prefix_caching = true;        // share the KV pages of common prompt prefixes
  /// Speculative decoding (runtime/speculative.h): with method "ngram", each request's
  /// pending token goes through the model with up to num_speculative_tokens
  /// prompt-lookup guesses; each row draws its token as without speculation (the same
  /// sampler, the same random stream), and a guess is kept when the row before it drew
  /// exactly that token, up to the first that is not, plus the token drawn after them.
  /// For a one-hot proposal this keeps a guess with probability p(guess) and otherwise
  /// draws from p without it: the speculative sampling rule (Leviathan et al. 2023).
  /// Output, greedy or sampled, is the output without speculation, token for token
  /// (row-invariant kernels on the CPU). With method "draft_model" the guesses come from
  /// `draft` (DraftProposer: greedy, one-hot, so the same holds).
  SpeculativeConfig speculative;
  /// The draft model's Engine for method "draft_model": on this engine's tp
  /// communicator, with the target's tokenizer (the caller checks it), its own KV pool.
  Engine* draft = nullptr;
};

/// Appends row `row`'s penalties as Sampler::sample applies them, for
/// Engine::step_paged_top to apply where the logits are: repetition_penalty (f32) once on
/// each distinct id of `prompt` + `generated` (none when the prompt is empty, as the
/// sampler's context), then presence + frequency x count (computed in f64, applied in
/// f32) on each distinct id of `generated`. Every rank builds the same list.
void add_sampler_penalties(const SamplingParams& s, std::span<const int32_t> prompt,
                           std::span<const int32_t> generated, int32_t row, std::vector<Backend::Penalty>& out);

/// An open-ended continuous-batching run over one engine's KV pool (up to
/// engine.max_batch() requests running at once; the others wait in arrival order).
class BatchSession {
 public:
  /// Token times (GenerationResult::token_ms) count from this construction.
  /// @throws Error when options.speculative asks for "draft_model" without a draft
  ///   engine, or the draft's tp group is not the engine's size.
  BatchSession(Engine& engine, SessionOptions options);

  /// Adds request `id` (not in use by an unfinished request). A request with an `error`
  /// of its own, whose prompt is empty, is longer than max_seq_len, whose length
  /// (prompt + max_new_tokens, capped at max_seq_len) can never fit in the KV pool, or
  /// which holds an id outside [0, vocab_size) finishes with "error" (on_done) at once; one
  /// with max_new_tokens 0, or whose prompt fills max_seq_len, finishes with "length".
  /// With `after` (an unfinished request with the same prompt, e.g. the first of n
  /// choices), the request is only queued once that one has its whole prompt in the
  /// cache, so it shares the prompt's full KV pages instead of computing them again.
  void add(int64_t id, BatchRequest request, std::optional<int64_t> after = std::nullopt);

  /// Finishes request `id` with finish_reason "cancelled" (on_done) and frees its KV
  /// pages now; requests deferred behind it (`after`) are queued. False when `id` is not
  /// an unfinished request.
  bool cancel(int64_t id);

  /// Runs one step when any request is waiting or running: one step_paged pass, then
  /// the sampling of each finished row (on_token / on_done). Returns false when there was
  /// nothing to run (or nothing could be admitted).
  /// @throws Error from the engine (a collective or backend failure).
  bool step();

  /// No request is waiting, deferred or running.
  bool idle() const { return scheduler_.idle() && deferred_count_ == 0; }
  int64_t running() const { return scheduler_.running(); }
  /// Requests queued for a batch slot or pages, deferred ones included.
  int64_t waiting() const { return scheduler_.waiting() + deferred_count_; }
  /// Sequences in the last step's pass (decode rows and prompt chunks).
  int64_t last_step_sequences() const { return last_step_sequences_; }
  int64_t pages_in_use() const { return scheduler_.pages_in_use(); }
  int64_t num_pages() const { return pool_.num_pages(); }
  const PagePoolStats& pool_stats() const { return scheduler_.pool_stats(); }
  /// What an unfinished request has generated so far, or null.
  const GenerationResult* result(int64_t id) const;
  /// The session's speculation so far (all zero without SessionOptions::speculative).
  const SpeculativeStats& speculative_stats() const { return spec_stats_; }

 private:
  struct Entry {
    BatchRequest request;
    GenerationResult result;
    std::unique_ptr<Sampler> sampler;  // tp rank 0, from the first logits row
    // Speculation's back-off: after a step whose guesses were all rejected the request
    // makes no guesses for `spec_skip` steps, 1, 2, 4, ... up to kMaxSpecBackoff after
    // consecutive misses (spec_backoff), reset by any kept guess. Its own outcomes only:
    // the same at every tp and batch size.
    int64_t spec_skip = 0;
    int64_t spec_backoff = 0;
  };
  static constexpr int64_t kMaxSpecBackoff = 16;
  void finish(int64_t id, const std::string& reason);
  void queue(int64_t id);              // hands a request to the scheduler (or finishes it)
  void release_deferred(int64_t id);   // queues the requests waiting for `id`'s prompt
  void sample(const std::vector<int64_t>& ids, const std::vector<float>& logits);
  // How a step's rows are drawn without gathering their logits (Engine::step_paged_top).
  struct ShardStep {
    int64_t k = 0;            // candidates a row; 0: the full path (the whole step's logits to tp rank 0)
    int64_t vocab_limit = 0;  // the rows' common vocab_limit
    std::vector<Engine::RowSum> sums;
    std::vector<int> nucleus_sum;   // per row: index into its TopCandidates::sums of the
                                    // temperature's normalizer (top_k 0 with top-p / min-p); -1: none
    std::vector<int> logprob_sum;   // the same for its logprobs' normalizer; -1: none
    std::vector<char> always_full;  // per row: no cut at all (temperature alone): its whole row
  };
  // The shard path of a step: the k of Engine::step_paged_top (the largest top_k of the
  // sampled rows, top_logprobs of the logprobs rows, kMaxShardTopK for a top-p / min-p
  // over the whole vocabulary, at least 1) and the sums; k = 0 (the full path) when a row
  // samples with 64 < top_k < the vocabulary, asks for more than kMaxShardTopK logprobs,
  // or asks for logprobs with a penalty (they are of the raw logits, the candidates are
  // penalized), or the rows' vocab limits differ. LINNET_SHARD_SAMPLING=0 always answers
  // k = 0, for A/B.
  ShardStep shard_step(const std::vector<int64_t>& ids) const;
  void sample_top(const std::vector<int64_t>& ids, const std::vector<Engine::TopCandidates>& cands,
                  const ShardStep& plan);
  template <class DrawRow>
  void draw_rows(const std::vector<int64_t>& ids, const DrawRow& draw_row);
  static constexpr int64_t kMaxShardTopK = 64;
  // The step's rows' penalties (add_sampler_penalties), row k for ids[k]; empty when none.
  std::vector<Backend::Penalty> penalties(const std::vector<int64_t>& ids) const;
  // Broadcasts tp rank 0's drawn {token, outcome} pairs and advances each request.
  void advance(const std::vector<int64_t>& ids, std::vector<int32_t>& drawn);
  // Whether request `e` guesses after its newest token this step (speculation on, not
  // backing off, the batch not above disable_by_batch_size); counts its back-off down.
  bool wants_guesses(Entry& e) const;
  // The guesses after each of `ids`' newest tokens (prompt lookup, or one batched call
  // of the draft model), then each request's pending token and guesses to the scheduler.
  void append_pending(const std::vector<std::pair<int64_t, int32_t>>& pending);
  // Whether `token`, the request's `n`-th new token, ends it (EOS, max_new_tokens, the
  // KV cache's length): tp rank 0 draws no guess row after it.
  bool ends(const Entry& e, int32_t token, int64_t n) const;
  double now_ms() const;

  Engine& engine_;
  SessionOptions options_;
  std::chrono::steady_clock::time_point t0_;
  PagePool pool_;
  PagedScheduler scheduler_;
  std::map<int64_t, Entry> entries_;                   // unfinished requests by id
  std::map<int64_t, std::vector<int64_t>> deferred_;   // by the request they wait for
  int64_t deferred_count_ = 0;
  int64_t last_step_sequences_ = 0;
  // The current step's guess per logits row: the guessed token the row's position was
  // fed (a request's rows after its first), -1 for a request's first row.
  std::vector<int32_t> guess_;
  // tp rank 0, the current step's: each drawn row's logprobs (when its request asks),
  // appended to the result when advance() emits the row's token.
  std::vector<std::optional<TokenLogprobs>> row_logprobs_;
  SpeculativeStats spec_stats_;
  std::unique_ptr<DraftProposer> draft_;  // method "draft_model"
};

}  // namespace linnet
