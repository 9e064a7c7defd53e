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

// exp(x) of 16 floats for any x (through pointers: no wide vector crosses a call), in GCC vector operations (element-wise, so every ISA
// gives the same bits; libm's expf is a call per element): x = 2^k e^r with k =
// round(x / ln 2) (the 1.5 2^23 rounding trick), r = x - k ln 2 in two parts (Cody and
// Waite), e^r by its Taylor polynomial of degree 7, 2^k put in the exponent bits, as
// attention's exp_block (attention_impl.h: at most 1.17 ulp from exp in double). x is
// clamped to [-87, 88] for the arithmetic; then x < -87 gives 0 (e^x < 2^-125),
// x > 88.72 gives +inf (past FLT_MAX), NaN stays NaN.
typedef float vf16 __attribute__((vector_size(64)));
typedef int vi16 __attribute__((vector_size(64)));
__attribute__((always_inline)) inline void exp16(const vf16* xp, vf16* out) {
  const vf16 x = *xp;
  const float log2e = 1.44269504088896341f, magic = 12582912.0f;  // 1.5 2^23
  const float ln2_hi = 0.693145751953125f, ln2_lo = 1.42860682030941723e-6f;
  const vf16 lo = vf16{} - 87.0f, hi = vf16{} + 88.0f;
  vf16 xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const vf16 t = xc * log2e + magic;
  const vf16 k = t - magic;
  vf16 r = xc - k * ln2_hi;
  r = r - k * ln2_lo;
  vf16 p = r * (1.0f / 5040) + (1.0f / 720);
  p = p * r + (1.0f / 120);
  p = p * r + (1.0f / 24);
  p = p * r + (1.0f / 6);
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  vi16 bits;
  __builtin_memcpy(&bits, &t, 64);
  const vi16 e2 = (bits - 0x4b400000 + 127) << 23;  // t's low bits hold k, |k| <= 127: 2^k
  vf16 two_k;
  __builtin_memcpy(&two_k, &e2, 64);
  vf16 e = p * two_k;
  const vf16 zero = {}, inf = vf16{} + __builtin_inff();
  e = x < lo ? zero : e;
  e = x > 88.72f ? inf : e;
  *out = x != x ? x : e;
}

// out[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n, 16 at a time (the tail padded).
inline void silu_mul(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    vf16 gv = {}, uv = {};
    const int64_t m = n - i < 16 ? n - i : 16;
    __builtin_memcpy(&gv, g + i, static_cast<size_t>(m) * 4);
    __builtin_memcpy(&uv, u + i, static_cast<size_t>(m) * 4);
    const vf16 ng = -gv;
    vf16 e;
    exp16(&ng, &e);
    const vf16 o = gv / (1.0f + e) * uv;
    __builtin_memcpy(out + i, &o, static_cast<size_t>(m) * 4);
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
