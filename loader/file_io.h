// file_io: opening the files of a model directory. Every loader opens its files here,
// so a FIFO, a directory or a device named config.json or model.safetensors is refused
// by name instead of blocking open() forever or failing deep inside a stream.
//
// Design choice: stat() the path before opening it (opening a FIFO blocks until a
// writer appears), then open non-blocking and fstat() again, so a file swapped in
// between is caught too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace linnet {

/// A regular file opened read-only; the descriptor is closed on destruction. Move-only.
class RegularFile {
 public:
  /// @param what  what the file is, for messages ("model config", "safetensors file").
  /// @throws Error naming `path` when it cannot be stat'ed or opened (with strerror),
  ///   or is not a regular file ("not a regular file", with its kind: directory, FIFO, ...).
  RegularFile(const std::filesystem::path& path, const char* what);
  ~RegularFile();
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&&) = delete;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  int fd() const { return fd_; }
  /// Size in bytes at open time.
  uint64_t size() const { return size_; }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// The whole content of the regular file `path`.
/// @throws Error naming `path` as RegularFile does, or when a read fails.
std::string read_text_file(const std::filesystem::path& path, const char* what);

}  // namespace linnet
