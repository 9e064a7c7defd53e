// Paged grouped-query attention of each query over its own range of its sequence's
// keys, f32, one query row at a time. Scores live in a per-call buffer sized to the
// longest range; softmax subtracts the row max. Keys are visited page by page, so the
// inner loops run over contiguous cache rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"

namespace linnet::cpu {

void attention(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
               int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
               int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t kv_stride = n_kv_heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  int64_t max_len = 0;
  for (int64_t r = 0; r < rows; ++r) max_len = std::max<int64_t>(max_len, key_end[r] - key_begin[r]);
  std::vector<float> scores(static_cast<size_t>(max_len));
  // Calls f(t, cache_row) for the keys of query r, t counting from 0 at key_begin[r].
  auto for_keys = [&](int64_t r, auto&& f) {
    const int32_t* table = page_table + r * max_pages;
    int64_t p = key_begin[r];
    const int64_t end = key_end[r];
    while (p < end) {
      const int64_t page = p / page_size, off = p % page_size;
      const int64_t n = std::min(end - p, page_size - off);
      const int64_t base = static_cast<int64_t>(table[page]) * page_size + off;
      for (int64_t j = 0; j < n; ++j) f(p - key_begin[r] + j, base + j);
      p += n;
    }
  };
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = key_end[r] - key_begin[r];
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* qh = q + r * q_stride + h * head_dim;
      const int64_t kvh = h / group;
      float mx = -std::numeric_limits<float>::infinity();
      for_keys(r, [&](int64_t t, int64_t row) {
        const float* kt = k_cache + row * kv_stride + kvh * head_dim;
        float dot = 0.0f;
        for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * kt[d];
        scores[t] = dot * scale;
        mx = std::max(mx, scores[t]);
      });
      float sum = 0.0f;
      for (int64_t t = 0; t < len; ++t) {
        scores[t] = std::exp(scores[t] - mx);
        sum += scores[t];
      }
      const float inv = 1.0f / sum;
      float* oh = out + r * n_heads * head_dim + h * head_dim;
      std::fill(oh, oh + head_dim, 0.0f);
      for_keys(r, [&](int64_t t, int64_t row) {
        const float p = scores[t] * inv;
        const float* vt = v_cache + row * kv_stride + kvh * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) oh[d] += p * vt[d];
      });
    }
  }
}

void gather_rows(const float* src, int64_t cols, const int32_t* index, int64_t n, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(out + r * cols, src + static_cast<int64_t>(index[r]) * cols, static_cast<size_t>(cols) * sizeof(float));
  }
}

}  // namespace linnet::cpu
