// The AVX-512F GEMM path over packed panels (gemm.h). This file alone is built with
// -mavx512f; it runs only when cpu_features finds AVX-512F. One zmm holds a panel's 16
// columns, so with 32 registers the micro-kernel takes R <= 12 rows x P = 2 panels (24
// accumulators: 2 weight loads and 12 broadcasts per 24 fused multiply-adds), and P = 4
// panels for GEMV-sized steps (m <= 2). Steps of more rows are blocked over k so a panel
// pair's block is reused from L1 by every row tile (panels_blocked). bf16 weights:
// zero-extend + shift; f16: vcvtph2ps. Each output element is the same single f32 fma
// chain in ascending k as on the AVX2 path, so both paths give the same bits (a fused
// multiply-add rounds once, whatever the vector width). AVX512_BF16's vdpbf16ps is not
// used: it would round the f32 activations to bf16 and pair the products, another
// numerics than transformers'. int8 / int4 weights (gemm.h): widened in registers for
// GEMV-sized steps (tile_q8, tile_q4: 4 panels), a k block of whole groups widened once
// for more rows (panels_blocked_q: 6 x 2 tiles, as each needs running and partial sums).
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/gemm.h"

namespace linnet::cpu::detail {
namespace {

template <DType WT>
inline __m512 load16(const void* w, int64_t i) {
  if constexpr (WT == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + i));
    if constexpr (WT == DType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

template <DType WT, int R, int P>
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

template <DType WT, int P>
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

// k per block of the blocked path, at most: a pair of panels' block (2 x 16 x kKc f32,
// at most 80 KiB; k = 576 is one block of 72 KiB) stays in L2 while every row tile of the
// row block runs over it. A tile reads 128 bytes of weights and 48 of packed x per 24
// fmas, well inside an L2's bandwidth, so fewer, longer blocks (fewer partial sums
// stored and reloaded) beat L1-sized ones: measured with `bench --gemm` on a Zen 4 VM
// (1 MiB L2), blocks of 576 vs 192 and row blocks of 256 vs 1024 KiB: 200-214 vs 187-200
// GFLOP/s at 512 x 576 x 1536 / 960 and the 49152-column head at 200 vs 180.
constexpr int64_t kKc = 640;
// Rows per row block: their slice of x (rows x k f32, 256 KiB) stays in L2 beside the
// weight blocks while the thread's panels stream past it once.
inline int64_t rows_per_block(int64_t k) {
  const int64_t rows = (int64_t{256} << 10) / (k * 4);
  return rows < 12 ? 12 : rows / 12 * 12;
}

// A per-thread scratch buffer, grown as needed and kept (no allocation per call). Only
// C allocation functions: no std:: template in an ISA file (see attention_impl.h).
struct Scratch {
  float* data = nullptr;
  int64_t cap = 0;
  ~Scratch() { std::free(data); }
  float* get(int64_t elems) {
    if (elems > cap) {
      std::free(data);
      data = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((elems * 4 + 63) / 64 * 64)));
      cap = elems;
    }
    return data;
  }
};
thread_local Scratch t_w;
constexpr int64_t kTileRows = kAvx512TileRows;

// The weight block the next k block (or panel pair) will read: a tile prefetches one
// 64-byte line of each of its (up to two) panel runs per k step, into L2, while it
// computes, so a block streamed from DRAM or L3 is in L2 before its first tile starts.
struct Prefetch {
  const char* a = nullptr;
  const char* b = nullptr;  // the second panel, or null
  int64_t bytes = 0;        // bytes of each run (0: nothing to prefetch)
};

// R rows x P panels over one k block of kc steps: xp is the tile's packed x at the
// block's first k (pack_x_by_tile: row i's value of step c at xp[c * 12 + i]), w the P
// panels' weights there (panel q at w + q * wstride,
// 16 per k). The accumulators start at zero (first block) or at the partial sums the
// previous block left in out (exact f32 values), so each element stays one chain in
// ascending k, the same bits as an unblocked pass.
template <DType WT, int R, int P>
inline void tile_block(const float* xp, const void* w, int64_t wstride, float* out, int64_t n, int64_t j0,
                       int64_t kc, bool first, const Prefetch& pf) {
  __m512 acc[R][P];
  __mmask16 mask[P];
  for (int q = 0; q < P; ++q) {
    const int64_t cols = n - (j0 + q * kPanel) < kPanel ? n - (j0 + q * kPanel) : kPanel;
    mask[q] = static_cast<__mmask16>((1u << cols) - 1u);
  }
  for (int i = 0; i < R; ++i)
    for (int q = 0; q < P; ++q)
      acc[i][q] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[q], out + i * n + j0 + q * kPanel);
  for (int64_t c = 0; c < kc; ++c) {
    __m512 wv[P];
    for (int q = 0; q < P; ++q) wv[q] = load16<WT>(w, q * wstride + c * kPanel);
    if (c * 64 < pf.bytes) {
      _mm_prefetch(pf.a + c * 64, _MM_HINT_T1);
      if (pf.b) _mm_prefetch(pf.b + c * 64, _MM_HINT_T1);
    }
    for (int i = 0; i < R; ++i) {
      const __m512 xv = _mm512_set1_ps(xp[c * kTileRows + i]);
      for (int q = 0; q < P; ++q) acc[i][q] = _mm512_fmadd_ps(xv, wv[q], acc[i][q]);
    }
  }
  for (int q = 0; q < P; ++q)
    for (int i = 0; i < R; ++i) _mm512_mask_storeu_ps(out + i * n + j0 + q * kPanel, mask[q], acc[i][q]);
}

template <DType WT, int P>
inline void tile_rows(int64_t R, const float* xp, const void* w, int64_t wstride, float* out, int64_t n, int64_t j0,
                      int64_t kc, bool first, const Prefetch& pf) {
  switch (R) {
    case 12: return tile_block<WT, 12, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 11: return tile_block<WT, 11, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 10: return tile_block<WT, 10, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 9: return tile_block<WT, 9, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 8: return tile_block<WT, 8, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 7: return tile_block<WT, 7, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 6: return tile_block<WT, 6, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 5: return tile_block<WT, 5, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 4: return tile_block<WT, 4, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 3: return tile_block<WT, 3, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 2: return tile_block<WT, 2, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    case 1: return tile_block<WT, 1, P>(xp, w, wstride, out, n, j0, kc, first, pf);
    default: return;
  }
}

// The blocked path (m > 2; x packed by tile, pack_x_by_tile): row blocks whose x stays
// in L2; in each, panel pairs in order; for each pair, k blocks of at most kKc in
// ascending order; for each k block, every 12-row tile of the row block over the pair's
// block, which stays in L2 (before blocking, each tile streamed the pair's whole k from
// L3 or DRAM: 256 KiB at k = 2048). The first
// tile of a block prefetches the next block into L2. bf16 / f16 weights of a block are
// widened to f32 once (exactly) into a per-thread buffer when the row block has more
// than one tile, so the tiles run the f32 kernel without the conversion's shuffles.
template <DType WT>
void panels_blocked(const float* x, const void* packed, float* out, int64_t m, int64_t k, int64_t n, int64_t p0,
                    int64_t p1) {
  using Raw = std::conditional_t<WT == DType::kF32, float, uint16_t>;
  const Raw* wp = static_cast<const Raw*>(packed);
  const int64_t mb = rows_per_block(k);
  float* wf = WT == DType::kF32 ? nullptr : t_w.get(2 * kPanel * kKc);  // widen: kb <= kKc
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    const bool widen = WT != DType::kF32 && r1 - r0 > 12;
    // k blocks of at most kKc, as even as k allows; one block when the row block is one
    // tile (nothing reuses a weight block then).
    const int64_t kb = r1 - r0 <= 12 ? k : (k + (k + kKc - 1) / kKc - 1) / ((k + kKc - 1) / kKc);
    for (int64_t p = p0; p < p1;) {
      const int64_t P = p + 2 <= p1 ? 2 : 1;
      const int64_t j0 = p * kPanel;
      for (int64_t c0 = 0; c0 < k; c0 += kb) {
        const int64_t kc = k - c0 < kb ? k - c0 : kb;
        const Raw* wb = wp + p * kPanel * k + c0 * kPanel;
        // What comes next: this pair's next k block, else the next pair's (or single's) first.
        Prefetch next;
        if (c0 + kb < k) {
          const int64_t kn = k - c0 - kb < kb ? k - c0 - kb : kb;
          next.a = reinterpret_cast<const char*>(wb + kb * kPanel);
          next.b = P == 2 ? next.a + kPanel * k * sizeof(Raw) : nullptr;
          next.bytes = kn * kPanel * static_cast<int64_t>(sizeof(Raw));
        } else if (p + P < p1) {
          const int64_t kn = k < kb ? k : kb;
          next.a = reinterpret_cast<const char*>(wp + (p + P) * kPanel * k);
          next.b = p + P + 1 < p1 ? next.a + kPanel * k * sizeof(Raw) : nullptr;
          next.bytes = kn * kPanel * static_cast<int64_t>(sizeof(Raw));
        }
        const Prefetch none;
        if (widen) {
          for (int64_t q = 0; q < P; ++q)
            for (int64_t c = 0; c < kc; c += 1)
              _mm512_storeu_ps(wf + q * kPanel * kc + c * kPanel, load16<WT>(wb, q * kPanel * k + c * kPanel));
        }
        for (int64_t t0 = r0; t0 < r1; t0 += 12) {
          const int64_t R = r1 - t0 < 12 ? r1 - t0 : 12;
          const float* xt = x + t0 * k + c0 * kTileRows;  // packed by tile (pack_x_by_tile)
          float* ot = out + t0 * n;
          const Prefetch& pf = t0 == r0 ? next : none;
          if (widen) {
            if (P == 2) {
              tile_rows<DType::kF32, 2>(R, xt, wf, kPanel * kc, ot, n, j0, kc, c0 == 0, pf);
            } else {
              tile_rows<DType::kF32, 1>(R, xt, wf, kPanel * kc, ot, n, j0, kc, c0 == 0, pf);
            }
          } else if (P == 2) {
            tile_rows<WT, 2>(R, xt, wb, kPanel * k, ot, n, j0, kc, c0 == 0, pf);
          } else {
            tile_rows<WT, 1>(R, xt, wb, kPanel * k, ot, n, j0, kc, c0 == 0, pf);
          }
        }
      }
      p += P;
    }
  }
}

// --- int8 weights (gemm.h): per group, a chain over x * q from zero, then one fma of
// that partial sum with the group's scales into the running sum ---

inline __m512 widen16(const int8_t* q) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
}

// R rows x P panels over all of k, widening q in registers (GEMV-sized steps).
template <int R, int P>
inline void tile_q8(const float* x, const QuantView& qv, float* out, int64_t k, int64_t n, int64_t r0, int64_t p) {
  __m512 acc[R][P];
  for (int i = 0; i < R; ++i)
    for (int q = 0; q < P; ++q) acc[i][q] = _mm512_setzero_ps();
  const float* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = x + (r0 + i) * k;
  const int8_t* wq[P];
  const float* sq[P];
  for (int q = 0; q < P; ++q) {
    wq[q] = qv.values + (p + q) * kPanel * k;
    sq[q] = qv.scales + (p + q) * qv.groups * kPanel;
  }
  for (int64_t g = 0; g < qv.groups; ++g) {
    __m512 part[R][P];
    for (int i = 0; i < R; ++i)
      for (int q = 0; q < P; ++q) part[i][q] = _mm512_setzero_ps();
    for (int64_t c = g * qv.group_size, c1 = c + qv.group_size; c < c1; ++c) {
      __m512 w[P];
      for (int q = 0; q < P; ++q) w[q] = widen16(wq[q] + c * kPanel);
      for (int i = 0; i < R; ++i) {
        const __m512 xv = _mm512_set1_ps(xr[i][c]);
        for (int q = 0; q < P; ++q) part[i][q] = _mm512_fmadd_ps(xv, w[q], part[i][q]);
      }
    }
    for (int q = 0; q < P; ++q) {
      const __m512 sv = _mm512_loadu_ps(sq[q] + g * kPanel);
      for (int i = 0; i < R; ++i) acc[i][q] = _mm512_fmadd_ps(part[i][q], sv, acc[i][q]);
    }
  }
  for (int q = 0; q < P; ++q) {
    const int64_t j0 = (p + q) * kPanel;
    const int64_t cols = n - j0 < kPanel ? n - j0 : kPanel;
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
    for (int i = 0; i < R; ++i) _mm512_mask_storeu_ps(out + (r0 + i) * n + j0, mask, acc[i][q]);
  }
}

// R rows x P panels over one k block of whole groups [c0, c0 + kc): wf holds the block's
// q widened to f32 (panel q at wf + q * kPanel * kc), sq / mq each panel's scales /
// mins (int4: Min, with xs the rows' group sums, `groups` apart); the running sums
// start at zero (c0 = 0) or at what the previous block stored in out.
template <int R, int P, bool Min>
inline void tile_block_q(const float* x, int64_t k, const float* wf, const float* const* sq, const float* const* mq,
                         const float* xs, int64_t groups, int64_t group, float* out, int64_t n, int64_t j0, int64_t c0,
                         int64_t kc) {
  __m512 acc[R][P];
  __mmask16 mask[P];
  for (int q = 0; q < P; ++q) {
    const int64_t cols = n - (j0 + q * kPanel) < kPanel ? n - (j0 + q * kPanel) : kPanel;
    mask[q] = static_cast<__mmask16>((1u << cols) - 1u);
  }
  for (int i = 0; i < R; ++i)
    for (int q = 0; q < P; ++q)
      acc[i][q] = c0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[q], out + i * n + j0 + q * kPanel);
  for (int64_t g0 = 0; g0 < kc; g0 += group) {
    __m512 part[R][P];
    for (int i = 0; i < R; ++i)
      for (int q = 0; q < P; ++q) part[i][q] = _mm512_setzero_ps();
    for (int64_t c = g0; c < g0 + group; ++c) {
      __m512 w[P];
      for (int q = 0; q < P; ++q) w[q] = _mm512_loadu_ps(wf + q * kPanel * kc + c * kPanel);
      for (int i = 0; i < R; ++i) {
        const __m512 xv = _mm512_set1_ps(x[i * k + c0 + c]);
        for (int q = 0; q < P; ++q) part[i][q] = _mm512_fmadd_ps(xv, w[q], part[i][q]);
      }
    }
    const int64_t g = (c0 + g0) / group;
    for (int q = 0; q < P; ++q) {
      const __m512 sv = _mm512_loadu_ps(sq[q] + g * kPanel);
      for (int i = 0; i < R; ++i) acc[i][q] = _mm512_fmadd_ps(part[i][q], sv, acc[i][q]);
      if constexpr (Min) {
        const __m512 mv = _mm512_loadu_ps(mq[q] + g * kPanel);
        for (int i = 0; i < R; ++i) acc[i][q] = _mm512_fmadd_ps(_mm512_set1_ps(xs[i * groups + g]), mv, acc[i][q]);
      }
    }
  }
  for (int q = 0; q < P; ++q)
    for (int i = 0; i < R; ++i) _mm512_mask_storeu_ps(out + i * n + j0 + q * kPanel, mask[q], acc[i][q]);
}

template <int P, bool Min>
inline void rows_block_q(int64_t R, const float* x, int64_t k, const float* wf, const float* const* sq,
                         const float* const* mq, const float* xs, int64_t groups, int64_t group, float* out, int64_t n,
                         int64_t j0, int64_t c0, int64_t kc) {
  switch (R) {
    case 6: return tile_block_q<6, P, Min>(x, k, wf, sq, mq, xs, groups, group, out, n, j0, c0, kc);
    case 5: return tile_block_q<5, P, Min>(x, k, wf, sq, mq, xs, groups, group, out, n, j0, c0, kc);
    case 4: return tile_block_q<4, P, Min>(x, k, wf, sq, mq, xs, groups, group, out, n, j0, c0, kc);
    case 3: return tile_block_q<3, P, Min>(x, k, wf, sq, mq, xs, groups, group, out, n, j0, c0, kc);
    case 2: return tile_block_q<2, P, Min>(x, k, wf, sq, mq, xs, groups, group, out, n, j0, c0, kc);
    case 1: return tile_block_q<1, P, Min>(x, k, wf, sq, mq, xs, groups, group, out, n, j0, c0, kc);
    default: return;
  }
}

// int4: the 16 bytes of a k pair -> q - 8 at the even step (low nibbles) and the odd one.
inline void widen_pair(const int8_t* b, __m512& even, __m512& odd) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m128i low = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
  even = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(v, low), eight)));
  odd = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), low), eight)));
}

// Steps of more rows: row blocks whose x stays in L2; per panel pair, k blocks of whole
// groups (about kKc inputs, at least one group), each widened once into the per-thread
// buffer and run by every 6-row tile (6 x 2 running sums and 6 x 2 partial sums fill
// the registers the f32 kernel's 12 x 2 tile uses). int4 (Int4): xs holds every row's
// group sums.
template <bool Int4>
void panels_blocked_q(const float* x, const QuantView& qv, float* out, int64_t m, int64_t k, int64_t n, int64_t p0,
                      int64_t p1, const float* xs) {
  const int64_t mb = rows_per_block(k);
  const int64_t G = qv.group_size;
  const int64_t kb = G >= kKc ? G : kKc / G * G;
  float* wf = t_w.get(2 * kPanel * kb);
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    for (int64_t p = p0; p < p1;) {
      const int64_t P = p + 2 <= p1 ? 2 : 1;
      const int64_t j0 = p * kPanel;
      const float* sq[2] = {qv.scales + p * qv.groups * kPanel, qv.scales + (p + 1) * qv.groups * kPanel};
      const float* mq[2] = {nullptr, nullptr};
      if (Int4) {
        mq[0] = qv.mins + p * qv.groups * kPanel;
        mq[1] = qv.mins + (p + 1) * qv.groups * kPanel;
      }
      for (int64_t c0 = 0; c0 < k; c0 += kb) {
        const int64_t kc = k - c0 < kb ? k - c0 : kb;
        for (int64_t q = 0; q < P; ++q) {
          float* dst = wf + q * kPanel * kc;
          if (Int4) {
            const int8_t* wq = qv.values + (p + q) * kPanel * k / 2 + c0 / 2 * kPanel;
            for (int64_t c = 0; c < kc; c += 2) {
              __m512 even, odd;
              widen_pair(wq + c / 2 * kPanel, even, odd);
              _mm512_storeu_ps(dst + c * kPanel, even);
              _mm512_storeu_ps(dst + (c + 1) * kPanel, odd);
            }
          } else {
            const int8_t* wq = qv.values + (p + q) * kPanel * k + c0 * kPanel;
            for (int64_t c = 0; c < kc; ++c) _mm512_storeu_ps(dst + c * kPanel, widen16(wq + c * kPanel));
          }
        }
        for (int64_t t0 = r0; t0 < r1; t0 += 6) {
          const int64_t R = r1 - t0 < 6 ? r1 - t0 : 6;
          const float* xst = Int4 ? xs + t0 * qv.groups : nullptr;
          if (P == 2) {
            rows_block_q<2, Int4>(R, x + t0 * k, k, wf, sq, mq, xst, qv.groups, G, out + t0 * n, n, j0, c0, kc);
          } else {
            rows_block_q<1, Int4>(R, x + t0 * k, k, wf, sq, mq, xst, qv.groups, G, out + t0 * n, n, j0, c0, kc);
          }
        }
      }
      p += P;
    }
  }
}

// int4 GEMV-sized steps: R rows x P panels over all of k, two k steps per load.
template <int R, int P>
inline void tile_q4(const float* x, const QuantView& qv, const float* xs, float* out, int64_t k, int64_t n, int64_t r0,
                    int64_t p) {
  __m512 acc[R][P];
  for (int i = 0; i < R; ++i)
    for (int q = 0; q < P; ++q) acc[i][q] = _mm512_setzero_ps();
  const float* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = x + (r0 + i) * k;
  const int8_t* wq[P];
  const float* sq[P];
  const float* mq[P];
  for (int q = 0; q < P; ++q) {
    wq[q] = qv.values + (p + q) * kPanel * k / 2;
    sq[q] = qv.scales + (p + q) * qv.groups * kPanel;
    mq[q] = qv.mins + (p + q) * qv.groups * kPanel;
  }
  for (int64_t g = 0; g < qv.groups; ++g) {
    __m512 part[R][P];
    for (int i = 0; i < R; ++i)
      for (int q = 0; q < P; ++q) part[i][q] = _mm512_setzero_ps();
    for (int64_t c = g * qv.group_size, c1 = c + qv.group_size; c < c1; c += 2) {
      __m512 even[P], odd[P];
      for (int q = 0; q < P; ++q) widen_pair(wq[q] + c / 2 * kPanel, even[q], odd[q]);
      for (int i = 0; i < R; ++i) {
        const __m512 xv = _mm512_set1_ps(xr[i][c]);
        for (int q = 0; q < P; ++q) part[i][q] = _mm512_fmadd_ps(xv, even[q], part[i][q]);
      }
      for (int i = 0; i < R; ++i) {
        const __m512 xv = _mm512_set1_ps(xr[i][c + 1]);
        for (int q = 0; q < P; ++q) part[i][q] = _mm512_fmadd_ps(xv, odd[q], part[i][q]);
      }
    }
    for (int q = 0; q < P; ++q) {
      const __m512 sv = _mm512_loadu_ps(sq[q] + g * kPanel), mv = _mm512_loadu_ps(mq[q] + g * kPanel);
      for (int i = 0; i < R; ++i) {
        acc[i][q] = _mm512_fmadd_ps(part[i][q], sv, acc[i][q]);
        acc[i][q] = _mm512_fmadd_ps(_mm512_set1_ps(xs[(r0 + i) * qv.groups + g]), mv, acc[i][q]);
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

thread_local Scratch t_xs;  // int4: the rows' group sums of the current call

void panels_q4(const float* x, const void* packed, float* out, int64_t m, int64_t k, int64_t n, int64_t p0,
               int64_t p1) {
  const QuantView qv = quant_view(packed);
  float* xs = t_xs.get(m * qv.groups);
  group_sums(x, m, k, qv.group_size, xs);
  if (m > 2) return panels_blocked_q<true>(x, qv, out, m, k, n, p0, p1, xs);
  int64_t p = p0;
  for (; p + 4 <= p1; p += 4) {
    if (m == 2) {
      tile_q4<2, 4>(x, qv, xs, out, k, n, 0, p);
    } else {
      tile_q4<1, 4>(x, qv, xs, out, k, n, 0, p);
    }
  }
  for (; p < p1; ++p) {
    if (m == 2) {
      tile_q4<2, 1>(x, qv, xs, out, k, n, 0, p);
    } else {
      tile_q4<1, 1>(x, qv, xs, out, k, n, 0, p);
    }
  }
}

void panels_q8(const float* x, const void* packed, float* out, int64_t m, int64_t k, int64_t n, int64_t p0,
               int64_t p1) {
  const QuantView qv = quant_view(packed);
  if (m > 2) return panels_blocked_q<false>(x, qv, out, m, k, n, p0, p1, nullptr);
  int64_t p = p0;
  for (; p + 4 <= p1; p += 4) {
    if (m == 2) {
      tile_q8<2, 4>(x, qv, out, k, n, 0, p);
    } else {
      tile_q8<1, 4>(x, qv, out, k, n, 0, p);
    }
  }
  for (; p < p1; ++p) {
    if (m == 2) {
      tile_q8<2, 1>(x, qv, out, k, n, 0, p);
    } else {
      tile_q8<1, 1>(x, qv, out, k, n, 0, p);
    }
  }
}

template <DType WT>
void panels_dense(const float* x, const void* packed, float* out, int64_t m, int64_t k, int64_t n, int64_t p0,
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
  panels_blocked<WT>(x, packed, out, m, k, n, p0, p1);
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

}  // namespace

void gemm_panels_avx512(const float* x, const void* packed, DType wt, float* out, int64_t m, int64_t k,
                        int64_t n, int64_t p0, int64_t p1) {
  dispatch_weight_dtype(wt, [&](auto d) { panels<decltype(d)::value>(x, packed, out, m, k, n, p0, p1); });
}

}  // namespace linnet::cpu::detail
