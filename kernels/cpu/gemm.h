// GEMM / GEMV of the decoder's projections: out[m, n] = x[m, k] * w[n, k]^T, with the
// weight given in nn.Linear [out, in] layout and stored as f32, bf16 or f16 (as the
// checkpoint holds it); x, out and every accumulation are f32.
//
// Layout: the CPU backend repacks each weight matrix once, at load, into panels of
// kPanel = 16 output columns: panel p holds columns [16p, 16p + 16) as k rows of 16
// consecutive elements (element (j, c) of w at panel j / 16, offset c * 16 + j % 16; the
// last panel zero-padded). A panel is one contiguous run, so a GEMV streams the weights
// front to back, and the micro-kernel needs no horizontal sums. No weight is packed per
// call.
//
// Micro-kernels (gemm_avx512.cpp, gemm_avx2.cpp; gemm_generic.cpp is the portable
// twin): R rows x P panels of accumulators (AVX-512: 12 x 2 zmm; AVX2: 6 x 1 panel in
// two ymm); per k they load each panel's 16 weights once (bf16: zero-extend + shift;
// f16: vcvtph2ps) and broadcast x[r, k] of each row. GEMV-sized steps (m <= 2) take 4
// (AVX-512) or 2 (AVX2) panels a tile so enough multiply-add chains are in flight to
// keep up with DRAM. Rows are taken in blocks whose slice of x stays in L2;
// panels are split over the rank's threads (OpenMP), each thread owning whole panels.
// On AVX-512, steps of more than 2 rows read x packed by 12-row tile (pack_x_by_tile,
// once a call, before the threads split: each tile's broadcasts are one contiguous
// stream through one pointer, where 12 row pointers spilled registers) and block over k
// (at most 640 a block): for each panel pair, block by block in ascending k, every
// 12-row tile runs over the pair's block while it sits in L2, and the next block is
// prefetched into L2; a tile starts its accumulators from the partial sums the previous
// block stored in out. A step of many rows is also split into row chunks (each row
// block's x read once per chunk row, not once per panel chunk: gemm.cpp).
//
// Fixed reduction order: out[r, j] = (...((x[r,0] w[j,0]) + x[r,1] w[j,1]) + ...) +
// x[r,k-1] w[j,k-1], one f32 chain in ascending k (fused multiply-adds on the AVX2 and
// AVX-512 paths, multiply then add on the generic one: it is built without FMA),
// whatever the tile, the row block, the k block (a partial sum stored in out and loaded
// back is the same f32 value), the panel grouping or the thread. So a row computed alone equals the same row among 31
// others bit for bit, and the thread count changes no bit. The two paths may differ
// from each other in the last bits (fused vs not); each is deterministic.
//
// int8 weights (DType::kI8, --weight-dtype int8): quantized at load, group-wise along k,
// symmetric absmax (llama.cpp's Q8_0 and compressed-tensors' int8 "group" strategy):
// for output column j and group g (k in [g G, g G + G)), s = max |w| / 127 in f32 and
// q = round-half-even(w / s) in [-127, 127] (q = 0 where s = 0; a group holding a NaN or
// inf weight gets s = NaN, so the outputs it feeds are NaN as in f32). The packed form is a
// QuantHeader, the q in the panel layout above (one byte each), then the f32 scales,
// scale (j, g) at scales[((j / 16) * groups + g) * 16 + j % 16]. The reduction, fixed as
// above: per group, a chain part = x[r,gG] q[j,gG] + ... + x[r,gG+G-1] q[j,gG+G-1] from
// zero in ascending k, then out[r, j] = fma(part, s[j, g], out[r, j]) in ascending g
// (the generic path: multiply then add). The scale is applied once per group, not per
// weight, which saves a multiply per weight (GEMV-sized steps are compute-bound on one
// core otherwise); the result is the GEMM of the dequantized matrix q * s up to f32
// rounding. GEMV-sized steps widen q in registers; steps of more rows widen a k block of
// whole groups once into the per-thread buffer and reuse it for every row tile. Every
// invariance above holds the same way: one fixed sequence of f32 operations per output
// element, whatever the rows, tile, k block or thread, and the same on AVX2 and AVX-512.
//
// int4 weights (DType::kI4, --weight-dtype int4): asymmetric, w ~ s q + m with q in
// [0, 15] and an f32 scale s and offset per output column and group. Quantizing
// searches each group's (s, m) for the least squared error, as llama.cpp's k-quants
// do (quantize_pack_weight: 21 candidate scalings of max - min, each refit by least
// squares; plain round-to-nearest is the first candidate; a NaN or inf weight makes its
// group's scale and offset NaN). Values are packed two a
// byte, two k steps per 16 bytes: byte l of pair c / 2 of a panel holds column l's q at
// k = c (even) in its low nibble and at k = c + 1 in its high nibble, so one load gives
// two k steps. The offsets follow the scales, [panels][groups][16], stored as
// m' = m + 8 s so that w = (q - 8) s + m': centred, the two sums below cancel less in
// f32. The reduction: per group a chain part over x * (q - 8) as for int8, and the row's
// sum over the group's x, xs (one f32 chain in ascending k, computed once per call);
// then out = fma(part, s, out), out = fma(xs, m', out), in ascending g (generic:
// multiply then add).
//
// int8 activations for int4 weights (--activation-dtype int8; off by default, the
// computation above is the default): a separate, named mode, as llama.cpp runs its
// k-quants (Q8_K activations) and vLLM / TensorRT-LLM their W4A8 schemes. Each row of x
// is quantized in blocks of kActBlock = 32 along k, symmetric absmax: d = max |x| / 127
// and xq = round-half-even(x * (127 / max |x|)) in [-127, 127] (an all-zero block: d =
// 0, xq = 0, also for max |x| below 127 / FLT_MAX; a block holding a NaN or inf: d = NaN, so
// the outputs it feeds are NaN).
// Needs the weight group size to be a multiple of 32. Per block b of group g, the
// integer sum t = sum q xq - 8 sum xq = sum (q - 8) xq is exact (int32; |t| <= 32512),
// and the reduction is part = fma(float(t), d_b, part) from zero in ascending b, then
// out = fma(part, s, out), out = fma(xs, m', out) in ascending g, xs the group's sum of
// the unquantized x as above (generic: multiply then add). The integer sums are exact
// whatever computes them (AVX-512 VNNI's vpdpbusd, AVX2's vpmaddubsw + vpmaddwd, plain
// C++), so the AVX-512 and AVX2 paths give the same bits, and a row alone equals the
// same row in a batch. What it costs in accuracy: docs/cpu-kernels.md.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/dtype.h"
#include "common/error.h"

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/threads.h"

namespace linnet::cpu {

/// Calls `f(std::integral_constant<DType, D>{})` with D = `wt` (kF32, kBF16, kF16 or kI8): the
/// one place a weight matrix's run-time dtype (common/dtype.h) picks a kernel
/// instantiation; each ISA's panel kernel is a template over it.
/// @throws Error for kI32 (not a weight dtype).
template <class F>
decltype(auto) dispatch_weight_dtype(DType wt, F&& f) {
  switch (wt) {
    case DType::kF32: return f(std::integral_constant<DType, DType::kF32>{});
    case DType::kBF16: return f(std::integral_constant<DType, DType::kBF16>{});
    case DType::kF16: return f(std::integral_constant<DType, DType::kF16>{});
    case DType::kI8: return f(std::integral_constant<DType, DType::kI8>{});
    case DType::kI4: return f(std::integral_constant<DType, DType::kI4>{});
    case DType::kI32:
    case DType::kI64:
    case DType::kF8E4M3: break;
  }
  throw Error("i32 / i64 / fp8 (widened at load) is not a kernel weight dtype (f32, bf16, f16 or int8 / int4)", "dispatch_weight_dtype");
}

/// Output columns per packed panel.
inline constexpr int64_t kPanel = 16;

/// The first bytes of a packed quantized matrix (file comment): what the kernels need
/// to find the values and the scales. kQuantHeaderBytes long, so the values start
/// 64-byte aligned when the buffer is.
struct QuantHeader {
  int64_t group_size;  // G: k elements per scale (divides k)
  int64_t groups;      // k / G
  int64_t k;           // the input width
  int64_t panels;      // ceil(n / kPanel)
  int64_t bits;        // 8 (kI8) or 4 (kI4: with mins)
};
inline constexpr int64_t kQuantHeaderBytes = 64;


/// Elements of the packed form of an [n, k] matrix: n rounded up to kPanel, times k.
/// (static: see detail::row_block.)
static inline int64_t packed_elements(int64_t n, int64_t k) { return (n + kPanel - 1) / kPanel * kPanel * k; }

/// Repacks `w` [n, k] row-major (type `wt`: kF32, kBF16 or kF16) into `packed`
/// (packed_elements(n, k) elements of `wt`, the layout of the file comment; padding
/// columns are zero).
void pack_weight(const void* w, DType wt, int64_t n, int64_t k, void* packed);

/// Bytes of the packed form of an [n, k] matrix quantized to `wt` (kI8 or kI4) with
/// groups of `group_size` along k: header + values (padded to kPanel columns; int4 two
/// a byte) + f32 scales (+ f32 mins for int4).
int64_t quantized_matrix_bytes(int64_t n, int64_t k, int64_t group_size, DType wt = DType::kI8);

/// Quantizes `w` [n, k] row-major f32 to `wt` (kI8 or kI4; the file comment's schemes)
/// into `packed` (quantized_matrix_bytes(n, k, group_size, wt) bytes, 8-byte aligned;
/// padding columns are zero with zero scales).
/// @throws Error if group_size < 1 or does not divide k (naming both), or is odd for
/// int4.
void quantize_pack_weight(const float* w, int64_t n, int64_t k, int64_t group_size, void* packed,
                          DType wt = DType::kI8);

/// Packs a matrix that is quantized already (a pre-quantized checkpoint's values and
/// scales) into the form quantize_pack_weight makes, so the same kernels run it.
/// `codes` [n, k] row-major, one byte per value: kI8 the int8 q (two's complement; w =
/// q s), kI4 q in [0, 15] (w = (q - 8) s + m'); `scales` and, for kI4, `offsets` (the m')
/// [n, k / group_size] f32 row-major (offsets null for kI8). Any group size dividing k
/// (int4: even), up to k itself (one scale per output row).
/// @throws Error when group_size does not divide k (naming both), is odd for int4, or
/// `wt` is not kI8 / kI4, or kI4 has no offsets.
void pack_quantized_weight(const uint8_t* codes, const float* scales, const float* offsets, int64_t n, int64_t k,
                           int64_t group_size, void* packed, DType wt);

/// Inputs (along k) per activation scale in the int8-activation mode (file comment).
inline constexpr int64_t kActBlock = 32;

/// The activations int4 weights are multiplied with, process-wide (like the ISA path):
/// kF32 (the default) or kI8 (the int8-activation mode of the file comment). Set before
/// the first matmul and not changed while one runs.
/// @throws Error for any other dtype.
void set_int4_activation_dtype(DType dt);

/// What set_int4_activation_dtype set (kF32 until it is called).
DType int4_activation_dtype();

/// Which kernel of the int8-activation mode `isa`'s path runs: "avx512 vnni" (AVX-512
/// with VNNI and VBMI), "avx2" (AVX2, and AVX-512 without them; the same bits) or
/// "generic".
const char* int8_activation_kernel(Isa isa);

/// out[m, n] = x[m, k] * w[n, k]^T from a packed weight (pack_weight), in f32 with the
/// fixed reduction order of the file comment, on the active ISA path. x, packed and out
/// need no alignment; out must not overlap x or packed.
void matmul_nt_packed(const float* x, const void* packed, DType wt, float* out, int64_t m, int64_t k, int64_t n);

/// matmul_nt_packed on a chosen path (tests compare each path with a double reference).
/// @throws Error when this CPU cannot run `isa`.
void matmul_nt_packed_isa(Isa isa, const float* x, const void* packed, DType wt, float* out, int64_t m,
                          int64_t k, int64_t n);

/// out[m, n] = x[m, k] * w[n, k]^T with `w` row-major [n, k] (kF32, kBF16 or kF16):
/// packs a copy, then matmul_nt_packed (for tests and references; the backend packs
/// once at load).
void matmul_nt(const float* x, const void* w, DType wt, float* out, int64_t m, int64_t k, int64_t n);

/// matmul_nt with f32 weights.
inline void matmul_nt(const float* x, const float* w, float* out, int64_t m, int64_t k, int64_t n) {
  matmul_nt(x, w, DType::kF32, out, m, k, n);
}

/// out[i] = w[i] as f32 for i < n (bf16 / f16 widened exactly; not kI8).
void widen_to_f32(const void* w, DType wt, int64_t n, float* out);

/// Row `row` of a packed [n, k] matrix, widened to f32: out[c] = w[row, c], c < k
/// (kI8: the dequantized q * s).
void unpack_row(const void* packed, DType wt, int64_t k, int64_t row, float* out);

/// embedding_lookup (ops.h) over a packed table [vocab_local, hidden] stored as `wt`.
void embedding_lookup_packed(const void* table, DType wt, int64_t vocab_begin, int64_t vocab_local,
                             int64_t hidden, const int32_t* ids, int64_t n, float* out);

namespace detail {
// One thread's share: out[:, 16 p0 : 16 p1) (clipped to n) over every row, one path.
void gemm_panels_generic(const float* x, const void* packed, DType wt, float* out, int64_t m, int64_t k,
                         int64_t n, int64_t p0, int64_t p1);
void gemm_panels_avx2(const float* x, const void* packed, DType wt, float* out, int64_t m, int64_t k,
                      int64_t n, int64_t p0, int64_t p1);
// AVX-512: when avx512_packs_x(wt, m), x is not row-major but packed by
// pack_x_by_tile (the caller packs it once a call, before the threads split the panels).
void gemm_panels_avx512(const float* x, const void* packed, DType wt, float* out, int64_t m, int64_t k,
                        int64_t n, int64_t p0, int64_t p1);
// Rows of the AVX-512 tile, and whether its panels read x packed: f32 / bf16 / f16
// weights and more than 2 rows (the blocked path).
constexpr int64_t kAvx512TileRows = 12;
static inline bool avx512_packs_x(DType wt, int64_t m) {
  return m > 2 && (wt == DType::kF32 || wt == DType::kBF16 || wt == DType::kF16);
}
// x [m, k] row-major -> xp by tiles of kAvx512TileRows rows: tile t's k steps in order,
// each holding its rows' values side by side, x[12 t + i, c] at xp[(t k + c) 12 + i]
// (the last tile's missing rows are left as they are: never read). xp holds
// ceil(m / 12) * 12 * k floats. Tiles over the rank's threads for many rows.
void pack_x_by_tile(const float* x, int64_t m, int64_t k, float* xp);
// Rows of x per block, so a block's slice of x (rows * k floats) stays in L2. static:
// each ISA file gets its own copy (an inline one would be shared across them).
// A multiple of 12 (the AVX-512 tile; twice the AVX2 one), at least 12.
static inline int64_t row_block(int64_t k) {
  const int64_t rows = (int64_t{512} << 10) / (k * 4);
  return rows < 12 ? 12 : rows / 12 * 12;
}
// Element i of a weight array of type wt (not kI8), as f32.
float load_weight(const void* w, DType wt, int64_t i);
// out[r * groups + g] = x[r, gG] + x[r, gG + 1] + ... + x[r, gG + G - 1], one f32 chain
// in ascending k (int4's minimum term; the same bits on every path).
static inline void group_sums(const float* x, int64_t m, int64_t k, int64_t group, float* out) {
  const int64_t groups = k / group;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.0f;
      for (int64_t c = g * group; c < (g + 1) * group; ++c) s = s + x[r * k + c];
      out[r * groups + g] = s;
    }
  }
}
// The int8-activation mode's form of one row x[0, k) (file comment): xq[c] the int8
// values, d[b] the blocks' scales and t8[b] = 8 * the sum of block b's xq (the q - 8
// term), b < k / kActBlock. Plain C++ with one rounding each, so every path computes
// the same (static: see row_block).
static inline void quantize_activations(const float* x, int64_t k, int8_t* xq, float* d, int32_t* t8) {
  for (int64_t b = 0; b < k / kActBlock; ++b) {
    const float* v = x + b * kActBlock;
    int8_t* q = xq + b * kActBlock;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kActBlock; ++i) {
      const float a = v[i] < 0.0f ? -v[i] : v[i];
      finite = finite && a <= 3.4028234663852886e38f;  // false for NaN and inf
      amax = a > amax ? a : amax;
    }
    int32_t sum = 0;
    // max |x| = 0, or below 127 / FLT_MAX (about 3.7e-37), overflows 127 / max |x|: the
    // block counts as zero (the products of so small a block are below f32's range).
    const float inv = 127.0f / amax;
    if (!finite || !(inv <= 3.4028234663852886e38f)) {
      for (int64_t i = 0; i < kActBlock; ++i) q[i] = 0;
      d[b] = finite ? 0.0f : __builtin_nanf("");
    } else {
      // Round half to even: adding and taking away 1.5 * 2^23 leaves an f32 whose unit
      // in the last place is 1, so the addition rounds (|v * inv| <= 127.5 here). Plain
      // arithmetic, so the compiler vectorizes it (nearbyintf is a call without SSE4.1).
      for (int64_t i = 0; i < kActBlock; ++i) {
        float t = (v[i] * inv + 12582912.0f) - 12582912.0f;
        t = t > 127.0f ? 127.0f : (t < -127.0f ? -127.0f : t);
        q[i] = static_cast<int8_t>(t);
      }
      for (int64_t i = 0; i < kActBlock; ++i) sum += q[i];
      d[b] = amax / 127.0f;
    }
    t8[b] = 8 * sum;
  }
}
// One thread's share of the int8-activation mode for int4 weights (file comment), on
// each path; xq / d / t8 from quantize_activations, xs from group_sums, for all m rows.
// The VNNI one needs AVX512BW + VNNI + VBMI (gemm_avx512_vnni.cpp: has_avx512_vnni).
struct ActView {
  const int8_t* xq;
  const float* d;
  const int32_t* t8;
  const float* xs;
};
void gemm_panels_q4a8_generic(const ActView& a, const void* packed, float* out, int64_t m, int64_t k, int64_t n,
                              int64_t p0, int64_t p1);
void gemm_panels_q4a8_avx2(const ActView& a, const void* packed, float* out, int64_t m, int64_t k, int64_t n,
                           int64_t p0, int64_t p1);
void gemm_panels_q4a8_avx512_vnni(const ActView& a, const void* packed, float* out, int64_t m, int64_t k, int64_t n,
                                  int64_t p0, int64_t p1);
bool has_avx512_vnni();
// A packed quantized matrix's parts (see QuantHeader).
struct QuantView {
  const int8_t* values;  // panel layout: int8 one a byte; int4 two k steps per 16 bytes
  const float* scales;   // [panels][groups][kPanel]
  const float* mins;     // int4: [panels][groups][kPanel]; int8: null
  int64_t group_size, groups;
};
static inline QuantView quant_view(const void* packed) {  // static: see row_block
  const auto* h = static_cast<const QuantHeader*>(packed);
  const auto* values = static_cast<const int8_t*>(packed) + kQuantHeaderBytes;
  const int64_t value_bytes = (h->panels * kPanel * h->k * h->bits / 8 + 63) / 64 * 64;
  const auto* scales = reinterpret_cast<const float*>(values + value_bytes);
  return {values, scales, h->bits == 4 ? scales + h->panels * h->groups * kPanel : nullptr, h->group_size, h->groups};
}
}  // namespace detail

}  // namespace linnet::cpu
