// The int8-activation mode for int4 weights (gemm.h) on AVX-512 with VNNI and VBMI. This
// file alone is built with -mavx512f -mavx512bw -mavx512vnni -mavx512vbmi; it runs only
// where has_avx512_vnni() finds them (elsewhere the AVX-512 path runs the AVX2 kernel of
// this mode, which gives the same bits).
//
// One 64-byte load of a panel holds 8 k steps of its 16 columns (gemm.h: byte l of k
// pair c / 2 holds column l's q at k = c, low nibble, and c + 1, high nibble). Masking
// and shifting give the even and odd steps' q; two vpermt2b (VBMI) gather each
// column's 4 consecutive q into one dword, so dword l of the result is column l's q at
// k = c .. c + 3 and vpdpbusd (VNNI) multiplies them with the row's 4 int8 activations
// (one broadcast dword) and adds the 4 products to column l's int32 sum: 64 products an
// instruction, no widening, no horizontal sums.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm.h"

namespace linnet::cpu::detail {

bool has_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
#else
  return false;
#endif
}

namespace {

// vpermt2b indices over (low nibbles, high nibbles): byte l of k pair i is byte 16 i + l
// of either; dword l of the first result takes column l at k pairs 0 and 1, of the
// second at pairs 2 and 3.
struct Gather {
  alignas(64) uint8_t first[64];
  alignas(64) uint8_t second[64];
  constexpr Gather() : first(), second() {
    for (int l = 0; l < 16; ++l) {
      const uint8_t col = static_cast<uint8_t>(l);
      first[4 * l] = col;             // k = c: low nibble of pair 0
      first[4 * l + 1] = col + 64;    // k = c + 1: high nibble of pair 0
      first[4 * l + 2] = col + 16;    // k = c + 2: pair 1
      first[4 * l + 3] = col + 80;    // k = c + 3
      second[4 * l] = col + 32;       // k = c + 4: pair 2
      second[4 * l + 1] = col + 96;
      second[4 * l + 2] = col + 48;   // k = c + 6: pair 3
      second[4 * l + 3] = col + 112;
    }
  }
};
constexpr Gather kGather;

// The 64 bytes at `w` (8 k steps of a panel) -> per column dwords of q at k .. k + 3 (a)
// and k + 4 .. k + 7 (b).
inline void unpack8(const uint8_t* w, __m512i& a, __m512i& b) {
  const __m512i v = _mm512_loadu_si512(w);
  const __m512i low = _mm512_set1_epi8(15);
  const __m512i even = _mm512_and_si512(v, low);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
  a = _mm512_permutex2var_epi8(even, _mm512_load_si512(kGather.first), odd);
  b = _mm512_permutex2var_epi8(even, _mm512_load_si512(kGather.second), odd);
}

inline __m512i broadcast4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm512_set1_epi32(v);
}

// R rows x P panels over all of k: per block of 32 inputs an int32 sum per output from
// -8 sum xq, then the f32 steps of gemm.h.
template <int R, int P>
inline void tile(const ActView& a, const QuantView& qv, float* out, int64_t k, int64_t n, int64_t r0, int64_t p) {
  const int64_t blocks = k / kActBlock, per_group = qv.group_size / kActBlock;
  const auto* values = reinterpret_cast<const uint8_t*>(qv.values);
  __m512 acc[R][P];
  for (int i = 0; i < R; ++i)
    for (int q = 0; q < P; ++q) acc[i][q] = _mm512_setzero_ps();
  for (int64_t g = 0; g < qv.groups; ++g) {
    __m512 part[R][P];
    for (int i = 0; i < R; ++i)
      for (int q = 0; q < P; ++q) part[i][q] = _mm512_setzero_ps();
    for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
      __m512i t[R][P];
      for (int i = 0; i < R; ++i) {
        const __m512i t8 = _mm512_set1_epi32(-a.t8[(r0 + i) * blocks + b]);
        for (int q = 0; q < P; ++q) t[i][q] = t8;
      }
      for (int64_t c = b * kActBlock; c < (b + 1) * kActBlock; c += 8) {
        __m512i wa[P], wb[P];
        for (int q = 0; q < P; ++q) unpack8(values + (p + q) * kPanel * k / 2 + c / 2 * kPanel, wa[q], wb[q]);
        for (int i = 0; i < R; ++i) {
          const int8_t* xr = a.xq + (r0 + i) * k + c;
          const __m512i xa = broadcast4(xr), xb = broadcast4(xr + 4);
          for (int q = 0; q < P; ++q) {
            t[i][q] = _mm512_dpbusd_epi32(t[i][q], wa[q], xa);
            t[i][q] = _mm512_dpbusd_epi32(t[i][q], wb[q], xb);
          }
        }
      }
      for (int i = 0; i < R; ++i) {
        const __m512 d = _mm512_set1_ps(a.d[(r0 + i) * blocks + b]);
        for (int q = 0; q < P; ++q) part[i][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[i][q]), d, part[i][q]);
      }
    }
    for (int q = 0; q < P; ++q) {
      const int64_t at = ((p + q) * qv.groups + g) * kPanel;
      const __m512 sv = _mm512_loadu_ps(qv.scales + at), mv = _mm512_loadu_ps(qv.mins + at);
      for (int i = 0; i < R; ++i) {
        acc[i][q] = _mm512_fmadd_ps(part[i][q], sv, acc[i][q]);
        acc[i][q] = _mm512_fmadd_ps(_mm512_set1_ps(a.xs[(r0 + i) * qv.groups + g]), mv, acc[i][q]);
      }
    }
  }
  for (int q = 0; q < P; ++q) {
    const int64_t j0 = (p + q) * kPanel;
    const int64_t cols = n - j0 < kPanel ? n - j0 : kPanel;
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
    for (int i = 0; i < R; ++i) _mm512_mask_storeu_ps(out + (r0 + i) * n + j0, mask, acc[i][q]);
  }
}

}  // namespace

// GEMV-sized steps (m <= 2): 4 panels (m = 1) or 2 a tile, streamed front to back.
// More rows: a panel at a time, read from L1 / L2 by every 4-row tile of a row block
// (row_block: whole tiles, its xq a quarter of what the f32 x would be in L2; a panel of
// the widest matrices, k = 14336, is 112 KiB).
void gemm_panels_q4a8_avx512_vnni(const ActView& a, const void* packed, float* out, int64_t m, int64_t k, int64_t n,
                                  int64_t p0, int64_t p1) {
  const QuantView qv = quant_view(packed);
  int64_t p = p0;
  if (m == 1) {
    for (; p + 4 <= p1; p += 4) tile<1, 4>(a, qv, out, k, n, 0, p);
    for (; p < p1; ++p) tile<1, 1>(a, qv, out, k, n, 0, p);
    return;
  }
  if (m == 2) {
    for (; p + 2 <= p1; p += 2) tile<2, 2>(a, qv, out, k, n, 0, p);
    for (; p < p1; ++p) tile<2, 1>(a, qv, out, k, n, 0, p);
    return;
  }
  const int64_t mb = row_block(k);
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    for (p = p0; p < p1; ++p) {
      int64_t r = r0;
      for (; r + 4 <= r1; r += 4) tile<4, 1>(a, qv, out, k, n, r, p);
      for (; r + 2 <= r1; r += 2) tile<2, 1>(a, qv, out, k, n, r, p);
      if (r < r1) tile<1, 1>(a, qv, out, k, n, r, p);
    }
  }
}

}  // namespace linnet::cpu::detail
