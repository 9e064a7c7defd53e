// Sampler: turns a full-vocabulary logits row into a token, in the order transformers'
// generate applies its logits processors and warpers (generation/logits_process.py):
// repetition penalty (RepetitionPenaltyLogitsProcessor), then temperature, top-k, top-p
// and min-p (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
// MinPLogitsWarper). temperature 0 is greedy (argmax of the penalized logits, ties to
// the lowest id). Draws use a seeded 64-bit Mersenne Twister, so a seed gives the same
// tokens on every run. A row with a NaN or infinite logit is refused (Error), never
// turned into a token.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace linnet {

/// Sampling settings. Defaults: greedy, no penalty.
struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // keep the smallest most-probable set with mass >= top_p; 1 = off
  double min_p = 0.0;        // drop tokens with prob < min_p * (max prob), after temperature; 0 = off
  double repetition_penalty = 1.0;  // > 0; 1 = off. Logits of ids already in the context:
                                    // l < 0 ? l * penalty : l / penalty (greedy too)
  double presence_penalty = 0.0;   // in [-2, 2]; 0 = off. Subtracted once from the logit of
                                   // each id already generated (OpenAI's presence penalty)
  double frequency_penalty = 0.0;  // in [-2, 2]; 0 = off. Subtracted once per occurrence of an
                                   // id already generated (OpenAI's frequency penalty)
  uint64_t seed = 0;
  int64_t vocab_limit = 0;   // only ids < vocab_limit may be drawn (0 = all); Phi-3's
                             // config has 32064 rows but its tokenizer knows 32011 ids
};

/// Log-probabilities of one generated token: log_softmax of the raw logits row (before
/// the repetition penalty, temperature or any cut, as vLLM reports by default).
struct TokenLogprobs {
  float logprob = 0.0f;  // of the token that was drawn
  std::vector<std::pair<int32_t, float>> top;  // the most probable ids, best first (ties: lower id)
};

/// Draws tokens from logits rows. Stateful: each call advances the random stream.
class Sampler {
 public:
  /// @throws Error naming the field when temperature < 0 or not finite, top_k < 0,
  ///   top_p is not in (0, 1], min_p is not in [0, 1], or repetition_penalty is not a
  ///   finite number > 0, or presence_penalty / frequency_penalty is not in [-2, 2].
  explicit Sampler(const SamplingParams& params);

  /// Picks a token id from `logits` (f32 [vocab]); ids >= vocab_limit are never chosen.
  /// `context` (prompt + tokens generated so far) is what the repetition penalty
  /// penalizes; `generated` (the new tokens only) is what the presence and frequency
  /// penalties count, after the repetition penalty and before temperature (vLLM's
  /// order); ids outside the row are ignored.
  /// @throws Error when a logit of the row (below vocab_limit) is NaN or infinite.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> context = {},
                 std::span<const int32_t> generated = {});

  /// sample() of a row whose penalties are already applied (Backend::apply_penalties
  /// where the logits are) and whose raw logits were already checked for NaN / inf:
  /// the same token and step of the random stream as sample() over the raw row.
  int32_t sample_penalized(std::span<const float> penalized_logits);

  /// The draw of sample() from a row's best candidates alone: `ids` and their logits
  /// `values` (penalties applied), sorted by logit descending, ties by id, none
  /// non-finite: the same token, and the same step of the random stream, as sample()
  /// over the full row (temperature 0: ids[0]). The vocab shards' candidates, merged
  /// (Engine::step_paged_top), come here instead of the logits. Either top_k > 0 and
  /// there are at least top_k candidates (all the row's ids when it has fewer), or
  /// top_k is 0 (or at least the row's length) and `row_sum` is the whole row's
  /// ExpSum of exp((l - values[0]) / temperature) (Backend::exp_sums over the shards),
  /// with the top-p / min-p cut inside the candidates (nucleus_within says so).
  /// @throws Error when ids and values differ in length or are empty, or when the cut
  ///   reaches past the candidates.
  int32_t sample_top(std::span<const int32_t> ids, std::span<const float> values, double row_sum = -1.0);

  /// Whether the top-p and min-p cuts of `params` over a row whose best logits are
  /// `values` (sorted descending; the row's exact best, as sample_top's) and whose
  /// ExpSum of exp((l - values[0]) / temperature) is `row_sum` end inside `values`: then
  /// sample_top can draw from them. False when neither cut is set (the whole row is
  /// drawn from) or temperature is 0.
  static bool nucleus_within(const SamplingParams& params, std::span<const float> values, double row_sum);

  /// argmax over logits; ties go to the lowest id.
  static int32_t argmax(std::span<const float> logits);

  /// log_softmax of `logits` (f32 [vocab], the first vocab_limit ids when > 0) at
  /// `token`, and the `top_n` most probable ids with their log-probabilities.
  /// Computed in double. @throws Error when token is outside the row or top_n < 0.
  static TokenLogprobs logprobs(std::span<const float> logits, int32_t token, int64_t top_n,
                                int64_t vocab_limit = 0);

  /// logprobs() from a row's best candidates (`ids`, `values`: raw logits sorted
  /// descending, ties by id, at least top_n of them or the whole row, `token` among them) and the whole
  /// row's ExpSum of exp(l - values[0]) `row_sum` (Backend::exp_sums over the shards):
  /// the same numbers, bit for bit. @throws Error when token is not a candidate.
  static TokenLogprobs logprobs_top(std::span<const int32_t> ids, std::span<const float> values, int32_t token,
                                    int64_t top_n, double row_sum);

 private:
  int32_t choose(std::span<const float> logits);
  int32_t draw(std::span<const int32_t> idx, std::span<const float> values, double row_sum);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> penalized_;  // scratch row for the repetition penalty
};

}  // namespace linnet
