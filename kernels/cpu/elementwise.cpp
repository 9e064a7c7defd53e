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
#include "kernels/cpu/vec_exp.h"

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

// exp(x) of 4 floats for any x: exp_in_range (vec_exp.h, as attention's exp: 1.17 ulp,
// the same bits on every ISA; libm's expf is a call per element) on x clamped to
// [-87, 88]; then x < -87 gives 0 (e^x < 2^-125), x > 88.72 gives +inf (past FLT_MAX),
// NaN stays NaN.
typedef float vf4 __attribute__((vector_size(16)));
typedef int vi4 __attribute__((vector_size(16)));
__attribute__((always_inline)) inline void exp4(const vf4* xp, vf4* out) {
  const vf4 x = *xp;
  const vf4 lo = vf4{} - 87.0f, hi = vf4{} + 88.0f;
  vf4 xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  vf4 e;
  exp_in_range<vf4, vi4>(&xc, &e);
  const vf4 zero = {}, inf = vf4{} + __builtin_inff();
  e = x < lo ? zero : e;
  e = x > 88.72f ? inf : e;
  *out = x != x ? x : e;
}

// out[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n, 4 at a time (the tail through a
// padded copy; the baseline ISA's width: wider GCC vectors spill on SSE2).
inline void silu_mul(const float* g, const float* u, float* out, int64_t n) {
  float gt[4] = {}, ut[4] = {}, ot[4];
  for (int64_t i = 0; i < n; i += 4) {
    const bool tail = n - i < 4;
    const float* gp = g + i;
    const float* up = u + i;
    if (tail) {  // fixed-size copies only: a variable one is a library call
      for (int64_t j = 0; j < n - i; ++j) gt[j] = g[i + j], ut[j] = u[i + j];
      gp = gt;
      up = ut;
    }
    vf4 gv, uv;
    __builtin_memcpy(&gv, gp, 16);
    __builtin_memcpy(&uv, up, 16);
    const vf4 ng = -gv;
    vf4 e;
    exp4(&ng, &e);
    const vf4 o = gv / (1.0f + e) * uv;
    if (tail) {
      __builtin_memcpy(ot, &o, 16);
      for (int64_t j = 0; j < n - i; ++j) out[i + j] = ot[j];
    } else {
      __builtin_memcpy(out + i, &o, 16);
    }
  }
}
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
      silu_mul(g + c * kChunk, u + c * kChunk, o + c * kChunk, end - c * kChunk);
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
