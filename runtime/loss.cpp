#include "runtime/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"

namespace linnet {

PackedLoss loss_packed(Engine& engine, const PackedBatch& batch) {
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
  const Tensor logits = engine.packed_logits_local(batch.tokens, batch.positions, batch.segments);
  const ShardPlan& plan = engine.plan();
  const int64_t vl = plan.vocab_local;
  // This rank's real (unpadded) columns.
  const int64_t cols = std::clamp<int64_t>(V - plan.vocab_begin, 0, vl);

  std::vector<int64_t> rows;  // scored positions
  for (int64_t i = 0; i < P; ++i) {
    if (batch.labels[i] != kIgnoreIndex) rows.push_back(i);
  }
  const size_t n = rows.size();
  std::vector<float> max(n, -std::numeric_limits<float>::infinity());
  for (size_t k = 0; k < n; ++k) {
    const float* l = logits.data() + rows[k] * vl;
    for (int64_t j = 0; j < cols; ++j) max[k] = std::max(max[k], l[j]);
  }
  engine.tp_comm().all_reduce_max(max.data(), n);

  // [0, n): sum of exp(l - max); [n, 2n): the target logit, from the rank that owns it.
  std::vector<double> sums(2 * n, 0.0);
  for (size_t k = 0; k < n; ++k) {
    const float* l = logits.data() + rows[k] * vl;
    double s = 0.0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(static_cast<double>(l[j]) - max[k]);
    sums[k] = s;
    const int64_t target = batch.labels[rows[k]] - plan.vocab_begin;
    if (target >= 0 && target < cols) sums[n + k] = l[target];
  }
  engine.tp_comm().all_reduce_sum(sums.data(), sums.size());

  PackedLoss out;
  out.nll.assign(static_cast<size_t>(P), 0.0);
  out.scored.assign(static_cast<size_t>(P), 0);
  for (size_t k = 0; k < n; ++k) {
    out.nll[rows[k]] = std::log(sums[k]) + max[k] - sums[n + k];
    out.scored[rows[k]] = 1;
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

}  // namespace linnet
