// Speculative decoding: guessed tokens verified by the target model in one pass.
// A proposer guesses the next k tokens of a sequence; the target runs the sequence's
// pending token and the k guesses as one chunk of a paged pass (Engine::step_paged),
// so each of the k + 1 positions gets its logits; the sequence keeps the longest prefix
// of guesses the target itself would have drawn, plus the target's token after it
// (BatchSession). On the CPU a row's logits do not depend on the other rows of its pass
// (the GEMM and attention kernels are row-invariant, tests/test_gemm.cpp and
// test_kernels.cpp), and each row draws as without speculation, so the output with
// speculation, greedy or sampled, is the output without it, bit for bit.
//
// The proposer here is prompt lookup (vLLM's "ngram", Saxena's prompt lookup decoding):
// the tokens that followed the latest earlier occurrence of the sequence's last n
// tokens, n from prompt_lookup_max down to prompt_lookup_min.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace linnet {

/// What --speculative-config asks for (vLLM's speculative_config keys).
struct SpeculativeConfig {
  std::string method;                  ///< "" (off), "ngram" or "draft_model"
  std::string model;                   ///< draft_model: the draft checkpoint's folder (or hub name)
  std::string quantization;            ///< draft_model: the draft's held weight dtype, as
                                       ///< --weight-dtype ("": the target's)
  int64_t num_speculative_tokens = 0;  ///< k: guesses per step and sequence (>= 1 when on)
  int64_t prompt_lookup_max = 4;       ///< longest n-gram matched
  int64_t prompt_lookup_min = 2;       ///< shortest n-gram matched (1 matches too often in open text)
  int64_t disable_by_batch_size = 0;   ///< no guesses in a step with more running requests than this; 0: never
  bool enabled() const { return !method.empty(); }
};

/// Prompt lookup: up to `k` tokens that followed the latest earlier occurrence of the
/// last n tokens of `tokens` (the prompt and the tokens generated so far, the newest
/// last), trying n = n_max down to n_min; fewer when that occurrence is near the end,
/// none when no n-gram recurs. O(len(tokens) * n_max) per call.
/// @throws Error when n_min < 1, n_max < n_min or k < 0.
std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int64_t n_min, int64_t n_max, int64_t k);

/// Counters of a run's speculation (the stats line and /metrics).
struct SpeculativeStats {
  int64_t steps = 0;     ///< verification rows groups: sequence-steps that carried guesses
  int64_t proposed = 0;  ///< guessed tokens run through the target
  int64_t accepted = 0;  ///< of those, kept
  double propose_ms = 0.0;  ///< wall time of the proposer (every rank runs it)
  double verify_ms = 0.0;   ///< wall time of the passes and draws of steps that carried guesses
  /// accepted / proposed (0 when none).
  double acceptance_rate() const { return proposed > 0 ? static_cast<double>(accepted) / proposed : 0.0; }
  /// Tokens a verification step emits on average: accepted / steps + 1 (the target's own).
  double mean_accepted_length() const { return steps > 0 ? static_cast<double>(accepted) / steps + 1.0 : 0.0; }
};

/// The stats line's words for a run's speculation: "speculation (ngram, k 4)<scope>: 56
/// guesses, 26 accepted (46.4%), 2.86 tokens per verified step over 14 steps; propose
/// 0.1 ms, verify 9.0 ms" (`scope`, e.g. " (dp group 0)", may be empty).
std::string speculation_summary(const SpeculativeConfig& config, const SpeculativeStats& stats,
                                const std::string& scope = "");

}  // namespace linnet
