#include "runtime/page_pool.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace linnet {

PagePool::PagePool(int64_t num_pages, int64_t page_size) : num_pages_(num_pages), page_size_(page_size) {
  if (num_pages <= 0 || page_size <= 0) {
    throw Error("the KV page pool needs pages", "--kv-cache-tokens", ">= one page of " + std::to_string(page_size),
                std::to_string(num_pages) + " pages");
  }
  pages_.resize(static_cast<size_t>(num_pages));
  // Handed out from the back: page 0 first.
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

void PagePool::hold(int32_t page) {
  Page& pg = pages_[page];
  if (pg.in_lru) {
    lru_.erase(pg.lru_it);
    pg.in_lru = false;
  }
  if (pg.refs++ == 0) stats_.peak_used_pages = std::max(stats_.peak_used_pages, ++used_);
}

void PagePool::forget(int32_t page) {
  Page& pg = pages_[page];
  if (pg.key) index_.erase(*pg.key);
  pg.key.reset();
  pg.reg_id = -1;
}

std::vector<int32_t> PagePool::match_prefix(std::span<const int32_t> tokens, int64_t max_tokens) {
  std::vector<int32_t> out;
  int64_t parent = -1;
  const int64_t limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  for (int64_t begin = 0; begin + page_size_ <= limit; begin += page_size_) {
    Key key{parent, std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + begin + page_size_)};
    const auto it = index_.find(key);
    if (it == index_.end()) break;
    out.push_back(it->second);
    parent = pages_[it->second].reg_id;
  }
  for (int32_t p : out) hold(p);
  stats_.prefix_hit_pages += static_cast<int64_t>(out.size());
  stats_.prefix_hit_tokens += static_cast<int64_t>(out.size()) * page_size_;
  return out;
}

std::optional<std::vector<int32_t>> PagePool::allocate(int64_t n) {
  if (n > available_pages()) return std::nullopt;
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < n) {
    int32_t p;
    if (!free_.empty()) {
      p = free_.back();
      free_.pop_back();
    } else {
      p = lru_.front();  // the cached page released longest ago
      forget(p);
      ++stats_.evicted_pages;
    }
    hold(p);
    out.push_back(p);
  }
  return out;
}

void PagePool::register_prefix(std::span<const int32_t> pages, std::span<const int32_t> tokens) {
  int64_t parent = -1;
  for (size_t i = 0; i < pages.size(); ++i) {
    const int64_t begin = static_cast<int64_t>(i) * page_size_;
    if (begin + page_size_ > static_cast<int64_t>(tokens.size())) break;
    Page& pg = pages_[pages[i]];
    if (pg.reg_id < 0) {
      Key key{parent, std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + begin + page_size_)};
      if (index_.count(key)) break;  // another page already stands for this prefix
      pg.reg_id = next_reg_id_++;
      pg.key = key;
      index_.emplace(std::move(key), pages[i]);
    }
    parent = pg.reg_id;
  }
}

void PagePool::unmatch(std::span<const int32_t> pages) {
  release(pages);
  stats_.prefix_hit_pages -= static_cast<int64_t>(pages.size());
  stats_.prefix_hit_tokens -= static_cast<int64_t>(pages.size()) * page_size_;
}

void PagePool::release(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    Page& pg = pages_[p];
    LINNET_CHECK(pg.refs > 0, "a KV page released more often than held");
    if (--pg.refs > 0) continue;
    --used_;
    if (pg.reg_id >= 0) {
      pg.lru_it = lru_.insert(lru_.end(), p);
      pg.in_lru = true;
    } else {
      free_.push_back(p);
    }
  }
}

}  // namespace linnet
