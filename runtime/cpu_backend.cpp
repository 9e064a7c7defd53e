// CpuBackend: forwards the Backend ops to kernels/cpu. Everything lives in host memory
// as f32, so uploads of weights are the tensors themselves.
#include <algorithm>
#include <cstring>
#include <thread>

#include "kernels/cpu/ops.h"
#include "runtime/backend.h"

namespace linnet {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads) { cpu::set_num_threads(num_threads); }
  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "cpu"; }
  Tensor zeros(std::vector<int64_t> shape, ScalarType dtype) override { return Tensor::zeros(std::move(shape), dtype); }

  Tensor upload_matrix(const Tensor& host) override { return host; }
  Tensor upload_vector(const Tensor& host) override { return host; }
  Tensor upload_i32(std::span<const int32_t> values) override {
    return Tensor::from_i32(std::vector<int32_t>(values.begin(), values.end()));
  }
  void to_host(const Tensor& t, float* out) override {
    if (t.numel() > 0) std::memcpy(out, t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
  }

  void matmul_nt(const float* x, const Tensor& w, float* out, int64_t m, int64_t k, int64_t n) override {
    cpu::matmul_nt(x, w.data(), out, m, k, n);
  }
  void embedding_lookup(const Tensor& table, int64_t vocab_begin, int64_t vocab_local, int64_t hidden,
                        const int32_t* ids, int64_t n, float* out) override {
    cpu::embedding_lookup(table.data(), vocab_begin, vocab_local, hidden, ids, n, out);
  }
  void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
               float eps) override {
    cpu::rmsnorm(x, weight, out, rows, dim, eps);
  }
  void rope(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
            const int32_t* positions, const float* inv_freq) override {
    cpu::rope(x, rows, row_stride, n_heads, head_dim, positions, inv_freq);
  }
  void swiglu(const float* gate_up, float* out, int64_t rows, int64_t inter) override {
    cpu::swiglu(gate_up, out, rows, inter);
  }
  void attention(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, float* out,
                 int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                 int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end) override {
    cpu::attention(q, q_stride, k_cache, v_cache, out, rows, n_heads, n_kv_heads, head_dim, page_table, max_pages,
                   page_size, key_begin, key_end);
  }
  void rmsnorm_heads(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                     const float* weight, float eps) override {
    cpu::rmsnorm_heads(x, rows, row_stride, n_heads, head_dim, weight, eps);
  }
  void add_inplace(float* x, const float* y, int64_t n) override { cpu::add_inplace(x, y, n); }
  void store_rows(const float* src, int64_t src_stride, float* cache, int64_t row_elems,
                  const int32_t* slots, int64_t rows) override {
    cpu::store_rows(src, src_stride, cache, row_elems, slots, rows);
  }
  void gather_rows(const float* src, int64_t cols, const int32_t* index, int64_t n, float* out) override {
    cpu::gather_rows(src, cols, index, n, out);
  }
};

}  // namespace

int blas_threads_per_rank(int requested, int ranks_on_node) {
  if (requested > 0) return requested;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_on_node));
}

std::unique_ptr<Backend> make_cpu_backend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace linnet
