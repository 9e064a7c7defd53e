#include "runtime/tensor.h"

namespace linnet {

Tensor Tensor::zeros(std::vector<int64_t> shape) {
  Tensor t;
  t.shape_ = std::move(shape);
  auto buf = std::make_shared<std::vector<float>>(static_cast<size_t>(t.numel()), 0.0f);
  t.data_ = buf->data();
  t.storage_ = std::move(buf);
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

}  // namespace linnet
