// Row moves: scatter of new K / V rows into the (paged) cache, and gathering the rows
// whose logits are wanted. One block per row.
#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace linnet::cuda {
namespace {

__device__ __forceinline__ void put(float* dst, float x) { *dst = x; }
// Round to nearest even, as cpu::store_rows into a bf16 cache (float_to_bf16).
__device__ __forceinline__ void put(__nv_bfloat16* dst, float x) { *dst = __float2bfloat16_rn(x); }

template <typename KV>
__global__ void store_rows_kernel(const float* src, int64_t src_stride, KV* cache, int64_t row_elems,
                                  const int32_t* slots) {
  const int64_t r = blockIdx.x;
  KV* dst = cache + static_cast<int64_t>(slots[r]) * row_elems;
  const float* s = src + r * src_stride;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) put(dst + i, s[i]);
}

__global__ void gather_rows_kernel(const float* src, int64_t cols, const int32_t* index, float* out) {
  const int64_t r = blockIdx.x;
  const float* s = src + static_cast<int64_t>(index[r]) * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[r * cols + i] = s[i];
}

}  // namespace

void launch_store_rows(const float* src, int64_t src_stride, float* cache, int64_t row_elems, const int32_t* slots,
                       int64_t rows, cudaStream_t stream) {
  if (rows <= 0) return;
  store_rows_kernel<float><<<static_cast<unsigned>(rows), 256, 0, stream>>>(src, src_stride, cache, row_elems, slots);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_store_rows(const float* src, int64_t src_stride, __nv_bfloat16* cache, int64_t row_elems,
                       const int32_t* slots, int64_t rows, cudaStream_t stream) {
  if (rows <= 0) return;
  store_rows_kernel<__nv_bfloat16>
      <<<static_cast<unsigned>(rows), 256, 0, stream>>>(src, src_stride, cache, row_elems, slots);
  LINNET_CUDA_CHECK_LAUNCH();
}

void launch_gather_rows(const float* src, int64_t cols, const int32_t* index, int64_t n, float* out,
                        cudaStream_t stream) {
  if (n <= 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(src, cols, index, out);
  LINNET_CUDA_CHECK_LAUNCH();
}

}  // namespace linnet::cuda
