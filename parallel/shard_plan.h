// ShardPlan: which q heads, KV heads, MLP inner units and vocabulary rows one tp rank
// holds (Megatron-style even splits). Global sizes stay in ModelConfig; every
// per-rank size here has a *_local name.
//
// Two cases go beyond an even split:
// - vocabulary padding: vocab_size is padded up to vocab_padded, a multiple of tp_size;
//   the padded rows hold zeros and their logits are dropped before sampling.
// - KV-head replication: when tp_size > num_key_value_heads and is a multiple of it,
//   each KV head lives on tp_size / num_key_value_heads ranks (one KV head per rank).
#pragma once

#include <cstdint>
#include <string>

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
  int64_t kv_replication = 1;           // ranks holding each KV head (1: no replication)
  int64_t intermediate_local = 0;       // MLP inner units on this rank
  int64_t intermediate_begin = 0;
  int64_t vocab_padded = 0;             // vocab_size rounded up to a multiple of tp_size
  int64_t vocab_local = 0;              // vocabulary rows on this rank (incl. padding)
  int64_t vocab_begin = 0;

  /// Splits `config` over `tp_size` ranks for rank `tp_rank`.
  /// @throws Error when num_attention_heads or intermediate_size is not divisible by
  ///   tp_size, or num_key_value_heads neither divides nor is divisible by tp_size; the
  ///   message names the dimension, its size, and the tp sizes that would work.
  static ShardPlan make(const ModelConfig& config, int tp_rank, int tp_size);

  /// "1, 2, 4, 8" : the tp sizes (up to 512) that `config` can be split over.
  static std::string working_tp_sizes(const ModelConfig& config);
};

}  // namespace linnet
