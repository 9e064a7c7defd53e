// Backend: the op set the decoder calls, over pointers into tensors the backend owns.
// The decoder (runtime/engine.cpp) is written once against this interface; CpuBackend
// forwards to kernels/cpu, CudaBackend (runtime/cuda_backend.cu, built when nvcc is
// found) to kernels/cuda. The math of each op is documented in kernels/cpu/ops.h.
//
// Memory: every pointer an op takes refers to this backend's memory (host for the CPU
// backend, the current device for CUDA). Activations are f32, the KV cache f32 or (CPU,
// --kv-cache-dtype) bf16; weight
// matrices are in the backend's weight dtype (f32, bf16 or f16 on CPU, bf16 on CUDA) and are passed
// as Tensors so an op can see their dtype; small i32 inputs (token ids, positions, page
// tables, key ranges) are uploaded once per pass with upload_i32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/error.h"
#include "runtime/exp_sum.h"
#include "runtime/tensor.h"

namespace linnet {

/// The decoder's ops. See the file comment for where each pointer must live.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  /// "cpu" or "cuda:N", for messages.
  virtual std::string name() const = 0;
  /// A zero-filled tensor on this backend's device.
  virtual Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::kF32) = 0;
  /// A tensor whose every element the caller writes before reading (the Engine's
  /// activations): CUDA leaves it unset (no memset per buffer per step); the CPU backend
  /// fills f32 ones with NaN, so a read before a write shows in every CPU test (the
  /// fill costs what the zeroing did); other dtypes are zeroed.
  virtual Tensor empty(std::vector<int64_t> shape, DType dtype = DType::kF32) = 0;

  /// A weight matrix (host [n, k] row-major, e.g. from load_weights) in this backend's
  /// weight dtype, memory and layout: the CPU backend converts an f32 one to its dtype
  /// (rounding to nearest even) and packs it into panels (kernels/cpu/gemm.h); CUDA
  /// keeps row-major bf16. Only the backend's own ops read the result.
  /// @throws Error for a dtype it cannot take.
  virtual Tensor upload_matrix(const Tensor& host) = 0;
  /// The embedding table or the lm_head ([vocab_local, hidden]): upload_matrix, except
  /// that the CPU backend holding int4 keeps them in int8 (vocab_weight_dtype).
  virtual Tensor upload_vocab_matrix(const Tensor& host) { return upload_matrix(host); }
  /// The dtype load_weights should read matrices in for upload_matrix, given the
  /// checkpoint's own (dominant) dtype `stored`: the CPU backend's weight dtype
  /// (--weight-dtype), or for int8 / int4 `stored` itself (f32, bf16 or f16: widened and
  /// quantized one matrix at a time, so the host copy is never wider than the file);
  /// f32 on CUDA (converted on the device).
  virtual DType host_weight_dtype(DType stored) const {
    (void)stored;
    return DType::kF32;
  }
  /// The dtype of the KV cache tensors the Engine makes on this backend (kv_cache.h):
  /// f32, or bf16 on the CPU backend with --kv-cache-dtype bf16.
  virtual DType kv_cache_dtype() const { return DType::kF32; }
  /// A weight vector (norm weights, rotary inverse frequencies; host f32) kept f32 in
  /// this backend's memory.
  virtual Tensor upload_vector(const Tensor& host) = 0;
  /// i32 values in this backend's memory, shape [values.size()].
  virtual Tensor upload_i32(std::span<const int32_t> values) = 0;
  /// Copies an f32 tensor of this backend into host memory `out` (t.numel() floats);
  /// waits for the work queued before it.
  virtual void to_host(const Tensor& t, float* out) = 0;

  /// out[m, n] = x[m, k] * w[n, k]^T. x, out f32; w a matrix from upload_matrix.
  virtual void matmul_nt(const float* x, const Tensor& w, float* out, int64_t m, int64_t k, int64_t n) = 0;
  /// Vocab-parallel lookup of `n` ids (i32, backend memory) in `table` [vocab_local,
  /// hidden] (a matrix from upload_matrix); rows of ids outside this slice are zero.
  virtual void embedding_lookup(const Tensor& table, int64_t vocab_begin, int64_t vocab_local, int64_t hidden,
                                const int32_t* ids, int64_t n, float* out) = 0;
  virtual void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
                       float eps) = 0;
  virtual void rope(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                    const int32_t* positions, const float* inv_freq) = 0;
  virtual void swiglu(const float* gate_up, float* out, int64_t rows, int64_t inter) = 0;
  /// Paged grouped-query attention (cpu::attention in kernels/cpu/ops.h): query r reads
  /// the keys at logical positions [key_begin[r], key_end[r]) of its sequence, position
  /// p living in cache row page_table[r * max_pages + p / page_size] * page_size +
  /// p % page_size of k_cache / v_cache (tensors in kv_cache_dtype()).
  virtual void attention(const float* q, int64_t q_stride, const Tensor& k_cache, const Tensor& v_cache, float* out,
                         int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                         const int32_t* page_table, int64_t max_pages, int64_t page_size,
                         const int32_t* key_begin, const int32_t* key_end) = 0;
  virtual void rmsnorm_heads(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                             const float* weight, float eps) = 0;
  virtual void add_inplace(float* x, const float* y, int64_t n) = 0;
  /// cache[slots[r] * row_elems + i] = src[r * src_stride + i] (slots i32, backend memory;
  /// `cache` in kv_cache_dtype(), a bf16 cache rounds to nearest even).
  virtual void store_rows(const float* src, int64_t src_stride, Tensor& cache, int64_t row_elems,
                          const int32_t* slots, int64_t rows) = 0;
  /// out[r, :] = src[index[r], :] for r < n; rows of `cols` floats (index i32, backend memory).
  virtual void gather_rows(const float* src, int64_t cols, const int32_t* index, int64_t n, float* out) = 0;

  /// Waits until the work queued on this backend has finished (for timing; a no-op on
  /// the CPU backend, whose ops return when done).
  /// @throws Error when queued work failed (a CUDA error, an aborted NCCL communicator).
  virtual void synchronize() {}
  /// Waits on the device so far (synchronize() calls, to_host's included) and the
  /// seconds spent in them: the host-side / device-side split of a step for `bench`.
  /// 0 on the CPU backend, whose ops return when done.
  virtual int64_t host_waits() const { return 0; }
  virtual double wait_seconds() const { return 0.0; }
  /// A weight matrix of `shape` in this backend's weight dtype and memory, element i =
  /// stddev * random_normal(seed, i) (common/random_normal.h), made where it lives: the
  /// CUDA backend fills it on the device, so an 8B-shaped model needs no host copy.
  /// Default (runtime/random_weights.cpp): filled on the host, then upload_matrix
  /// (upload_vocab_matrix when `vocab`).
  virtual Tensor random_matrix(std::vector<int64_t> shape, float stddev, uint64_t seed, bool vocab = false);

  // --- Recording and replaying queued work (CUDA graphs; optional) ---------------------
  // The Engine records a decode pass once per batch-size bucket and replays it (see
  // Engine's cuda_graphs). The CPU backend records nothing: supports_graphs() is false.

  /// Work recorded between begin_capture and end_capture; destroying it frees its arena.
  class Graph {
   public:
    virtual ~Graph() = default;
  };
  /// True when begin_capture / end_capture / replay work on this backend.
  virtual bool supports_graphs() const { return false; }
  /// Running total of the bytes this backend's ops have allocated (zeros, op
  /// workspaces; rounded as the capture arena rounds them): the difference across an
  /// eager pass is the arena its capture needs.
  virtual size_t allocated_bytes() const { return 0; }
  /// Starts recording: the work queued until end_capture is recorded, not run, and the
  /// memory allocated meanwhile (zeros, op workspaces) is carved from an arena of
  /// `arena_bytes` owned by the graph, so every address it records stays valid for the
  /// graph's lifetime (freeing a tensor from the arena frees nothing). Nothing may wait
  /// on the backend (synchronize, to_host) until end_capture.
  /// @throws Error when unsupported, or when already recording.
  virtual void begin_capture(size_t /*arena_bytes*/) { throw Error("this backend cannot record graphs", name()); }
  /// Ends the recording (also after an error inside it) and returns the graph.
  /// @throws Error naming the failed CUDA call when the recording is unusable.
  virtual std::unique_ptr<Graph> end_capture() { throw Error("this backend cannot record graphs", name()); }
  /// Queues the recorded work again, after the work queued before it.
  virtual void replay(Graph& /*graph*/) { throw Error("this backend cannot record graphs", name()); }
  /// Copies `values` into `dst` (i32, backend memory, at least values.size() elements),
  /// ordered after the work queued before it (the CUDA backend stages them in pinned
  /// memory, so the copy is truly asynchronous).
  virtual void copy_i32(std::span<const int32_t> values, Tensor& dst) {
    std::copy(values.begin(), values.end(), dst.i32());
  }

  /// The vocab-parallel cross-entropy pieces of each row of this rank's logits slice
  /// `logits` (this backend's memory, f32 [rows, ld]; Engine::lm_head_block), computed
  /// where the logits are, so only 3 numbers a row reach the host (Megatron's
  /// vocab_parallel_cross_entropy; the math of cuda::launch_cross_entropy_pieces): over
  /// columns < n_valid, row_max[r] = the max, sum_exp[r] = sum exp(l - row_max[r]) (f32
  /// sums), target_logit[r] = the logit of global id targets[r] when vocab_begin <=
  /// targets[r] < vocab_begin + n_valid, else 0. targets host i32 [rows]; the outputs host
  /// [rows]; one wait on the backend. The CPU backend has none (loss.cpp computes its rows
  /// on the host, cpu::softmax_stats).
  /// @throws Error on a backend without it, or as the backend's kernels.
  virtual void cross_entropy_rows(const Tensor& logits, int64_t ld, int64_t n_valid, int64_t vocab_begin,
                                  std::span<const int32_t> targets, float* row_max, float* sum_exp,
                                  float* target_logit) {
    (void)logits, (void)ld, (void)n_valid, (void)vocab_begin, (void)targets, (void)row_max, (void)sum_exp,
        (void)target_logit;
    throw Error("this backend computes the cross-entropy on the host", name() + " cross_entropy_rows");
  }
  /// Greedy picks of this rank's logits slice: for each of the `rows` rows of `logits`
  /// (this backend's memory, f32 [rows, ld]), over columns < n_valid: value[r] and
  /// index[r] = the max and its column (ties to the lower column; index -1 when
  /// n_valid == 0), and bad[r] = the first column holding NaN or +-inf, -1 when none
  /// (the picks of such a row are not used: the sampler refuses non-finite rows). Host
  /// outputs [rows]; one wait on the backend. The CPU backend reads the rows in place.
  virtual void argmax_rows(const Tensor& logits, int64_t rows, int64_t ld, int64_t n_valid, float* value,
                           int32_t* index, int32_t* bad);

  /// One penalty of Sampler::sample on one logit: row `row` of a logits slice, global
  /// vocabulary id `id`; `repetition` (1: none) as repetition_penalty (l < 0 ? l * p :
  /// l / p, in f32), then `subtract` (0: none) as presence + frequency x count.
  struct Penalty {
    int32_t row = 0;
    int32_t id = 0;
    float repetition = 1.0f;
    float subtract = 0.0f;
  };
  /// Applies `penalties` in place to this rank's logits slice `logits` (f32 [rows, ld],
  /// this backend's memory) for the ids in [vocab_begin, vocab_begin + n_valid), in the
  /// sampler's f32 operations, so the penalized values are bit-equal to Sampler::sample's.
  /// At most one entry per (row, id). The CPU backend writes the rows in place; CUDA
  /// uploads the entries and runs one thread per entry.
  virtual void apply_penalties(Tensor& logits, int64_t ld, int64_t vocab_begin, int64_t n_valid,
                               std::span<const Penalty> penalties);

  /// This rank's `k` best columns (< n_valid) of each row of `logits` (as
  /// cross_entropy_rows; rows = logits.dim(0)), by value descending, ties to the lower
  /// column: values f32 and column indices i32, host [rows, k]. 0 < k <= n_valid. The
  /// CPU backend reads the rows in place (a row holding NaN gets (-inf, -1) throughout:
  /// argmax_rows names it); CUDA runs cuda::launch_topk, which never picks -inf or NaN and
  /// returns column INT32_MAX where a row has fewer than k others (callers treat a column
  /// outside [0, n_valid) as padding).
  /// @throws Error when k is outside (0, n_valid].
  virtual void top_k_rows(const Tensor& logits, int64_t ld, int64_t n_valid, int64_t k, float* values,
                          int32_t* index);

  /// One softmax normalizer wanted of a logits slice: row `row`, the row's max over the
  /// whole vocabulary `max` (so every term is in [0, 1]) and the divisor (the
  /// temperature; 1 for log-probabilities).
  struct ExpSumRequest {
    int32_t row = 0;
    double max = 0.0;
    double divisor = 1.0;
  };
  /// For each request j, over columns < n_valid of row requests[j].row of this rank's
  /// logits slice `logits` (this backend's memory, f32 [rows, ld]): out[j] = the ExpSum
  /// (runtime/exp_sum.h) of exp((double(l) - max) / divisor), each term computed in
  /// double. The shards' partial sums add up, exactly, to the sampler's sum over the
  /// whole row (Sampler::sample_top's row_sum, Sampler::logprobs_top). Host outputs;
  /// one wait on the backend. The CPU backend reads the rows in place; CUDA runs
  /// cuda::launch_exp_sums (its exp may differ from the host's in the last bit).
  virtual void exp_sums(const Tensor& logits, int64_t ld, int64_t n_valid, std::span<const ExpSumRequest> requests,
                        ExpSum* out);
};

/// Kernel (OpenMP) threads per rank: `requested` when > 0, else the node's cores shared by its
/// `ranks_on_node` ranks (at least 1).
int kernel_threads_per_rank(int requested, int ranks_on_node);

/// Input elements per int8 scale when --weight-group-size is not given: 64 divides the
/// input widths of the target models at tp 1-8 (SmolLM2's 576 and its slices at tp 3
/// too, where 128 does not) and costs 4 / 64 bytes a weight for the scales (llama.cpp's
/// Q8_0: 2 / 32).
inline constexpr int64_t kDefaultWeightGroupSize = 64;

/// The same for int4: 32, as llama.cpp's k-quants' sub-blocks (SmolLM2-135M's
/// perplexity on real text: -0.1% against f32 at 32, +37% at 64).
inline constexpr int64_t kDefaultInt4GroupSize = 32;

/// --weight-group-size's default for `dtype`: kDefaultInt4GroupSize for kI4, else
/// kDefaultWeightGroupSize.
inline int64_t default_weight_group_size(DType dtype) {
  return dtype == DType::kI4 ? kDefaultInt4GroupSize : kDefaultWeightGroupSize;
}

/// Host backend: kernels/cpu with `num_threads` threads, weight matrices held in
/// `weight_dtype` (kF32, kBF16, kF16, or kI8 / kI4: quantized at upload with groups of
/// `weight_group_size` along the input width, kernels/cpu/gemm.h), the KV cache in
/// `kv_cache_dtype` (kF32 or kBF16); activations and sums stay f32.
/// @throws Error for another dtype, or a group size < 1.
std::unique_ptr<Backend> make_cpu_backend(int num_threads, DType weight_dtype = DType::kF32,
                                          DType kv_cache_dtype = DType::kF32,
                                          int64_t weight_group_size = kDefaultWeightGroupSize);

}  // namespace linnet
