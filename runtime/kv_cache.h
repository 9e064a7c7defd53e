// KvCache: per-layer K and V in a pool of pages of page_size positions each, holding
// this rank's KV heads. Position p of a sequence whose page table is T lives at cache
// row T[p / page_size] * page_size + p % page_size (vLLM's PagedAttention layout).
// A contiguous cache of `rows` sequences of max_seq_len positions is the special case
// page_size = max_seq_len, one page per sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/backend.h"

namespace linnet {

/// Positions per page of the paged KV pool (the model cards' prefill_paged / decode_paged).
constexpr int64_t kKvPageSize = 64;

/// K and V for every layer: k[layer], v[layer] are
/// [num_pages * page_size, num_kv_heads_local, head_dim] in backend memory, in the
/// backend's kv_cache_dtype() (f32; bf16 on CPU with --kv-cache-dtype bf16).
struct KvCache {
  int64_t page_size = 0;
  int64_t num_pages = 0;
  int64_t num_kv_heads_local = 0;
  int64_t head_dim = 0;
  std::vector<Tensor> k;  // [num_hidden_layers] x [num_pages * page_size, num_kv_heads_local, head_dim]
  std::vector<Tensor> v;

  /// Allocates a zeroed pool on `backend` in its kv_cache_dtype(), with `extra_rows` rows past its pages (the
  /// Engine's CUDA graphs keep their padding rows' K/V there: row tokens(), which page
  /// table entry num_pages addresses at position 0).
  static KvCache make(Backend& backend, int64_t num_layers, int64_t page_size, int64_t num_pages,
                      int64_t num_kv_heads_local, int64_t head_dim, int64_t extra_rows = 0);
  /// Positions the pool holds.
  int64_t tokens() const { return page_size * num_pages; }
  /// Bytes held by this rank's cache (K and V, all layers).
  int64_t bytes() const;
  /// Bytes a cache of `tokens` positions will hold in `dtype`, before allocating it;
  /// INT64_MAX when the product does not fit in int64 (or a factor is negative).
  static int64_t bytes_for(int64_t num_layers, int64_t tokens, int64_t num_kv_heads_local, int64_t head_dim,
                           DType dtype = DType::kF32);
};

}  // namespace linnet
