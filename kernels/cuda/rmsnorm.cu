// RMSNorm (LlamaRMSNorm) over rows and over per-head slices (Qwen3 QK-norm). One block
// per row, or one warp per head; the sum of squares accumulates in f32.
#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace linnet::cuda {
namespace {

__global__ void rmsnorm_kernel(const float* x, const float* weight, float* out, int64_t dim, float eps) {
  const float* xr = x + blockIdx.x * dim;
  float* o = out + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = weight[i] * (xr[i] * inv);
}

// One warp per (row, head): blockDim.x = 32 * heads_per_block.
__global__ void rmsnorm_heads_kernel(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                                     const float* weight, float eps) {
  const int64_t task = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (task >= rows * n_heads) return;
  const int lane = threadIdx.x % kWarp;
  float* xh = x + (task / n_heads) * row_stride + (task % n_heads) * head_dim;
  float ss = 0.0f;
  for (int64_t i = lane; i < head_dim; i += kWarp) ss += xh[i] * xh[i];
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(head_dim) + eps);
  for (int64_t i = lane; i < head_dim; i += kWarp) xh[i] = weight[i] * (xh[i] * inv);
}

}  // namespace

void launch_rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps,
                    cudaStream_t stream) {
  if (rows <= 0) return;
  const int threads = dim >= 1024 ? 1024 : (dim >= 256 ? 256 : 128);
  rmsnorm_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, weight, out, dim, eps);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_rmsnorm_heads(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                          const float* weight, float eps, cudaStream_t stream) {
  const int64_t tasks = rows * n_heads;
  if (tasks <= 0) return;
  constexpr int kHeadsPerBlock = 8;
  const auto blocks = static_cast<unsigned>((tasks + kHeadsPerBlock - 1) / kHeadsPerBlock);
  rmsnorm_heads_kernel<<<blocks, kHeadsPerBlock * kWarp, 0, stream>>>(x, rows, row_stride, n_heads, head_dim, weight,
                                                                       eps);
  LINNET_CUDA_CHECK_LAUNCH();
}

}  // namespace linnet::cuda
