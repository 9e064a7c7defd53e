// Sampling pieces over a rank's logits slice: argmax (greedy), top-k candidates (k
// rounds of a block argmax, each striking out its winner in a scratch copy: O(k * V),
// meant for the small k of sampling), and the top-p mask over sorted candidates.
#include <cfloat>

#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace linnet::cuda {
namespace {

constexpr int kThreads = 256;

__device__ ArgMax row_argmax(const float* row, int64_t n_valid) {
  ArgMax best{-FLT_MAX, INT32_MAX};
  for (int64_t i = threadIdx.x; i < n_valid; i += blockDim.x) best = better(best, ArgMax{row[i], static_cast<int32_t>(i)});
  return block_argmax(best);
}

__global__ void argmax_kernel(const float* logits, int64_t ld, int64_t n_valid, float* out_value, int32_t* out_index) {
  const ArgMax a = row_argmax(logits + blockIdx.x * ld, n_valid);
  if (threadIdx.x == 0) {
    out_value[blockIdx.x] = a.value;
    out_index[blockIdx.x] = a.index;
  }
}

__global__ void topk_kernel(const float* logits, int64_t ld, int64_t n_valid, int64_t k, float* workspace,
                            float* out_value, int32_t* out_index) {
  const int64_t r = blockIdx.x;
  float* row = workspace + r * n_valid;
  for (int64_t i = threadIdx.x; i < n_valid; i += blockDim.x) row[i] = logits[r * ld + i];
  __syncthreads();
  for (int64_t j = 0; j < k; ++j) {
    const ArgMax a = row_argmax(row, n_valid);
    if (threadIdx.x == 0) {
      out_value[r * k + j] = a.value;
      out_index[r * k + j] = a.index;
      // Below -FLT_MAX: never chosen again. No winner (every value left is -inf or NaN)
      // comes back as INT32_MAX, which must not be written through.
      if (a.index < n_valid) row[a.index] = -INFINITY;
    }
    __syncthreads();
  }
}

// Each thread stops at its first non-finite column (its columns ascend); the block keeps
// the least of those.
__global__ void first_nonfinite_kernel(const float* logits, int64_t ld, int64_t n_valid, int32_t* out) {
  __shared__ int first;
  if (threadIdx.x == 0) first = INT32_MAX;
  __syncthreads();
  const float* row = logits + blockIdx.x * ld;
  for (int64_t i = threadIdx.x; i < n_valid; i += blockDim.x) {
    if (!isfinite(row[i])) {
      atomicMin(&first, static_cast<int>(i));
      break;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = first == INT32_MAX ? -1 : first;
}

// One thread per entry: entries[4 i .. 4 i + 3] = row, global id, bits of the
// repetition factor, bits of the subtraction (distinct (row, id) pairs: no races).
__global__ void apply_penalties_kernel(float* logits, int64_t ld, int64_t vocab_begin, int64_t n_valid,
                                       const int32_t* entries, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int32_t* e = entries + 4 * i;
  const int64_t col = static_cast<int64_t>(e[1]) - vocab_begin;
  if (col < 0 || col >= n_valid) return;
  const float rep = __int_as_float(e[2]), sub = __int_as_float(e[3]);
  float& l = logits[static_cast<int64_t>(e[0]) * ld + col];
  if (rep != 1.0f) l = l < 0.0f ? __fmul_rn(l, rep) : __fdiv_rn(l, rep);
  if (sub != 0.0f) l = __fsub_rn(l, sub);
}

// One block per request: entries[5 j .. 5 j + 4] = row, the low and high words of the
// row's max (f64) and of the divisor (f64). Each thread adds its columns' fixed-point
// terms (runtime/exp_sum.h: floor(min(t, 1) * 2^62), 0 for t <= 0 or NaN) into a 128-bit
// (lo, hi) pair; the block adds the pairs in shared memory. Integer sums: the same total
// in any order.
__global__ void exp_sums_kernel(const float* logits, int64_t ld, int64_t n_valid, const int32_t* entries,
                                unsigned long long* out) {
  __shared__ unsigned long long s_lo[kThreads], s_hi[kThreads];
  const int32_t* e = entries + 5 * blockIdx.x;
  const float* row = logits + static_cast<int64_t>(e[0]) * ld;
  const double mx = __hiloint2double(e[2], e[1]);
  const double divisor = __hiloint2double(e[4], e[3]);
  unsigned long long lo = 0, hi = 0;
  for (int64_t i = threadIdx.x; i < n_valid; i += blockDim.x) {
    const double t = exp((static_cast<double>(row[i]) - mx) / divisor);
    const unsigned long long v = t > 0.0 ? __double2ull_rz(fmin(t, 1.0) * 0x1p62) : 0ull;
    lo += v;
    hi += lo < v ? 1ull : 0ull;
  }
  s_lo[threadIdx.x] = lo;
  s_hi[threadIdx.x] = hi;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const unsigned long long other = s_lo[threadIdx.x + stride];
      s_lo[threadIdx.x] += other;
      s_hi[threadIdx.x] += s_hi[threadIdx.x + stride] + (s_lo[threadIdx.x] < other ? 1ull : 0ull);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = s_lo[0];
    out[2 * blockIdx.x + 1] = s_hi[0];
  }
}

// One thread per row (k is small).
__global__ void top_p_kernel(const float* values, int64_t rows, int64_t k, float temperature, float top_p,
                             float* probs) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const float* v = values + r * k;
  float* p = probs + r * k;
  const float m = v[0];
  float total = 0.0f;
  for (int64_t j = 0; j < k; ++j) total += expf((v[j] - m) / temperature);
  float kept = 0.0f;
  int64_t n = 0;
  while (n < k) {
    kept += expf((v[n] - m) / temperature) / total;
    ++n;
    if (kept >= top_p) break;
  }
  float z = 0.0f;
  for (int64_t j = 0; j < n; ++j) z += expf((v[j] - m) / temperature);
  for (int64_t j = 0; j < k; ++j) p[j] = j < n ? expf((v[j] - m) / temperature) / z : 0.0f;
}

}  // namespace

void launch_argmax(const float* logits, int64_t rows, int64_t ld, int64_t n_valid, float* out_value,
                   int32_t* out_index, cudaStream_t stream) {
  if (rows <= 0) return;
  argmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, ld, n_valid, out_value, out_index);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_exp_sums(const float* logits, int64_t ld, int64_t n_valid, const int32_t* entries, int64_t n,
                     unsigned long long* out, cudaStream_t stream) {
  if (n <= 0) return;
  exp_sums_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(logits, ld, n_valid, entries, out);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_first_nonfinite(const float* logits, int64_t rows, int64_t ld, int64_t n_valid, int32_t* out,
                            cudaStream_t stream) {
  if (rows <= 0) return;
  first_nonfinite_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, ld, n_valid, out);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_apply_penalties(float* logits, int64_t ld, int64_t vocab_begin, int64_t n_valid, const int32_t* entries,
                            int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  apply_penalties_kernel<<<grid_for(n, 128), 128, 0, stream>>>(logits, ld, vocab_begin, n_valid, entries, n);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_topk(const float* logits, int64_t rows, int64_t ld, int64_t n_valid, int64_t k, float* workspace,
                 float* out_value, int32_t* out_index, cudaStream_t stream) {
  if (rows <= 0 || k <= 0) return;
  if (k > n_valid) throw Error("top-k larger than the vocabulary slice", "launch_topk", "k <= " + std::to_string(n_valid),
                               std::to_string(k));
  topk_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, ld, n_valid, k, workspace, out_value,
                                                                      out_index);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_top_p(const float* values, int64_t rows, int64_t k, float temperature, float top_p, float* probs,
                  cudaStream_t stream) {
  if (rows <= 0 || k <= 0) return;
  top_p_kernel<<<grid_for(rows, 128), 128, 0, stream>>>(values, rows, k, temperature, top_p, probs);
  LINNET_CUDA_CHECK_LAUNCH();
}

}  // namespace linnet::cuda
