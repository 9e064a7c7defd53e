// random_normal: a counter-based N(0, 1) generator, the same function on the host and
// in CUDA kernels, so `bench --random-weights` builds the same model on every backend
// and a device can fill billions of weights without a host buffer.
// Math: SplitMix64 (Steele, Lea, Flood 2014) of (seed, index) gives 64 random bits; two
// 24-bit uniforms go through Box-Muller.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define LINNET_HOST_DEVICE __host__ __device__
#else
#define LINNET_HOST_DEVICE
#endif

namespace linnet {

/// SplitMix64's output function of `x`.
LINNET_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Element `index` of the standard normal stream `seed` (f32; host and device values
/// may differ in the last bits of log / cos).
LINNET_HOST_DEVICE inline float random_normal(uint64_t seed, uint64_t index) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ (index * 0xD1B54A32D192ED03ull));
  const float u1 = static_cast<float>((bits >> 40) + 1) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = static_cast<float>(bits & 0xFFFFFFull) * (1.0f / 16777216.0f);  // [0, 1)
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

}  // namespace linnet
