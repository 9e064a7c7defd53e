#include "parallel/shard_plan.h"

#include <string>

#include "common/error.h"

namespace linnet {
namespace {

// Empty when `tp` works for `c`, else the message for the first dimension that fails.
std::string split_problem(const ModelConfig& c, int64_t tp) {
  auto msg = [tp](const char* name, int64_t size, const char* how) {
    return std::string(name) + " = " + std::to_string(size) + " cannot be split over " + std::to_string(tp) +
           " tensor-parallel ranks (" + how + ")";
  };
  if (c.num_attention_heads % tp != 0) return msg("num_attention_heads", c.num_attention_heads, "not divisible");
  const int64_t kv = c.num_key_value_heads;
  if (kv % tp != 0 && tp % kv != 0) {
    return msg("num_key_value_heads", kv, "it neither divides nor is divisible by the tp size");
  }
  if (c.intermediate_size % tp != 0) return msg("intermediate_size", c.intermediate_size, "not divisible");
  return {};
}

}  // namespace

std::string ShardPlan::working_tp_sizes(const ModelConfig& c) {
  std::string out;
  for (int64_t tp = 1; tp <= 512; ++tp) {
    if (split_problem(c, tp).empty()) out += (out.empty() ? "" : ", ") + std::to_string(tp);
  }
  return out;
}

ShardPlan ShardPlan::make(const ModelConfig& c, int tp_rank, int tp_size) {
  LINNET_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size,
               "bad tp rank " << tp_rank << " of " << tp_size);
  if (const std::string problem = split_problem(c, tp_size); !problem.empty()) {
    throw Error(problem + "; tp sizes that work for this model: " + working_tp_sizes(c), "config.json");
  }
  ShardPlan p;
  p.tp_rank = tp_rank;
  p.tp_size = tp_size;
  p.num_heads_local = c.num_attention_heads / tp_size;
  p.head_begin = p.num_heads_local * tp_rank;
  if (c.num_key_value_heads % tp_size == 0) {
    p.num_kv_heads_local = c.num_key_value_heads / tp_size;
    p.kv_head_begin = p.num_kv_heads_local * tp_rank;
  } else {
    // Replication: ranks r*R .. r*R+R-1 share KV head r, and their q heads all map to
    // it because num_heads_local divides the q heads per KV head.
    p.kv_replication = tp_size / c.num_key_value_heads;
    p.num_kv_heads_local = 1;
    p.kv_head_begin = tp_rank / p.kv_replication;
  }
  p.intermediate_local = c.intermediate_size / tp_size;
  p.intermediate_begin = p.intermediate_local * tp_rank;
  p.vocab_padded = (c.vocab_size + tp_size - 1) / tp_size * tp_size;
  p.vocab_local = p.vocab_padded / tp_size;
  p.vocab_begin = p.vocab_local * tp_rank;
  return p;
}

}  // namespace linnet
