// The CPU op set: kernels over raw pointers and sizes (they know no model structs and
// no ranks). GEMMs are kernels/cpu/gemm.h (weights f32, bf16 or f16); the rest are f32
// loops. Each kernel's math follows transformers' modeling_llama.py, cited per function.
#pragma once

#include <cstdint>

#include "kernels/cpu/gemm.h"

namespace linnet::cpu {

/// Vocab-parallel embedding lookup: out[i, :] = table[ids[i] - vocab_begin, :] when
/// vocab_begin <= ids[i] < vocab_begin + vocab_local, else zeros (the all_reduce after it
/// fills in the other ranks' rows). table [vocab_local, hidden], out [n, hidden].
void embedding_lookup(const float* table, int64_t vocab_begin, int64_t vocab_local, int64_t hidden,
                      const int32_t* ids, int64_t n, float* out);

/// RMSNorm (LlamaRMSNorm): out = x / sqrt(mean(x^2) + eps) * weight, per row.
/// x, out [rows, dim] (may alias), weight [dim].
void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps);

/// Rotary inverse frequencies, inv_freq[i] = 1 / theta^(2i / head_dim), i < head_dim/2,
/// computed in f32 as transformers' default rope init does. out [head_dim / 2].
void rope_inv_freq(double theta, int64_t head_dim, float* out);

/// Llama 3.1's rope scaling (rope_type "llama3", transformers' _compute_llama3_parameters)
/// applied in place to a plain inv_freq table [head_dim / 2]: with wavelength
/// w = 2 pi / f, low = original_max_position_embeddings / low_freq_factor and
/// high = original_max_position_embeddings / high_freq_factor:
///   w < high: f unchanged;  w > low: f / factor;
///   otherwise (1 - s) f / factor + s f with s = (orig / w - low_freq_factor) /
///   (high_freq_factor - low_freq_factor).
void rope_scale_llama3(float* inv_freq, int64_t n, double factor, double low_freq_factor,
                       double high_freq_factor, double original_max_position_embeddings);

/// RMSNorm of each head's head_dim slice, in place (Qwen3 q_norm / k_norm): for row r and
/// head h, x[r * row_stride + h * head_dim + i] is normalized over i < head_dim and scaled
/// by weight[i].
void rmsnorm_heads(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                   const float* weight, float eps);

/// RoPE in place, half-split layout (rotate_half in modeling_llama.py): for each row r,
/// head h, i < head_dim/2 with angle a = positions[r] * inv_freq[i]:
///   x[i] <- x[i] cos a - x[i + d/2] sin a;  x[i + d/2] <- x[i + d/2] cos a + x[i] sin a.
/// x [rows, row_stride] holding n_heads heads of head_dim from column 0.
void rope(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
          const int32_t* positions, const float* inv_freq);

/// SwiGLU (LlamaMLP): out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i], silu(g) =
/// g / (1 + exp(-g)) with a vectorized f32 exp (about 1 ulp; elementwise.cpp), the same
/// bits on every ISA path.
/// gate_up [rows, 2 * inter] ([gate | up]), out [rows, inter].
void swiglu(const float* gate_up, float* out, int64_t rows, int64_t inter);

/// Paged grouped-query attention of `rows` queries, each over its own range of its
/// sequence's keys. q [rows, q_stride] with n_heads heads of head_dim from column 0;
/// query r attends to the logical positions [key_begin[r], key_end[r]) of its sequence
/// (callers encode causality, sliding windows and packed documents in the ranges;
/// key_begin[r] < key_end[r]). Position p of query r's sequence is cache row
///   page_table[r * max_pages + p / page_size] * page_size + p % page_size
/// of k_cache / v_cache [cache rows, n_kv_heads, head_dim] (a contiguous cache is one
/// page per sequence: page_size = its length). q head h reads KV head
/// h / (n_heads / n_kv_heads). out [rows, n_heads * head_dim].
/// softmax(q k^T / sqrt(head_dim)) v in f32 (eager_attention_forward in modeling_llama.py;
/// paging as vLLM's PagedAttention).
void attention(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
               int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
               int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end);

/// attention over a bf16 cache (--kv-cache-dtype bf16): k_cache / v_cache hold bfloat16
/// bits in the same layout; each element is widened exactly where it is read, so the
/// result has the same bits as the f32 overload over a cache of those values.
void attention(const float* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache, float* out,
               int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
               int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end);

/// The softmax statistics of one row of logits l f32 [n] (the cross-entropy's, as
/// torch's log_softmax: log sum exp(l) = max + log(sum)): writes max(l) to *max_out and
/// returns sum_j exp(l[j] - max) in f64. The exp is attention's f32 one (at most 1.17
/// ulp from exp in double), summed in f64 over 16 lanes in a fixed order: the same bits
/// on every ISA path, for a row alone or in any batch. A NaN in l makes the sum NaN;
/// n = 0 gives max -inf and sum 0.
double softmax_stats(const float* l, int64_t n, float* max_out);

/// out[r, :] = src[index[r], :] for r < n, rows of `cols` floats.
void gather_rows(const float* src, int64_t cols, const int32_t* index, int64_t n, float* out);

/// x[i] += y[i] for i < n.
void add_inplace(float* x, const float* y, int64_t n);

}  // namespace linnet::cpu

namespace linnet::cpu {
/// Scatters rows into a cache: cache[positions[r] * row_elems + i] = src[r * src_stride + i]
/// for r < rows, i < row_elems.
void store_rows(const float* src, int64_t src_stride, float* cache, int64_t row_elems,
                const int32_t* positions, int64_t rows);
/// store_rows into a bf16 cache: each element rounded to bfloat16, nearest even
/// (common/float16.h float_to_bf16, as torch's .to(torch.bfloat16)).
void store_rows(const float* src, int64_t src_stride, uint16_t* cache, int64_t row_elems,
                const int32_t* positions, int64_t rows);
}  // namespace linnet::cpu
