// safetensors reader: mmap the file, validate the header completely before any
// tensor is used, then hand out f32 copies of (slices of) tensors.
//
// Format (huggingface/safetensors): 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data area. Offsets are relative to the data area.
//
// Design choice: the mapping is lazy, so a rank that reads only its slice of a tensor
// only faults in those pages: "each rank reads only the bytes of its own slices".
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"

namespace linnet {

// The element types the loader accepts in a header: F32, F16, BF16, F8_E4M3 (read as
// f32, exactly, or narrowed), and I32 / I64 (the packed words, zero points and shapes of
// compressed-tensors checkpoints; read only as stored) (common/dtype.h); anything else
// is an error naming it.

/// out[i] = float_to_bf16(src[i]) (common/float16.h) (to == BF16) or float_to_half(src[i]) (to == F16),
/// i < n.
void narrow_f32(const float* src, int64_t n, DType to, uint16_t* out);

/// One tensor's header entry. begin/end are byte offsets into the data area.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major; empty = scalar
  uint64_t begin = 0;
  uint64_t end = 0;

  /// Product of shape (1 for a scalar).
  int64_t numel() const;
};

/// "[a, b, c]" for messages.
std::string shape_str(const std::vector<int64_t>& shape);

/// A rectangle of a 1-D or 2-D tensor: rows [row_begin, row_end) and columns
/// [col_begin, col_end). For a 1-D tensor only the column range is used (rows = 1).
struct Slice2D {
  int64_t row_begin = 0, row_end = 0;
  int64_t col_begin = 0, col_end = 0;
};

/// The tables of a validated safetensors header.
struct SafetensorsHeader {
  std::map<std::string, TensorInfo> tensors;    // by name
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty when absent)
  uint64_t header_bytes = 0;                    // N: the data area starts at byte 8 + N
};

/// Validates the start of a safetensors file held in memory: `file` is the whole file
/// (or at least its 8-byte length, the header and, for the range checks, the data area
/// it describes: every tensor must lie inside file.size() - 8 - N bytes). Reads nothing
/// outside `file`. `where` names the file in errors. What SafetensorsFile's constructor
/// runs on the mapped file.
/// @throws Error naming `where` for every header fault SafetensorsFile lists (too short,
///   header length over kMaxHeaderBytes or past the end, nesting, JSON, entries, dtypes,
///   sizes, ranges, overlaps, __metadata__, duplicate keys).
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, const std::string& where);

/// A validated, memory-mapped safetensors file. Move-only.
class SafetensorsFile {
 public:
  /// Maps `path` and validates its header.
  /// @throws Error naming the file when: it cannot be opened, is not a regular file
  ///   or is shorter than 8 bytes; the header length exceeds kMaxHeaderBytes or runs
  ///   past the end of the file; the header nests deeper than kMaxHeaderDepth or is
  ///   not a JSON object; an entry lacks dtype/shape/data_offsets or has
  ///   them of the wrong JSON type; a dtype is not F32/F16/BF16/F8_E4M3/I32/I64 (the error names the
  ///   tensor and dtype); prod(shape) * itemsize != end - begin; a range lies outside
  ///   the data area; two ranges overlap; __metadata__ is not a map of strings (the
  ///   error names the key); the header repeats a key, such as a tensor name
  ///   ("duplicate key ...", which JSON parsers would otherwise resolve to the last).
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MiB
  /// Nesting of a valid header: object > tensor entry > shape array is 3; one spare.
  static constexpr std::size_t kMaxHeaderDepth = 4;

  const std::filesystem::path& path() const { return path_; }
  /// All tensors, by name.
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  /// The string map under "__metadata__" (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// Copies `slice` of a 1-D or 2-D tensor into `out` as f32, row-major
  /// [rows, cols], converting F16/BF16. Reads only the bytes of the slice.
  /// @throws Error naming file and tensor when the slice is outside the shape or the
  ///   tensor has more than 2 dimensions.
  void read_f32(const TensorInfo& info, const Slice2D& slice, float* out) const;
  /// read_f32 into `out` as `out_dtype` (2 or 4 bytes an element): the file's own
  /// dtype is copied as stored; f32 from F16/BF16 exactly; BF16/F16 from another dtype
  /// rounded to nearest even (float_to_bf16 / float_to_half). I32 / I64 tensors are
  /// read as stored only.
  /// @throws Error naming file and tensor as read_f32 does, or when an integer tensor is
  ///   asked for as another dtype (or a float one as an integer).
  void read(const TensorInfo& info, const Slice2D& slice, DType out_dtype, void* out) const;

 private:
  std::filesystem::path path_;
  const std::byte* map_ = nullptr;
  std::size_t map_size_ = 0;
  const std::byte* data_ = nullptr;  // start of the data area
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace linnet
