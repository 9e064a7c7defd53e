// Paged grouped-query attention, FlashAttention-style: each (query row, head) pair
// walks its key range in blocks of kKeyBlock keys with an online softmax (running max m,
// running sum l, output rescaled by exp(m_old - m_new) when the max grows), so the
// memory is one block of scores and one head_dim accumulator per pair, whatever the
// sequence length: O(tile), not O(S). Keys are visited page by page, so the inner loops
// run over contiguous cache rows. Pairs are spread over the rank's OpenMP threads (the
// pair, not its keys, is the unit: flash-decoding's key splits are not done, which
// leaves decode of one long row on n_heads-way parallelism).
//
// Fixed order: a pair's result depends only on its query, its key range and the cache:
// the blocks are cut at multiples of kKeyBlock counted from key_begin, each dot product
// of head_dim is eight lane sums combined as in gemm.h, and each pair is computed by one
// thread start to end. So a row alone equals the same row in any batch, and the thread
// count changes no bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>

#include "kernels/cpu/ops.h"

namespace linnet::cpu {
namespace {

constexpr int64_t kKeyBlock = 64;

// sum_d a[d] b[d] as eight lane sums over d = l (mod 8), combined pairwise, then the tail.
inline float dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t nv = n / 8 * 8;
  for (int64_t d = 0; d < nv; d += 8)
    for (int l = 0; l < 8; ++l) lane[l] = lane[l] + a[d + l] * b[d + l];
  float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (int64_t d = nv; d < n; ++d) s = s + a[d] * b[d];
  return s;
}

}  // namespace

void attention(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
               int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
               int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t kv_stride = n_kv_heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  int64_t keys = 0;
  for (int64_t r = 0; r < rows; ++r) keys += key_end[r] - key_begin[r];
  const int64_t pairs = rows * n_heads;
  const int threads = keys * n_heads * head_dim < (int64_t{1} << 15) ? 1 : std::min<int>(num_threads(), static_cast<int>(pairs));

#pragma omp parallel num_threads(threads)
  {
    float scores[kKeyBlock];
    int64_t rows_of[kKeyBlock];
    std::vector<float> acc(static_cast<size_t>(head_dim));
#pragma omp for schedule(dynamic, 1)
    for (int64_t pr = 0; pr < pairs; ++pr) {
      const int64_t r = pr / n_heads, h = pr % n_heads;
      const float* qh = q + r * q_stride + h * head_dim;
      const int64_t kvh = h / group;
      const int32_t* table = page_table + r * max_pages;
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t b0 = key_begin[r]; b0 < key_end[r]; b0 += kKeyBlock) {
        const int64_t n = std::min<int64_t>(kKeyBlock, key_end[r] - b0);
        float bm = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          const int64_t p = b0 + j;
          rows_of[j] = static_cast<int64_t>(table[p / page_size]) * page_size + p % page_size;
          scores[j] = dot(qh, k_cache + rows_of[j] * kv_stride + kvh * head_dim, head_dim) * scale;
          bm = std::max(bm, scores[j]);
        }
        const float m_new = std::max(m, bm);
        const float corr = std::exp(m - m_new);  // 0 on the first block (m = -inf)
        l *= corr;
        for (int64_t d = 0; d < head_dim; ++d) acc[d] *= corr;
        for (int64_t j = 0; j < n; ++j) {
          const float e = std::exp(scores[j] - m_new);
          l += e;
          const float* vt = v_cache + rows_of[j] * kv_stride + kvh * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) acc[d] += e * vt[d];
        }
        m = m_new;
      }
      const float inv = 1.0f / l;
      float* oh = out + r * n_heads * head_dim + h * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) oh[d] = acc[d] * inv;
    }
  }
}

void gather_rows(const float* src, int64_t cols, const int32_t* index, int64_t n, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(out + r * cols, src + static_cast<int64_t>(index[r]) * cols, static_cast<size_t>(cols) * sizeof(float));
  }
}

}  // namespace linnet::cpu
