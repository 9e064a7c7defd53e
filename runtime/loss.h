// loss_packed / log_probs_packed: training-loss evaluation over a packed batch with
// vocab-parallel (split) cross-entropy, as Megatron's vocab_parallel_cross_entropy:
// no rank ever holds a full vocabulary row of logits. For each scored token,
//   m = all_reduce_max(local max logit), s = all_reduce_sum(local sum exp(l - m)),
//   t = all_reduce_sum(target logit, contributed by the rank that owns the target),
//   nll = log(s) + m - t.
// Padded vocabulary rows (past vocab_size) are left out of the max and the sum.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "runtime/engine.h"

namespace linnet {

/// Label of a position that is not scored (transformers' ignore_index).
inline constexpr int32_t kIgnoreIndex = -100;

/// Several documents packed end to end into one pass (see Engine::packed_hidden).
/// labels[i] is the token position i predicts (already shifted: usually tokens[i + 1]
/// of the same document), or kIgnoreIndex.
struct PackedBatch {
  std::vector<int32_t> tokens;     // [P]
  std::vector<int32_t> positions;  // [P], 0 at each document's start
  std::vector<int32_t> segments;   // [P], document index in the pack, non-decreasing
  std::vector<int32_t> labels;     // [P], target id in [0, vocab_size) or kIgnoreIndex
};

/// Per-position negative log-likelihood of `batch.labels` (f64 [P]; 0 where ignored)
/// and whether each position was scored. Every rank of the tp group gets the same
/// values.
struct PackedLoss {
  std::vector<double> nll;
  std::vector<uint8_t> scored;
};

/// loss_packed: the NLL of every labelled position. The lm_head runs `block_rows`
/// labelled rows at a time (0: as many as 64 MiB of this rank's logits hold, at least
/// 48), and each block's cross-entropy statistics are taken while it is in memory: the
/// full [P, vocab] logits never exist. The block size changes no bit.
/// @throws Error when a label is outside [0, vocab_size) and not kIgnoreIndex (naming
///   the position and the label), when block_rows < 0, or as Engine::packed_hidden.
PackedLoss loss_packed(Engine& engine, const PackedBatch& batch, int64_t block_rows = 0);

/// log_probs_packed: log p(labels[i]) per position (f64 [P]), NaN where ignored.
std::vector<double> log_probs_packed(Engine& engine, const PackedBatch& batch);

/// log p(labels[i]) per position, and at each labelled position the `top_k` most
/// probable ids with their log probabilities (best first, ties: lower id), as OpenAI's
/// and vLLM's prompt top_logprobs list them.
struct PackedLogprobs {
  std::vector<double> logprob;                             // [P], NaN where ignored
  std::vector<std::vector<std::pair<int32_t, float>>> top;  // [P], empty where ignored
};

/// log_probs_packed with the top_k alternatives, over the vocab shards: each rank picks
/// its shard's top_k logits of each labelled row, only those candidates are gathered
/// (all_gather of top_k (logit, id) pairs a row), and each becomes logit - log-sum-exp of
/// the whole row (the same all_reduce as loss_packed). Only ids < `vocab_limit` are
/// candidates when it is > 0 (a tokenizer smaller than the padded embedding); the
/// softmax is over the whole vocabulary, as loss_packed's. A NaN logit is never a
/// candidate (its row's log probabilities are NaN).
/// Candidates are picked a block of rows at a time, as loss_packed's statistics.
/// @throws Error as loss_packed, or when top_k < 0.
PackedLogprobs log_probs_packed(Engine& engine, const PackedBatch& batch, int64_t top_k, int64_t vocab_limit = 0,
                                int64_t block_rows = 0);

}  // namespace linnet
