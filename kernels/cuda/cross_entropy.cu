// Vocab-parallel cross-entropy pieces (Megatron's vocab_parallel_cross_entropy): per row
// of a rank's logits slice, the local max, the sum of exp relative to it, and the target
// logit when this rank owns the target. The ranks combine them with one all_reduce MAX
// and two all_reduce SUM; no rank holds a full vocabulary row.
#include <cfloat>

#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace linnet::cuda {
namespace {

__global__ void cross_entropy_pieces_kernel(const float* logits, int64_t ld, int64_t n_valid, int64_t vocab_begin,
                                            const int32_t* targets, float* row_max, float* sum_exp,
                                            float* target_logit) {
  const int64_t r = blockIdx.x;
  const float* row = logits + r * ld;
  float m = -FLT_MAX;
  for (int64_t i = threadIdx.x; i < n_valid; i += blockDim.x) m = fmaxf(m, row[i]);
  m = block_max(m);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n_valid; i += blockDim.x) s += expf(row[i] - m);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
    row_max[r] = m;
    sum_exp[r] = s;
    target_logit[r] = t >= 0 && t < n_valid ? row[t] : 0.0f;
  }
}

}  // namespace

void launch_cross_entropy_pieces(const float* logits, int64_t rows, int64_t ld, int64_t n_valid, int64_t vocab_begin,
                                 const int32_t* targets, float* row_max, float* sum_exp, float* target_logit,
                                 cudaStream_t stream) {
  if (rows <= 0) return;
  cross_entropy_pieces_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(logits, ld, n_valid, vocab_begin,
                                                                                targets, row_max, sum_exp, target_logit);
  LINNET_CUDA_CHECK_LAUNCH();
}

}  // namespace linnet::cuda
