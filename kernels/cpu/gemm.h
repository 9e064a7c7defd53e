// GEMM / GEMV of the decoder's projections: out[m, n] = x[m, k] * w[n, k]^T, with the
// weight in nn.Linear [out, in] layout and stored as f32, bf16 or f16 (as the checkpoint
// holds it); x, out and every accumulation are f32.
//
// Design (kernels/cpu/gemm.cpp, gemm_avx2.cpp, gemm_generic.cpp): no packing of the
// weight per call. A micro-kernel computes a tile of up to 4 rows x 3 columns as 12
// dot products over k, reading each weight row once for the 4 rows of x beside it, and
// converting bf16 / f16 weights to f32 in registers. Rows are taken in blocks whose
// slice of x stays in L2 (so each weight row is streamed once per block: once per step
// for decode batches and prefill chunks up to the block), columns are split over the
// rank's threads (OpenMP), each thread owning whole output columns.
//
// Fixed reduction order: every output element is one dot product computed the same way
// wherever it lies (any m, any tile position, any thread count): eight f32 lane sums
// over k (lane l holds the products k = l (mod 8) in ascending k, fused multiply-adds on
// the AVX2 path), combined as ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), then the k % 8 tail
// products added in ascending k. So a row computed alone equals the same row among 31
// others bit for bit, and the result does not depend on the thread count. The generic
// path uses the same order with separate multiply and add (its results may differ from
// AVX2's in the last bits; each path is deterministic on its own).
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace linnet::cpu {

/// Storage type of a weight matrix.
enum class WeightType { kF32, kBF16, kF16 };

/// Bytes per element of `t`.
int weight_type_size(WeightType t);

/// Sets the rank's kernel thread count (OpenMP; also OpenBLAS's, which the remaining
/// BLAS calls use). n < 1 means 1.
void set_num_threads(int n);
/// The rank's kernel thread count.
int num_threads();

/// out[m, n] = x[m, k] * w[n, k]^T (nn.Linear with weight [out, in], no bias), in f32
/// with the fixed reduction order of the file comment, on the active ISA path.
/// w: n * k elements of type `wt` (bf16: the upper 16 bits of an f32; f16: IEEE half).
/// x, w, out need no alignment; out must not overlap x or w.
void matmul_nt(const float* x, const void* w, WeightType wt, float* out, int64_t m, int64_t k, int64_t n);

/// matmul_nt with f32 weights.
inline void matmul_nt(const float* x, const float* w, float* out, int64_t m, int64_t k, int64_t n) {
  matmul_nt(x, w, WeightType::kF32, out, m, k, n);
}

/// matmul_nt on a chosen path (tests compare each path with a double reference).
/// @throws Error when this CPU cannot run `isa`.
void matmul_nt_isa(Isa isa, const float* x, const void* w, WeightType wt, float* out, int64_t m, int64_t k,
                   int64_t n);

/// out[i] = w[i] as f32 for i < n (bf16 / f16 widened exactly).
void widen_to_f32(const void* w, WeightType wt, int64_t n, float* out);

/// embedding_lookup (ops.h) over a table stored as `wt`: rows widened to f32.
void embedding_lookup_typed(const void* table, WeightType wt, int64_t vocab_begin, int64_t vocab_local,
                            int64_t hidden, const int32_t* ids, int64_t n, float* out);

namespace detail {
// One thread's share: out[:, j_begin:j_end] over every row, on one path.
void gemm_columns_generic(const float* x, const void* w, WeightType wt, float* out, int64_t m, int64_t k, int64_t n,
                          int64_t j_begin, int64_t j_end);
void gemm_columns_avx2(const float* x, const void* w, WeightType wt, float* out, int64_t m, int64_t k, int64_t n,
                       int64_t j_begin, int64_t j_end);
// Rows of x per block, so a block's slice of x (rows * k floats) stays in L2.
inline int64_t row_block(int64_t k) {
  const int64_t rows = (int64_t{192} << 10) / (k * 4);
  return rows < 4 ? 4 : rows / 4 * 4;
}
}  // namespace detail

}  // namespace linnet::cpu
