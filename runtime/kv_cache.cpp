#include "runtime/kv_cache.h"

#include <cstdint>

namespace linnet {

KvCache KvCache::make(Backend& backend, int64_t num_layers, int64_t page_size, int64_t num_pages,
                      int64_t num_kv_heads_local, int64_t head_dim, int64_t extra_rows) {
  const DType dtype = backend.kv_cache_dtype();
  KvCache c;
  c.page_size = page_size;
  c.num_pages = num_pages;
  c.num_kv_heads_local = num_kv_heads_local;
  c.head_dim = head_dim;
  for (int64_t i = 0; i < num_layers; ++i) {
    c.k.push_back(backend.zeros({num_pages * page_size + extra_rows, num_kv_heads_local, head_dim}, dtype));
    c.v.push_back(backend.zeros({num_pages * page_size + extra_rows, num_kv_heads_local, head_dim}, dtype));
  }
  return c;
}

int64_t KvCache::bytes() const {
  int64_t n = 0;
  for (const auto& t : k) n += t.bytes();
  for (const auto& t : v) n += t.bytes();
  return n;
}

int64_t KvCache::bytes_for(int64_t num_layers, int64_t tokens, int64_t num_kv_heads_local, int64_t head_dim,
                           DType dtype) {
  // Saturates instead of wrapping: a huge --kv-cache-tokens must read as too big for
  // the memory preflight, never as a small (or negative) size.
  int64_t bytes = 2 * static_cast<int64_t>(element_size(dtype));
  for (int64_t f : {num_layers, tokens, num_kv_heads_local, head_dim}) {
    if (f < 0 || __builtin_mul_overflow(bytes, f, &bytes)) return INT64_MAX;
  }
  return bytes;
}

}  // namespace linnet
