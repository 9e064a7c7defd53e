#include "runtime/tensor.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"

namespace linnet {

int64_t element_size(DType dtype) { return static_cast<int64_t>(dtype_size(dtype)); }

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype) { return filled(std::move(shape), dtype, 0u); }

Tensor Tensor::filled(std::vector<int64_t> shape, DType dtype, uint32_t word) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  const int64_t bytes = t.numel() * element_size(dtype);
  if (bytes >= kLazyZeroBytes) {
    // Anonymous pages read as zero and are committed only when first written, so a
    // large KV pool takes resident memory as its pages are used, not at start-up.
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      throw Error("cannot reserve " + std::to_string(bytes) + " bytes of address space: " + std::strerror(errno),
                  "Tensor::filled");
    }
    const size_t len = static_cast<size_t>(bytes);
    t.storage_ = std::shared_ptr<void>(p, [len](void* q) { munmap(q, len); });
    t.data_ = p;
    if (word != 0) std::fill_n(static_cast<uint32_t*>(p), len / 4, word);
    return t;
  }
  // 4-byte words cover every element type and keep f32 / i32 data aligned.
  const int64_t words = (bytes + 3) / 4;
  auto buf = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(words), word);
  t.data_ = buf->data();
  t.storage_ = std::move(buf);
  return t;
}

int64_t peak_resident_bytes() {
  struct rusage u {};
  if (getrusage(RUSAGE_SELF, &u) != 0) return -1;
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux: KiB
}

Tensor Tensor::from_i32(const std::vector<int32_t>& values) {
  Tensor t = zeros({static_cast<int64_t>(values.size())}, DType::kI32);
  if (!values.empty()) std::memcpy(t.data_, values.data(), values.size() * sizeof(int32_t));
  return t;
}

Tensor Tensor::wrap(std::vector<int64_t> shape, DType dtype, Device device, std::shared_ptr<void> storage,
                    void* data) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::move(storage);
  t.data_ = data;
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

}  // namespace linnet
