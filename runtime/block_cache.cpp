#include "runtime/block_cache.h"

#include <new>
#include <utility>

namespace linnet {

BlockCache::BlockCache(Allocate allocate, Free free) : allocate_(std::move(allocate)), free_(std::move(free)) {}

BlockCache::~BlockCache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_locked();
}

size_t BlockCache::class_of(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  size_t top = 1;
  while (top < bytes && top <= (SIZE_MAX >> 1)) top <<= 1;  // the power of two >= bytes
  const size_t step = top / 16;                              // 8 steps between top / 2 and top
  return (bytes + step - 1) / step * step;
}

void* BlockCache::take(size_t bytes) {
  const size_t c = class_of(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cached_.find(c);
  if (it != cached_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= c;
    stats_.taken_bytes += c;
    ++stats_.reuses;
    taken_.emplace(p, c);
    return p;
  }
  void* p = allocate_(c);
  if (p == nullptr) {  // out of memory: give the cached blocks back and try once more
    release_locked();
    p = allocate_(c);
    if (p == nullptr) throw std::bad_alloc();
  }
  ++stats_.allocations;
  stats_.taken_bytes += c;
  taken_.emplace(p, c);
  return p;
}

void BlockCache::give(void* block) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = taken_.find(block);
  if (it == taken_.end()) return;  // not ours: nothing to do
  const size_t c = it->second;
  taken_.erase(it);
  stats_.taken_bytes -= c;
  stats_.cached_bytes += c;
  cached_[c].push_back(block);
}

void BlockCache::release() {
  std::lock_guard<std::mutex> lock(mu_);
  release_locked();
}

void BlockCache::release_locked() {
  for (auto& [c, blocks] : cached_) {
    for (void* p : blocks) free_(p);
  }
  cached_.clear();
  stats_.cached_bytes = 0;
  ++stats_.releases;
}

BlockCache::Stats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace linnet
