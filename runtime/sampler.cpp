#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <utility>

#include "common/error.h"
#include "runtime/exp_sum.h"

namespace linnet {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::span<const float> window(std::span<const float> logits, int64_t vocab_limit) {
  return vocab_limit > 0 && static_cast<size_t>(vocab_limit) < logits.size()
             ? logits.first(static_cast<size_t>(vocab_limit))
             : logits;
}

// The softmax terms of candidates sorted by logit descending: p[i] = exp((v[i] - v[0]) /
// temperature), in double. The max is subtracted before dividing, so a tiny temperature
// gives exp(-inf) = 0 for the others (greedy in the limit) rather than inf - inf.
std::vector<double> softmax_terms(std::span<const float> values, double temperature) {
  const double mx = values[0];
  std::vector<double> p(values.size());
  for (size_t i = 0; i < values.size(); ++i) p[i] = std::exp((static_cast<double>(values[i]) - mx) / temperature);
  return p;
}

double exp_sum_of(std::span<const double> p) {
  ExpSum s;
  for (const double t : p) s.add(exp_sum_term(t));
  return s.value();
}

// How many of the candidates (terms p, descending) top-p then min-p keep, given the
// whole row's sum: at least one. `complete`: p is the whole row, so a cut that is not
// reached keeps everything; otherwise that answers 0 (the cut lies past the candidates).
size_t nucleus_cut(const SamplingParams& s, std::span<const double> p, double sum, bool complete) {
  size_t keep = p.size();
  bool cut = false;
  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  if (s.top_p < 1.0) {
    double mass = 0.0;
    for (size_t i = 0; i < p.size(); ++i) {
      mass += p[i] / sum;
      // Within rounding of top_p counts as reaching it: [0.5, 0.3] must make 0.8.
      if (mass >= s.top_p - 1e-9) {
        keep = i + 1;
        cut = true;
        break;
      }
    }
  }
  // min-p: keep prob >= min_p * max prob. The ratio does not depend on the
  // normalization, so p[i] / p[0] = p[i] compares directly; the first always stays.
  if (s.min_p > 0.0) {
    size_t i = 1;
    while (i < keep && !(p[i] < s.min_p * p[0])) ++i;
    if (i < keep) cut = true;
    keep = i;
  }
  return cut || complete ? keep : 0;
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  if (!(params.temperature >= 0.0) || std::isinf(params.temperature)) {
    throw Error("invalid value", "temperature", "a finite number >= 0", num(params.temperature));
  }
  if (params.top_k < 0) throw Error("invalid value", "top_k", ">= 0", std::to_string(params.top_k));
  if (!(params.top_p > 0.0 && params.top_p <= 1.0)) {
    throw Error("invalid value", "top_p", "in (0, 1]", num(params.top_p));
  }
  if (!(params.min_p >= 0.0 && params.min_p <= 1.0)) {
    throw Error("invalid value", "min_p", "in [0, 1]", num(params.min_p));
  }
  if (!(params.repetition_penalty > 0.0) || std::isinf(params.repetition_penalty)) {
    throw Error("invalid value", "repetition_penalty", "a finite number > 0", num(params.repetition_penalty));
  }
  if (!(params.presence_penalty >= -2.0 && params.presence_penalty <= 2.0)) {
    throw Error("invalid value", "presence_penalty", "in [-2, 2]", num(params.presence_penalty));
  }
  if (!(params.frequency_penalty >= -2.0 && params.frequency_penalty <= 2.0)) {
    throw Error("invalid value", "frequency_penalty", "in [-2, 2]", num(params.frequency_penalty));
  }
}

int32_t Sampler::argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

int32_t Sampler::sample(std::span<const float> all_logits, std::span<const int32_t> context,
                        std::span<const int32_t> generated) {
  std::span<const float> logits = window(all_logits, params_.vocab_limit);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) {
      throw Error("non-finite logits (NaN or inf): no token can be drawn", "logits row",
                  "finite values", "id " + std::to_string(i) + " = " + num(logits[i]));
    }
  }
  // Repetition penalty (RepetitionPenaltyLogitsProcessor): each id of the context once,
  // however often it occurs, in f32 as transformers does.
  if (params_.repetition_penalty != 1.0 && !context.empty()) {
    penalized_.assign(logits.begin(), logits.end());
    std::vector<int32_t> seen(context.begin(), context.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    const float penalty = static_cast<float>(params_.repetition_penalty);
    for (int32_t id : seen) {
      if (id < 0 || static_cast<size_t>(id) >= penalized_.size()) continue;
      float& l = penalized_[static_cast<size_t>(id)];
      l = l < 0.0f ? l * penalty : l / penalty;
    }
    logits = penalized_;
  }
  // Presence and frequency penalties over the generated tokens (OpenAI's formula:
  // l -= presence * [count > 0] + frequency * count).
  if ((params_.presence_penalty != 0.0 || params_.frequency_penalty != 0.0) && !generated.empty()) {
    if (logits.data() != penalized_.data()) penalized_.assign(logits.begin(), logits.end());
    std::vector<int32_t> ids(generated.begin(), generated.end());
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      while (j < ids.size() && ids[j] == ids[i]) ++j;
      const int32_t id = ids[i];
      if (id >= 0 && static_cast<size_t>(id) < penalized_.size()) {
        penalized_[static_cast<size_t>(id)] -= static_cast<float>(params_.presence_penalty +
                                                                  params_.frequency_penalty * static_cast<double>(j - i));
      }
      i = j;
    }
    logits = penalized_;
  }
  return choose(logits);
}

int32_t Sampler::sample_penalized(std::span<const float> all_logits) {
  return choose(window(all_logits, params_.vocab_limit));
}

// Greedy, or the candidates of a penalized row ordered by logit (descending), ties by
// id, cut to top_k, and the draw.
int32_t Sampler::choose(std::span<const float> logits) {
  if (params_.temperature == 0.0) return argmax(logits);
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

  std::vector<float> values(keep);
  for (size_t i = 0; i < keep; ++i) values[i] = logits[static_cast<size_t>(idx[i])];
  idx.resize(keep);
  return draw(idx, values, -1.0);
}

int32_t Sampler::sample_top(std::span<const int32_t> ids, std::span<const float> values, double row_sum) {
  if (ids.empty() || ids.size() != values.size()) {
    throw Error("candidates and their logits differ in length or are empty", "Sampler::sample_top",
                std::to_string(ids.size()) + " ids", std::to_string(values.size()) + " logits");
  }
  if (params_.temperature == 0.0) return ids[0];
  if (row_sum >= 0.0) return draw(ids, values, row_sum);
  const size_t keep = params_.top_k > 0 ? std::min(ids.size(), static_cast<size_t>(params_.top_k)) : ids.size();
  return draw(ids.first(keep), values.first(keep), -1.0);
}

bool Sampler::nucleus_within(const SamplingParams& params, std::span<const float> values, double row_sum) {
  if (params.temperature == 0.0 || values.empty() || !(row_sum > 0.0)) return false;
  return nucleus_cut(params, softmax_terms(values, params.temperature), row_sum, false) > 0;
}

// The softmax over the candidates (sorted by logit descending, ties by id), top-p,
// min-p and the draw: the one tail of sample() and sample_top(). The softmax's
// normalizer is the candidates' ExpSum, or `row_sum` (>= 0) when the candidates are the
// best of a longer row.
int32_t Sampler::draw(std::span<const int32_t> idx, std::span<const float> values, double row_sum) {
  const std::vector<double> p = softmax_terms(values, params_.temperature);
  const bool complete = row_sum < 0.0;
  const size_t keep = nucleus_cut(params_, p, complete ? exp_sum_of(p) : row_sum, complete);
  if (keep == 0) {
    throw Error("the top-p / min-p cut reaches past the candidates", "Sampler::sample_top",
                "a cut inside the " + std::to_string(p.size()) + " candidates (nucleus_within)", "none");
  }

  // Inverse-CDF draw with a 53-bit uniform in [0, 1), over the kept candidates in id
  // order: two nearly tied logits that swap places under a different batch or tp size
  // (last-bit float differences) then still map a random number to the same token.
  std::vector<std::pair<int32_t, double>> kept(keep);
  for (size_t i = 0; i < keep; ++i) kept[i] = {idx[i], p[i]};
  std::sort(kept.begin(), kept.end());
  double sum = 0.0;
  for (const auto& c : kept) sum += c.second;
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0.0;
  for (const auto& [id, q] : kept) {
    acc += q;
    if (u < acc) return id;
  }
  return kept.back().first;
}

TokenLogprobs Sampler::logprobs(std::span<const float> all_logits, int32_t token, int64_t top_n,
                                int64_t vocab_limit) {
  const std::span<const float> logits = window(all_logits, vocab_limit);
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
    throw Error("token id outside the logits row", "logprobs", "< " + std::to_string(logits.size()),
                std::to_string(token));
  }
  if (top_n < 0) throw Error("invalid value", "top_logprobs", ">= 0", std::to_string(top_n));
  double mx = -INFINITY;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  // The normalizer as an ExpSum (exp_sum.h), so the shards' partial sums give the same.
  ExpSum sum;
  for (float l : logits) sum.add(exp_sum_term(std::exp((static_cast<double>(l) - mx) / 1.0)));
  const double log_z = mx + std::log(sum.value());
  TokenLogprobs out;
  out.logprob = static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)]) - log_z);
  const size_t n = std::min(static_cast<size_t>(top_n), logits.size());
  if (n > 0) {
    std::vector<int32_t> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(n), idx.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
             (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
    });
    for (size_t i = 0; i < n; ++i) {
      out.top.emplace_back(idx[i], static_cast<float>(static_cast<double>(logits[static_cast<size_t>(idx[i])]) - log_z));
    }
  }
  return out;
}

TokenLogprobs Sampler::logprobs_top(std::span<const int32_t> ids, std::span<const float> values, int32_t token,
                                    int64_t top_n, double row_sum) {
  if (top_n < 0) throw Error("invalid value", "top_logprobs", ">= 0", std::to_string(top_n));
  const auto at = std::find(ids.begin(), ids.end(), token);
  if (at == ids.end() || ids.size() != values.size()) {
    throw Error("the token or top_logprobs reach past the candidates", "Sampler::logprobs_top",
                std::to_string(ids.size()) + " candidates holding the token", "token " + std::to_string(token));
  }
  const double log_z = static_cast<double>(values[0]) + std::log(row_sum);
  TokenLogprobs out;
  out.logprob = static_cast<float>(static_cast<double>(values[static_cast<size_t>(at - ids.begin())]) - log_z);
  const size_t n = std::min(static_cast<size_t>(top_n), ids.size());
  for (size_t i = 0; i < n; ++i) {
    out.top.emplace_back(ids[i], static_cast<float>(static_cast<double>(values[i]) - log_z));
  }
  return out;
}

}  // namespace linnet
