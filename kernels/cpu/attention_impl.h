// The attention kernel's body (see attention.cpp for what it computes and its fixed
// order), included once per ISA file: attention.cpp (generic), attention_avx2.cpp,
// attention_avx512.cpp, each compiled with its own target flags, so the compiler
// vectorizes the head_dim loops (dot products as eight lane sums, the value update) on
// that ISA. Multiply and add stay separate (-ffp-contract=off), so every path gives the
// same bits (kernels/CMakeLists.txt builds these files with -ffp-contract=off).
// The cache is f32 or bf16 (--kv-cache-dtype): a bf16 element is widened exactly
// (its bits are the float's upper half) where it is read, so a bf16 cache gives the
// same bits as an f32 cache holding the same bf16-rounded values.
// Not a public header: it defines LINNET_ATTENTION_NS::attention_impl (f32 cache) and
// attention_impl_bf16 (bf16 cache). It uses no
// std:: template or inline function (min, max, vector, exp wrappers): those would be
// emitted once per ISA file and the linker would keep one copy for all, possibly the
// AVX-512 one on a CPU without it. Helpers live in the per-ISA namespace instead.
#include <cstdint>
#include <cstdlib>

#include <omp.h>

#include "kernels/cpu/ops.h"

namespace linnet::cpu::LINNET_ATTENTION_NS {

constexpr int64_t kKeyBlock = 64;
constexpr int64_t kSplitKeys = 1024;  // keys per split of one (row, head) pair: 16 key blocks
constexpr int64_t kMaxHeadDim = 1024;  // accumulators up to this live on the stack, larger on the heap

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline float fmax(float a, float b) { return a < b ? b : a; }

// A cache element as f32: itself, or a bf16 widened exactly.
inline float kv_load(const float* p, int64_t i) { return p[i]; }
inline float kv_load(const uint16_t* p, int64_t i) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(p[i]) << 16);
}

// sum_d a[d] b[d] as eight lane sums over d = l (mod 8), combined pairwise, then the tail.
template <typename KV>
inline float dot(const float* a, const KV* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t nv = n / 8 * 8;
  for (int64_t d = 0; d < nv; d += 8)
    for (int l = 0; l < 8; ++l) lane[l] = lane[l] + a[d + l] * kv_load(b, d + l);
  float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (int64_t d = nv; d < n; ++d) s = s + a[d] * kv_load(b, d);
  return s;
}

// GCC vector types (element-wise, so each path's own registers give the same bits):
// 8 and 16 floats; loads through memcpy (no alignment), results through pointers (no
// wide vector crosses a call on the narrower ISA paths).
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf16 __attribute__((vector_size(64)));
typedef unsigned int vu8 __attribute__((vector_size(32)));
typedef unsigned int vu16 __attribute__((vector_size(64)));
typedef unsigned short vh8 __attribute__((vector_size(16)));
typedef unsigned short vh16 __attribute__((vector_size(32)));
inline void load8(const float* p, vf8* v) { __builtin_memcpy(v, p, 32); }
inline void load8(const uint16_t* p, vf8* v) {
  vh8 h;
  __builtin_memcpy(&h, p, 16);
  const vu8 u = __builtin_convertvector(h, vu8) << 16;
  __builtin_memcpy(v, &u, 32);
}
inline void load16(const float* p, vf16* v) { __builtin_memcpy(v, p, 64); }
inline void load16(const uint16_t* p, vf16* v) {
  vh16 h;
  __builtin_memcpy(&h, p, 32);
  const vu16 u = __builtin_convertvector(h, vu16) << 16;
  __builtin_memcpy(v, &u, 64);
}
inline float lane_sum(const vf8& v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// dot() of a with four rows b0..b3 at once (out[t] = dot(a, bt, n)): the same lane sums
// and the same combination per row, four independent chains.
template <typename KV>
inline void dot4(const float* a, const KV* b0, const KV* b1, const KV* b2, const KV* b3, int64_t n, float* out) {
  vf8 l0 = {0, 0, 0, 0, 0, 0, 0, 0}, l1 = l0, l2 = l0, l3 = l0;
  const int64_t nv = n / 8 * 8;
  for (int64_t d = 0; d < nv; d += 8) {
    vf8 x, k;
    load8(a + d, &x);
    load8(b0 + d, &k);
    l0 = l0 + x * k;
    load8(b1 + d, &k);
    l1 = l1 + x * k;
    load8(b2 + d, &k);
    l2 = l2 + x * k;
    load8(b3 + d, &k);
    l3 = l3 + x * k;
  }
  float s0 = lane_sum(l0), s1 = lane_sum(l1), s2 = lane_sum(l2), s3 = lane_sum(l3);
  for (int64_t d = nv; d < n; ++d) {
    s0 = s0 + a[d] * kv_load(b0, d);
    s1 = s1 + a[d] * kv_load(b1, d);
    s2 = s2 + a[d] * kv_load(b2, d);
    s3 = s3 + a[d] * kv_load(b3, d);
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

// acc[0, 16 V) = acc * corr, then += e[j] * v_j[off, off + 16 V) for j in [0, n) in
// order, where v_j is cache row rows_of[j]: the accumulators kept in registers over the
// keys (the same operations per element as one key at a time).
template <int V, typename KV>
inline void accumulate16(float* acc, float corr, const float* e, const KV* v_cache, const int64_t* rows_of,
                         int64_t n, int64_t kv_stride, int64_t off) {
  vf16 a[V];
  for (int q = 0; q < V; ++q) {
    load16(acc + 16 * q, &a[q]);
    a[q] = a[q] * corr;
  }
  for (int64_t j = 0; j < n; ++j) {
    const KV* vt = v_cache + rows_of[j] * kv_stride + off;
    const float ej = e[j];
    for (int q = 0; q < V; ++q) {
      vf16 v;
      load16(vt + 16 * q, &v);
      a[q] = a[q] + ej * v;
    }
  }
  for (int q = 0; q < V; ++q) __builtin_memcpy(acc + 16 * q, &a[q], 64);
}

// The same over one element (head_dim tails).
template <typename KV>
inline void accumulate1(float* acc, float corr, const float* e, const KV* v_cache, const int64_t* rows_of, int64_t n,
                        int64_t kv_stride, int64_t off) {
  float a = *acc * corr;
  for (int64_t j = 0; j < n; ++j) a = a + e[j] * kv_load(v_cache + rows_of[j] * kv_stride + off, 0);
  *acc = a;
}

// One (row, head) pair over keys [k0, k1) of its sequence: the online softmax's running
// max m, running sum l and unnormalized accumulator acc[head_dim] at the end.
template <typename KV>
inline void attend_keys(const float* qh, const KV* k_cache, const KV* v_cache, const int32_t* table,
                        int64_t kv_stride, int64_t kvh, int64_t head_dim, int64_t page_size, float scale, int64_t k0,
                        int64_t k1, float* acc, float* m_out, float* l_out) {
  float scores[kKeyBlock];
  int64_t rows_of[kKeyBlock];
  float m = -__builtin_inff(), l = 0.0f;
  for (int64_t d = 0; d < head_dim; ++d) acc[d] = 0.0f;
  for (int64_t b0 = k0; b0 < k1; b0 += kKeyBlock) {
    const int64_t n = imin(kKeyBlock, k1 - b0);
    float bm = -__builtin_inff();
    int64_t page = b0 / page_size, off = b0 % page_size;  // walked, not divided, per key
    for (int64_t j = 0; j < n; ++j) {
      rows_of[j] = static_cast<int64_t>(table[page]) * page_size + off;
      if (++off == page_size) {
        off = 0;
        ++page;
      }
    }
    // Four keys at a time: four independent dot products in flight (each one the same
    // eight-lane sum as dot(), so the same bits as one at a time).
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      dot4(qh, k_cache + rows_of[j] * kv_stride + kvh * head_dim, k_cache + rows_of[j + 1] * kv_stride + kvh * head_dim,
           k_cache + rows_of[j + 2] * kv_stride + kvh * head_dim, k_cache + rows_of[j + 3] * kv_stride + kvh * head_dim,
           head_dim, scores + j);
      for (int t = 0; t < 4; ++t) scores[j + t] *= scale;
    }
    for (; j < n; ++j) scores[j] = dot(qh, k_cache + rows_of[j] * kv_stride + kvh * head_dim, head_dim) * scale;
    for (j = 0; j < n; ++j) bm = fmax(bm, scores[j]);
    const float m_new = fmax(m, bm);
    const float corr = __builtin_expf(m - m_new);  // 0 on the first block (m = -inf)
    l *= corr;
    for (j = 0; j < n; ++j) {
      scores[j] = __builtin_expf(scores[j] - m_new);
      l += scores[j];
    }
    // acc = acc * corr, then + e_j v_j in ascending j: chunks of head_dim held in
    // registers over the block's keys (the same operations per element, in the same
    // order, as one key at a time over the whole row).
    int64_t d0 = 0;
    const int64_t voff = kvh * head_dim;
    for (; d0 + 64 <= head_dim; d0 += 64) accumulate16<4>(acc + d0, corr, scores, v_cache, rows_of, n, kv_stride, voff + d0);
    for (; d0 + 16 <= head_dim; d0 += 16) accumulate16<1>(acc + d0, corr, scores, v_cache, rows_of, n, kv_stride, voff + d0);
    for (; d0 < head_dim; ++d0) accumulate1(acc + d0, corr, scores, v_cache, rows_of, n, kv_stride, voff + d0);
    m = m_new;
  }
  *m_out = m;
  *l_out = l;
}

template <typename KV>
void attention_body(const float* q, int64_t q_stride, const KV* k_cache, const KV* v_cache, float* out,
                    int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                    int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t kv_stride = n_kv_heads * head_dim;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(head_dim));
  // Work items: (row, head, split), a row's keys cut into splits of kSplitKeys counted
  // from key_begin. item_row[i] is the row of item i, first_item[r] its first item;
  // rows of more than one split keep each split's (m, l, acc) at partial + part_at[r].
  int64_t keys = 0, items = 0, parts = 0;
  int64_t* first_item = static_cast<int64_t*>(std::malloc(static_cast<size_t>(rows + 1) * 8));
  int64_t* part_at = static_cast<int64_t*>(std::malloc(static_cast<size_t>(rows + 1) * 8));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = key_end[r] - key_begin[r];
    const int64_t splits = (n + kSplitKeys - 1) / kSplitKeys;
    keys += n;
    first_item[r] = items;
    part_at[r] = parts;
    items += n_heads * splits;
    if (splits > 1) parts += n_heads * splits * (head_dim + 2);
  }
  first_item[rows] = items;
  int32_t* item_row = static_cast<int32_t*>(std::malloc(static_cast<size_t>(items) * 4 + 4));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = first_item[r]; i < first_item[r + 1]; ++i) item_row[i] = static_cast<int32_t>(r);
  float* partial = parts > 0 ? static_cast<float*>(std::malloc(static_cast<size_t>(parts) * 4)) : nullptr;
  const int threads =
      keys * n_heads * head_dim < (int64_t{1} << 15) ? 1 : static_cast<int>(imin(num_threads(), items));

#pragma omp parallel num_threads(threads)
  {
    float stack_acc[kMaxHeadDim];
    float* acc = head_dim <= kMaxHeadDim ? stack_acc
                                         : static_cast<float*>(std::malloc(static_cast<size_t>(head_dim) * 4));
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t r = item_row[it];
      const int64_t n = key_end[r] - key_begin[r];
      const int64_t splits = (n + kSplitKeys - 1) / kSplitKeys;
      const int64_t h = (it - first_item[r]) / splits, c = (it - first_item[r]) % splits;
      const int64_t k0 = key_begin[r] + c * kSplitKeys, k1 = imin(key_end[r], k0 + kSplitKeys);
      float m = 0.0f, l = 0.0f;
      float* dst = splits > 1 ? partial + part_at[r] + (h * splits + c) * (head_dim + 2) + 2 : acc;
      attend_keys(q + r * q_stride + h * head_dim, k_cache, v_cache, page_table + r * max_pages, kv_stride,
                  h / group, head_dim, page_size, scale, k0, k1, dst, &m, &l);
      if (splits > 1) {
        dst[-2] = m;
        dst[-1] = l;
      } else {
        const float inv = 1.0f / l;
        float* oh = out + r * n_heads * head_dim + h * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) oh[d] = acc[d] * inv;
      }
    }
    // Split rows: the splits' softmax states combined in split order (flash-decoding's
    // reduction): M = max m_c, out = sum_c exp(m_c - M) acc_c / sum_c exp(m_c - M) l_c.
#pragma omp for schedule(static)
    for (int64_t pr = 0; pr < rows * n_heads; ++pr) {
      const int64_t r = pr / n_heads, h = pr % n_heads;
      const int64_t splits = (key_end[r] - key_begin[r] + kSplitKeys - 1) / kSplitKeys;
      if (splits <= 1) continue;
      const float* st = partial + part_at[r] + h * splits * (head_dim + 2);
      float mx = -__builtin_inff();
      for (int64_t c = 0; c < splits; ++c) mx = fmax(mx, st[c * (head_dim + 2)]);
      float l = 0.0f;
      for (int64_t d = 0; d < head_dim; ++d) acc[d] = 0.0f;
      for (int64_t c = 0; c < splits; ++c) {
        const float* sc = st + c * (head_dim + 2);
        const float w = __builtin_expf(sc[0] - mx);
        l += w * sc[1];
        for (int64_t d = 0; d < head_dim; ++d) acc[d] += w * sc[2 + d];
      }
      const float inv = 1.0f / l;
      float* oh = out + r * n_heads * head_dim + h * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) oh[d] = acc[d] * inv;
    }
    if (acc != stack_acc) std::free(acc);
  }
  std::free(partial);
  std::free(item_row);
  std::free(part_at);
  std::free(first_item);
}

void attention_impl(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
                    int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                    int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end) {
  attention_body(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads, head_dim, page_table, max_pages,
                 page_size, key_begin, key_end);
}

void attention_impl_bf16(const float* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                         float* out, int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                         const int32_t* page_table, int64_t max_pages, int64_t page_size, const int32_t* key_begin,
                         const int32_t* key_end) {
  attention_body(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads, head_dim, page_table, max_pages,
                 page_size, key_begin, key_end);
}

}  // namespace linnet::cpu::LINNET_ATTENTION_NS
