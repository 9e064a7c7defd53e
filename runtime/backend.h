// Backend: the op set the decoder calls, over pointers into tensors the backend owns.
// The decoder is written once against this interface; CpuBackend forwards to
// kernels/cpu (the CUDA backend, in its own issue, to kernels/cuda). Shapes and math
// of each op are documented in kernels/cpu/ops.h.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/tensor.h"

namespace linnet {

/// The decoder's ops. All pointers refer to memory of this backend's device.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  /// A zero-filled tensor on this backend's device.
  virtual Tensor zeros(std::vector<int64_t> shape) = 0;

  virtual void matmul_nt(const float* x, const float* w, float* out, int64_t m, int64_t k, int64_t n) = 0;
  virtual void embedding_lookup(const float* table, int64_t vocab_begin, int64_t vocab_local,
                                int64_t hidden, const int32_t* ids, int64_t n, float* out) = 0;
  virtual void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
                       float eps) = 0;
  virtual void rope(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                    const int32_t* positions, const float* inv_freq) = 0;
  virtual void swiglu(const float* gate_up, float* out, int64_t rows, int64_t inter) = 0;
  virtual void attention(const float* q, int64_t q_stride, const float* k, const float* v, float* out,
                         int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                         const int32_t* key_begin, const int32_t* key_end) = 0;
  virtual void rmsnorm_heads(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                             const float* weight, float eps) = 0;
  virtual void add_inplace(float* x, const float* y, int64_t n) = 0;
  virtual void store_rows(const float* src, int64_t src_stride, float* cache, int64_t row_elems,
                          const int32_t* positions, int64_t rows) = 0;
};

/// BLAS threads per rank: `requested` when > 0, else the node's cores shared by its
/// `ranks_on_node` ranks (at least 1).
int blas_threads_per_rank(int requested, int ranks_on_node);

/// f32 host backend: kernels/cpu with `num_threads` BLAS threads.
std::unique_ptr<Backend> make_cpu_backend(int num_threads);

}  // namespace linnet
