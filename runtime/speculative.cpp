#include "runtime/speculative.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"

namespace linnet {

std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int64_t n_min, int64_t n_max, int64_t k) {
  if (n_min < 1 || n_max < n_min || k < 0) {
    throw Error("invalid prompt lookup sizes", "propose_ngram", "1 <= prompt_lookup_min <= prompt_lookup_max, k >= 0",
                std::to_string(n_min) + ", " + std::to_string(n_max) + ", " + std::to_string(k));
  }
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (k == 0) return {};
  for (int64_t n = std::min(n_max, len - 1); n >= n_min; --n) {
    const std::span<const int32_t> tail = tokens.last(static_cast<size_t>(n));
    // The latest start s < len - n whose n tokens equal the tail (s + n <= len - 1, so at
    // least one token follows it).
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(tail.begin(), tail.end(), tokens.begin() + s)) continue;
      const int64_t from = s + n, to = std::min(len, from + k);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

std::string speculation_summary(const SpeculativeConfig& config, const SpeculativeStats& stats,
                                const std::string& scope) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "speculation (%s, k %lld)%s: %lld guesses, %lld accepted (%.1f%%), %.2f tokens per verified step over "
                "%lld steps; propose %.1f ms, verify %.1f ms",
                config.method.c_str(), static_cast<long long>(config.num_speculative_tokens), scope.c_str(),
                static_cast<long long>(stats.proposed), static_cast<long long>(stats.accepted),
                100.0 * stats.acceptance_rate(), stats.mean_accepted_length(), static_cast<long long>(stats.steps),
                stats.propose_ms, stats.verify_ms);
  return buf;
}

}  // namespace linnet
