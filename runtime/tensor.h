// Tensor: a shaped f32 buffer owned by a backend. Handles share storage (copying a
// Tensor copies the handle, not the data), so a tied lm_head is the embedding's buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace linnet {

/// Where a tensor's storage lives.
enum class Device { kCpu, kCuda };

/// Row-major f32 storage with a shape. Empty (numel 0, data nullptr) when default
/// constructed.
class Tensor {
 public:
  Tensor() = default;
  /// Zero-filled host tensor of `shape`.
  static Tensor zeros(std::vector<int64_t> shape);

  float* data() { return data_; }
  const float* data() const { return data_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  /// Size of dimension i (negative counts from the end).
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int64_t numel() const;
  Device device() const { return device_; }
  bool empty() const { return data_ == nullptr; }

 private:
  std::vector<int64_t> shape_;
  std::shared_ptr<void> storage_;
  float* data_ = nullptr;
  Device device_ = Device::kCpu;
};

}  // namespace linnet
