// Fuzz target: a safetensors file (8-byte header length, JSON header, data area).
//
// The bytes go through parse_safetensors_header (what SafetensorsFile runs on its
// mapping); a header it accepts must keep its promises (every tensor inside the data
// area with prod(shape) * itemsize bytes, no two overlapping), and then the same bytes
// are opened as a SafetensorsFile (through a memfd) and every 1-D / 2-D tensor is read
// whole and as an inner slice, in a dtype the input picks.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "loader/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

using namespace linnet;

namespace {

void check_promises(const SafetensorsHeader& h, uint64_t file_size) {
  const uint64_t data_size = file_size - 8 - h.header_bytes;
  std::vector<const TensorInfo*> order;
  for (const auto& [name, t] : h.tensors) {
    if (name != t.name) fuzz::fail("tensor '" + name + "' is listed as '" + t.name + "'");
    if (t.begin > t.end || t.end > data_size) fuzz::fail("tensor '" + name + "' lies outside the data area");
    uint64_t numel = 1;
    for (const int64_t d : t.shape) {
      if (d < 0) fuzz::fail("tensor '" + name + "' has a negative dimension");
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) fuzz::fail("numel overflows: " + name);
    }
    if (numel * dtype_size(t.dtype) != t.end - t.begin) fuzz::fail("tensor '" + name + "' has the wrong byte size");
    if (t.begin != t.end) order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < order.size(); ++i) {
    if (order[i]->begin < order[i - 1]->end) fuzz::fail("tensors overlap: " + order[i - 1]->name + ", " + order[i]->name);
  }
}

// Opens the bytes as a file and reads its tensors.
void read_tensors(const uint8_t* data, size_t size, const SafetensorsHeader& h) {
  const int fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) fuzz::fail("memfd_create failed");
  for (size_t done = 0; done < size;) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) fuzz::fail("write to the memfd failed");
    done += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const DType out_dtype = static_cast<DType>(size % 3);
  try {
    const SafetensorsFile file(path);
    if (file.tensors().size() != h.tensors.size()) fuzz::fail("the file and the in-memory parse disagree");
    for (const auto& [name, t] : file.tensors()) {
      if (t.shape.size() > 2) continue;
      const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
      const int64_t cols = t.shape.empty() ? 1 : t.shape.back();
      if (rows == 0 || cols == 0) continue;
      std::vector<uint8_t> out(static_cast<size_t>(rows * cols) * 4);
      file.read(t, Slice2D{0, rows, 0, cols}, out_dtype, out.data());
      const Slice2D inner{rows / 3, rows, cols / 4, cols - cols / 4};
      file.read(t, inner, out_dtype, out.data());
    }
  } catch (const Error& e) {
    // The same bytes parsed in memory were accepted: the file may only fail to open.
    close(fd);
    fuzz::fail(std::string("SafetensorsFile refused what parse_safetensors_header accepted: ") + e.what());
  }
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SafetensorsHeader h;
  try {
    h = parse_safetensors_header(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size),
                                 "fuzz.safetensors");
  } catch (const Error& e) {
    fuzz::refused(e);
    return 0;
  }
  check_promises(h, size);
  read_tensors(data, size, h);
  return 0;
}
