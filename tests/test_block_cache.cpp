// BlockCache (runtime/block_cache.h), the CUDA backend's cache of freed device blocks, on
// host memory: after the first step's shapes, no step allocates; a size class is at most
// 12.5% above the request; out of memory releases the cache and retries once.
#include <cstdlib>
#include <map>
#include <new>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/block_cache.h"

namespace linnet {
namespace {

// malloc with a budget, counting live bytes: "out of memory" past the budget.
struct Heap {
  size_t budget = SIZE_MAX, live = 0;
  int64_t frees = 0;
  std::map<void*, size_t> blocks;
  BlockCache::Allocate allocate() {
    return [this](size_t n) -> void* {
      if (live + n > budget) return nullptr;
      void* p = std::malloc(n);
      live += n;
      blocks.emplace(p, n);
      return p;
    };
  }
  BlockCache::Free release() {
    return [this](void* p) {
      auto it = blocks.find(p);
      ASSERT_NE(it, blocks.end()) << "freed a block twice or one not made here";
      live -= it->second;
      blocks.erase(it);
      std::free(p);
      ++frees;
    };
  }
};

TEST(BlockCache, SizeClassesAreAtMostAnEighthAbove) {
  EXPECT_EQ(BlockCache::class_of(0), BlockCache::kMinBlock);
  EXPECT_EQ(BlockCache::class_of(512), 512u);
  EXPECT_EQ(BlockCache::class_of(513), 576u);  // 1024 / 16 = 64-byte steps
  EXPECT_EQ(BlockCache::class_of(1024), 1024u);
  EXPECT_EQ(BlockCache::class_of(1025), 1152u);
  for (size_t n = 1; n < (size_t{1} << 34); n = n * 3 + 7) {
    const size_t c = BlockCache::class_of(n);
    EXPECT_GE(c, n);
    EXPECT_LE(c, std::max<size_t>(BlockCache::kMinBlock, n + n / 8 + 1)) << n;
    EXPECT_EQ(BlockCache::class_of(c), c) << "a class is its own class";
  }
}

// The Engine's pattern: each step takes the same shapes and gives them back; only the
// first step allocates.
TEST(BlockCache, RepeatedStepsReuseEveryBlock) {
  Heap heap;
  {
    BlockCache cache(heap.allocate(), heap.release());
    const std::vector<size_t> step = {4096 * 4, 4096 * 4, 12288 * 4, 14336 * 8, 14336 * 4, 128256 * 4, 4096 * 4};
    for (int s = 0; s < 20; ++s) {
      std::vector<void*> taken;
      for (size_t n : step) taken.push_back(cache.take(n));
      EXPECT_EQ(std::set<void*>(taken.begin(), taken.end()).size(), taken.size()) << "a block handed out twice";
      for (void* p : taken) cache.give(p);
    }
    const BlockCache::Stats st = cache.stats();
    EXPECT_EQ(st.allocations, static_cast<int64_t>(step.size()));
    EXPECT_EQ(st.reuses, static_cast<int64_t>(19 * step.size()));
    EXPECT_EQ(st.taken_bytes, 0u);
    EXPECT_EQ(st.cached_bytes, heap.live);
    // A request of another size in the same class reuses too.
    void* p = cache.take(4096 * 4 - 100);
    EXPECT_EQ(cache.stats().allocations, static_cast<int64_t>(step.size()));
    cache.give(p);
  }
  EXPECT_TRUE(heap.blocks.empty()) << "the destructor frees every cached block";
}

TEST(BlockCache, OutOfMemoryReleasesTheCacheAndRetriesOnce) {
  Heap heap;
  heap.budget = 10000;
  BlockCache cache(heap.allocate(), heap.release());
  void* a = cache.take(4000);  // 4096
  void* b = cache.take(4000);
  cache.give(a);
  cache.give(b);
  EXPECT_EQ(cache.stats().cached_bytes, 8192u);
  // 6000 -> class 6144: does not fit beside the cached 8192; the cache is released.
  void* c = cache.take(6000);
  EXPECT_NE(c, nullptr);
  EXPECT_EQ(cache.stats().releases, 1);
  EXPECT_EQ(cache.stats().cached_bytes, 0u);
  EXPECT_EQ(heap.frees, 2);
  // Still no room: std::bad_alloc, and the block taken stays valid.
  EXPECT_THROW(cache.take(6000), std::bad_alloc);
  cache.give(c);
  cache.give(c);  // given twice: ignored
  cache.give(&heap);  // never taken: ignored
  EXPECT_EQ(cache.stats().cached_bytes, 6144u);
  cache.release();
  EXPECT_TRUE(heap.blocks.empty());
}

}  // namespace
}  // namespace linnet
