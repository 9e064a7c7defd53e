// CpuBackend: forwards the Backend ops to kernels/cpu. Everything lives in host memory;
// weight matrices in the backend's weight dtype (f32, bf16, f16, or int8 quantized at
// upload: --weight-dtype, --weight-group-size),
// everything else f32, so uploads of weights in that dtype are the tensors themselves.
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <thread>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/ops.h"
#include "loader/safetensors.h"
#include "runtime/backend.h"
#include "runtime/weights.h"

namespace linnet {
namespace {

// The dtype of weight matrix `w`: f32, bf16 or f16.
DType weight_type(const Tensor& w, const char* op) {
  if (w.dtype() == DType::kI32) throw Error("an i32 tensor is not a weight matrix", std::string("CpuBackend::") + op);
  return w.dtype();
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int num_threads, DType weight_dtype, DType kv_cache_dtype, int64_t weight_group_size)
      : weight_dtype_(weight_dtype), kv_cache_dtype_(kv_cache_dtype), group_size_(weight_group_size) {
    if (weight_dtype == DType::kI32) throw Error("i32 is not a weight dtype", "make_cpu_backend");
    if (weight_group_size < 1 || (weight_dtype == DType::kI4 && (weight_group_size % 2 != 0 || weight_group_size > 1024))) {
      throw Error("the weight group size must be at least 1 (int4: even, at most 1024)", "--weight-group-size",
                  weight_dtype == DType::kI4 ? "an even size in [2, 1024]" : ">= 1", std::to_string(weight_group_size));
    }
    if (kv_cache_dtype != DType::kF32 && kv_cache_dtype != DType::kBF16) {
      throw Error(std::string("the CPU KV cache is f32 or bf16, not ") + dtype_name(kv_cache_dtype),
                  "--kv-cache-dtype");
    }
    cpu::set_num_threads(num_threads);
  }
  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "cpu"; }
  Tensor zeros(std::vector<int64_t> shape, DType dtype) override { return Tensor::zeros(std::move(shape), dtype); }
  Tensor empty(std::vector<int64_t> shape, DType dtype) override {
    constexpr uint32_t kQuietNan = 0x7fc00000u;  // f32 quiet NaN
    return Tensor::filled(std::move(shape), dtype, dtype == DType::kF32 ? kQuietNan : 0u);
  }

  // Every matrix is held packed (kernels/cpu/gemm.h: panels of 16 output columns) in
  // the weight dtype; the Tensor keeps the logical shape [n, k].
  Tensor upload_matrix(const Tensor& host) override {
    if (host.shape().size() != 2) throw Error("a weight matrix must be 2-D", "CpuBackend::upload_matrix");
    if (is_quantized(host.dtype())) return host;  // packed already (a pre-quantized checkpoint: load_weights)
    if (is_quantized(weight_dtype_)) return upload_quantized(host, weight_dtype_);
    if (host.dtype() != weight_dtype_ && host.dtype() != DType::kF32) {
      throw Error("a weight matrix must be f32 or in the backend's weight dtype", "CpuBackend::upload_matrix",
                  "f32 or the --weight-dtype", "another dtype");
    }
    const int64_t n = host.dim(0), k = host.dim(1);
    Tensor src = host;
    if (host.dtype() != weight_dtype_) {  // f32 -> bf16 / f16, rounded to nearest even
      src = Tensor::zeros(host.shape(), weight_dtype_);
      narrow_f32(host.data(), host.numel(), weight_dtype_, static_cast<uint16_t*>(src.raw()));
    }
    const int64_t bytes = cpu::packed_elements(n, k) * element_size(weight_dtype_);
    auto storage = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>((bytes + 3) / 4));
    cpu::pack_weight(src.raw(), weight_type(src, "upload_matrix"), n, k, storage->data());
    void* data = storage->data();
    return Tensor::wrap(host.shape(), weight_dtype_, Device::kCpu, std::move(storage), data);
  }
  Tensor upload_vocab_matrix(const Tensor& host) override {
    if (host.shape().size() != 2) throw Error("a weight matrix must be 2-D", "CpuBackend::upload_vocab_matrix");
    if (is_quantized(weight_dtype_)) return upload_quantized(host, vocab_weight_dtype(weight_dtype_));
    return upload_matrix(host);
  }
  DType host_weight_dtype(DType stored) const override {
    if (!is_quantized(weight_dtype_)) return weight_dtype_;
    return stored == DType::kBF16 || stored == DType::kF16 ? stored : DType::kF32;
  }
  DType kv_cache_dtype() const override { return kv_cache_dtype_; }
  Tensor upload_vector(const Tensor& host) override { return host; }
  Tensor upload_i32(std::span<const int32_t> values) override {
    return Tensor::from_i32(std::vector<int32_t>(values.begin(), values.end()));
  }
  void to_host(const Tensor& t, float* out) override {
    if (t.numel() > 0) std::memcpy(out, t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
  }

  void matmul_nt(const float* x, const Tensor& w, float* out, int64_t m, int64_t k, int64_t n) override {
    cpu::matmul_nt_packed(x, w.raw(), weight_type(w, "matmul_nt"), out, m, k, n);
  }
  void embedding_lookup(const Tensor& table, int64_t vocab_begin, int64_t vocab_local, int64_t hidden,
                        const int32_t* ids, int64_t n, float* out) override {
    cpu::embedding_lookup_packed(table.raw(), weight_type(table, "embedding_lookup"), vocab_begin, vocab_local,
                                 hidden, ids, n, out);
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
  void attention(const float* q, int64_t q_stride, const Tensor& k_cache, const Tensor& v_cache, float* out,
                 int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                 int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end) override {
    check_cache(k_cache, "attention");
    check_cache(v_cache, "attention");
    if (kv_cache_dtype_ == DType::kBF16) {
      cpu::attention(q, q_stride, static_cast<const uint16_t*>(k_cache.raw()),
                     static_cast<const uint16_t*>(v_cache.raw()), out, rows, n_heads, n_kv_heads, head_dim,
                     page_table, max_pages, page_size, key_begin, key_end);
    } else {
      cpu::attention(q, q_stride, k_cache.data(), v_cache.data(), out, rows, n_heads, n_kv_heads, head_dim,
                     page_table, max_pages, page_size, key_begin, key_end);
    }
  }
  void rmsnorm_heads(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                     const float* weight, float eps) override {
    cpu::rmsnorm_heads(x, rows, row_stride, n_heads, head_dim, weight, eps);
  }
  void add_inplace(float* x, const float* y, int64_t n) override { cpu::add_inplace(x, y, n); }
  void store_rows(const float* src, int64_t src_stride, Tensor& cache, int64_t row_elems,
                  const int32_t* slots, int64_t rows) override {
    check_cache(cache, "store_rows");
    if (kv_cache_dtype_ == DType::kBF16) {
      cpu::store_rows(src, src_stride, static_cast<uint16_t*>(cache.raw()), row_elems, slots, rows);
    } else {
      cpu::store_rows(src, src_stride, cache.data(), row_elems, slots, rows);
    }
  }
  void gather_rows(const float* src, int64_t cols, const int32_t* index, int64_t n, float* out) override {
    cpu::gather_rows(src, cols, index, n, out);
  }

 private:
  // int8 / int4: the matrix widened to f32 (exactly) if it is not, then quantized and packed
  // (kernels/cpu/gemm.h: quantize_pack_weight).
  Tensor upload_quantized(const Tensor& host, DType dt) {
    const int64_t n = host.dim(0), k = host.dim(1);
    if (k % group_size_ != 0) {
      throw Error("the weight group size does not divide a matrix's input width " + std::to_string(k),
                  "--weight-group-size", "a divisor of " + std::to_string(k), std::to_string(group_size_));
    }
    std::vector<float> widened;
    const float* src = nullptr;
    if (host.dtype() == DType::kF32) {
      src = host.data();
    } else if (host.dtype() == DType::kBF16 || host.dtype() == DType::kF16) {
      widened.resize(static_cast<size_t>(host.numel()));
      cpu::widen_to_f32(host.raw(), host.dtype(), host.numel(), widened.data());
      src = widened.data();
    } else {
      throw Error("a weight matrix to quantize must be f32, bf16 or f16", "CpuBackend::upload_matrix", "",
                  dtype_name(host.dtype()));
    }
    const int64_t bytes = cpu::quantized_matrix_bytes(n, k, group_size_, dt);
    auto storage = std::make_shared<std::vector<uint64_t>>(static_cast<size_t>((bytes + 7) / 8));
    cpu::quantize_pack_weight(src, n, k, group_size_, storage->data(), dt);
    void* data = storage->data();
    return Tensor::wrap(host.shape(), dt, Device::kCpu, std::move(storage), data);
  }

  void check_cache(const Tensor& cache, const char* op) const {
    if (cache.dtype() != kv_cache_dtype_) {
      throw Error(std::string("a KV cache tensor in ") + dtype_name(cache.dtype()) + ", the backend's is " +
                      dtype_name(kv_cache_dtype_),
                  std::string("CpuBackend::") + op);
    }
  }

  DType weight_dtype_;
  DType kv_cache_dtype_;
  int64_t group_size_;
};

}  // namespace

int kernel_threads_per_rank(int requested, int ranks_on_node) {
  if (requested > 0) return requested;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks_on_node));
}

std::unique_ptr<Backend> make_cpu_backend(int num_threads, DType weight_dtype, DType kv_cache_dtype,
                                          int64_t weight_group_size) {
  return std::make_unique<CpuBackend>(num_threads, weight_dtype, kv_cache_dtype, weight_group_size);
}

// The host-memory default of Backend::argmax_rows (the CPU backend's): a scan per row.
void Backend::argmax_rows(const Tensor& logits, int64_t rows, int64_t ld, int64_t n_valid, float* value,
                          int32_t* index, int32_t* bad) {
  if (logits.device() != Device::kCpu) throw Error("argmax_rows of device memory needs its backend", name());
  LINNET_CHECK(rows >= 0 && n_valid >= 0 && n_valid <= ld && logits.numel() >= rows * ld, "argmax_rows shape");
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits.data() + r * ld;
    int32_t best = -1, first_bad = -1;
    for (int64_t j = 0; j < n_valid; ++j) {
      if (!std::isfinite(l[j])) {
        first_bad = static_cast<int32_t>(j);
        break;
      }
      if (best < 0 || l[j] > l[best]) best = static_cast<int32_t>(j);
    }
    value[r] = best >= 0 ? l[best] : -std::numeric_limits<float>::infinity();
    index[r] = best;
    bad[r] = first_bad;
  }
}

// The host-memory default of Backend::top_k_rows (the CPU backend's).
void Backend::top_k_rows(const Tensor& logits, int64_t ld, int64_t n_valid, int64_t k, float* values,
                         int32_t* index) {
  if (logits.device() != Device::kCpu) throw Error("top_k_rows of device memory needs its backend", name());
  if (k <= 0 || k > n_valid) {
    throw Error("top-k outside the vocabulary slice", "top_k_rows", "(0, " + std::to_string(n_valid) + "]",
                std::to_string(k));
  }
  const int64_t rows = logits.dim(0);
  LINNET_CHECK(n_valid <= ld && logits.numel() >= rows * ld, "top_k_rows shape");
  std::vector<int32_t> idx(static_cast<size_t>(n_valid));
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits.data() + r * ld;
    float* v = values + r * k;
    int32_t* ix = index + r * k;
    // NaN breaks the ordering: such a row gets padding (argmax_rows names it). +-inf (a
    // finite logit pushed past the f32 range by a penalty) is ordered as any value.
    if (std::any_of(l, l + n_valid, [](float x) { return std::isnan(x); })) {
      std::fill_n(v, k, -std::numeric_limits<float>::infinity());
      std::fill_n(ix, k, -1);
      continue;
    }
    for (int32_t j = 0; j < n_valid; ++j) idx[static_cast<size_t>(j)] = j;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int64_t c = 0; c < k; ++c) {
      ix[c] = idx[static_cast<size_t>(c)];
      v[c] = l[ix[c]];
    }
  }
}

// The host-memory default of Backend::apply_penalties (the CPU backend's).
void Backend::apply_penalties(Tensor& logits, int64_t ld, int64_t vocab_begin, int64_t n_valid,
                              std::span<const Penalty> penalties) {
  if (logits.device() != Device::kCpu) throw Error("apply_penalties on device memory needs its backend", name());
  for (const Penalty& p : penalties) {
    const int64_t col = static_cast<int64_t>(p.id) - vocab_begin;
    if (col < 0 || col >= n_valid) continue;
    LINNET_CHECK(p.row >= 0 && (p.row + 1) * ld <= logits.numel(), "apply_penalties row");
    float& l = logits.data()[p.row * ld + col];
    if (p.repetition != 1.0f) l = l < 0.0f ? l * p.repetition : l / p.repetition;
    if (p.subtract != 0.0f) l -= p.subtract;
  }
}

// The host-memory default of Backend::exp_sums (the CPU backend's).
void Backend::exp_sums(const Tensor& logits, int64_t ld, int64_t n_valid, std::span<const ExpSumRequest> requests,
                       ExpSum* out) {
  if (logits.device() != Device::kCpu) throw Error("exp_sums of device memory needs its backend", name());
  LINNET_CHECK(n_valid >= 0 && n_valid <= ld, "exp_sums shape");
  for (size_t j = 0; j < requests.size(); ++j) {
    const ExpSumRequest& q = requests[j];
    LINNET_CHECK(q.row >= 0 && (q.row + 1) * ld <= logits.numel(), "exp_sums row");
    const float* l = logits.data() + q.row * ld;
    ExpSum s;
    for (int64_t c = 0; c < n_valid; ++c) s.add(exp_sum_term(std::exp((static_cast<double>(l[c]) - q.max) / q.divisor)));
    out[j] = s;
  }
}

}  // namespace linnet
