#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"

namespace linnet {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  if (!(params.temperature >= 0.0)) {
    throw Error("invalid value", "temperature", ">= 0", std::to_string(params.temperature));
  }
  if (params.top_k < 0) throw Error("invalid value", "top_k", ">= 0", std::to_string(params.top_k));
  if (!(params.top_p > 0.0 && params.top_p <= 1.0)) {
    throw Error("invalid value", "top_p", "in (0, 1]", std::to_string(params.top_p));
  }
}

int32_t Sampler::argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

int32_t Sampler::sample(std::span<const float> all_logits) {
  const std::span<const float> logits =
      params_.vocab_limit > 0 && static_cast<size_t>(params_.vocab_limit) < all_logits.size()
          ? all_logits.first(static_cast<size_t>(params_.vocab_limit))
          : all_logits;
  if (params_.temperature == 0.0) return argmax(logits);

  // Candidates ordered by logit (descending), ties by id, cut to top_k.
  const size_t n = logits.size();
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  };
  size_t keep = n;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(keep), idx.end(), by_logit);
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }

  // Softmax of logits / temperature over the candidates, in double. The max is
  // subtracted before dividing, so a tiny temperature gives exp(-inf) = 0 for the others
  // (greedy in the limit) rather than inf - inf.
  const double mx = logits[static_cast<size_t>(idx[0])];
  std::vector<double> p(keep);
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((static_cast<double>(logits[static_cast<size_t>(idx[i])]) - mx) / params_.temperature);
    sum += p[i];
  }
  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  if (params_.top_p < 1.0) {
    double mass = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      mass += p[i] / sum;
      // Within rounding of top_p counts as reaching it: [0.5, 0.3] must make 0.8.
      if (mass >= params_.top_p - 1e-9) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = std::accumulate(p.begin(), p.begin() + static_cast<long>(keep), 0.0);
  }

  // Inverse-CDF draw with a 53-bit uniform in [0, 1).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace linnet
