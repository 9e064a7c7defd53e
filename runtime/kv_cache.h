// KvCache: contiguous per-layer K and V for `rows` sequences (batch rows) of up to
// max_seq_len positions each, holding this rank's KV heads. Row r's position p lives at
// cache index r * max_seq_len + p. Sized by --max-seq-len and --max-batch.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/backend.h"

namespace linnet {

/// K and V for every layer: k[layer], v[layer] are
/// [rows * max_seq_len, num_kv_heads_local, head_dim].
struct KvCache {
  int64_t rows = 1;
  int64_t max_seq_len = 0;
  int64_t num_kv_heads_local = 0;
  int64_t head_dim = 0;
  std::vector<Tensor> k;  // [num_hidden_layers] x [max_seq_len, num_kv_heads_local, head_dim]
  std::vector<Tensor> v;

  /// Allocates a zeroed cache on `backend`.
  static KvCache make(Backend& backend, int64_t num_layers, int64_t max_seq_len,
                      int64_t num_kv_heads_local, int64_t head_dim, int64_t rows = 1);
  /// Bytes held by this rank's cache (K and V, all layers).
  int64_t bytes() const;
  /// Bytes a cache of these sizes will hold (f32), before allocating it.
  static int64_t bytes_for(int64_t num_layers, int64_t max_seq_len, int64_t num_kv_heads_local, int64_t head_dim,
                           int64_t rows = 1);
};

}  // namespace linnet
