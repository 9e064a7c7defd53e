#include "runtime/kv_cache.h"

namespace linnet {

KvCache KvCache::make(Backend& backend, int64_t num_layers, int64_t max_seq_len,
                      int64_t num_kv_heads_local, int64_t head_dim, int64_t rows) {
  KvCache c;
  c.rows = rows;
  c.max_seq_len = max_seq_len;
  c.num_kv_heads_local = num_kv_heads_local;
  c.head_dim = head_dim;
  for (int64_t i = 0; i < num_layers; ++i) {
    c.k.push_back(backend.zeros({rows * max_seq_len, num_kv_heads_local, head_dim}));
    c.v.push_back(backend.zeros({rows * max_seq_len, num_kv_heads_local, head_dim}));
  }
  return c;
}

int64_t KvCache::bytes() const {
  int64_t n = 0;
  for (const auto& t : k) n += t.numel();
  for (const auto& t : v) n += t.numel();
  return n * static_cast<int64_t>(sizeof(float));
}

int64_t KvCache::bytes_for(int64_t num_layers, int64_t max_seq_len, int64_t num_kv_heads_local,
                           int64_t head_dim, int64_t rows) {
  return 2 * num_layers * rows * max_seq_len * num_kv_heads_local * head_dim * static_cast<int64_t>(sizeof(float));
}

}  // namespace linnet
