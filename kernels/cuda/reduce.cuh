// Warp and block reductions shared by the kernels (f32 sum / max, argmax pairs).
#pragma once

#include <cfloat>
#include <cstdint>

namespace linnet::cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // part may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int n = blockDim.x / kWarp;
  v = lane < n ? part[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int n = blockDim.x / kWarp;
  v = lane < n ? part[lane] : -FLT_MAX;
  return warp_max(v);
}

// (value, index) with the larger value, the lower index on ties.
struct ArgMax {
  float value;
  int32_t index;
};

__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    ArgMax b{__shfl_xor_sync(0xffffffffu, a.value, o), __shfl_xor_sync(0xffffffffu, a.index, o)};
    a = better(a, b);
  }
  return a;
}

__device__ __forceinline__ ArgMax block_argmax(ArgMax a) {
  __shared__ float pv[kWarp];
  __shared__ int32_t pi[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  a = warp_argmax(a);
  __syncthreads();
  if (lane == 0) {
    pv[warp] = a.value;
    pi[warp] = a.index;
  }
  __syncthreads();
  const int n = blockDim.x / kWarp;
  a = lane < n ? ArgMax{pv[lane], pi[lane]} : ArgMax{-FLT_MAX, INT32_MAX};
  return warp_argmax(a);
}

// Blocks of a 1-D grid covering n elements with `threads` per block, capped so a huge
// tensor is walked by a grid-stride loop.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

}  // namespace linnet::cuda
