// Element-wise ops: dtype conversion, random fill, residual add, SwiGLU. Grid-stride
// loops over flat indices; f32 math.
#include "common/random_normal.h"
#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace linnet::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void f32_to_bf16_kernel(const float* in, __nv_bfloat16* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

__global__ void bf16_to_f32_kernel(const __nv_bfloat16* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __bfloat162float(in[i]);
  }
}

__global__ void fill_normal_bf16_kernel(__nv_bfloat16* out, int64_t n, uint64_t seed, float stddev) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(stddev * random_normal(seed, static_cast<uint64_t>(i)));
  }
}

__global__ void add_inplace_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void swiglu_kernel(const float* gate_up, float* out, int64_t rows, int64_t inter) {
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, c = i % inter;
    const float g = gate_up[r * 2 * inter + c];
    const float u = gate_up[r * 2 * inter + inter + c];
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}

}  // namespace

void launch_f32_to_bf16(const float* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(in, out, n);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_bf16_to_f32(const __nv_bfloat16* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(in, out, n);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_fill_normal_bf16(__nv_bfloat16* out, int64_t n, uint64_t seed, float stddev, cudaStream_t stream) {
  if (n <= 0) return;
  fill_normal_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, n, seed, stddev);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_inplace_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_swiglu(const float* gate_up, float* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return;
  swiglu_kernel<<<grid_for(rows * inter, kThreads), kThreads, 0, stream>>>(gate_up, out, rows, inter);
  LINNET_CUDA_CHECK_LAUNCH();
}

}  // namespace linnet::cuda
