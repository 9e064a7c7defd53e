// Paged grouped-query attention, FlashAttention-style: each (query row, head) pair
// walks its key range in blocks of kKeyBlock keys with an online softmax (running max m,
// running sum l, output rescaled by exp(m_old - m_new) when the max grows), so the
// memory is one block of scores and one head_dim accumulator per pair, whatever the
// sequence length: O(tile), not O(S). Keys are visited page by page, so the inner loops
// run over contiguous cache rows.
//
// Query tiles: the pairs that read the same keys are computed together, so each key and
// value row is loaded once for all of them: the heads of one KV group (GQA) and up to
// kTileRows consecutive rows of one sequence (same key_begin, same pages), at most
// kMaxTileQ pairs a work item. Per block: the scores as a small GEMM (kQkTile query
// vectors x 4 keys in registers, two keys' eight lanes per 16-float vector), the lane
// sums reduced 16 keys at a time by shuffles, then the value sum with kPvTile query
// vectors' accumulators in registers over the block's keys. The work items spread over
// the rank's OpenMP threads, largest first, are (tile, KV head, split): a pair with more
// than kSplitKeys (1024) keys is cut into splits of that many keys (flash-decoding), each
// split's softmax state (m, l, acc) is kept, and the states are combined in split order
// after all items are done, so decode of one long row uses more than n_heads-way
// parallelism.
//
// Fixed order: a pair's result depends only on its query, its key range and the cache,
// never on the pairs tiled with it: the splits are cut at multiples of kSplitKeys and the
// blocks at multiples of kKeyBlock, both counted from key_begin; each dot product of
// head_dim is eight lane sums over d = l (mod 8) in ascending d, combined as
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) (as in gemm.h), then the head_dim
// tail; the block's sum l and each output element's value sum run over the keys in
// ascending order; each split is computed by one thread start to end and the splits are
// combined in order. So a row alone equals the same row in any batch or tile, and
// neither the thread count nor the ISA path (only the tile sizes differ) changes a bit.
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops.h"

#define LINNET_ATTENTION_NS generic_path
#include "kernels/cpu/attention_impl.h"
#undef LINNET_ATTENTION_NS

#include <cstring>

namespace linnet::cpu {
namespace avx2_path {
double softmax_stats_impl(const float* l, int64_t n, float* max_out);
void attention_impl(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
                    int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                    int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end);
void attention_impl_bf16(const float* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                         float* out, int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                         const int32_t* page_table, int64_t max_pages, int64_t page_size, const int32_t* key_begin,
                         const int32_t* key_end);
}
namespace avx512_path {
double softmax_stats_impl(const float* l, int64_t n, float* max_out);
void attention_impl(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
                    int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                    int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end);
void attention_impl_bf16(const float* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                         float* out, int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                         const int32_t* page_table, int64_t max_pages, int64_t page_size, const int32_t* key_begin,
                         const int32_t* key_end);
}

void attention(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
               int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
               int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end) {
  switch (active_isa()) {
    case Isa::kAvx512:
      return avx512_path::attention_impl(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads, head_dim,
                                         page_table, max_pages, page_size, key_begin, key_end);
    case Isa::kAvx2:
      return avx2_path::attention_impl(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads, head_dim,
                                       page_table, max_pages, page_size, key_begin, key_end);
    case Isa::kGeneric: break;
  }
  generic_path::attention_impl(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads, head_dim, page_table,
                               max_pages, page_size, key_begin, key_end);
}

void attention(const float* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache, float* out,
               int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
               int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end) {
  switch (active_isa()) {
    case Isa::kAvx512:
      return avx512_path::attention_impl_bf16(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads,
                                              head_dim, page_table, max_pages, page_size, key_begin, key_end);
    case Isa::kAvx2:
      return avx2_path::attention_impl_bf16(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads, head_dim,
                                            page_table, max_pages, page_size, key_begin, key_end);
    case Isa::kGeneric: break;
  }
  generic_path::attention_impl_bf16(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads, head_dim,
                                    page_table, max_pages, page_size, key_begin, key_end);
}

double softmax_stats(const float* l, int64_t n, float* max_out) {
  switch (active_isa()) {
    case Isa::kAvx512: return avx512_path::softmax_stats_impl(l, n, max_out);
    case Isa::kAvx2: return avx2_path::softmax_stats_impl(l, n, max_out);
    case Isa::kGeneric: break;
  }
  return generic_path::softmax_stats_impl(l, n, max_out);
}

void gather_rows(const float* src, int64_t cols, const int32_t* index, int64_t n, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(out + r * cols, src + static_cast<int64_t>(index[r]) * cols, static_cast<size_t>(cols) * sizeof(float));
  }
}

}  // namespace linnet::cpu
