#include "runtime/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "common/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threads.h"

namespace linnet {

namespace {

// Logits a block of rows holds at most (f32 [rows, vocab_local]): 64 MiB, and at least
// 48 rows, so the lm_head GEMM keeps many rows a pass while a long pack never holds a
// [P, vocab] tensor (8192 tokens x 49152 columns would be 1.5 GiB, faulted in fresh each pack).
constexpr int64_t kLogitBlockBytes = int64_t{64} << 20;
constexpr int64_t kMinBlockRows = 48;

// The vocab-parallel softmax statistics of the labelled rows of one packed pass.
struct RowStats {
  std::vector<int64_t> rows;   // labelled positions
  std::vector<float> max;      // [n] the row's max logit (all ranks)
  std::vector<double> sums;    // [0, n): sum of exp(l - max); [n, 2n): the label's logit
};

// Runs the packed pass, then the lm_head a block of labelled rows at a time; each row's
// local (max, sum exp(l - local max), label logit) comes from its block while the block
// is hot, and per_row(k, l) sees the row's logits slice l [vocab_local] (any thread,
// each row once). On a device backend (CUDA) the block stays in device memory: the
// statistics come from Backend::cross_entropy_rows (3 numbers a row to the host) and
// per_block(b0, bn, logits) sees the device block instead of per_row. Across the ranks: m = all_reduce_max of the local maxima, and each
// local sum is rescaled by exp(local max - m) before all_reduce_sum (at tp 1 the factor
// is exp(0) = 1: the sum unchanged). Each row's statistics are one fixed chain
// (cpu::softmax_stats), so neither the thread count nor the batch changes a bit.
template <class PerRow, class PerBlock>
RowStats row_stats(Engine& engine, const PackedBatch& batch, int64_t block_rows, const PerRow& per_row,
                   const PerBlock& per_block) {
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
  std::vector<int32_t> rows32;
  for (int64_t i = 0; i < P; ++i) {
    if (batch.labels[i] != kIgnoreIndex) {
      st.rows.push_back(i);
      rows32.push_back(static_cast<int32_t>(i));
    }
  }
  // No labelled row: no pass (every rank of the tp group holds the same batch, so all
  // skip it together and no collective is left waiting).
  const Tensor hidden = engine.packed_hidden(batch.tokens, batch.positions, batch.segments, rows32);
  const ShardPlan& plan = engine.plan();
  const int64_t vl = plan.vocab_local;
  const int64_t cols = std::clamp<int64_t>(V - plan.vocab_begin, 0, vl);
  const auto n = static_cast<int64_t>(st.rows.size());
  std::vector<float> local_max(static_cast<size_t>(n), -std::numeric_limits<float>::infinity());
  st.sums.assign(static_cast<size_t>(2 * n), 0.0);
  if (block_rows < 0) throw Error("invalid value", "loss block rows", ">= 0", std::to_string(block_rows));
  const int64_t block = block_rows > 0 ? block_rows : std::max(kLogitBlockBytes / (vl * 4), kMinBlockRows);
  if (engine.backend().device() != Device::kCpu) {
    std::vector<int32_t> targets(static_cast<size_t>(n));
    std::vector<float> sum_f(static_cast<size_t>(n)), target_f(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) targets[k] = batch.labels[st.rows[k]];
    for (int64_t b0 = 0; b0 < n; b0 += block) {
      const int64_t bn = std::min(block, n - b0);
      const Tensor logits = engine.lm_head_block(hidden, b0, bn);
      engine.backend().cross_entropy_rows(logits, vl, cols, plan.vocab_begin,
                                          std::span<const int32_t>(targets).subspan(b0, bn), &local_max[b0],
                                          &sum_f[b0], &target_f[b0]);
      per_block(b0, bn, logits);
    }
    for (int64_t k = 0; k < n; ++k) {
      st.sums[k] = sum_f[k];
      st.sums[n + k] = target_f[k];
    }
  }
  const int64_t host_rows = engine.backend().device() == Device::kCpu ? n : 0;
  const std::unique_ptr<float[]> logits(
      new float[static_cast<size_t>(std::min(block, std::max<int64_t>(host_rows, 1)) * vl)]);
  const int threads = cpu::num_threads();
  for (int64_t b0 = 0; b0 < host_rows; b0 += block) {
    const int64_t bn = std::min(block, n - b0);
    engine.lm_head_local(hidden, b0, bn, logits.get());
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t k = b0; k < b0 + bn; ++k) {
      const float* l = logits.get() + (k - b0) * vl;
      st.sums[k] = cpu::softmax_stats(l, cols, &local_max[k]);
      const int64_t target = batch.labels[st.rows[k]] - plan.vocab_begin;
      if (target >= 0 && target < cols) st.sums[n + k] = l[target];
      per_row(k, l);
    }
  }
  st.max = local_max;
  engine.tp_comm().all_reduce_max(st.max.data(), st.max.size());
  if (engine.tp_comm().size() > 1) {
    for (int64_t k = 0; k < n; ++k) {
      if (st.sums[k] != 0.0) st.sums[k] *= std::exp(static_cast<double>(local_max[k]) - st.max[k]);
    }
  }
  engine.tp_comm().all_reduce_sum(st.sums.data(), st.sums.size());
  return st;
}

}  // namespace

PackedLoss loss_packed(Engine& engine, const PackedBatch& batch, int64_t block_rows) {
  const RowStats st = row_stats(engine, batch, block_rows, [](int64_t, const float*) {},
                                [](int64_t, int64_t, const Tensor&) {});
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

PackedLogprobs log_probs_packed(Engine& engine, const PackedBatch& batch, int64_t top_k, int64_t vocab_limit,
                                int64_t block_rows) {
  if (top_k < 0) throw Error("invalid value", "top_logprobs", ">= 0", std::to_string(top_k));
  // Ids travel as floats in the gathered candidates: exact below 2^24.
  LINNET_CHECK(engine.config().vocab_size < (int64_t{1} << 24), "vocabulary too large for float ids");
  const ShardPlan& plan = engine.plan();
  const int64_t V = engine.config().vocab_size;
  const int64_t cols = std::clamp<int64_t>(V - plan.vocab_begin, 0, plan.vocab_local);
  // This rank's candidates: its shard's top_k of each row, (logit, global id) pairs,
  // padded with (-inf, -1) where the shard has fewer; picked while the row's block of
  // logits is at hand.
  const int64_t limit = vocab_limit > 0 ? std::clamp<int64_t>(vocab_limit - plan.vocab_begin, 0, cols) : cols;
  const size_t K = static_cast<size_t>(top_k);
  std::vector<float> send;
  const auto pick = [&](int64_t k, const float* l) {
    std::vector<int32_t> idx;
    idx.reserve(static_cast<size_t>(limit));
    for (int32_t j = 0; j < limit; ++j) {
      if (!std::isnan(l[j])) idx.push_back(j);
    }
    const size_t m = std::min(K, idx.size());
    std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(m), idx.end(),
                      [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (size_t c = 0; c < K; ++c) {
      float* slot = send.data() + (static_cast<size_t>(k) * K + c) * 2;
      slot[0] = c < m ? l[idx[c]] : -std::numeric_limits<float>::infinity();
      slot[1] = c < m ? static_cast<float>(plan.vocab_begin + idx[c]) : -1.0f;
    }
  };
  // The same on a device backend: its k best columns of the block (Backend::top_k_rows),
  // only the candidates reaching the host. The device never picks NaN nor -inf, so where
  // a shard has fewer than k finite logits it pads with (-inf, -1) where the host path
  // lists the -inf ids.
  const auto pick_block = [&](int64_t b0, int64_t bn, const Tensor& logits) {
    const int64_t m = std::min<int64_t>(top_k, limit);
    std::vector<float> vals(static_cast<size_t>(bn * std::max<int64_t>(m, 1)));
    std::vector<int32_t> idx(vals.size());
    if (m > 0) engine.backend().top_k_rows(logits, plan.vocab_local, limit, m, vals.data(), idx.data());
    for (int64_t k = b0; k < b0 + bn; ++k) {
      for (size_t c = 0; c < K; ++c) {
        float* slot = send.data() + (static_cast<size_t>(k) * K + c) * 2;
        const size_t at = static_cast<size_t>((k - b0) * m) + c;
        // No winner left (every remaining value -inf or NaN) comes back as index INT32_MAX.
        const bool real = static_cast<int64_t>(c) < m && idx[at] >= 0 && idx[at] < limit;
        slot[0] = real ? vals[at] : -std::numeric_limits<float>::infinity();
        slot[1] = real ? static_cast<float>(plan.vocab_begin + idx[at]) : -1.0f;
      }
    }
  };
  int64_t labelled = 0;
  for (const int32_t y : batch.labels) labelled += y != kIgnoreIndex;
  if (top_k > 0) send.assign(static_cast<size_t>(labelled) * K * 2, 0.0f);
  const auto none_block = [](int64_t, int64_t, const Tensor&) {};
  const RowStats st = top_k > 0 ? row_stats(engine, batch, block_rows, pick, pick_block)
                                 : row_stats(engine, batch, block_rows, [](int64_t, const float*) {}, none_block);
  const size_t n = st.rows.size();
  PackedLogprobs out;
  out.logprob.assign(batch.tokens.size(), std::numeric_limits<double>::quiet_NaN());
  out.top.resize(batch.tokens.size());
  std::vector<double> log_z(n);
  for (size_t k = 0; k < n; ++k) {
    log_z[k] = static_cast<double>(st.max[k]) + std::log(st.sums[k]);
    out.logprob[st.rows[k]] = st.sums[n + k] - log_z[k];
  }
  if (top_k == 0 || n == 0) return out;

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
