// ExpSum: the softmax normalizer Z = sum_i exp((l_i - max) / t) summed so that the
// result does not depend on the order of the terms. Each term (in [0, 1], since max is
// the row's largest logit) is truncated to a multiple of 2^-62 and the integers are
// added exactly in 128 bits; the total is then one deterministic conversion to double.
// So the sum over a row equals the sum of its vocab shards' partial sums bit for bit, at
// every tp size, wherever the terms are computed with the same exp: Sampler (the whole
// row on the host), the CPU backend's Backend::exp_sums (each rank's slice) and
// Engine::step_paged_top (the merge) all add the same integers. CUDA's exp may differ
// from the host's in the last bit of a term, so on a GPU the shard path's normalizer is
// within ~1e-15 of the gathered row's, not bit-equal.
// Truncation drops < 2^-62 per term: with Z >= 1 (the max's term is 1) and 2^24 terms at
// most, the relative error is below 2^-38 before the double conversion, far under
// anything a logprob printed as f32 or a top-p comparison (1e-9 slack) can see.
#pragma once

#include <algorithm>
#include <cstdint>

namespace linnet {

/// The fixed-point value of one softmax term t (expected in [0, 1]): floor(min(t, 1) *
/// 2^62); 0 for t <= 0 or NaN. kernels/cuda/sampling.cu's exp_sums_kernel computes the
/// same with __double2ull_rz.
inline uint64_t exp_sum_term(double t) {
  return t > 0.0 ? static_cast<uint64_t>(std::min(t, 1.0) * 0x1p62) : uint64_t{0};
}

/// An exact 128-bit sum of exp_sum_term values (lo, hi words), mergeable in any order.
struct ExpSum {
  uint64_t lo = 0;
  uint64_t hi = 0;
  void add(uint64_t term) {
    lo += term;
    hi += lo < term ? 1 : 0;
  }
  void add(const ExpSum& other) {
    lo += other.lo;
    hi += other.hi + (lo < other.lo ? 1 : 0);
  }
  /// The sum as a double: (hi * 2^64 + lo) * 2^-62 (hi * 2^64 is exact for any sum of
  /// fewer than 2^53 * 4 terms; one rounding for lo, one for the addition).
  double value() const { return (static_cast<double>(hi) * 0x1p64 + static_cast<double>(lo)) * 0x1p-62; }
};

}  // namespace linnet
