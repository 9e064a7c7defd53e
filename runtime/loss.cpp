#include "runtime/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"
#include "kernels/cpu/threads.h"

namespace linnet {

namespace {

// The vocab-parallel softmax statistics of the labelled rows of one packed pass.
struct RowStats {
  Tensor logits;               // this rank's slice [P, vocab_local]
  int64_t cols = 0;            // its real (unpadded) columns
  std::vector<int64_t> rows;   // labelled positions
  std::vector<float> max;      // [n] the row's max logit (all ranks)
  std::vector<double> sums;    // [0, n): sum of exp(l - max); [n, 2n): the label's logit
};

RowStats row_stats(Engine& engine, const PackedBatch& batch) {
  const int64_t P = static_cast<int64_t>(batch.tokens.size());
  const int64_t V = engine.config().vocab_size;
  if (static_cast<int64_t>(batch.labels.size()) != P) {
    throw Error("labels and tokens differ in length", "packed batch", std::to_string(P),
                std::to_string(batch.labels.size()));
  }
  for (int64_t i = 0; i < P; ++i) {
    const int32_t y = batch.labels[i];
    if (y != kIgnoreIndex && (y < 0 || y >= V)) {
      throw Error("label out of range", "label at position " + std::to_string(i),
                  "[0, " + std::to_string(V) + ") or -100", std::to_string(y));
    }
  }
  RowStats st;
  st.logits = engine.packed_logits_local(batch.tokens, batch.positions, batch.segments);
  const ShardPlan& plan = engine.plan();
  const int64_t vl = plan.vocab_local;
  st.cols = std::clamp<int64_t>(V - plan.vocab_begin, 0, vl);

  for (int64_t i = 0; i < P; ++i) {
    if (batch.labels[i] != kIgnoreIndex) st.rows.push_back(i);
  }
  const size_t n = st.rows.size();
  st.max.assign(n, -std::numeric_limits<float>::infinity());
  // Rows over the kernel threads: each row's max and sum are one fixed chain in
  // ascending column whatever thread takes it, so the split changes no bit.
  const int threads = cpu::num_threads();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (size_t k = 0; k < n; ++k) {
    const float* l = st.logits.data() + st.rows[k] * vl;
    for (int64_t j = 0; j < st.cols; ++j) st.max[k] = std::max(st.max[k], l[j]);
  }
  engine.tp_comm().all_reduce_max(st.max.data(), n);

  st.sums.assign(2 * n, 0.0);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (size_t k = 0; k < n; ++k) {
    const float* l = st.logits.data() + st.rows[k] * vl;
    double s = 0.0;
    for (int64_t j = 0; j < st.cols; ++j) s += std::exp(static_cast<double>(l[j]) - st.max[k]);
    st.sums[k] = s;
    const int64_t target = batch.labels[st.rows[k]] - plan.vocab_begin;
    if (target >= 0 && target < st.cols) st.sums[n + k] = l[target];
  }
  engine.tp_comm().all_reduce_sum(st.sums.data(), st.sums.size());
  return st;
}

}  // namespace

PackedLoss loss_packed(Engine& engine, const PackedBatch& batch) {
  const RowStats st = row_stats(engine, batch);
  const size_t n = st.rows.size();
  PackedLoss out;
  out.nll.assign(batch.tokens.size(), 0.0);
  out.scored.assign(batch.tokens.size(), 0);
  for (size_t k = 0; k < n; ++k) {
    out.nll[st.rows[k]] = std::log(st.sums[k]) + st.max[k] - st.sums[n + k];
    out.scored[st.rows[k]] = 1;
  }
  return out;
}

std::vector<double> log_probs_packed(Engine& engine, const PackedBatch& batch) {
  const PackedLoss loss = loss_packed(engine, batch);
  std::vector<double> out(loss.nll.size(), std::numeric_limits<double>::quiet_NaN());
  for (size_t i = 0; i < out.size(); ++i) {
    if (loss.scored[i]) out[i] = -loss.nll[i];
  }
  return out;
}

PackedLogprobs log_probs_packed(Engine& engine, const PackedBatch& batch, int64_t top_k, int64_t vocab_limit) {
  if (top_k < 0) throw Error("invalid value", "top_logprobs", ">= 0", std::to_string(top_k));
  // Ids travel as floats in the gathered candidates: exact below 2^24.
  LINNET_CHECK(engine.config().vocab_size < (int64_t{1} << 24), "vocabulary too large for float ids");
  const RowStats st = row_stats(engine, batch);
  const size_t n = st.rows.size();
  const ShardPlan& plan = engine.plan();
  const int64_t vl = plan.vocab_local;
  PackedLogprobs out;
  out.logprob.assign(batch.tokens.size(), std::numeric_limits<double>::quiet_NaN());
  out.top.resize(batch.tokens.size());
  std::vector<double> log_z(n);
  for (size_t k = 0; k < n; ++k) {
    log_z[k] = static_cast<double>(st.max[k]) + std::log(st.sums[k]);
    out.logprob[st.rows[k]] = st.sums[n + k] - log_z[k];
  }
  if (top_k == 0 || n == 0) return out;

  // This rank's candidates: its shard's top_k of each row, (logit, global id) pairs,
  // padded with (-inf, -1) where the shard has fewer.
  const int64_t limit = vocab_limit > 0 ? std::clamp<int64_t>(vocab_limit - plan.vocab_begin, 0, st.cols) : st.cols;
  const size_t K = static_cast<size_t>(top_k);
  std::vector<float> send(n * K * 2);
  std::vector<int32_t> idx;
  for (size_t k = 0; k < n; ++k) {
    const float* l = st.logits.data() + st.rows[k] * vl;
    idx.clear();
    for (int32_t j = 0; j < limit; ++j) {
      if (!std::isnan(l[j])) idx.push_back(j);
    }
    const size_t m = std::min(K, idx.size());
    std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(m), idx.end(),
                      [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (size_t c = 0; c < K; ++c) {
      float* slot = send.data() + (k * K + c) * 2;
      slot[0] = c < m ? l[idx[c]] : -std::numeric_limits<float>::infinity();
      slot[1] = c < m ? static_cast<float>(plan.vocab_begin + idx[c]) : -1.0f;
    }
  }
  const int tp = engine.tp_comm().size();
  std::vector<float> recv(send.size() * static_cast<size_t>(tp));
  engine.tp_comm().all_gather(send.data(), send.size(), recv.data());

  std::vector<std::pair<float, int32_t>> cand;
  for (size_t k = 0; k < n; ++k) {
    cand.clear();
    for (int r = 0; r < tp; ++r) {
      const float* from = recv.data() + (static_cast<size_t>(r) * n * K + k * K) * 2;
      for (size_t c = 0; c < K; ++c) {
        if (from[2 * c + 1] >= 0) cand.emplace_back(from[2 * c], static_cast<int32_t>(from[2 * c + 1]));
      }
    }
    const size_t m = std::min(K, cand.size());
    std::partial_sort(cand.begin(), cand.begin() + static_cast<long>(m), cand.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    auto& top = out.top[st.rows[k]];
    for (size_t c = 0; c < m; ++c) {
      top.emplace_back(cand[c].second, static_cast<float>(static_cast<double>(cand[c].first) - log_z[k]));
    }
  }
  return out;
}

}  // namespace linnet
