// The AVX2 + FMA + F16C GEMM path over packed panels (gemm.h). This file alone is built
// with -mavx2 -mfma -mf16c; it runs only when cpu_features finds them. Micro-kernel: R <=
// 6 rows x P panels (P = 2 for GEMV-sized steps of m <= 2, else 1), 2P ymm of weights a
// k-step (bf16: zero-extend and shift into the f32 high half; f16: vcvtph2ps), each x
// element broadcast once and fused-multiply-added into its row's 2P accumulators: one
// chain per output element in ascending k, the fixed order of gemm.h. int8 weights: q
// widened in registers, a partial chain per group, scaled once per group (tile_q8).
#include <immintrin.h>

#include <cstdlib>
#include <cstring>

#include "kernels/cpu/gemm.h"

namespace linnet::cpu::detail {
namespace {

template <DType WT>
inline void load16(const void* w, int64_t i, __m256& lo, __m256& hi) {
  if constexpr (WT == DType::kF32) {
    const float* p = static_cast<const float*>(w) + i;
    lo = _mm256_loadu_ps(p);
    hi = _mm256_loadu_ps(p + 8);
  } else {
    const auto* p = reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i);
    const __m128i a = _mm_loadu_si128(p), b = _mm_loadu_si128(p + 1);
    if constexpr (WT == DType::kBF16) {
      lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(a), 16));
      hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
    } else {
      lo = _mm256_cvtph_ps(a);
      hi = _mm256_cvtph_ps(b);
    }
  }
}

template <DType WT, int R, int P>
inline void tile(const float* x, const void* packed, float* out, int64_t k, int64_t n, int64_t r0, int64_t p) {
  __m256 acc[R][2 * P];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < 2 * P; ++v) acc[i][v] = _mm256_setzero_ps();
  const float* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = x + (r0 + i) * k;
  int64_t base[P];
  for (int q = 0; q < P; ++q) base[q] = (p + q) * kPanel * k;
  for (int64_t c = 0; c < k; ++c) {
    __m256 w[2 * P];
    for (int q = 0; q < P; ++q) load16<WT>(packed, base[q] + c * kPanel, w[2 * q], w[2 * q + 1]);
    for (int i = 0; i < R; ++i) {
      const __m256 xv = _mm256_broadcast_ss(xr[i] + c);
      for (int v = 0; v < 2 * P; ++v) acc[i][v] = _mm256_fmadd_ps(xv, w[v], acc[i][v]);
    }
  }
  for (int q = 0; q < P; ++q) {
    const int64_t j0 = (p + q) * kPanel;
    const int64_t cols = n - j0 < kPanel ? n - j0 : kPanel;
    for (int i = 0; i < R; ++i) {
      float* o = out + (r0 + i) * n + j0;
      if (cols == kPanel) {
        _mm256_storeu_ps(o, acc[i][2 * q]);
        _mm256_storeu_ps(o + 8, acc[i][2 * q + 1]);
      } else {
        float tmp[kPanel];
        _mm256_storeu_ps(tmp, acc[i][2 * q]);
        _mm256_storeu_ps(tmp + 8, acc[i][2 * q + 1]);
        std::memcpy(o, tmp, static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
}

template <DType WT, int P>
inline void rows(const float* x, const void* packed, float* out, int64_t k, int64_t n, int64_t r0, int64_t r1,
                 int64_t p) {
  int64_t r = r0;
  for (; r + 6 <= r1; r += 6) tile<WT, 6, P>(x, packed, out, k, n, r, p);
  switch (r1 - r) {
    case 5: tile<WT, 5, P>(x, packed, out, k, n, r, p); break;
    case 4: tile<WT, 4, P>(x, packed, out, k, n, r, p); break;
    case 3: tile<WT, 3, P>(x, packed, out, k, n, r, p); break;
    case 2: tile<WT, 2, P>(x, packed, out, k, n, r, p); break;
    case 1: tile<WT, 1, P>(x, packed, out, k, n, r, p); break;
    default: break;
  }
}

// --- int8 weights (gemm.h): per group, a chain over x * q from zero, then one fma of
// that partial sum with the group's scales into the running sum (as the AVX-512 path) ---

inline __m256 widen8(const int8_t* q) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

// R rows x P panels over all of k, widening q in registers. 16 ymm: R x 2P running sums
// and as many partial sums, so R x P <= 3 (1 x 2 and 2 x 1 for GEMV steps, 3 x 1 else).
template <int R, int P>
inline void tile_q8(const float* x, const QuantView& qv, float* out, int64_t k, int64_t n, int64_t r0, int64_t p) {
  __m256 acc[R][2 * P];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < 2 * P; ++v) acc[i][v] = _mm256_setzero_ps();
  const float* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = x + (r0 + i) * k;
  const int8_t* wq[P];
  const float* sq[P];
  for (int q = 0; q < P; ++q) {
    wq[q] = qv.values + (p + q) * kPanel * k;
    sq[q] = qv.scales + (p + q) * qv.groups * kPanel;
  }
  for (int64_t g = 0; g < qv.groups; ++g) {
    __m256 part[R][2 * P];
    for (int i = 0; i < R; ++i)
      for (int v = 0; v < 2 * P; ++v) part[i][v] = _mm256_setzero_ps();
    for (int64_t c = g * qv.group_size, c1 = c + qv.group_size; c < c1; ++c) {
      __m256 w[2 * P];
      for (int q = 0; q < P; ++q) {
        w[2 * q] = widen8(wq[q] + c * kPanel);
        w[2 * q + 1] = widen8(wq[q] + c * kPanel + 8);
      }
      for (int i = 0; i < R; ++i) {
        const __m256 xv = _mm256_broadcast_ss(xr[i] + c);
        for (int v = 0; v < 2 * P; ++v) part[i][v] = _mm256_fmadd_ps(xv, w[v], part[i][v]);
      }
    }
    for (int q = 0; q < P; ++q) {
      const __m256 lo = _mm256_loadu_ps(sq[q] + g * kPanel), hi = _mm256_loadu_ps(sq[q] + g * kPanel + 8);
      for (int i = 0; i < R; ++i) {
        acc[i][2 * q] = _mm256_fmadd_ps(part[i][2 * q], lo, acc[i][2 * q]);
        acc[i][2 * q + 1] = _mm256_fmadd_ps(part[i][2 * q + 1], hi, acc[i][2 * q + 1]);
      }
    }
  }
  for (int q = 0; q < P; ++q) {
    const int64_t j0 = (p + q) * kPanel;
    const int64_t cols = n - j0 < kPanel ? n - j0 : kPanel;
    for (int i = 0; i < R; ++i) {
      float tmp[kPanel];
      _mm256_storeu_ps(tmp, acc[i][2 * q]);
      _mm256_storeu_ps(tmp + 8, acc[i][2 * q + 1]);
      std::memcpy(out + (r0 + i) * n + j0, tmp, static_cast<size_t>(cols) * sizeof(float));
    }
  }
}

void panels_q8(const float* x, const void* packed, float* out, int64_t m, int64_t k, int64_t n, int64_t p0,
               int64_t p1) {
  const QuantView qv = quant_view(packed);
  if (m == 1) {
    int64_t p = p0;
    for (; p + 2 <= p1; p += 2) tile_q8<1, 2>(x, qv, out, k, n, 0, p);
    if (p < p1) tile_q8<1, 1>(x, qv, out, k, n, 0, p);
    return;
  }
  const int64_t mb = row_block(k);
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    for (int64_t p = p0; p < p1; ++p) {
      int64_t r = r0;
      for (; r + 3 <= r1; r += 3) tile_q8<3, 1>(x, qv, out, k, n, r, p);
      if (r1 - r == 2) tile_q8<2, 1>(x, qv, out, k, n, r, p);
      if (r1 - r == 1) tile_q8<1, 1>(x, qv, out, k, n, r, p);
    }
  }
}

// int4: the 16 bytes of a k pair -> the even step's q - 8 (low nibbles; columns 0-7,
// 8-15) and the odd step's (high nibbles).
inline void widen_pair(const int8_t* b, __m256 w[4]) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m128i low = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
  const __m128i e = _mm_sub_epi8(_mm_and_si128(v, low), eight);
  const __m128i o = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), low), eight);
  w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e));
  w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e, 8)));
  w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(o));
  w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(o, 8)));
}

// int4: R rows x P panels over all of k (R x P <= 2), two k steps per load; xs the rows'
// group sums.
template <int R, int P>
inline void tile_q4(const float* x, const QuantView& qv, const float* xs, float* out, int64_t k, int64_t n, int64_t r0,
                    int64_t p) {
  __m256 acc[R][2 * P];
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < 2 * P; ++v) acc[i][v] = _mm256_setzero_ps();
  const float* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = x + (r0 + i) * k;
  for (int64_t g = 0; g < qv.groups; ++g) {
    __m256 part[R][2 * P];
    for (int i = 0; i < R; ++i)
      for (int v = 0; v < 2 * P; ++v) part[i][v] = _mm256_setzero_ps();
    for (int64_t c = g * qv.group_size, c1 = c + qv.group_size; c < c1; c += 2) {
      for (int q = 0; q < P; ++q) {
        __m256 w[4];
        widen_pair(qv.values + (p + q) * kPanel * k / 2 + c / 2 * kPanel, w);
        for (int i = 0; i < R; ++i) {
          const __m256 x0 = _mm256_broadcast_ss(xr[i] + c), x1 = _mm256_broadcast_ss(xr[i] + c + 1);
          part[i][2 * q] = _mm256_fmadd_ps(x0, w[0], part[i][2 * q]);
          part[i][2 * q + 1] = _mm256_fmadd_ps(x0, w[1], part[i][2 * q + 1]);
          part[i][2 * q] = _mm256_fmadd_ps(x1, w[2], part[i][2 * q]);
          part[i][2 * q + 1] = _mm256_fmadd_ps(x1, w[3], part[i][2 * q + 1]);
        }
      }
    }
    for (int q = 0; q < P; ++q) {
      const float* sq = qv.scales + ((p + q) * qv.groups + g) * kPanel;
      const float* mq = qv.mins + ((p + q) * qv.groups + g) * kPanel;
      for (int h = 0; h < 2; ++h) {
        const __m256 sv = _mm256_loadu_ps(sq + 8 * h), mv = _mm256_loadu_ps(mq + 8 * h);
        for (int i = 0; i < R; ++i) {
          acc[i][2 * q + h] = _mm256_fmadd_ps(part[i][2 * q + h], sv, acc[i][2 * q + h]);
          acc[i][2 * q + h] = _mm256_fmadd_ps(_mm256_set1_ps(xs[(r0 + i) * qv.groups + g]), mv, acc[i][2 * q + h]);
        }
      }
    }
  }
  for (int q = 0; q < P; ++q) {
    const int64_t j0 = (p + q) * kPanel;
    const int64_t cols = n - j0 < kPanel ? n - j0 : kPanel;
    for (int i = 0; i < R; ++i) {
      float tmp[kPanel];
      _mm256_storeu_ps(tmp, acc[i][2 * q]);
      _mm256_storeu_ps(tmp + 8, acc[i][2 * q + 1]);
      std::memcpy(out + (r0 + i) * n + j0, tmp, static_cast<size_t>(cols) * sizeof(float));
    }
  }
}

// The rows' group sums of the current call (C allocation only, as attention_impl.h).
struct GroupSums {
  float* data = nullptr;
  int64_t cap = 0;
  ~GroupSums() { std::free(data); }
  float* get(int64_t elems) {
    if (elems > cap) {
      std::free(data);
      data = static_cast<float*>(std::malloc(static_cast<size_t>(elems) * sizeof(float)));
      cap = elems;
    }
    return data;
  }
};
thread_local GroupSums t_xs;

void panels_q4(const float* x, const void* packed, float* out, int64_t m, int64_t k, int64_t n, int64_t p0,
               int64_t p1) {
  const QuantView qv = quant_view(packed);
  float* xs = t_xs.get(m * qv.groups);
  group_sums(x, m, k, qv.group_size, xs);
  if (m == 1) {
    int64_t p = p0;
    for (; p + 2 <= p1; p += 2) tile_q4<1, 2>(x, qv, xs, out, k, n, 0, p);
    if (p < p1) tile_q4<1, 1>(x, qv, xs, out, k, n, 0, p);
    return;
  }
  const int64_t mb = row_block(k);
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    for (int64_t p = p0; p < p1; ++p) {
      int64_t r = r0;
      for (; r + 2 <= r1; r += 2) tile_q4<2, 1>(x, qv, xs, out, k, n, r, p);
      if (r < r1) tile_q4<1, 1>(x, qv, xs, out, k, n, r, p);
    }
  }
}

template <DType WT>
void panels_dense(const float* x, const void* packed, float* out, int64_t m, int64_t k, int64_t n, int64_t p0,
                  int64_t p1) {
  if (m <= 2) {  // GEMV-sized: two panels a tile, enough chains in flight for DRAM
    int64_t p = p0;
    for (; p + 2 <= p1; p += 2) {
      if (m == 2) {
        tile<WT, 2, 2>(x, packed, out, k, n, 0, p);
      } else {
        tile<WT, 1, 2>(x, packed, out, k, n, 0, p);
      }
    }
    if (p < p1) rows<WT, 1>(x, packed, out, k, n, 0, m, p);
    return;
  }
  const int64_t mb = row_block(k);
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    for (int64_t p = p0; p < p1; ++p) rows<WT, 1>(x, packed, out, k, n, r0, r1, p);
  }
}

template <DType WT>
void panels(const float* x, const void* packed, float* out, int64_t m, int64_t k, int64_t n, int64_t p0,
            int64_t p1) {
  if constexpr (WT == DType::kI8) {
    panels_q8(x, packed, out, m, k, n, p0, p1);
  } else if constexpr (WT == DType::kI4) {
    panels_q4(x, packed, out, m, k, n, p0, p1);
  } else {
    panels_dense<WT>(x, packed, out, m, k, n, p0, p1);
  }
}

// --- int8 activations for int4 weights (gemm.h) ---
// The 32 bytes at `w` (4 k steps of a panel) -> per column dwords of q at k .. k + 3, in
// two ymm whose lanes hold columns [0-3 | 8-11] (lo) and [4-7 | 12-15] (hi): the nibbles
// interleaved by byte (one k pair per 16-bit word), the two pairs' 128-bit lanes swapped
// into place, then interleaved by word.
inline void unpack4(const uint8_t* w, __m256i& lo, __m256i& hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i low = _mm256_set1_epi8(15);
  const __m256i even = _mm256_and_si256(v, low), odd = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
  const __m256i c0_7 = _mm256_unpacklo_epi8(even, odd), c8_15 = _mm256_unpackhi_epi8(even, odd);
  const __m256i pair0 = _mm256_permute2x128_si256(c0_7, c8_15, 0x20);  // k, k + 1: columns 0-7 | 8-15
  const __m256i pair1 = _mm256_permute2x128_si256(c0_7, c8_15, 0x31);  // k + 2, k + 3
  lo = _mm256_unpacklo_epi16(pair0, pair1);
  hi = _mm256_unpackhi_epi16(pair0, pair1);
}

// 16 floats of a panel's group (scales or mins) in unpack4's column order.
inline void load_permuted(const float* s, __m256& lo, __m256& hi) {
  lo = _mm256_set_m128(_mm_loadu_ps(s + 8), _mm_loadu_ps(s));
  hi = _mm256_set_m128(_mm_loadu_ps(s + 12), _mm_loadu_ps(s + 4));
}

// R rows x 1 panel over all of k: per block of 32 inputs an exact int32 sum per output
// (vpmaddubsw pairs, |q xq + q' xq'| <= 3810, no saturation; vpmaddwd adds the pairs),
// then the f32 steps of gemm.h, the same operations as the AVX-512 kernel.
template <int R>
inline void tile_q4a8(const ActView& a, const QuantView& qv, float* out, int64_t k, int64_t n, int64_t r0, int64_t p) {
  const int64_t blocks = k / kActBlock, per_group = qv.group_size / kActBlock;
  const auto* values = reinterpret_cast<const uint8_t*>(qv.values) + p * kPanel * k / 2;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < qv.groups; ++g) {
    __m256 part[R][2];
    for (int i = 0; i < R; ++i) part[i][0] = part[i][1] = _mm256_setzero_ps();
    for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
      __m256i t[R][2];
      for (int i = 0; i < R; ++i) t[i][0] = t[i][1] = _mm256_set1_epi32(-a.t8[(r0 + i) * blocks + b]);
      for (int64_t c = b * kActBlock; c < (b + 1) * kActBlock; c += 4) {
        __m256i lo, hi;
        unpack4(values + c / 2 * kPanel, lo, hi);
        for (int i = 0; i < R; ++i) {
          int32_t xv;
          std::memcpy(&xv, a.xq + (r0 + i) * k + c, 4);
          const __m256i x4 = _mm256_set1_epi32(xv);
          t[i][0] = _mm256_add_epi32(t[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x4), ones));
          t[i][1] = _mm256_add_epi32(t[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x4), ones));
        }
      }
      for (int i = 0; i < R; ++i) {
        const __m256 d = _mm256_set1_ps(a.d[(r0 + i) * blocks + b]);
        for (int h = 0; h < 2; ++h) part[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t[i][h]), d, part[i][h]);
      }
    }
    const int64_t at = (p * qv.groups + g) * kPanel;
    __m256 sv[2], mv[2];
    load_permuted(qv.scales + at, sv[0], sv[1]);
    load_permuted(qv.mins + at, mv[0], mv[1]);
    for (int i = 0; i < R; ++i) {
      const __m256 xs = _mm256_set1_ps(a.xs[(r0 + i) * qv.groups + g]);
      for (int h = 0; h < 2; ++h) {
        acc[i][h] = _mm256_fmadd_ps(part[i][h], sv[h], acc[i][h]);
        acc[i][h] = _mm256_fmadd_ps(xs, mv[h], acc[i][h]);
      }
    }
  }
  const int64_t j0 = p * kPanel;
  const int64_t cols = n - j0 < kPanel ? n - j0 : kPanel;
  for (int i = 0; i < R; ++i) {
    float tmp[kPanel];
    _mm_storeu_ps(tmp, _mm256_castps256_ps128(acc[i][0]));
    _mm_storeu_ps(tmp + 8, _mm256_extractf128_ps(acc[i][0], 1));
    _mm_storeu_ps(tmp + 4, _mm256_castps256_ps128(acc[i][1]));
    _mm_storeu_ps(tmp + 12, _mm256_extractf128_ps(acc[i][1], 1));
    std::memcpy(out + (r0 + i) * n + j0, tmp, static_cast<size_t>(cols) * sizeof(float));
  }
}

}  // namespace

// int8 activations for int4 weights: a panel at a time, every 2-row tile of a row block
// (row_block) reading it from L1 / L2.
void gemm_panels_q4a8_avx2(const ActView& a, const void* packed, float* out, int64_t m, int64_t k, int64_t n,
                           int64_t p0, int64_t p1) {
  const QuantView qv = quant_view(packed);
  const int64_t mb = row_block(k);
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    for (int64_t p = p0; p < p1; ++p) {
      int64_t r = r0;
      for (; r + 2 <= r1; r += 2) tile_q4a8<2>(a, qv, out, k, n, r, p);
      if (r < r1) tile_q4a8<1>(a, qv, out, k, n, r, p);
    }
  }
}

void gemm_panels_avx2(const float* x, const void* packed, DType wt, float* out, int64_t m, int64_t k,
                      int64_t n, int64_t p0, int64_t p1) {
  dispatch_weight_dtype(wt, [&](auto d) { panels<decltype(d)::value>(x, packed, out, m, k, n, p0, p1); });
}

}  // namespace linnet::cpu::detail
