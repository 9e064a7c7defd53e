// The AVX2 + FMA + F16C GEMM path (this file alone is compiled with -mavx2 -mfma
// -mf16c; it runs only when cpu_features says the CPU has them). Micro-kernel: R <= 4
// rows x C <= 3 columns of out, 12 ymm accumulators, each holding one output element's
// eight lane sums (gemm.h's fixed order); the C weight vectors of a k-step are loaded
// (bf16: zero-extend and shift into the f32 high half; f16: vcvtph2ps) once and used for
// all R rows.
#include <immintrin.h>

#include "kernels/cpu/gemm.h"

namespace linnet::cpu::detail {
namespace {

template <WeightType WT>
inline __m256 load8(const void* w, int64_t i) {
  if constexpr (WT == WeightType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  } else if constexpr (WT == WeightType::kBF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    return _mm256_cvtph_ps(h);
  }
}

template <WeightType WT>
inline float load1(const void* w, int64_t i) {
  if constexpr (WT == WeightType::kF32) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (WT == WeightType::kBF16) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) << 16;
    return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(bits))));
  } else {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<const uint16_t*>(w)[i])));
  }
}

// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))
inline float hsum(__m256 v) {
  const __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l0+l4 .. l3+l7
  const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));  // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
  return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

template <WeightType WT, int R, int C>
inline void tile(const float* x, const void* w, float* out, int64_t k, int64_t n, int64_t r0, int64_t j0) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = x + (r0 + r) * k;
  const int64_t kv = k / 8 * 8;
  for (int64_t kk = 0; kk < kv; kk += 8) {
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load8<WT>(w, (j0 + c) * k + kk);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(xr[r] + kk);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t kk = kv; kk < k; ++kk) s = s + xr[r][kk] * load1<WT>(w, (j0 + c) * k + kk);
      out[(r0 + r) * n + j0 + c] = s;
    }
  }
}

template <WeightType WT, int C>
inline void rows_tile(const float* x, const void* w, float* out, int64_t k, int64_t n, int64_t r0, int64_t r1,
                      int64_t j0) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) tile<WT, 4, C>(x, w, out, k, n, r, j0);
  switch (r1 - r) {
    case 3: tile<WT, 3, C>(x, w, out, k, n, r, j0); break;
    case 2: tile<WT, 2, C>(x, w, out, k, n, r, j0); break;
    case 1: tile<WT, 1, C>(x, w, out, k, n, r, j0); break;
    default: break;
  }
}

template <WeightType WT>
void columns(const float* x, const void* w, float* out, int64_t m, int64_t k, int64_t n, int64_t j_begin,
             int64_t j_end) {
  const int64_t mb = row_block(k);
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    int64_t j = j_begin;
    for (; j + 3 <= j_end; j += 3) rows_tile<WT, 3>(x, w, out, k, n, r0, r1, j);
    if (j_end - j == 2) rows_tile<WT, 2>(x, w, out, k, n, r0, r1, j);
    if (j_end - j == 1) rows_tile<WT, 1>(x, w, out, k, n, r0, r1, j);
  }
}

}  // namespace

void gemm_columns_avx2(const float* x, const void* w, WeightType wt, float* out, int64_t m, int64_t k, int64_t n,
                       int64_t j_begin, int64_t j_end) {
  switch (wt) {
    case WeightType::kF32: return columns<WeightType::kF32>(x, w, out, m, k, n, j_begin, j_end);
    case WeightType::kBF16: return columns<WeightType::kBF16>(x, w, out, m, k, n, j_begin, j_end);
    case WeightType::kF16: return columns<WeightType::kF16>(x, w, out, m, k, n, j_begin, j_end);
  }
}

}  // namespace linnet::cpu::detail
