// Sampler: min-p, repetition penalty, non-finite rows and logprobs, against values
// computed by hand from the definitions in transformers' logits_process.py
// (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor) and log_softmax. The top-k /
// top-p / greedy edge cases live in test_parallel_units.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "runtime/exp_sum.h"
#include "runtime/sampler.h"

namespace linnet {
namespace {

// logits = log(p): softmax gives back p.
std::vector<float> log_of(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

// The ids drawn in `n` samples, with counts.
std::map<int32_t, int> draws(const SamplingParams& p, const std::vector<float>& logits, int n,
                             const std::vector<int32_t>& context = {}) {
  Sampler s(p);
  std::map<int32_t, int> seen;
  for (int i = 0; i < n; ++i) seen[s.sample(logits, context)]++;
  return seen;
}

std::set<int32_t> ids_of(const std::map<int32_t, int>& seen) {
  std::set<int32_t> ids;
  for (const auto& [id, n] : seen) ids.insert(id);
  return ids;
}

// Two nearly tied logits that swap order (as last-bit differences between batch or tp
// layouts do) still give the same seeded draws: the draw walks the kept ids in id order.
TEST(SeededDraw, DoesNotDependOnTheOrderOfNearTies) {
  const std::vector<float> a = {0.5f, 2.0f, 2.0000005f, 1.0f, -1.0f};
  std::vector<float> b = a;
  std::swap(b[1], b[2]);  // now id 1 is the larger one
  int differ = 0;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    SamplingParams p;
    p.temperature = 1.0;
    p.top_k = 4;
    p.seed = seed;
    Sampler sa(p), sb(p);
    differ += sa.sample(a) != sb.sample(b);
  }
  EXPECT_EQ(differ, 0);
}

TEST(MinP, DropsTokensBelowMinPTimesTheTopProbability) {
  // p = [0.5, 0.3, 0.15, 0.05]; ratios to the top: 1, 0.6, 0.3, 0.1.
  const auto logits = log_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 1;
  p.min_p = 0.31;  // keeps ratios >= 0.31: ids 0, 1
  EXPECT_EQ(ids_of(draws(p, logits, 3000)), (std::set<int32_t>{0, 1}));
  p.min_p = 0.29;  // ratio 0.3 stays: ids 0, 1, 2
  EXPECT_EQ(ids_of(draws(p, logits, 3000)), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 0.0;  // off: all four
  EXPECT_EQ(ids_of(draws(p, logits, 6000)), (std::set<int32_t>{0, 1, 2, 3}));
  p.min_p = 1.0;  // only the most probable
  EXPECT_EQ(ids_of(draws(p, logits, 500)), (std::set<int32_t>{0}));
}

TEST(MinP, KeptTokensAreDrawnInProportion) {
  // min_p 0.31 keeps {0.5, 0.3}: renormalized 0.625 / 0.375.
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 2;
  p.min_p = 0.31;
  const auto seen = draws(p, log_of({0.5, 0.3, 0.15, 0.05}), 4000);
  EXPECT_NEAR(seen.at(0) / 4000.0, 0.625, 0.03);
}

TEST(MinP, AppliesAfterTemperature) {
  // At temperature 2 the ratios become sqrt(0.6) = 0.775, sqrt(0.3) = 0.548 and
  // sqrt(0.1) = 0.316: min_p 0.5 keeps ids 0..2. At temperature 1 it keeps ids 0, 1.
  const auto logits = log_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.seed = 3;
  p.min_p = 0.5;
  p.temperature = 2.0;
  EXPECT_EQ(ids_of(draws(p, logits, 4000)), (std::set<int32_t>{0, 1, 2}));
  p.temperature = 1.0;
  EXPECT_EQ(ids_of(draws(p, logits, 4000)), (std::set<int32_t>{0, 1}));
}

TEST(MinP, AppliesAfterTopP) {
  // top_p 0.8 keeps {0.5, 0.3}; min_p 0.29 cannot bring back 0.15.
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 4;
  p.top_p = 0.8;
  p.min_p = 0.29;
  EXPECT_EQ(ids_of(draws(p, log_of({0.5, 0.3, 0.15, 0.05}), 3000)), (std::set<int32_t>{0, 1}));
}

TEST(RepetitionPenalty, DividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p;  // greedy
  p.repetition_penalty = 2.0;
  // [2.0, 1.5, -0.5, -1.0], context {0, 3}: id 0 -> 1.0, id 3 -> -2.0; argmax id 1.
  const std::vector<float> pos = {2.0f, 1.5f, -0.5f, -1.0f};
  Sampler s(p);
  EXPECT_EQ(s.sample(pos), 0);  // no context, no penalty
  EXPECT_EQ(s.sample(pos, std::vector<int32_t>{0, 3}), 1);
  EXPECT_EQ(s.sample(pos, std::vector<int32_t>{1}), 0);
  // [-1.0, -1.5, -3.0], context {0}: -1.0 * 2 = -2.0 < -1.5 -> id 1. (Dividing would
  // give -0.5 and keep id 0.)
  const std::vector<float> neg = {-1.0f, -1.5f, -3.0f};
  EXPECT_EQ(s.sample(neg, std::vector<int32_t>{0}), 1);
}

TEST(RepetitionPenalty, EachIdCountsOnceAndOutOfRangeIdsAreIgnored) {
  SamplingParams p;
  p.repetition_penalty = 2.0;
  Sampler s(p);
  // [2.0, 0.9]: id 0 penalized once -> 1.0 > 0.9 (three times would give 0.25).
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, 0.9f}, std::vector<int32_t>{0, 0, 0, 7, -1}), 0);
}

TEST(RepetitionPenalty, BelowOneFavoursRepeats) {
  SamplingParams p;
  p.repetition_penalty = 0.5;
  Sampler s(p);
  // [1.0, 0.8], context {1}: 0.8 / 0.5 = 1.6 -> id 1.
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 0.8f}, std::vector<int32_t>{1}), 1);
}

TEST(RepetitionPenalty, AppliesBeforeTopK) {
  // [2.0, 1.9, 0.0], penalty 2 on id 0 -> [1.0, 1.9, 0.0]; top_k 1 then keeps id 1 only.
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 1;
  p.repetition_penalty = 2.0;
  p.seed = 5;
  EXPECT_EQ(ids_of(draws(p, {2.0f, 1.9f, 0.0f}, 200, {0})), (std::set<int32_t>{1}));
}

TEST(RepetitionPenalty, ShiftsSampledProbabilities) {
  // p = [0.5, 0.5]: logits log 0.5 = -0.693; id 0 penalized x2 -> exp(-1.386) = 0.25,
  // so p(0) = 0.25 / (0.25 + 0.5) = 1/3.
  SamplingParams p;
  p.temperature = 1.0;
  p.repetition_penalty = 2.0;
  p.seed = 6;
  const auto seen = draws(p, log_of({0.5, 0.5}), 6000, {0});
  EXPECT_NEAR(seen.at(0) / 6000.0, 1.0 / 3.0, 0.025);
}

TEST(SamplerValues, OutOfRangeMinPAndPenaltyAreRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double v : {-0.1, 1.1, nan}) {
    SamplingParams p;
    p.min_p = v;
    EXPECT_THROW(Sampler{p}, Error) << v;
  }
  for (double v : {0.0, -1.0, nan, std::numeric_limits<double>::infinity()}) {
    SamplingParams p;
    p.repetition_penalty = v;
    try {
      Sampler s(p);
      ADD_FAILURE() << "penalty " << v << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("repetition_penalty"), std::string::npos) << e.what();
    }
  }
  SamplingParams ok;
  ok.min_p = 1.0;
  ok.repetition_penalty = 1e-3;
  EXPECT_NO_THROW(Sampler{ok});
}

TEST(NonFiniteLogits, AreAnErrorNeverAToken) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {nan, inf, -inf}) {
    for (double t : {0.0, 1.0}) {
      SamplingParams p;
      p.temperature = t;
      Sampler s(p);
      EXPECT_THROW(s.sample(std::vector<float>{0.1f, bad, 0.3f}), Error) << bad << " at temperature " << t;
    }
  }
  // Padded ids past vocab_limit are never looked at.
  SamplingParams p;
  p.vocab_limit = 2;
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 0.3f, nan}), 1);
}

TEST(Logprobs, AreTheLogSoftmaxOfTheRawRow) {
  // logits [1, 2, 3]: log Z = 3 + log(1 + e^-1 + e^-2) = 3.4076059644.
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const TokenLogprobs lp = Sampler::logprobs(logits, 1, 2);
  EXPECT_NEAR(lp.logprob, -1.4076059644, 1e-6);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].first, 2);
  EXPECT_NEAR(lp.top[0].second, -0.4076059644, 1e-6);
  EXPECT_EQ(lp.top[1].first, 1);
  EXPECT_NEAR(lp.top[1].second, -1.4076059644, 1e-6);
  EXPECT_EQ(Sampler::logprobs(logits, 0, 10).top.size(), 3u);  // capped at the row
  EXPECT_TRUE(Sampler::logprobs(logits, 0, 0).top.empty());
  // Ties go to the lower id; vocab_limit hides padded ids.
  const TokenLogprobs tie = Sampler::logprobs(std::vector<float>{0.0f, 5.0f, 5.0f, 9.0f}, 1, 2, 3);
  EXPECT_NEAR(tie.logprob, -std::log(2.0 + std::exp(-5.0)), 1e-6);
  EXPECT_EQ(tie.top[0].first, 1);
  EXPECT_EQ(tie.top[1].first, 2);
  EXPECT_THROW(Sampler::logprobs(logits, 3, 1), Error);
}

// The fixed-point normalizer (exp_sum.h) gives one total however the terms are ordered or
// split into shards, and stays within 1e-12 of the plain double sum.
TEST(ExpSum, IsTheSameInAnyOrderAndSplit) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> t(5000);
  for (double& x : t) x = std::pow(u(rng), 8.0);  // many small terms, as a softmax has
  t[17] = 1.0;
  const auto total = [](const std::vector<double>& v, size_t parts) {
    std::vector<ExpSum> part(parts);
    for (size_t i = 0; i < v.size(); ++i) part[i * parts / v.size()].add(exp_sum_term(v[i]));
    ExpSum s;
    for (auto it = part.rbegin(); it != part.rend(); ++it) s.add(*it);
    return s.value();
  };
  const double want = total(t, 1);
  EXPECT_NEAR(want, std::accumulate(t.begin(), t.end(), 0.0), 1e-12 * want);
  std::vector<double> shuffled = t;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (size_t parts : {2, 3, 7}) {
    EXPECT_EQ(total(t, parts), want) << parts << " parts";
    EXPECT_EQ(total(shuffled, parts), want) << parts << " parts, shuffled";
  }
  EXPECT_EQ(exp_sum_term(0.0), 0u);
  EXPECT_EQ(exp_sum_term(std::nan("")), 0u);
  EXPECT_EQ(exp_sum_term(2.0), exp_sum_term(1.0));  // a term is at most 1
}

// A row's 64 best logits and its whole-row normalizer (what the vocab shards hand over)
// draw with top-p / min-p and no top-k exactly as sample() over the row, when the cut
// ends inside the candidates (nucleus_within); the random stream stays in step, so a
// draw from the whole row may follow. Log-probabilities from the candidates equal
// logprobs() over the row, bit for bit.
TEST(SampleTop, NucleusOverTheWholeRowDrawsAsSample) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> row(3000);
  std::vector<SamplingParams> settings(4);
  settings[0].temperature = 1.0, settings[0].top_p = 0.9;
  settings[1].temperature = 1.5, settings[1].min_p = 0.05;
  settings[2].temperature = 0.7, settings[2].top_p = 0.95, settings[2].min_p = 0.01;
  settings[3].temperature = 3.0, settings[3].top_p = 0.999;  // reaches past 64 candidates
  int within = 0, past = 0;
  for (size_t si = 0; si < settings.size(); ++si) {
    SamplingParams p = settings[si];
    p.seed = 40 + si;
    Sampler whole(p), top(p);
    for (int step = 0; step < 60; ++step) {
      for (float& x : row) x = normal(rng);
      row[static_cast<size_t>(step * 37 % 3000)] += 9.0f;  // a confident row now and then
      std::vector<int32_t> idx(row.size());
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + 64, idx.end(),
                        [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      idx.resize(64);
      std::vector<float> vals;
      for (int32_t i : idx) vals.push_back(row[static_cast<size_t>(i)]);
      ExpSum sum, raw;
      for (float x : row) {
        sum.add(exp_sum_term(std::exp((static_cast<double>(x) - vals[0]) / p.temperature)));
        raw.add(exp_sum_term(std::exp((static_cast<double>(x) - vals[0]) / 1.0)));
      }
      const int32_t want = whole.sample(row);
      int32_t got = -1;
      if (Sampler::nucleus_within(p, vals, sum.value())) {
        ++within;
        got = top.sample_top(idx, vals, sum.value());
        const TokenLogprobs a = Sampler::logprobs(row, got, 5), b = Sampler::logprobs_top(idx, vals, got, 5, raw.value());
        EXPECT_EQ(a.logprob, b.logprob);
        EXPECT_EQ(a.top, b.top);
      } else {
        ++past;
        EXPECT_THROW(Sampler(p).sample_top(idx, vals, sum.value()), Error);
        got = top.sample(row);
      }
      ASSERT_EQ(got, want) << "setting " << si << " step " << step;
    }
  }
  EXPECT_GT(within, 60);  // 93 of 240 at the time of writing
  EXPECT_GT(past, 60);
  // No cut at all: the candidates never decide; greedy is not a nucleus.
  SamplingParams plain;
  plain.temperature = 1.0;
  EXPECT_FALSE(Sampler::nucleus_within(plain, std::vector<float>{5.0f, 1.0f}, 1.1));
  plain.temperature = 0.0, plain.top_p = 0.5;
  EXPECT_FALSE(Sampler::nucleus_within(plain, std::vector<float>{5.0f, 1.0f}, 1.1));
  EXPECT_THROW(Sampler::logprobs_top(std::vector<int32_t>{4, 2}, std::vector<float>{1.0f, 0.5f}, 7, 1, 2.0), Error);
}

}  // namespace
}  // namespace linnet
