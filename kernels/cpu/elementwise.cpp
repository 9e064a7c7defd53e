// Row-wise and element-wise ops: embedding lookup, RMSNorm, SwiGLU, residual add, the
// KV-cache scatter. Each output element is computed by one thread in a fixed order
// (RMSNorm: the row's sum of squares in double, front to back), and the rows or column
// chunks are split over the rank's threads (threads_for) only when the work pays for
// the fork, so results never depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/float16.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threads.h"

namespace linnet::cpu {

void embedding_lookup(const float* table, int64_t vocab_begin, int64_t vocab_local, int64_t hidden,
                      const int32_t* ids, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = static_cast<int64_t>(ids[i]) - vocab_begin;
    float* dst = out + i * hidden;
    if (row >= 0 && row < vocab_local) {
      std::memcpy(dst, table + row * hidden, sizeof(float) * hidden);
    } else {
      std::memset(dst, 0, sizeof(float) * hidden);
    }
  }
}

namespace {
constexpr int64_t kChunk = 1024;  // columns per task of the element-wise ops
}  // namespace

void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for num_threads(rows > 1 ? threads_for(rows * dim) : 1) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / dim) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = weight[i] * (xr[i] * inv);
  }
}

void swiglu(const float* gate_up, float* out, int64_t rows, int64_t inter) {
  const int64_t chunks = (inter + kChunk - 1) / kChunk;
#pragma omp parallel for collapse(2) num_threads(threads_for(rows * inter)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < chunks; ++c) {
      const float* g = gate_up + r * 2 * inter;
      const float* u = g + inter;
      float* o = out + r * inter;
      const int64_t end = std::min(inter, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  }
}

void add_inplace(float* x, const float* y, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads_for(n)) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) x[i] += y[i];
  }
}

}  // namespace linnet::cpu

namespace linnet::cpu {
void store_rows(const float* src, int64_t src_stride, float* cache, int64_t row_elems,
                const int32_t* positions, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(cache + static_cast<int64_t>(positions[r]) * row_elems, src + r * src_stride,
                sizeof(float) * row_elems);
  }
}

void store_rows(const float* src, int64_t src_stride, uint16_t* cache, int64_t row_elems,
                const int32_t* positions, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* dst = cache + static_cast<int64_t>(positions[r]) * row_elems;
    const float* s = src + r * src_stride;
    for (int64_t i = 0; i < row_elems; ++i) dst[i] = float_to_bf16(s[i]);
  }
}
}  // namespace linnet::cpu

namespace linnet::cpu {
void rmsnorm_heads(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                   const float* weight, float eps) {
#pragma omp parallel for collapse(2) num_threads(threads_for(rows * n_heads * head_dim)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + r * row_stride + h * head_dim;
      rmsnorm(xh, weight, xh, 1, head_dim, eps);
    }
  }
}
}  // namespace linnet::cpu
