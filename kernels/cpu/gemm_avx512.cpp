// The AVX-512F GEMM path over packed panels (gemm.h). This file alone is built with
// -mavx512f; it runs only when cpu_features finds AVX-512F. One zmm holds a panel's 16
// columns, so with 32 registers the micro-kernel takes R <= 12 rows x P = 2 panels (24
// accumulators: 2 weight loads and 12 broadcasts per 24 fused multiply-adds), and P = 4
// panels for GEMV-sized steps (m <= 2). bf16 weights: zero-extend + shift; f16:
// vcvtph2ps. Each output element is the same single f32 fma chain in ascending k as on
// the AVX2 path, so both paths give the same bits (a fused multiply-add rounds once,
// whatever the vector width). AVX512_BF16's vdpbf16ps is not used: it would round the
// f32 activations to bf16 and pair the products, another numerics than transformers'.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/gemm.h"

namespace linnet::cpu::detail {
namespace {

template <WeightType WT>
inline __m512 load16(const void* w, int64_t i) {
  if constexpr (WT == WeightType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + i));
    if constexpr (WT == WeightType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

template <WeightType WT, int R, int P>
inline void tile(const float* x, const void* packed, float* out, int64_t k, int64_t n, int64_t r0, int64_t p) {
  __m512 acc[R][P];
  for (int i = 0; i < R; ++i)
    for (int q = 0; q < P; ++q) acc[i][q] = _mm512_setzero_ps();
  const float* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = x + (r0 + i) * k;
  for (int64_t c = 0; c < k; ++c) {
    __m512 w[P];
    for (int q = 0; q < P; ++q) w[q] = load16<WT>(packed, (p + q) * kPanel * k + c * kPanel);
    for (int i = 0; i < R; ++i) {
      const __m512 xv = _mm512_set1_ps(xr[i][c]);
      for (int q = 0; q < P; ++q) acc[i][q] = _mm512_fmadd_ps(xv, w[q], acc[i][q]);
    }
  }
  for (int q = 0; q < P; ++q) {
    const int64_t j0 = (p + q) * kPanel;
    const int64_t cols = n - j0 < kPanel ? n - j0 : kPanel;
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
    for (int i = 0; i < R; ++i) _mm512_mask_storeu_ps(out + (r0 + i) * n + j0, mask, acc[i][q]);
  }
}

template <WeightType WT, int P>
inline void rows(const float* x, const void* packed, float* out, int64_t k, int64_t n, int64_t r0, int64_t r1,
                 int64_t p) {
  int64_t r = r0;
  for (; r + 12 <= r1; r += 12) tile<WT, 12, P>(x, packed, out, k, n, r, p);
  switch (r1 - r) {
    case 11: tile<WT, 11, P>(x, packed, out, k, n, r, p); break;
    case 10: tile<WT, 10, P>(x, packed, out, k, n, r, p); break;
    case 9: tile<WT, 9, P>(x, packed, out, k, n, r, p); break;
    case 8: tile<WT, 8, P>(x, packed, out, k, n, r, p); break;
    case 7: tile<WT, 7, P>(x, packed, out, k, n, r, p); break;
    case 6: tile<WT, 6, P>(x, packed, out, k, n, r, p); break;
    case 5: tile<WT, 5, P>(x, packed, out, k, n, r, p); break;
    case 4: tile<WT, 4, P>(x, packed, out, k, n, r, p); break;
    case 3: tile<WT, 3, P>(x, packed, out, k, n, r, p); break;
    case 2: tile<WT, 2, P>(x, packed, out, k, n, r, p); break;
    case 1: tile<WT, 1, P>(x, packed, out, k, n, r, p); break;
    default: break;
  }
}

template <WeightType WT>
void panels(const float* x, const void* packed, float* out, int64_t m, int64_t k, int64_t n, int64_t p0,
            int64_t p1) {
  int64_t p = p0;
  if (m <= 2) {  // GEMV-sized: four panels a tile, enough chains in flight for DRAM
    for (; p + 4 <= p1; p += 4) {
      if (m == 2) {
        tile<WT, 2, 4>(x, packed, out, k, n, 0, p);
      } else {
        tile<WT, 1, 4>(x, packed, out, k, n, 0, p);
      }
    }
    for (; p < p1; ++p) rows<WT, 1>(x, packed, out, k, n, 0, m, p);
    return;
  }
  const int64_t mb = row_block(k);
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    for (p = p0; p + 2 <= p1; p += 2) rows<WT, 2>(x, packed, out, k, n, r0, r1, p);
    if (p < p1) rows<WT, 1>(x, packed, out, k, n, r0, r1, p);
  }
}

}  // namespace

void gemm_panels_avx512(const float* x, const void* packed, WeightType wt, float* out, int64_t m, int64_t k,
                        int64_t n, int64_t p0, int64_t p1) {
  switch (wt) {
    case WeightType::kF32: return panels<WeightType::kF32>(x, packed, out, m, k, n, p0, p1);
    case WeightType::kBF16: return panels<WeightType::kBF16>(x, packed, out, m, k, n, p0, p1);
    case WeightType::kF16: return panels<WeightType::kF16>(x, packed, out, m, k, n, p0, p1);
  }
}

}  // namespace linnet::cpu::detail
