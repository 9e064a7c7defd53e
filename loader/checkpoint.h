// A Hugging Face checkpoint directory: model.safetensors, or
// model.safetensors.index.json + the shards its weight_map names.
//
// Design choice: every header of every shard is validated on open, and the model's
// whole tensor list is checked (presence, shape, dtype) before any weight is read,
// with all problems reported in one error.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loader/safetensors.h"

namespace linnet {

/// What the model needs of one checkpoint tensor: its shape and, by `dtypes`, its
/// element type (empty: a float, any of F32/F16/BF16, converted at load as needed).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<DType> dtypes = {};  // the accepted ones; empty = F32, F16 or BF16
};

/// The tensors of a checkpoint directory, across its shard files.
class Checkpoint {
 public:
  /// Opens `dir`: model.safetensors.index.json when present (every file its
  /// weight_map names must exist and hold the tensors mapped to it), else
  /// model.safetensors.
  /// @throws Error naming the directory/file when neither exists, the index JSON is
  ///   malformed or not a regular file, a weight_map file name is absolute, has a ".."
  ///   part or a NUL byte, a shard is missing, or any shard fails SafetensorsFile
  ///   validation.
  static Checkpoint open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }

  /// The tensor `name` and the file that holds it, or {nullptr, nullptr}.
  std::pair<const TensorInfo*, const SafetensorsFile*> find(std::string_view name) const;

  /// Checks every spec for presence, shape and dtype. Throws one Error that counts every problem and lists the
  /// first 20 (then "... and N more"), each with file, tensor, expected and actual
  /// shape (or dtype). Returns the names of checkpoint tensors no spec asked for (the caller lists
  /// them in a warning).
  std::vector<std::string> validate(const std::vector<TensorSpec>& specs) const;

  /// read_f32 of the file holding `name`.
  /// @throws Error naming the tensor when it is absent.
  void read_f32(std::string_view name, const Slice2D& slice, float* out) const;
  /// SafetensorsFile::read of the file holding `name`: the slice as `out_dtype`.
  /// @throws Error naming the tensor when it is absent.
  void read(std::string_view name, const Slice2D& slice, DType out_dtype, void* out) const;
  /// The dtype most of the checkpoint's bytes are stored in (F32 when it is empty): what
  /// --weight-dtype auto keeps.
  DType dominant_dtype() const;

  /// Bytes of tensor data copied out by read_f32 so far (the slices, in file dtype).
  uint64_t bytes_read() const { return bytes_read_; }
  /// Bytes of tensor data in the whole checkpoint.
  uint64_t total_bytes() const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const TensorInfo*, const SafetensorsFile*>, std::less<>> index_;
  mutable uint64_t bytes_read_ = 0;
};

}  // namespace linnet
