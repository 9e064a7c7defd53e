// Paged grouped-query attention, f32, for prefill and decode alike. A block owns one
// (query row, KV head, key split): it stages the group's q heads (prescaled by
// 1/sqrt(head_dim)) in shared memory, then walks its keys in tiles of kTile, four warps
// computing the tile's scores (each K row read once for all q heads of the group),
// an online-softmax update (running max and sum per head, FlashAttention's rescaling)
// and the V accumulation, each thread owning a few output elements in registers.
// Several splits per row (flash-decoding) keep the multiprocessors busy when there are
// few rows; their partial results are merged by attention_combine_kernel.
#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace linnet::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kTile = 32;          // keys per tile
constexpr int kMaxGroup = 16;      // q heads per KV head
constexpr int kMaxHeadDim = 256;
constexpr int kMaxAcc = 16;        // output elements per thread: group * head_dim <= kThreads * kMaxAcc
constexpr int64_t kMinChunk = 64;  // fewest keys per split
constexpr int kMaxSplits = 64;

// A cache element widened to f32 (exact for bf16).
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

// KV: the cache element, float or __nv_bfloat16 (--kv-cache-dtype); the math is f32.
template <typename KV>
__global__ void __launch_bounds__(kThreads)
    attention_kernel(const float* q, int64_t q_stride, const KV* k_cache, const KV* v_cache, float* out,
                     int n_heads, int n_kv_heads, int head_dim, const int32_t* page_table, int64_t max_pages,
                     int64_t page_size, const int32_t* key_begin, const int32_t* key_end, int splits,
                     float* part_out, float* part_ml) {
  extern __shared__ float q_s[];  // [group * head_dim]
  __shared__ float p_s[kMaxGroup][kTile];
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup], alpha_s[kMaxGroup];
  __shared__ int64_t row_s[kTile];

  const int64_t r = blockIdx.x;
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int group = n_heads / n_kv_heads;
  const int gd = group * head_dim;
  const int64_t kv_stride = static_cast<int64_t>(n_kv_heads) * head_dim;
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));

  // q heads kvh * group .. + group are consecutive columns of the row.
  const float* qr = q + r * q_stride + static_cast<int64_t>(kvh) * gd;
  for (int e = tid; e < gd; e += kThreads) q_s[e] = qr[e] * scale;
  if (tid < group) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }

  const int64_t begin = key_begin[r], end = key_end[r];
  const int64_t len = end - begin;
  const int64_t chunk = splits == 1 ? len : max(kMinChunk, (len + splits - 1) / splits);
  const int64_t start = begin + split * chunk;
  const int64_t stop = min(end, start + chunk);
  const int32_t* table = page_table + r * max_pages;

  float acc[kMaxAcc];
#pragma unroll
  for (int j = 0; j < kMaxAcc; ++j) acc[j] = 0.0f;
  __syncthreads();

  for (int64_t t0 = start; t0 < stop; t0 += kTile) {
    const int n = static_cast<int>(min(static_cast<int64_t>(kTile), stop - t0));
    if (tid < n) {
      const int64_t p = t0 + tid;
      row_s[tid] = static_cast<int64_t>(table[p / page_size]) * page_size + p % page_size;
    }
    __syncthreads();
    // Scores: warp w takes keys w, w + kWarps, ...; lanes split head_dim.
    for (int t = warp; t < n; t += kWarps) {
      const KV* kt = k_cache + row_s[t] * kv_stride + static_cast<int64_t>(kvh) * head_dim;
      float dots[kMaxGroup];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) dots[g] = 0.0f;
      for (int d = lane; d < head_dim; d += kWarp) {
        const float kd = widen(kt[d]);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < group) dots[g] += q_s[g * head_dim + d] * kd;
        }
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {
          const float s = warp_sum(dots[g]);
          if (lane == 0) p_s[g][t] = s;
        }
      }
    }
    __syncthreads();
    // Online softmax: thread g rescales head g's running max and sum.
    if (tid < group) {
      const int g = tid;
      float mx = m_s[g];
      for (int t = 0; t < n; ++t) mx = fmaxf(mx, p_s[g][t]);
      const float alpha = expf(m_s[g] - mx);  // 0 on the first tile (m = -inf)
      float sum = 0.0f;
      for (int t = 0; t < n; ++t) {
        const float e = expf(p_s[g][t] - mx);
        p_s[g][t] = e;
        sum += e;
      }
      l_s[g] = l_s[g] * alpha + sum;
      m_s[g] = mx;
      alpha_s[g] = alpha;
    }
    __syncthreads();
    // V accumulation: element e = tid + j * kThreads of the group's [group, head_dim].
#pragma unroll
    for (int j = 0; j < kMaxAcc; ++j) {
      const int e = tid + j * kThreads;
      if (e < gd) {
        const int g = e / head_dim, d = e % head_dim;
        const KV* vbase = v_cache + static_cast<int64_t>(kvh) * head_dim + d;
        float a = acc[j] * alpha_s[g];
        for (int t = 0; t < n; ++t) a += p_s[g][t] * widen(vbase[row_s[t] * kv_stride]);
        acc[j] = a;
      }
    }
    __syncthreads();  // row_s / p_s are rewritten by the next tile
  }

#pragma unroll
  for (int j = 0; j < kMaxAcc; ++j) {
    const int e = tid + j * kThreads;
    if (e < gd) {
      const int g = e / head_dim, d = e % head_dim;
      const int64_t h = static_cast<int64_t>(kvh) * group + g;
      if (splits == 1) {
        out[(r * n_heads + h) * head_dim + d] = l_s[g] > 0.0f ? acc[j] / l_s[g] : 0.0f;
      } else {
        part_out[((r * n_heads + h) * splits + split) * head_dim + d] = acc[j];
      }
    }
  }
  if (splits > 1 && tid < group) {
    const int64_t h = static_cast<int64_t>(kvh) * group + tid;
    const int64_t base = (r * n_heads + h) * splits + split;
    part_ml[2 * base] = m_s[tid];
    part_ml[2 * base + 1] = l_s[tid];
  }
}

// One block per (row, q head): out = sum_s w_s acc_s / sum_s w_s l_s, w_s = exp(m_s - M).
__global__ void attention_combine_kernel(const float* part_out, const float* part_ml, float* out, int head_dim,
                                         int splits) {
  const int64_t rh = blockIdx.x;
  const float* ml = part_ml + rh * splits * 2;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, ml[2 * s]);
  float l = 0.0f;
  for (int s = 0; s < splits; ++s) l += ml[2 * s] == -INFINITY ? 0.0f : expf(ml[2 * s] - m) * ml[2 * s + 1];
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < splits; ++s) {
      if (ml[2 * s] != -INFINITY) o += expf(ml[2 * s] - m) * part_out[(rh * splits + s) * head_dim + d];
    }
    out[rh * head_dim + d] = l > 0.0f ? o / l : 0.0f;
  }
}

}  // namespace

int attention_num_splits(int64_t rows, int64_t n_kv_heads, int64_t max_keys, int num_sms) {
  const int64_t blocks = std::max<int64_t>(1, rows * n_kv_heads);
  const int64_t target = 2 * static_cast<int64_t>(std::max(1, num_sms));
  if (blocks >= target) return 1;
  const int64_t want = (target + blocks - 1) / blocks;
  const int64_t cap = std::max<int64_t>(1, (max_keys + kMinChunk - 1) / kMinChunk);
  return static_cast<int>(std::min<int64_t>({want, cap, kMaxSplits}));
}

size_t attention_workspace_floats(int64_t rows, int64_t n_heads, int64_t head_dim, int splits) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(rows * n_heads * splits * (head_dim + 2));
}

namespace {
template <typename KV>
void attention_impl(const float* q, int64_t q_stride, const KV* k_cache, const KV* v_cache, float* out,
                      int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                      int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end,
                      int splits, float* workspace, cudaStream_t stream) {
  if (rows <= 0) return;
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || head_dim <= 0 || head_dim > kMaxHeadDim ||
      n_heads / n_kv_heads > kMaxGroup || (n_heads / n_kv_heads) * head_dim > kThreads * kMaxAcc ||
      n_kv_heads > 65535) {
    throw Error("attention shape not supported by the CUDA kernel", "launch_attention",
                "head_dim <= 256, n_heads / n_kv_heads <= 16 and their product <= 2048",
                "n_heads " + std::to_string(n_heads) + ", n_kv_heads " + std::to_string(n_kv_heads) + ", head_dim " +
                    std::to_string(head_dim));
  }
  splits = std::clamp(splits, 1, kMaxSplits);
  if (splits > 1 && workspace == nullptr) throw Error("split attention needs a workspace", "launch_attention");
  float* part_out = workspace;
  float* part_ml = splits > 1 ? workspace + rows * n_heads * splits * head_dim : nullptr;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(n_kv_heads), static_cast<unsigned>(splits));
  const size_t smem = static_cast<size_t>(n_heads / n_kv_heads * head_dim) * sizeof(float);
  attention_kernel<KV><<<grid, kThreads, smem, stream>>>(
      q, q_stride, k_cache, v_cache, out, static_cast<int>(n_heads), static_cast<int>(n_kv_heads),
      static_cast<int>(head_dim), page_table, max_pages, page_size, key_begin, key_end, splits, part_out, part_ml);
  LINNET_CUDA_CHECK_LAUNCH();
  if (splits > 1) {
    attention_combine_kernel<<<static_cast<unsigned>(rows * n_heads), 128, 0, stream>>>(
        part_out, part_ml, out, static_cast<int>(head_dim), splits);
    LINNET_CUDA_CHECK_LAUNCH();
  }
}
}  // namespace

void launch_attention(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
                      int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                      int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end,
                      int splits, float* workspace, cudaStream_t stream) {
  attention_impl(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads, head_dim, page_table, max_pages,
                 page_size, key_begin, key_end, splits, workspace, stream);
}

void launch_attention(const float* q, int64_t q_stride, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                      float* out, int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                      const int32_t* page_table, int64_t max_pages, int64_t page_size, const int32_t* key_begin,
                      const int32_t* key_end, int splits, float* workspace, cudaStream_t stream) {
  attention_impl(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads, head_dim, page_table, max_pages,
                 page_size, key_begin, key_end, splits, workspace, stream);
}

}  // namespace linnet::cuda
