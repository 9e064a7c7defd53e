// Sampler: turns a full-vocabulary logits row into a token. temperature 0 is greedy
// (argmax, ties to the lowest id); otherwise softmax(logits / temperature) restricted
// by top-k then top-p (the order of transformers' logits warpers), drawn with a seeded
// 64-bit Mersenne Twister so a seed gives the same tokens on every run.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace linnet {

/// Sampling settings. Defaults: greedy.
struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // keep the smallest most-probable set with mass >= top_p; 1 = off
  uint64_t seed = 0;
  int64_t vocab_limit = 0;   // only ids < vocab_limit may be drawn (0 = all); Phi-3's
                             // config has 32064 rows but its tokenizer knows 32011 ids
};

/// Draws tokens from logits rows. Stateful: each call advances the random stream.
class Sampler {
 public:
  /// @throws Error when temperature < 0, top_k < 0 or top_p is not in (0, 1].
  explicit Sampler(const SamplingParams& params);

  /// Picks a token id from `logits` (f32 [vocab]); ids >= vocab_limit are never chosen.
  int32_t sample(std::span<const float> logits);

  /// argmax over logits; ties go to the lowest id.
  static int32_t argmax(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace linnet
