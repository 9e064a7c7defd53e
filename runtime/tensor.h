// Tensor: a shaped buffer owned by a backend (host or device memory). Handles share
// storage (copying a Tensor copies the handle, not the data), so a tied lm_head is the
// embedding's buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/dtype.h"

namespace linnet {

/// Where a tensor's storage lives.
enum class Device { kCpu, kCuda };

// A tensor's storage holds one DType (common/dtype.h). Activations and the KV cache are
// f32 on every backend (the CPU backend's KV cache bf16 with --kv-cache-dtype); weight
// matrices are f32, bf16 or f16 on the CPU backend (--weight-dtype) and bf16 on the CUDA
// backend; token ids, positions and page tables are i32.

/// Size from which Tensor::zeros maps its storage lazily: 32 MiB, glibc's largest mmap
/// threshold, so the per-pass activations below it keep reusing the heap (no fresh pages
/// to fault in every pass) and only what malloc would have mapped anyway - the KV pool,
/// big logits buffers - skips the zero-fill.
inline constexpr int64_t kLazyZeroBytes = int64_t{32} << 20;

/// This process's peak resident set size in bytes (getrusage), or -1.
int64_t peak_resident_bytes();

/// Bytes of one element of `dtype`.
int64_t element_size(DType dtype);

/// Row-major storage with a shape and an element type. Empty (numel 0, data nullptr)
/// when default constructed.
class Tensor {
 public:
  Tensor() = default;
  /// Zero-filled host tensor of `shape`. From kLazyZeroBytes up, the storage is an
  /// anonymous mapping whose pages are committed when first written (resident memory
  /// follows use: a KV pool costs what its used pages hold).
  /// @throws Error when the address space cannot be reserved.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::kF32);
  /// Host tensor of `shape` whose every 4-byte word holds `word` (zeros: 0; the CPU
  /// backend's Backend::empty: a quiet NaN's bits), written in one pass. The tail of a
  /// size that is not a multiple of 4 bytes is zero where a large tensor is mapped.
  static Tensor filled(std::vector<int64_t> shape, DType dtype, uint32_t word);
  /// Host i32 tensor holding `values` (shape [values.size()]).
  static Tensor from_i32(const std::vector<int32_t>& values);
  /// A tensor over `data`, kept alive by `storage` (a backend's allocation).
  static Tensor wrap(std::vector<int64_t> shape, DType dtype, Device device, std::shared_ptr<void> storage,
                     void* data);

  /// The storage as f32 (valid when dtype() is kF32).
  float* data() { return static_cast<float*>(data_); }
  const float* data() const { return static_cast<const float*>(data_); }
  /// The storage as i32 (valid when dtype() is kI32).
  int32_t* i32() { return static_cast<int32_t*>(data_); }
  const int32_t* i32() const { return static_cast<const int32_t*>(data_); }
  /// The storage, whatever its element type.
  void* raw() { return data_; }
  const void* raw() const { return data_; }

  const std::vector<int64_t>& shape() const { return shape_; }
  /// Size of dimension i (negative counts from the end).
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int64_t numel() const;
  int64_t bytes() const { return numel() * element_size(dtype_); }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  bool empty() const { return data_ == nullptr; }

 private:
  std::vector<int64_t> shape_;
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  Device device_ = Device::kCpu;
  DType dtype_ = DType::kF32;
};

}  // namespace linnet
