// safetensors reader: mmap + complete header validation + f32 slice copies.
//
// The header is untrusted input: every field is type-checked, every size is checked
// for overflow, and every range is checked against the data area and against the
// other ranges before the constructor returns. After that, read_f32 only has to check
// the caller's slice.
#include "loader/safetensors.h"
#include "common/float16.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "loader/file_io.h"
#include "loader/json_brief.h"

namespace linnet {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts are not supported");

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {

using nlohmann::json;

/// Converts `n` little-endian elements at `src` (any alignment) to f32.
void convert_to_f32(DType dtype, const std::byte* src, int64_t n, float* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, src, static_cast<std::size_t>(n) * 4);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = half_to_float(h);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        out[i] = bf16_to_float(b);
      }
      return;
    case DType::kF8E4M3:  // OCP FP8 e4m3fn: bias 7, no infinities, S.1111.111 is NaN; exact in f32
      for (int64_t i = 0; i < n; ++i) {
        const auto b = static_cast<uint8_t>(src[i]);
        const int e = (b >> 3) & 15, m = b & 7;
        const float mag = e == 15 && m == 7 ? std::numeric_limits<float>::quiet_NaN()
                          : e == 0          ? std::ldexp(static_cast<float>(m), -9)
                                            : std::ldexp(static_cast<float>(8 + m), e - 10);
        out[i] = (b & 0x80) ? -mag : mag;
      }
      return;
    case DType::kI32:
    case DType::kI64:
    case DType::kI8:
    case DType::kI4:
      break;  // integers are copied as stored only (convert)
  }
}

}  // namespace

void narrow_f32(const float* src, int64_t n, DType to, uint16_t* out) {
  const bool bf16 = to == DType::kBF16;
  for (int64_t i = 0; i < n; ++i) out[i] = bf16 ? float_to_bf16(src[i]) : float_to_half(src[i]);
}

namespace {

/// Converts `n` little-endian elements of `src` (dtype `from`, any alignment) into `out`
/// as dtype `to` (f32 widening exactly; narrowing rounds to nearest even).
void convert(DType from, const std::byte* src, int64_t n, DType to, void* out) {
  if (from == to) {
    std::memcpy(out, src, static_cast<std::size_t>(n) * dtype_size(to));
    return;
  }
  if (to == DType::kF32) return convert_to_f32(from, src, n, static_cast<float*>(out));
  float buf[1024];
  auto* dst = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; i += 1024) {
    const int64_t c = std::min<int64_t>(1024, n - i);
    convert_to_f32(from, src + static_cast<std::size_t>(i) * dtype_size(from), c, buf);
    narrow_f32(buf, c, to, dst + i);
  }
}

/// A JSON integer >= 0 (the parser stores those as unsigned) as uint64.
bool as_u64(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

/// Validates a JSON-parsed header against the data area and fills the tables.
/// Each failure names the file (where) and the tensor or key.
class HeaderParser {
 public:
  HeaderParser(const std::string& file, uint64_t data_size) : file_(file), data_size_(data_size) {}

  void parse(const json& header, std::map<std::string, TensorInfo>& tensors,
             std::map<std::string, std::string>& metadata) {
    if (!header.is_object())
      fail("safetensors header is not a JSON object", "a JSON object", header.type_name());
    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__") {
        parse_metadata(value, metadata);
        continue;
      }
      tensors.emplace(key, parse_entry(key, value));
    }
    check_overlaps(tensors);
  }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& expected = {},
                         const std::string& actual = {}) const {
    throw Error(what, file_, expected, actual);
  }

  void parse_metadata(const json& value, std::map<std::string, std::string>& metadata) const {
    if (!value.is_object())
      fail("__metadata__ is not a map of strings", "a JSON object", value.type_name());
    for (const auto& [k, v] : value.items()) {
      if (!v.is_string())
        fail("__metadata__ value '" + k + "' is not a string", "string", v.type_name());
      metadata.emplace(k, v.get<std::string>());
    }
  }

  TensorInfo parse_entry(const std::string& name, const json& entry) const {
    const std::string t = "tensor '" + name + "'";
    if (!entry.is_object())
      fail(t + ": header entry is not an object", "object", entry.type_name());
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(field)) fail(t + ": header entry lacks \"" + field + "\"");

    TensorInfo info;
    info.name = name;

    const json& dt = entry["dtype"];
    if (!dt.is_string()) fail(t + ": dtype is not a string", "string", dt.type_name());
    const std::string ds = dt.get<std::string>();
    if (ds == "F32") {
      info.dtype = DType::kF32;
    } else if (ds == "F16") {
      info.dtype = DType::kF16;
    } else if (ds == "BF16") {
      info.dtype = DType::kBF16;
    } else if (ds == "I32") {  // compressed-tensors' packed int4 / int8 words and zero points
      info.dtype = DType::kI32;
    } else if (ds == "I64") {  // compressed-tensors' weight_shape
      info.dtype = DType::kI64;
    } else if (ds == "F8_E4M3") {  // compressed-tensors' FP8 weights
      info.dtype = DType::kF8E4M3;
    } else {
      fail("unsupported dtype " + ds + " for " + t + "; supported: F32, F16, BF16, F8_E4M3, I32, I64");
    }

    const json& sh = entry["shape"];
    if (!sh.is_array()) fail(t + ": shape is not an array", "array of integers", sh.type_name());
    uint64_t numel = 1;
    bool overflow = false;
    for (const json& d : sh) {
      uint64_t v = 0;
      if (!as_u64(d, v))
        fail(t + ": shape has an entry that is not a non-negative integer",
             "non-negative integers", json_brief(sh));
      if (v > static_cast<uint64_t>(INT64_MAX))
        fail(t + ": shape dimension too large", "<= 2^63-1", json_brief(sh));
      info.shape.push_back(static_cast<int64_t>(v));
      overflow = overflow || __builtin_mul_overflow(numel, v, &numel);
    }

    const json& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !as_u64(off[0], info.begin) ||
        !as_u64(off[1], info.end))
      fail(t + ": data_offsets is not [begin, end] of non-negative integers",
           "[begin, end]", json_brief(off));
    if (info.begin > info.end)
      fail(t + ": data_offsets begin > end", "begin <= end", json_brief(off));

    const uint64_t item = dtype_size(info.dtype);
    uint64_t bytes = 0;
    overflow = overflow || __builtin_mul_overflow(numel, item, &bytes);
    if (overflow || bytes != info.end - info.begin)
      fail(t + ": byte size does not match dtype and shape " + shape_str(info.shape),
           (overflow ? std::string("an element count that fits in 64 bits")
                     : std::to_string(bytes) + " bytes (" + std::to_string(numel) + " x " + ds +
                           ")"),
           std::to_string(info.end - info.begin) + " bytes from data_offsets [" +
               std::to_string(info.begin) + ", " + std::to_string(info.end) + "]");
    if (info.end > data_size_)
      fail(t + ": data_offsets run past the data area",
           "end <= " + std::to_string(data_size_), "end " + std::to_string(info.end));
    return info;
  }

  void check_overlaps(const std::map<std::string, TensorInfo>& tensors) const {
    std::vector<const TensorInfo*> order;
    order.reserve(tensors.size());
    for (const auto& [name, info] : tensors)
      if (info.begin != info.end) order.push_back(&info);  // empty tensors own no bytes
    std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
      return a->begin < b->begin;
    });
    for (std::size_t i = 1; i < order.size(); ++i) {
      const TensorInfo& a = *order[i - 1];
      const TensorInfo& b = *order[i];
      if (b.begin < a.end)
        fail("data ranges of tensors '" + a.name + "' [" + std::to_string(a.begin) + ", " +
             std::to_string(a.end) + ") and '" + b.name + "' [" + std::to_string(b.begin) +
             ", " + std::to_string(b.end) + ") overlap");
    }
  }

  const std::string& file_;
  uint64_t data_size_;
};

}  // namespace

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, const std::string& where) {
  const uint64_t size = file.size();
  if (size < 8)
    throw Error("file too short for a safetensors header length", where, ">= 8 bytes",
                std::to_string(size) + " bytes");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  if (n > SafetensorsFile::kMaxHeaderBytes)
    throw Error("safetensors header length exceeds the cap", where,
                "<= " + std::to_string(SafetensorsFile::kMaxHeaderBytes) + " bytes", std::to_string(n) + " bytes");
  if (n > size - 8)
    throw Error("safetensors header runs past the end of the file", where,
                "8 + header length <= file size " + std::to_string(size), "8 + " + std::to_string(n));
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), n);
  // object > tensor entry > shape / data_offsets array; parsing deeper nesting only
  // costs memory (100 MiB of '[' is gigabytes of json nodes).
  check_json_text_depth(text, SafetensorsFile::kMaxHeaderDepth, where);
  json parsed;
  try {
    parsed = parse_json_unique_keys(text, where);
  } catch (const json::exception& e) {
    throw Error("safetensors header is not valid JSON", where, "a JSON object", e.what());
  }
  SafetensorsHeader header;
  header.header_bytes = n;
  HeaderParser(where, size - 8 - n).parse(parsed, header.tensors, header.metadata);
  return header;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const std::string file = path.string();
  uint64_t size = 0;
  void* p = MAP_FAILED;
  int map_errno = 0;
  {
    const RegularFile f(path, "safetensors file");
    size = f.size();
    if (size < 8)
      throw Error("file too short for a safetensors header length", file, ">= 8 bytes",
                  std::to_string(size) + " bytes");
    p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, f.fd(), 0);
    map_errno = errno;
  }  // the mapping keeps the file alive
  if (p == MAP_FAILED)
    throw Error(std::string("cannot mmap safetensors file: ") + std::strerror(map_errno), file);
  map_ = static_cast<const std::byte*>(p);
  map_size_ = size;

  try {
    SafetensorsHeader header = parse_safetensors_header(std::span<const std::byte>(map_, map_size_), file);
    data_ = map_ + 8 + header.header_bytes;
    tensors_ = std::move(header.tensors);
    metadata_ = std::move(header.metadata);
  } catch (...) {
    ::munmap(const_cast<std::byte*>(map_), map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), map_size_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (map_) ::munmap(const_cast<std::byte*>(map_), map_size_);
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    data_ = std::exchange(other.data_, nullptr);
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

void SafetensorsFile::read_f32(const TensorInfo& info, const Slice2D& slice, float* out) const {
  read(info, slice, DType::kF32, out);
}

void SafetensorsFile::read(const TensorInfo& info, const Slice2D& slice, DType out_dtype, void* out_raw) const {
  const std::string where = path_.string();
  const std::string t = "tensor '" + info.name + "'";
  auto* out = static_cast<std::byte*>(out_raw);
  const std::size_t out_item = dtype_size(out_dtype);
  if (info.shape.size() > 2)
    throw Error(t + ": read takes 1-D or 2-D tensors", where, "rank <= 2",
                "shape " + shape_str(info.shape));
  const bool int_in = info.dtype == DType::kI32 || info.dtype == DType::kI64;
  if ((int_in || out_dtype == DType::kI32 || out_dtype == DType::kI64) && out_dtype != info.dtype)
    throw Error(t + ": integer tensors are read as stored, floats as floats", where,
                safetensors_dtype_name(info.dtype), safetensors_dtype_name(out_dtype));
  // A 0-D tensor is read as one column; a 1-D one as one row.
  const int64_t rows = info.shape.size() == 2 ? info.shape[0] : 1;
  const int64_t cols = info.shape.empty() ? 1 : info.shape.back();
  const bool two_d = info.shape.size() == 2;
  const int64_t r0 = two_d ? slice.row_begin : 0;
  const int64_t r1 = two_d ? slice.row_end : 1;
  const int64_t c0 = slice.col_begin, c1 = slice.col_end;
  if (r0 < 0 || r0 > r1 || r1 > rows || c0 < 0 || c0 > c1 || c1 > cols)
    throw Error(t + ": slice outside the tensor", where,
                "rows within [0, " + std::to_string(rows) + "), cols within [0, " +
                    std::to_string(cols) + ")",
                "rows [" + std::to_string(r0) + ", " + std::to_string(r1) + "), cols [" +
                    std::to_string(c0) + ", " + std::to_string(c1) + ")");
  // The header promised this; a check here guards against a TensorInfo from elsewhere.
  LINNET_CHECK(info.end <= map_size_ && data_ + info.end <= map_ + map_size_,
               "tensor '" << info.name << "' is not from file " << where);

  const std::size_t item = dtype_size(info.dtype);
  const std::byte* base = data_ + info.begin;
  const int64_t n_cols = c1 - c0;
  if (n_cols == 0 || r1 == r0) return;
  if (c0 == 0 && c1 == cols) {
    // Whole rows are one contiguous run.
    convert(info.dtype, base + static_cast<std::size_t>(r0 * cols) * item, (r1 - r0) * cols, out_dtype, out);
  } else {
    for (int64_t r = r0; r < r1; ++r)
      convert(info.dtype, base + static_cast<std::size_t>(r * cols + c0) * item, n_cols, out_dtype,
              out + static_cast<std::size_t>((r - r0) * n_cols) * out_item);
  }
  // The copy is made: drop the mapped pages from this process's resident set (they stay
  // in the page cache), so loading peaks at the weights plus one tensor, not weights
  // plus the file. A page shared with a tensor still to be read faults back in.
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(base + static_cast<std::size_t>(r0 * cols + c0) * item) / page * page;
  const auto last = reinterpret_cast<uintptr_t>(base + static_cast<std::size_t>((r1 - 1) * cols + c1) * item);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace linnet
