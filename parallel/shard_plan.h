// ShardPlan: which q heads, KV heads, MLP inner units and vocabulary rows one tp rank
// holds (Megatron-style even splits). Global sizes stay in ModelConfig; every
// per-rank size here has a *_local name.
#pragma once

#include <cstdint>

#include "loader/model_config.h"

namespace linnet {

/// This rank's slice of every sharded dimension. Ranges are [begin, begin + local).
struct ShardPlan {
  int tp_rank = 0;
  int tp_size = 1;
  int64_t num_heads_local = 0;          // q heads on this rank
  int64_t head_begin = 0;
  int64_t num_kv_heads_local = 0;       // KV heads on this rank
  int64_t kv_head_begin = 0;
  int64_t intermediate_local = 0;       // MLP inner units on this rank
  int64_t intermediate_begin = 0;
  int64_t vocab_local = 0;              // vocabulary rows on this rank
  int64_t vocab_begin = 0;

  /// Splits `config` over `tp_size` ranks for rank `tp_rank`.
  /// @throws Error when a sharded dimension (num_attention_heads, num_key_value_heads,
  ///   intermediate_size, vocab_size) is not divisible by tp_size; the message names
  ///   the dimension, its size, and the tp sizes that would work for this model.
  static ShardPlan make(const ModelConfig& config, int tp_rank, int tp_size);
};

}  // namespace linnet
