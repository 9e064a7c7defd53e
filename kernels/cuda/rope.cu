// Rotary position embedding in place, half-split layout (rotate_half in transformers'
// modeling_llama.py). The angle is formed in f32 (pos * inv_freq, as transformers does)
// and its cos / sin taken in f64, as kernels/cpu/rope.cpp does, so long positions round
// alike on both backends. Llama-3 scaling lives in inv_freq (cpu::rope_scale_llama3).
#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace linnet::cuda {
namespace {

// One block per row; threads over (head, i < head_dim / 2).
__global__ void rope_kernel(float* x, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                            const int32_t* positions, const float* inv_freq) {
  const int64_t r = blockIdx.x;
  const int64_t half = head_dim / 2;
  const float pos = static_cast<float>(positions[r]);
  for (int64_t t = threadIdx.x; t < n_heads * half; t += blockDim.x) {
    const int64_t h = t / half, i = t % half;
    const float a = pos * inv_freq[i];
    double s = 0.0, c = 0.0;
    sincos(static_cast<double>(a), &s, &c);
    float* xh = x + r * row_stride + h * head_dim;
    const float x1 = xh[i], x2 = xh[i + half];
    xh[i] = x1 * static_cast<float>(c) - x2 * static_cast<float>(s);
    xh[i + half] = x2 * static_cast<float>(c) + x1 * static_cast<float>(s);
  }
}

}  // namespace

void launch_rope(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                 const int32_t* positions, const float* inv_freq, cudaStream_t stream) {
  if (rows <= 0 || n_heads <= 0) return;
  rope_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, row_stride, n_heads, head_dim, positions, inv_freq);
  LINNET_CUDA_CHECK_LAUNCH();
}

}  // namespace linnet::cuda
