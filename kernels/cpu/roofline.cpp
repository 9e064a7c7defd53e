#include "kernels/cpu/roofline.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include <omp.h>

#include "kernels/cpu/cpu_features.h"

namespace linnet::cpu {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sums kStreams far-apart parts of [a, a + n) in one loop, 64 bytes of each per step: a
// GEMV reads many weight rows at once, and one sequential stream per core leaves
// bandwidth unused on cores whose prefetchers track several streams (a Xeon here read
// 12.5 GB/s with one stream against the 15-16 a decode step streams). Other cores do the
// opposite (an AMD EPYC here: 28.6 GB/s on one core with one stream, 10.6 with eight,
// while its decode streamed 44-47 GB/s on two), so the probe takes the best of both.
template <size_t kStreams>
__attribute__((target("avx2"))) float sum_avx2(const float* a, size_t n) {
  const size_t part = n / kStreams / 16 * 16;
  __m256 s[kStreams];
  for (size_t k = 0; k < kStreams; ++k) s[k] = _mm256_setzero_ps();
  for (size_t i = 0; i < part; i += 16) {
    for (size_t k = 0; k < kStreams; ++k) {
      const float* p = a + k * part + i;
      s[k] = _mm256_add_ps(s[k], _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)));
    }
  }
  __m256 t = _mm256_setzero_ps();
  for (size_t k = 0; k < kStreams; ++k) t = _mm256_add_ps(t, s[k]);
  float f[8];
  _mm256_storeu_ps(f, t);
  float total = f[0] + f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7];
  for (size_t i = kStreams * part; i < n; ++i) total += a[i];
  return total;
}

float sum_generic(const float* a, size_t n) {
  float s[4] = {0, 0, 0, 0};
  for (size_t i = 0; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) s[l] += a[i + l];
  return s[0] + s[1] + s[2] + s[3];
}

#define LINNET_FMA12(T, op, set1)                                                                    \
  T a0 = set1(1.0f), a1 = set1(1.1f), a2 = set1(1.2f), a3 = set1(1.3f), a4 = set1(1.4f),             \
    a5 = set1(1.5f), a6 = set1(1.6f), a7 = set1(1.7f), a8 = set1(1.8f), a9 = set1(1.9f),             \
    a10 = set1(2.0f), a11 = set1(2.1f);                                                              \
  const T b = set1(0.999999f), c = set1(1e-7f);                                                      \
  for (long it = 0; it < iters; ++it) {                                                              \
    a0 = op(a0, b, c); a1 = op(a1, b, c); a2 = op(a2, b, c); a3 = op(a3, b, c);                      \
    a4 = op(a4, b, c); a5 = op(a5, b, c); a6 = op(a6, b, c); a7 = op(a7, b, c);                      \
    a8 = op(a8, b, c); a9 = op(a9, b, c); a10 = op(a10, b, c); a11 = op(a11, b, c);                  \
  }

__attribute__((target("avx512f"))) float fma_avx512(long iters) {
  LINNET_FMA12(__m512, _mm512_fmadd_ps, _mm512_set1_ps)
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                               _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
  return _mm512_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) float fma_avx2(long iters) {
  LINNET_FMA12(__m256, _mm256_fmadd_ps, _mm256_set1_ps)
  const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)),
                                               _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11))));
  return _mm256_cvtss_f32(s);
}

inline float scalar_fma(float a, float b, float c) { return a * b + c; }
inline float scalar_set1(float v) { return v; }
float fma_generic(long iters) {
  LINNET_FMA12(float, scalar_fma, scalar_set1)
  return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
}
#undef LINNET_FMA12

}  // namespace

double dram_read_gbps(int threads) {
  threads = std::max(1, threads);
  const size_t n = (size_t{1} << 30) / sizeof(float);
  std::vector<float> a(n, 1.0f);
  const bool avx2 = isa_supported(Isa::kAvx2);
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 8; ++rep) {  // even reps: 8 streams a thread, odd: 1 (AVX2)
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const size_t t = static_cast<size_t>(omp_get_thread_num()), T = static_cast<size_t>(omp_get_num_threads());
      const size_t b = n * t / T, e = n * (t + 1) / T;
      total += !avx2       ? sum_generic(a.data() + b, e - b)
               : rep % 2 ? sum_avx2<1>(a.data() + b, e - b)
                         : sum_avx2<8>(a.data() + b, e - b);
    }
    sink = sink + total;
    best = std::max(best, static_cast<double>(n * sizeof(float)) / seconds_since(t0) / 1e9);
  }
  return best;
}

double fma_peak_gflops(int threads) {
  threads = std::max(1, threads);
  const Isa isa = active_isa();
  const int lanes = isa == Isa::kAvx512 ? 16 : isa == Isa::kAvx2 ? 8 : 1;
  const long iters = isa == Isa::kGeneric ? 20000000L : 40000000L;
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    total += isa == Isa::kAvx512 ? fma_avx512(iters) : isa == Isa::kAvx2 ? fma_avx2(iters) : fma_generic(iters);
    sink = sink + total;
    best = std::max(best, static_cast<double>(iters) * 12 * 2 * lanes * threads / seconds_since(t0) / 1e9);
  }
  return best;
}

}  // namespace linnet::cpu
