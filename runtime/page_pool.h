// PagePool: host-side bookkeeping of the paged KV cache's pages (the pool itself lives
// in the Engine's KvCache): which pages are free, which are held by how many running
// sequences, and which full pages of prompt tokens can be shared by later prompts with
// the same prefix (vLLM's automatic prefix caching). Every rank of a tp group keeps an
// identical pool by making the same calls in the same order.
//
// Prefix identity is exact: a full page is registered under (its parent page's
// registration id, its page_size tokens), so two pages match only when the whole token
// prefix up to and including them is equal; no hash collision can share a wrong page.
// Registered pages nobody holds stay cached and are reused least-recently-released
// first when fresh pages run out.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace linnet {

/// Counters of a pool, for the run's stats.
struct PagePoolStats {
  int64_t prefix_hit_pages = 0;   // pages reused from the prefix cache (summed over requests)
  int64_t prefix_hit_tokens = 0;  // prompt tokens not recomputed thanks to them
  int64_t evicted_pages = 0;      // cached pages recycled for new content
  int64_t peak_used_pages = 0;    // most pages held by running sequences at once
};

/// Pages of one pool, handed out by index in [0, num_pages).
class PagePool {
 public:
  /// @throws Error when num_pages or page_size is not positive.
  PagePool(int64_t num_pages, int64_t page_size);

  int64_t num_pages() const { return num_pages_; }
  int64_t page_size() const { return page_size_; }
  /// Pages that allocate() can hand out now (free plus cached-but-unheld).
  int64_t available_pages() const { return static_cast<int64_t>(free_.size() + lru_.size()); }

  /// The registered pages covering the longest prefix of `tokens` made of whole pages,
  /// at most `max_tokens` tokens; each returned page is held once more (release it).
  std::vector<int32_t> match_prefix(std::span<const int32_t> tokens, int64_t max_tokens);
  /// `n` fresh pages, each held once, or nullopt (nothing changed) when fewer are available.
  std::optional<std::vector<int32_t>> allocate(int64_t n);
  /// Registers full pages of a sequence for sharing once their K/V are written: page i of
  /// `pages` holds tokens[i * page_size, (i + 1) * page_size). Pages already registered
  /// (matched ones) are kept; registration stops at the first page another page with the
  /// same prefix already stands for.
  void register_prefix(std::span<const int32_t> pages, std::span<const int32_t> tokens);
  /// Drops one hold on each page; unheld registered pages become reusable cache.
  void release(std::span<const int32_t> pages);
  /// Gives back what match_prefix returned when the request could not be admitted after
  /// all: releases the pages and takes them out of the hit counters.
  void unmatch(std::span<const int32_t> pages);

  const PagePoolStats& stats() const { return stats_; }

 private:
  using Key = std::pair<int64_t, std::vector<int32_t>>;  // (parent registration id, page tokens)
  struct Page {
    int32_t refs = 0;
    int64_t reg_id = -1;                       // registration id, -1 when unregistered
    std::optional<Key> key;                    // where it is in index_
    std::list<int32_t>::iterator lru_it;       // valid when cached and unheld
    bool in_lru = false;
  };
  void hold(int32_t page);
  void forget(int32_t page);  // unregisters a page about to be overwritten

  int64_t num_pages_, page_size_;
  std::vector<Page> pages_;
  std::vector<int32_t> free_;       // never-registered (or forgotten) unheld pages
  std::list<int32_t> lru_;          // registered unheld pages, least recently released first
  std::map<Key, int32_t> index_;    // registered pages by prefix identity
  int64_t next_reg_id_ = 0;
  int64_t used_ = 0;
  PagePoolStats stats_;
};

}  // namespace linnet
