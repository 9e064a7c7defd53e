#include "parallel/shard_plan.h"

#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace linnet {
namespace {

// Every tp size up to the largest dimension that divides all of them evenly.
std::string working_tp_sizes(const std::vector<std::pair<const char*, int64_t>>& dims) {
  std::string out;
  for (int64_t tp = 1; tp <= 512; ++tp) {
    bool ok = true;
    for (const auto& [name, size] : dims) ok = ok && size % tp == 0;
    if (ok) out += (out.empty() ? "" : ", ") + std::to_string(tp);
  }
  return out;
}

}  // namespace

ShardPlan ShardPlan::make(const ModelConfig& c, int tp_rank, int tp_size) {
  LINNET_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size,
               "bad tp rank " << tp_rank << " of " << tp_size);
  const std::vector<std::pair<const char*, int64_t>> dims = {
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"intermediate_size", c.intermediate_size},
      {"vocab_size", c.vocab_size},
  };
  for (const auto& [name, size] : dims) {
    if (size % tp_size != 0) {
      throw Error(std::string(name) + " = " + std::to_string(size) + " cannot be split evenly over " +
                      std::to_string(tp_size) + " tensor-parallel ranks; tp sizes that work for this model: " +
                      working_tp_sizes(dims),
                  "config.json");
    }
  }
  ShardPlan p;
  p.tp_rank = tp_rank;
  p.tp_size = tp_size;
  p.num_heads_local = c.num_attention_heads / tp_size;
  p.head_begin = p.num_heads_local * tp_rank;
  p.num_kv_heads_local = c.num_key_value_heads / tp_size;
  p.kv_head_begin = p.num_kv_heads_local * tp_rank;
  p.intermediate_local = c.intermediate_size / tp_size;
  p.intermediate_begin = p.intermediate_local * tp_rank;
  p.vocab_local = c.vocab_size / tp_size;
  p.vocab_begin = p.vocab_local * tp_rank;
  return p;
}

}  // namespace linnet
