// The CUDA op set: kernels over raw device pointers and sizes (no model structs, no
// ranks), each with a host launcher `launch_xxx(..., cudaStream_t)` that queues it on
// the stream and checks the launch. Storage: weight matrices bf16, activations f32, the
// KV cache bf16 or f32; every reduction (norms, softmax, dot products) accumulates in f32. The
// math of each op is that of its CPU twin in kernels/cpu/ops.h (which cites
// transformers' modeling_llama.py); tests/test_cuda_kernels.cpp compares the two.
// GEMMs are in kernels/cuda/gemm.h (cuBLASLt).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace linnet::cuda {

/// f32 -> bf16 (round to nearest even), n elements.
void launch_f32_to_bf16(const float* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream);
/// bf16 -> f32 (exact), n elements.
void launch_bf16_to_f32(const __nv_bfloat16* in, float* out, int64_t n, cudaStream_t stream);
/// out[i] = bf16(stddev * random_normal(seed, i)) for i < n (common/random_normal.h):
/// random weights made on the device, no host buffer.
void launch_fill_normal_bf16(__nv_bfloat16* out, int64_t n, uint64_t seed, float stddev, cudaStream_t stream);

/// Vocab-parallel embedding lookup (cpu::embedding_lookup): out[i, :] = f32(table[ids[i] -
/// vocab_begin, :]) for ids inside [vocab_begin, vocab_begin + vocab_local), else zeros.
/// table bf16 [vocab_local, hidden], ids i32 [n], out f32 [n, hidden].
void launch_embedding_lookup(const __nv_bfloat16* table, int64_t vocab_begin, int64_t vocab_local, int64_t hidden,
                             const int32_t* ids, int64_t n, float* out, cudaStream_t stream);

/// RMSNorm (cpu::rmsnorm): out = x / sqrt(mean(x^2) + eps) * weight per row, f32.
/// x, out [rows, dim] (may alias), weight f32 [dim].
void launch_rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps,
                    cudaStream_t stream);
/// Per-head RMSNorm in place (cpu::rmsnorm_heads; Qwen3 q_norm / k_norm): head h of row
/// r is x[r * row_stride + h * head_dim, +head_dim), scaled by weight f32 [head_dim].
void launch_rmsnorm_heads(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                          const float* weight, float eps, cudaStream_t stream);

/// RoPE in place, half-split layout (cpu::rope): angle positions[r] * inv_freq[i] formed
/// in f32, its cos / sin in f64 as the CPU kernel does. x f32 [rows, row_stride] with
/// n_heads heads of head_dim from column 0; positions i32 [rows]; inv_freq f32 [head_dim/2].
void launch_rope(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                 const int32_t* positions, const float* inv_freq, cudaStream_t stream);

/// SwiGLU (cpu::swiglu): out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i].
/// gate_up f32 [rows, 2 * inter], out f32 [rows, inter].
void launch_swiglu(const float* gate_up, float* out, int64_t rows, int64_t inter, cudaStream_t stream);

/// x[i] += y[i], i < n, f32.
void launch_add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream);
/// cache[slots[r] * row_elems + i] = src[r * src_stride + i] (cpu::store_rows); f32,
/// slots i32 [rows].
void launch_store_rows(const float* src, int64_t src_stride, float* cache, int64_t row_elems, const int32_t* slots,
                       int64_t rows, cudaStream_t stream);
/// The same into a bf16 cache (--kv-cache-dtype bf16): each element rounded to bfloat16,
/// nearest even, as cpu::store_rows into a bf16 cache.
void launch_store_rows(const float* src, int64_t src_stride, __nv_bfloat16* cache, int64_t row_elems,
                       const int32_t* slots, int64_t rows, cudaStream_t stream);
/// out[r, :] = src[index[r], :] for r < n, rows of `cols` f32 (cpu::gather_rows).
void launch_gather_rows(const float* src, int64_t cols, const int32_t* index, int64_t n, float* out,
                        cudaStream_t stream);

/// Paged grouped-query attention (cpu::attention; same arguments, device memory): query r
/// attends to logical positions [key_begin[r], key_end[r]) of its sequence, position p at
/// cache row page_table[r * max_pages + p / page_size] * page_size + p % page_size of
/// k_cache / v_cache f32 [cache rows, n_kv_heads, head_dim]; q f32 [rows, q_stride], out
/// f32 [rows, n_heads * head_dim]. One thread block per (query row, KV head, key split)
/// serves all n_heads / n_kv_heads q heads of that KV head (GQA: each K/V row is read
/// once per group), walking its keys in tiles with the f32 online softmax of
/// FlashAttention (Dao et al. 2022); with splits > 1 (flash-decoding: few rows, long
/// caches) each split writes a partial (max, sum, unnormalized output) to `workspace`
/// and a second kernel combines them. The same kernel serves prefill (many rows, causal
/// or windowed ranges, packed documents) and decode (one row per sequence, each its own
/// length). Requires head_dim <= 256 and (n_heads / n_kv_heads) * head_dim <= 2048.
/// @throws Error on unsupported sizes or a failed launch.
void launch_attention(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
                      int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                      int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end,
                      int splits, float* workspace, cudaStream_t stream);
/// The same over a bf16 cache (k_cache / v_cache __nv_bfloat16, each element widened to
/// f32 exactly; the math f32 as above), as cpu::attention over a bf16 cache.
void launch_attention(const float* q, int64_t q_stride, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                      float* out, int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                      const int32_t* page_table, int64_t max_pages, int64_t page_size, const int32_t* key_begin,
                      const int32_t* key_end, int splits, float* workspace, cudaStream_t stream);
/// Key splits per (row, KV head) for launch_attention: enough blocks to fill
/// 2 * num_sms multiprocessors, at most one split per 64 of the `max_keys` (an upper
/// bound of any row's range, e.g. max_pages * page_size) and at most 64.
int attention_num_splits(int64_t rows, int64_t n_kv_heads, int64_t max_keys, int num_sms);
/// f32 elements of launch_attention's workspace for `splits` (0 when splits == 1).
size_t attention_workspace_floats(int64_t rows, int64_t n_heads, int64_t head_dim, int splits);

/// Per-row argmax over the first n_valid columns of logits f32 [rows, ld] (padding
/// columns past n_valid are never chosen); ties go to the lowest index. out_value f32
/// [rows], out_index i32 [rows] (column index).
void launch_argmax(const float* logits, int64_t rows, int64_t ld, int64_t n_valid, float* out_value,
                   int32_t* out_index, cudaStream_t stream);
/// Per row of logits f32 [rows, ld]: the first column < n_valid holding NaN or +-inf,
/// -1 when none; out i32 [rows]. (The greedy path refuses such rows as the sampler does.)
void launch_first_nonfinite(const float* logits, int64_t rows, int64_t ld, int64_t n_valid, int32_t* out,
                            cudaStream_t stream);
/// Softmax normalizers of rows of a logits slice f32 [rows, ld] (Backend::exp_sums):
/// request j is entries[5 j .. 5 j + 4] = row, the f64 bits (low word, high word) of the
/// row's max and of the divisor; out[2 j], out[2 j + 1] = the low and high words of the
/// 128-bit sum over columns < n_valid of floor(min(t, 1) * 2^62), t = exp((l - max) /
/// divisor) in f64 (runtime/exp_sum.h's ExpSum, whatever the order of the columns).
void launch_exp_sums(const float* logits, int64_t ld, int64_t n_valid, const int32_t* entries, int64_t n,
                     unsigned long long* out, cudaStream_t stream);
/// The sampler's penalties in place on a logits slice f32 [rows, ld] (Backend::
/// apply_penalties): entry i is entries[4 i .. 4 i + 3] = row, global id, the f32 bits
/// of the repetition factor (1: none; l < 0 ? l * p : l / p) and of the subtraction
/// (0: none), applied to column id - vocab_begin when inside [0, n_valid); IEEE f32
/// operations, as the host sampler's. At most one entry per (row, id).
void launch_apply_penalties(float* logits, int64_t ld, int64_t vocab_begin, int64_t n_valid, const int32_t* entries,
                            int64_t n, cudaStream_t stream);
/// Per-row top-k over the first n_valid columns, sorted by value descending (ties: lower
/// index first): out_value f32 [rows, k], out_index i32 [rows, k]. A rank's candidates
/// for distributed top-k sampling (gather k per rank, not the vocabulary). `workspace`
/// f32 [rows * n_valid]. k <= n_valid.
void launch_topk(const float* logits, int64_t rows, int64_t ld, int64_t n_valid, int64_t k, float* workspace,
                 float* out_value, int32_t* out_index, cudaStream_t stream);
/// Top-p (nucleus) over candidates sorted descending, values f32 [rows, k]: probs[r, j] =
/// softmax(values[r] / temperature)[j] renormalized over the smallest prefix whose mass
/// reaches top_p, 0 past it (transformers' TopPLogitsWarper keeps the token crossing p).
void launch_top_p(const float* values, int64_t rows, int64_t k, float temperature, float top_p, float* probs,
                  cudaStream_t stream);

/// Vocab-parallel cross-entropy pieces of each row of this rank's logits slice f32
/// [rows, ld] (Megatron's vocab_parallel_cross_entropy): over columns < n_valid,
/// row_max[r] = max, sum_exp[r] = sum exp(l - row_max[r]), target_logit[r] = the logit of
/// global id targets[r] when vocab_begin <= targets[r] < vocab_begin + n_valid, else 0.
/// Combining ranks: M = all_reduce_max(row_max); S = all_reduce_sum(sum_exp *
/// exp(row_max - M)); T = all_reduce_sum(target_logit); nll = log S + M - T.
void launch_cross_entropy_pieces(const float* logits, int64_t rows, int64_t ld, int64_t n_valid, int64_t vocab_begin,
                                 const int32_t* targets, float* row_max, float* sum_exp, float* target_logit,
                                 cudaStream_t stream);

}  // namespace linnet::cuda
