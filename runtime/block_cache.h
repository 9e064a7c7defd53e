// BlockCache: the CUDA backend's cache of freed device blocks, so that after the first
// steps no pass allocates from the driver or the pool at all (PyTorch's caching allocator
// idea, reduced to what one stream needs).
//
// Design choice: blocks are cached by size class (8 classes per power of two, so a block
// is at most 12.5% larger than asked; at least 512 bytes) and handed out again whole, never
// split: an engine's passes ask for the same few shapes step after step. Every block is
// used on one stream, so a block given back while queued kernels still use it can be
// taken again at once: the kernels of its next user are queued after them (the rule
// cudaMallocAsync itself applies within a stream). When the allocator reports no memory,
// the cache frees every cached block and tries once more. Host code only: the allocate /
// free functions are the caller's (cudaMallocAsync / cudaFreeAsync on its stream), so
// tests/test_block_cache.cpp runs it here with malloc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace linnet {

class BlockCache {
 public:
  /// Returns a new block of at least `bytes` bytes, or nullptr when out of memory.
  using Allocate = std::function<void*(size_t bytes)>;
  /// Frees a block Allocate returned.
  using Free = std::function<void(void*)>;

  BlockCache(Allocate allocate, Free free);
  /// Frees every cached block (blocks still taken are the caller's to give back first).
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  /// The size class of a request: `bytes` rounded up to one of 8 steps per power of
  /// two, at least kMinBlock.
  static size_t class_of(size_t bytes);
  static constexpr size_t kMinBlock = 512;

  /// A block of class_of(bytes) bytes: a cached one when there is one, else a new one;
  /// when Allocate reports no memory, every cached block is freed and it tries again.
  /// @throws std::bad_alloc when there is still none.
  void* take(size_t bytes);
  /// Gives a block from take() back to the cache. Thread-safe.
  void give(void* block);
  /// Frees every cached block (not the ones taken).
  void release();

  /// What it holds, for tests and the --verbose line.
  struct Stats {
    int64_t allocations = 0;  ///< calls of Allocate that returned a block
    int64_t reuses = 0;       ///< take() served from the cache
    int64_t releases = 0;     ///< release() calls, out-of-memory retries included
    size_t cached_bytes = 0;  ///< in cached blocks now
    size_t taken_bytes = 0;   ///< in blocks taken and not given back
  };
  Stats stats() const;

 private:
  void release_locked();

  Allocate allocate_;
  Free free_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> cached_;  // by class
  std::unordered_map<void*, size_t> taken_;      // block -> class
  Stats stats_;
};

}  // namespace linnet
