// The attention kernel's body (see attention.cpp for what it computes and its fixed
// order), included once per ISA file: attention.cpp (generic), attention_avx2.cpp,
// attention_avx512.cpp, each compiled with its own target flags, so the compiler
// vectorizes the head_dim loops (dot products as eight lane sums, the value update) on
// that ISA. The compiler never contracts (-ffp-contract=off on all three files: where it
// contracts depends on the tile's template, and a row alone must equal the row in a
// tile); the dot products and value sums are explicit fused multiply-adds (madd16 /
// madd1) on the AVX2 and AVX-512 paths, so those two give the same bits, and a multiply
// and an add on the generic path, which differs from them in the last bits.
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
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_exp.h"

namespace linnet::cpu::LINNET_ATTENTION_NS {

constexpr int64_t kKeyBlock = 64;
constexpr int64_t kSplitKeys = 1024;  // keys per split of one (row, head) pair: 16 key blocks

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline float fmax(float a, float b) { return a < b ? b : a; }
// Splits of kSplitKeys keys a pair of n keys is cut into (0 for no keys).
inline int64_t key_splits(int64_t n) { return n > 0 ? (n + kSplitKeys - 1) / kSplitKeys : 0; }

// A cache element as f32: itself, or a bf16 widened exactly.
inline float kv_load(const float* p, int64_t i) { return p[i]; }
inline float kv_load(const uint16_t* p, int64_t i) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(p[i]) << 16);
}

// GCC vector types (element-wise, so each path's own registers give the same bits):
// 8 and 16 floats; loads through memcpy (no alignment), results through pointers (no
// wide vector crosses a call on the narrower ISA paths).
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf16 __attribute__((vector_size(64)));
typedef unsigned int vu16 __attribute__((vector_size(64)));
typedef unsigned short vh8 __attribute__((vector_size(16)));
typedef unsigned short vh16 __attribute__((vector_size(32)));
inline void load16(const float* p, vf16* v) { __builtin_memcpy(v, p, 64); }
// The dot products' and value sums' multiply-adds: *acc = x * y + *acc, one fused
// multiply-add per element where the path has FMA (the AVX2 and AVX-512 files: the same
// rounding on both, whatever the vector width), else a multiply and an add (the generic
// path, which differs from them in the last bits, as the GEMM's does). The softmax's exp
// keeps separate operations on every path (exp_block; softmax_stats shares it).
#if defined(__AVX512F__)
inline void madd16(vf16* acc, const vf16* x, const vf16* y) {
  __m512 a, b, c;
  __builtin_memcpy(&a, x, 64);
  __builtin_memcpy(&b, y, 64);
  __builtin_memcpy(&c, acc, 64);
  c = _mm512_fmadd_ps(a, b, c);
  __builtin_memcpy(acc, &c, 64);
}
inline float madd1(float x, float y, float acc) { return __builtin_fmaf(x, y, acc); }
#elif defined(__FMA__)
inline void madd16(vf16* acc, const vf16* x, const vf16* y) {
  __m256 a[2], b[2], c[2];
  __builtin_memcpy(a, x, 64);
  __builtin_memcpy(b, y, 64);
  __builtin_memcpy(c, acc, 64);
  c[0] = _mm256_fmadd_ps(a[0], b[0], c[0]);
  c[1] = _mm256_fmadd_ps(a[1], b[1], c[1]);
  __builtin_memcpy(acc, c, 64);
}
inline float madd1(float x, float y, float acc) { return __builtin_fmaf(x, y, acc); }
#else
inline void madd16(vf16* acc, const vf16* x, const vf16* y) { *acc = *acc + *x * *y; }
inline float madd1(float x, float y, float acc) { return acc + x * y; }
#endif
inline void load16(const uint16_t* p, vf16* v) {
  vh16 h;
  __builtin_memcpy(&h, p, 32);
  const vu16 u = __builtin_convertvector(h, vu16) << 16;
  __builtin_memcpy(v, &u, 64);
}
// acc = acc * corr, then += e[j] * v_j[off] for j in [0, n) in order, v_j being cache
// row rows_of[j]: one element of a value sum (head_dim tails).
template <typename KV>
inline void accumulate1(float* acc, float corr, const float* e, const KV* v_cache, const int64_t* rows_of, int64_t n,
                        int64_t kv_stride, int64_t off) {
  float a = *acc * corr;
  for (int64_t j = 0; j < n; ++j) a = madd1(e[j], kv_load(v_cache + rows_of[j] * kv_stride + off, 0), a);
  *acc = a;
}

// Per-ISA micro-tile sizes: how many query vectors share one load of a key or value
// row. They change only which rows are computed together, never the operations a
// (row, head) pair's result goes through, so every path still gives the same bits.
#if defined(__AVX512F__)
constexpr int kQkTile = 8;   // q vectors per QK micro-tile: 2 accumulators each (16 of 32 zmm)
constexpr int kPvTile = 6;   // q vectors per PV micro-tile: kPvChunk accumulators each
constexpr int kPvChunk = 4;  // 16-float vectors of head_dim per PV micro-tile (64 floats)
#elif defined(__AVX2__)
constexpr int kQkTile = 3;  // a vf16 is two ymm here: 12 of 16 registers
constexpr int kPvTile = 2;
constexpr int kPvChunk = 2;
#else
constexpr int kQkTile = 1;
constexpr int kPvTile = 1;
constexpr int kPvChunk = 1;
#endif
constexpr int64_t kMaxTileQ = 16;  // (row, head) pairs of one work item
constexpr int64_t kTileRows = 4;   // rows of one tile at most

typedef int vi16 __attribute__((vector_size(64)));

// Two keys' eight lanes in one 16-float vector: lanes 0-7 from p0, 8-15 from p1 (one
// register insert: through memory, the two halves' stores would not forward to the
// wide load).
inline void load_pair(const float* p0, const float* p1, vf16* v) {
  vf8 a, b;
  __builtin_memcpy(&a, p0, 32);
  __builtin_memcpy(&b, p1, 32);
  *v = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
inline void load_pair(const uint16_t* p0, const uint16_t* p1, vf16* v) {
  vh8 a, b;
  __builtin_memcpy(&a, p0, 16);
  __builtin_memcpy(&b, p1, 16);
  const vh16 h = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const vu16 u = __builtin_convertvector(h, vu16) << 16;
  __builtin_memcpy(v, &u, 64);
}

// The eight lane sums' tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), done for
// 16 keys at once by shuffles (data movement only, so the same bits as one key at a time).
// Step 1: a = [key pair A | key pair B] -> per key (l0 + l4, l1 + l5, l2 + l6, l3 + l7).
inline void tree_step1(const vf16& a, const vf16& b, vf16* out) {
  const vi16 lo = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const vi16 hi = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  *out = __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);
}
// Step 2: 4 keys x 4 sums twice -> per key ((l0 + l4) + (l2 + l6), (l1 + l5) + (l3 + l7)).
inline void tree_step2(const vf16& a, const vf16& b, vf16* out) {
  const vi16 lo = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const vi16 hi = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  *out = __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);
}
// Step 3: 8 keys x 2 sums twice -> the 16 keys' dot products, in key order.
inline void tree_step3(const vf16& a, const vf16& b, vf16* out) {
  const vi16 ev = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  const vi16 od = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  *out = __builtin_shuffle(a, b, ev) + __builtin_shuffle(a, b, od);
}

// e[j] = exp(s[j] - m) for j in [0, n), n a multiple of 16, for s[j] - m <= 0 (softmax
// weights), 16 floats at a time by exp_in_range (vec_exp.h: 1.17 ulp, the same bits on
// every path). x < -87 (k below f32's normal range, and -inf) gives 0, where e^x < 2^-125.
inline void exp_block(float* s, float m, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    vf16 x;
    load16(s + j, &x);
    x = x - m;
    vf16 e;
    exp_in_range<vf16, vi16>(&x, &e);
    const vf16 zero = {};
    e = x < -87.0f ? zero : e;
    __builtin_memcpy(s + j, &e, 64);
  }
}

// T query vectors against the 4 keys kp[0..3] (each at its KV head's first element):
// each pair's eight lane sums over d = l (mod 8) for d < 8 nch (qd[t] holds q's chunk c
// twice at qd[t] + 16 c), then tree step 1, stored at s1[t].
template <int T, typename KV>
inline void qk_quad(const float* const* qd, int64_t nch, const KV* const* kp, float* const* s1) {
  vf16 a[T][2];
  for (int t = 0; t < T; ++t) {
    a[t][0] = vf16{};
    a[t][1] = vf16{};
  }
  for (int64_t c = 0; c < nch; ++c) {
    vf16 k01, k23;
    load_pair(kp[0] + 8 * c, kp[1] + 8 * c, &k01);
    load_pair(kp[2] + 8 * c, kp[3] + 8 * c, &k23);
    for (int t = 0; t < T; ++t) {
      vf16 x;
      load16(qd[t] + 16 * c, &x);
      madd16(&a[t][0], &x, &k01);
      madd16(&a[t][1], &x, &k23);
    }
  }
  for (int t = 0; t < T; ++t) {
    vf16 s;
    tree_step1(a[t][0], a[t][1], &s);
    __builtin_memcpy(s1[t], &s, 64);
  }
}

// qk_quad over key quads [0, quads) for `cnt` <= T query vectors (T counts down to cnt).
template <int T, typename KV>
inline void qk_rows(int cnt, const float* const* qd, int64_t nch, const KV* const* kp, float* const* s1,
                    int64_t quads) {
  if constexpr (T > 1) {
    if (cnt < T) return qk_rows<T - 1, KV>(cnt, qd, nch, kp, s1, quads);
  }
  float* s1q[T];
  for (int64_t u = 0; u < quads; ++u) {
    for (int t = 0; t < T; ++t) s1q[t] = s1[t] + 16 * u;
    qk_quad<T, KV>(qd, nch, kp + 4 * u, s1q);
  }
}

// acc_t[d0, d0 + 16 V) = acc_t * corr_t, then += e_t[j] * v_j[off + d0, ...) for j in
// [0, n) in order, for T query vectors sharing each load of v_j (the same operations per
// element as accumulate1, one query vector and one element at a time).
template <int T, int V, typename KV>
inline void pv_tile(float* const* acc, const float* corr, const float* const* e, const KV* v_cache,
                    const int64_t* rows_of, int64_t n, int64_t kv_stride, int64_t off, int64_t d0) {
  vf16 a[T][V];
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < V; ++q) {
      load16(acc[t] + d0 + 16 * q, &a[t][q]);
      a[t][q] = a[t][q] * corr[t];
    }
  for (int64_t j = 0; j < n; ++j) {
    const KV* vt = v_cache + rows_of[j] * kv_stride + off + d0;
    vf16 v[V];
    for (int q = 0; q < V; ++q) load16(vt + 16 * q, &v[q]);
    for (int t = 0; t < T; ++t) {
      const vf16 ej = vf16{} + e[t][j];
      for (int q = 0; q < V; ++q) madd16(&a[t][q], &ej, &v[q]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < V; ++q) __builtin_memcpy(acc[t] + d0 + 16 * q, &a[t][q], 64);
}

// pv_tile over all of head_dim for `cnt` <= T query vectors: chunks of 16 kPvChunk, then
// of 16, then one element at a time.
template <int T, typename KV>
inline void pv_rows(int cnt, float* const* acc, const float* corr, const float* const* e, const KV* v_cache,
                    const int64_t* rows_of, int64_t n, int64_t kv_stride, int64_t off, int64_t head_dim) {
  if constexpr (T > 1) {
    if (cnt < T) return pv_rows<T - 1, KV>(cnt, acc, corr, e, v_cache, rows_of, n, kv_stride, off, head_dim);
  }
  int64_t d0 = 0;
  for (; d0 + 16 * kPvChunk <= head_dim; d0 += 16 * kPvChunk)
    pv_tile<T, kPvChunk, KV>(acc, corr, e, v_cache, rows_of, n, kv_stride, off, d0);
  for (; d0 + 16 <= head_dim; d0 += 16) pv_tile<T, 1, KV>(acc, corr, e, v_cache, rows_of, n, kv_stride, off, d0);
  for (; d0 < head_dim; ++d0)
    for (int t = 0; t < T; ++t) accumulate1(acc[t] + d0, corr[t], e[t], v_cache, rows_of, n, kv_stride, off + d0);
}

// One thread's scratch for a work item (allocated once per call and thread).
struct TileScratch {
  float* qd;     // [kMaxTileQ][nch][16]: each q vector's 8-float chunks, twice
  float* s1;     // [kMaxTileQ][kKeyBlock / 4][16]: tree step 1 of each key quad
  float* sc;     // [kMaxTileQ][kKeyBlock]: scores, then exp(score - m)
  float* acc;    // [kMaxTileQ][head_dim]: unnormalized outputs
  void* zero;    // head_dim zero cache elements: the key of padding slots
};

// One work item: query vectors (row r_t, head h_t) for t < nq, all of one tile (rows of
// one sequence with the same key_begin kb and page table), over split c's keys. Each
// pair's result is what it would be computed alone: its own key range
// [kb + c kSplitKeys, min(key_end, kb + (c + 1) kSplitKeys)), blocks of kKeyBlock keys from
// kb, the same lane sums, softmax updates and value sums in the same order; the other
// pairs of the tile only share the loads of each key and value row.
template <typename KV>
inline void attend_tile(const float* q, int64_t q_stride, const KV* k_cache, const KV* v_cache, const int32_t* table,
                        int64_t kv_stride, int64_t kvh, int64_t head_dim, int64_t page_size, float scale,
                        const int64_t* rows, const int64_t* heads, const int64_t* k1_of, int64_t nq, int64_t k0,
                        const TileScratch& ws, float* m_out, float* l_out) {
  const int64_t nch = head_dim / 8, nv = nch * 8;
  const int64_t koff = kvh * head_dim;
  float m[kMaxTileQ], l[kMaxTileQ];
  int64_t k1 = k0;
  for (int64_t t = 0; t < nq; ++t) {
    const float* qh = q + rows[t] * q_stride + heads[t] * head_dim;
    float* qd = ws.qd + t * nch * 16;
    for (int64_t c = 0; c < nch; ++c)
      for (int i = 0; i < 16; ++i) qd[16 * c + i] = qh[8 * c + (i & 7)];
    for (int64_t d = 0; d < head_dim; ++d) ws.acc[t * head_dim + d] = 0.0f;
    m[t] = -__builtin_inff();
    l[t] = 0.0f;
    k1 = k1_of[t] > k1 ? k1_of[t] : k1;
  }
  const KV* kp[kKeyBlock];
  int64_t rows_of[kKeyBlock];
  int64_t act[kMaxTileQ];
  const float* qd_act[kMaxTileQ];
  float* s1_act[kMaxTileQ];
  const float* e_act[kMaxTileQ];
  float* acc_act[kMaxTileQ];
  float corr_act[kMaxTileQ];
  for (int64_t b0 = k0; b0 < k1; b0 += kKeyBlock) {
    const int64_t n = imin(kKeyBlock, k1 - b0);
    int64_t page = b0 / page_size, off = b0 % page_size;  // walked, not divided, per key
    for (int64_t j = 0; j < n; ++j) {
      rows_of[j] = static_cast<int64_t>(table[page]) * page_size + off;
      kp[j] = k_cache + rows_of[j] * kv_stride + koff;
      if (++off == page_size) {
        off = 0;
        ++page;
      }
    }
    const int64_t padded = (n + 15) / 16 * 16;  // whole groups of 16 keys for the tree
    for (int64_t j = n; j < padded; ++j) kp[j] = static_cast<const KV*>(ws.zero);
    // The pairs that still have keys in this block, and how many each has.
    int64_t na = 0, n_common = n;
    int64_t nk[kMaxTileQ];
    for (int64_t t = 0; t < nq; ++t) {
      const int64_t kt = imin(kKeyBlock, k1_of[t] - b0);
      if (kt <= 0) continue;
      nk[na] = kt;
      n_common = imin(n_common, kt);
      act[na] = t;
      qd_act[na] = ws.qd + t * nch * 16;
      s1_act[na] = ws.s1 + t * (kKeyBlock / 4) * 16;
      ++na;
    }
    // Scores: the lane sums kQkTile query vectors at a time, then the tree.
    for (int64_t g = 0; g < na; g += kQkTile) {
      const int cnt = static_cast<int>(imin(kQkTile, na - g));
      qk_rows<kQkTile, KV>(cnt, qd_act + g, nch, kp, s1_act + g, padded / 4);
    }
    for (int64_t a = 0; a < na; ++a) {
      const int64_t t = act[a];
      const float* s1 = s1_act[a];
      float* sc = ws.sc + t * kKeyBlock;
      for (int64_t u = 0; u < padded / 16; ++u) {
        vf16 p0, p1, p2, p3;
        load16(s1 + 64 * u, &p0);
        load16(s1 + 64 * u + 16, &p1);
        load16(s1 + 64 * u + 32, &p2);
        load16(s1 + 64 * u + 48, &p3);
        vf16 u01, u23, s;
        tree_step2(p0, p1, &u01);
        tree_step2(p2, p3, &u23);
        tree_step3(u01, u23, &s);
        __builtin_memcpy(sc + 16 * u, &s, 64);
      }
      if (nv < head_dim) {  // head_dim tails, added after the tree
        const float* qh = q + rows[t] * q_stride + heads[t] * head_dim;
        for (int64_t j = 0; j < nk[a]; ++j) {
          float s = sc[j];
          for (int64_t d = nv; d < head_dim; ++d) s = madd1(qh[d], kv_load(kp[j], d), s);
          sc[j] = s;
        }
      }
      const int64_t kt = nk[a];
      for (int64_t j = 0; j < padded; ++j) sc[j] = j < kt ? sc[j] * scale : -__builtin_inff();
      // The block's max 16 lanes at a time (a max is exact in any order).
      vf16 mv;
      load16(sc, &mv);
      for (int64_t u = 16; u < padded; u += 16) {
        vf16 x;
        load16(sc + u, &x);
        mv = mv < x ? x : mv;
      }
      float bm = mv[0];
      for (int i = 1; i < 16; ++i) bm = fmax(bm, mv[i]);
      const float m_new = fmax(m[t], bm);
      corr_act[a] = __builtin_expf(m[t] - m_new);  // 0 on the first block (m = -inf)
      exp_block(sc, m_new, padded);                // 0 past the pair's keys
      m[t] = m_new;
      e_act[a] = sc;
      acc_act[a] = ws.acc + t * head_dim;
    }
    // l = l * corr + e_j in ascending j, the pairs' sums side by side (independent chains).
    float lsum[kMaxTileQ];
    for (int64_t a = 0; a < na; ++a) lsum[a] = l[act[a]] * corr_act[a];
    for (int64_t j = 0; j < n_common; ++j)
      for (int64_t a = 0; a < na; ++a) lsum[a] += e_act[a][j];
    for (int64_t a = 0; a < na; ++a) {
      for (int64_t j = n_common; j < nk[a]; ++j) lsum[a] += e_act[a][j];
      l[act[a]] = lsum[a];
    }
    // Values: the keys every active pair has, kPvTile pairs sharing each value row; then
    // each pair's own last keys (acc * 1 is acc: the rescale happened once, above).
    for (int64_t g = 0; g < na; g += kPvTile) {
      const int cnt = static_cast<int>(imin(kPvTile, na - g));
      pv_rows<kPvTile, KV>(cnt, acc_act + g, corr_act + g, e_act + g, v_cache, rows_of, n_common, kv_stride, koff,
                           head_dim);
    }
    const float one = 1.0f;
    for (int64_t a = 0; a < na; ++a) {
      if (nk[a] == n_common) continue;
      const float* e_rest = e_act[a] + n_common;
      pv_rows<1, KV>(1, acc_act + a, &one, &e_rest, v_cache, rows_of + n_common, nk[a] - n_common, kv_stride, koff,
                     head_dim);
    }
  }
  for (int64_t t = 0; t < nq; ++t) {
    m_out[t] = m[t];
    l_out[t] = l[t];
  }
}

template <typename KV>
void attention_body(const float* q, int64_t q_stride, const KV* k_cache, const KV* v_cache, float* out,
                    int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                    int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t kv_stride = n_kv_heads * head_dim;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(head_dim));
  // Pairs per item: a group's heads in chunks of at most kMaxTileQ, and as many rows of
  // a tile as fit beside them.
  const int64_t chunk_heads = imin(group, kMaxTileQ);
  const int64_t chunks = (group + chunk_heads - 1) / chunk_heads;
  const int64_t tile_rows = imin(kTileRows, kMaxTileQ / chunk_heads);
  // Tiles: runs of up to tile_rows consecutive rows with the same key_begin and the same
  // pages over the keys they read (rows of one sequence); rows of no keys get none.
  int64_t* tile_first = static_cast<int64_t*>(std::malloc(static_cast<size_t>(rows + 1) * 8));
  int64_t* tile_items = static_cast<int64_t*>(std::malloc(static_cast<size_t>(rows + 1) * 8));
  int64_t* tile_splits = static_cast<int64_t*>(std::malloc(static_cast<size_t>(rows + 1) * 8));
  int64_t* part_at = static_cast<int64_t*>(std::malloc(static_cast<size_t>(rows + 1) * 8));
  int64_t tiles = 0, items = 0, parts = 0, keys = 0;
  for (int64_t r = 0; r < rows;) {
    int64_t nr = 1, max_end = key_end[r];
    while (key_end[r] > key_begin[r] && nr < tile_rows && r + nr < rows && key_begin[r + nr] == key_begin[r] &&
           key_end[r + nr] > key_begin[r + nr]) {
      const int64_t end = key_end[r + nr] > max_end ? key_end[r + nr] : max_end;
      bool same = true;
      for (int64_t p = key_begin[r] / page_size; p <= (end - 1) / page_size && same; ++p)
        for (int64_t i = 0; i < nr; ++i)
          same = same && page_table[(r + i) * max_pages + p] == page_table[(r + nr) * max_pages + p];
      if (!same) break;
      max_end = end;
      ++nr;
    }
    int64_t splits = 0;
    for (int64_t i = r; i < r + nr; ++i) {
      const int64_t n = key_end[i] - key_begin[i];
      const int64_t s = key_splits(n);
      splits = s > splits ? s : splits;
      keys += n > 0 ? n : 0;
      part_at[i] = parts;
      if (s > 1) parts += n_heads * s * (head_dim + 2);
    }
    tile_first[tiles] = r;
    tile_items[tiles] = items;
    tile_splits[tiles] = splits;
    items += n_kv_heads * chunks * splits;
    ++tiles;
    r += nr;
  }
  tile_first[tiles] = rows;
  tile_items[tiles] = items;
  int32_t* item_tile = static_cast<int32_t*>(std::malloc(static_cast<size_t>(items) * 4 + 4));
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t i = tile_items[t]; i < tile_items[t + 1]; ++i) item_tile[i] = static_cast<int32_t>(t);
  float* partial = parts > 0 ? static_cast<float*>(std::malloc(static_cast<size_t>(parts) * 4)) : nullptr;
  const int threads =
      keys * n_heads * head_dim < (int64_t{1} << 15) ? 1 : static_cast<int>(imin(num_threads(), items));
  const int64_t nch = head_dim / 8;

#pragma omp parallel num_threads(threads)
  {
    TileScratch ws;
    const size_t floats = static_cast<size_t>(kMaxTileQ * (nch * 16 + kKeyBlock / 4 * 16 + kKeyBlock + head_dim));
    float* mem = static_cast<float*>(std::malloc(floats * 4));
    ws.qd = mem;
    ws.s1 = ws.qd + kMaxTileQ * nch * 16;
    ws.sc = ws.s1 + kMaxTileQ * (kKeyBlock / 4) * 16;
    ws.acc = ws.sc + kMaxTileQ * kKeyBlock;
    ws.zero = std::calloc(static_cast<size_t>(head_dim + 16), sizeof(KV));
    int64_t q_rows[kMaxTileQ], q_heads[kMaxTileQ], q_k1[kMaxTileQ];
    float q_m[kMaxTileQ], q_l[kMaxTileQ];
    // Largest items first (the last tiles of a causal sequence have the most keys).
#pragma omp for schedule(dynamic, 1)
    for (int64_t idx = 0; idx < items; ++idx) {
      const int64_t it = items - 1 - idx;
      const int64_t tile = item_tile[it];
      const int64_t r0 = tile_first[tile], nr = tile_first[tile + 1] - r0, splits = tile_splits[tile];
      const int64_t local = it - tile_items[tile];
      const int64_t c = local % splits, hc = (local / splits) % chunks, kvh = local / splits / chunks;
      const int64_t kb = key_begin[r0], k0 = kb + c * kSplitKeys;
      const int64_t h0 = kvh * group + hc * chunk_heads, h1 = imin((kvh + 1) * group, h0 + chunk_heads);
      int64_t nq = 0;
      for (int64_t i = r0; i < r0 + nr; ++i) {
        if (key_end[i] <= k0) continue;  // this row has no keys in split c
        for (int64_t h = h0; h < h1; ++h) {
          q_rows[nq] = i;
          q_heads[nq] = h;
          q_k1[nq] = imin(key_end[i], k0 + kSplitKeys);
          ++nq;
        }
      }
      if (nq == 0) continue;
      attend_tile(q, q_stride, k_cache, v_cache, page_table + r0 * max_pages, kv_stride, kvh, head_dim, page_size,
                  scale, q_rows, q_heads, q_k1, nq, k0, ws, q_m, q_l);
      for (int64_t t = 0; t < nq; ++t) {
        const int64_t r = q_rows[t], h = q_heads[t];
        const int64_t rs = key_splits(key_end[r] - key_begin[r]);
        const float* acc = ws.acc + t * head_dim;
        if (rs > 1) {
          float* dst = partial + part_at[r] + (h * rs + c) * (head_dim + 2);
          dst[0] = q_m[t];
          dst[1] = q_l[t];
          for (int64_t d = 0; d < head_dim; ++d) dst[2 + d] = acc[d];
        } else {
          const float inv = 1.0f / q_l[t];
          float* oh = out + r * n_heads * head_dim + h * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) oh[d] = acc[d] * inv;
        }
      }
    }
    // Split rows: the splits' softmax states combined in split order (flash-decoding's
    // reduction): M = max m_c, out = sum_c exp(m_c - M) acc_c / sum_c exp(m_c - M) l_c.
    float* acc = ws.acc;
#pragma omp for schedule(static)
    for (int64_t pr = 0; pr < rows * n_heads; ++pr) {
      const int64_t r = pr / n_heads, h = pr % n_heads;
      const int64_t splits = key_splits(key_end[r] - key_begin[r]);
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
    std::free(ws.zero);
    std::free(mem);
  }
  std::free(partial);
  std::free(item_tile);
  std::free(part_at);
  std::free(tile_splits);
  std::free(tile_items);
  std::free(tile_first);
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


// softmax_stats (ops.h) on this path: the max of l[0, n) (16 lane maxima, then lanes in
// order; a NaN is skipped, the sum below turns it into NaN), then sum exp(l[j] - max)
// with exp_block's f32 exp widened to f64 and added into 16 lane sums (l[j] into lane
// j mod 16, the tail padded with -inf, whose exp is 0), the lanes added in order. Every
// step is element-wise or in a fixed order: the same bits on every path.
typedef double vd16 __attribute__((vector_size(128)));
double softmax_stats_impl(const float* l, int64_t n, float* max_out) {
  const float ninf = -__builtin_inff();
  vf16 mx = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf};
  const int64_t full = n / 16 * 16;
  for (int64_t j = 0; j < full; j += 16) {
    vf16 x;
    load16(l + j, &x);
    mx = mx < x ? x : mx;
  }
  float m = ninf;
  for (int i = 0; i < 16; ++i) m = m < mx[i] ? mx[i] : m;
  for (int64_t j = full; j < n; ++j) m = m < l[j] ? l[j] : m;
  *max_out = m;
  vd16 acc = {};
  float e[16];
  for (int64_t j = 0; j < n; j += 16) {
    if (j + 16 <= n) {
      __builtin_memcpy(e, l + j, 64);
    } else {
      for (int64_t i = 0; i < 16; ++i) e[i] = j + i < n ? l[j + i] : ninf;
    }
    exp_block(e, m, 16);
    vf16 ev;
    load16(e, &ev);
    acc += __builtin_convertvector(ev, vd16);
  }
  double sum = 0.0;
  for (int i = 0; i < 16; ++i) sum += acc[i];
  return sum;
}

}  // namespace linnet::cpu::LINNET_ATTENTION_NS
