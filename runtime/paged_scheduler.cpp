#include "runtime/paged_scheduler.h"

#include <algorithm>

#include "common/error.h"

namespace linnet {

PagedScheduler::PagedScheduler(PagePool& pool, int64_t max_batch, int64_t max_seq_len, int64_t token_budget,
                               bool prefix_caching)
    : pool_(pool),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len),
      token_budget_(token_budget),
      prefix_caching_(prefix_caching) {
  LINNET_CHECK(max_batch >= 1 && max_seq_len >= 1 && token_budget >= 1, "scheduler sizes must be positive");
}

int64_t PagedScheduler::pages_for(int64_t positions) const {
  return (positions + pool_.page_size() - 1) / pool_.page_size();
}

std::optional<std::string> PagedScheduler::add(int64_t id, std::vector<int32_t> prompt, int64_t max_new_tokens) {
  LINNET_CHECK(!prompt.empty() && max_new_tokens >= 1, "a scheduled request needs a prompt and new tokens");
  Request r;
  r.id = id;
  const int64_t P = static_cast<int64_t>(prompt.size());
  if (P > max_seq_len_) {
    return "the prompt has " + std::to_string(prompt.size()) + " tokens; --max-seq-len is " +
           std::to_string(max_seq_len_);
  }
  // max_new_tokens may be anything up to INT64_MAX: it is capped at what the context
  // leaves before it is added (prompt + max_new_tokens would overflow). The request then
  // ends with "length" at --max-seq-len, as vLLM's engine ends a sequence at max_model_len.
  r.length = P + std::min<int64_t>(max_new_tokens, max_seq_len_ - P);
  if (pages_for(r.length) > pool_.num_pages()) {
    return "the request needs " + std::to_string(r.length) + " KV positions (" + std::to_string(pages_for(r.length)) +
           " pages of " + std::to_string(pool_.page_size()) + "); the KV pool holds " +
           std::to_string(pool_.num_pages() * pool_.page_size()) + " (--kv-cache-tokens)";
  }
  r.prompt = std::move(prompt);
  waiting_.push_back(std::move(r));
  return std::nullopt;
}

bool PagedScheduler::admit(Request& r) {
  // Share whole cached pages of the prompt, but always compute its last token (its
  // logits give the first new token).
  const int64_t P = static_cast<int64_t>(r.prompt.size());
  std::vector<int32_t> shared;
  if (prefix_caching_) shared = pool_.match_prefix(r.prompt, P - 1);
  const int64_t need = pages_for(r.length) - static_cast<int64_t>(shared.size());
  auto fresh = pool_.allocate(need);
  if (!fresh) {
    pool_.unmatch(shared);  // not admitted: no hit
    return false;
  }
  r.cached = static_cast<int64_t>(shared.size()) * pool_.page_size();
  r.pages = std::move(shared);
  r.pages.insert(r.pages.end(), fresh->begin(), fresh->end());
  return true;
}

std::optional<PagedScheduler::Step> PagedScheduler::next_step() {
  // Admit in arrival order while a batch slot and the pages are there.
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < max_batch_) {
    Request& r = waiting_.front();
    if (!admit(r)) break;
    const int64_t id = r.id;
    running_.emplace(id, std::move(r));
    waiting_.pop_front();
  }
  if (running_.empty()) return std::nullopt;

  Step step;
  Engine::PagedBatch& b = step.batch;
  int64_t budget = token_budget_;
  auto add_sequence = [&](const Request& r) {
    b.page_tables.push_back(r.pages);
    step.seq_ids.push_back(r.id);
    return static_cast<int32_t>(b.page_tables.size() - 1);
  };
  // Decode tokens first: every running request with its prompt in the cache.
  int64_t pending = 0;  // decode tokens not yet packed: the budget keeps room for them before any guess
  for (const auto& [id, r] : running_) pending += r.next_token ? 1 : 0;
  for (const auto& [id, r] : running_) {
    if (!r.next_token) continue;
    const int32_t s = add_sequence(r);
    // The pending token, then the guesses the budget leaves room for once every
    // request's pending token is counted (the decode tokens themselves always run).
    const int64_t guesses = std::clamp<int64_t>(budget - pending, 0, static_cast<int64_t>(r.draft.size()));
    --pending;
    for (int64_t i = 0; i <= guesses; ++i) {
      b.tokens.push_back(i == 0 ? *r.next_token : r.draft[static_cast<size_t>(i - 1)]);
      b.seq.push_back(s);
      b.positions.push_back(static_cast<int32_t>(r.cached + i));
      b.last.push_back(static_cast<int32_t>(b.tokens.size() - 1));
      step.ids.push_back(id);
      --budget;
    }
  }
  // Then prompt chunks, oldest first, while the budget lasts (at least one token per
  // step, so a step never comes out empty).
  for (const auto& [id, r] : running_) {
    const int64_t P = static_cast<int64_t>(r.prompt.size());
    if (r.next_token || r.cached >= P) continue;
    if (budget <= 0 && !b.tokens.empty()) break;
    const int64_t n = std::min(P - r.cached, std::max<int64_t>(budget, 1));
    const int32_t s = add_sequence(r);
    for (int64_t i = 0; i < n; ++i) {
      b.tokens.push_back(r.prompt[r.cached + i]);
      b.seq.push_back(s);
      b.positions.push_back(static_cast<int32_t>(r.cached + i));
    }
    budget -= n;
    if (r.cached + n == P) {  // the prompt is complete: its last token's logits are wanted
      b.last.push_back(static_cast<int32_t>(b.tokens.size() - 1));
      step.ids.push_back(id);
    }
  }
  return step;
}

void PagedScheduler::done_step(const Step& step) {
  std::vector<int64_t> count(step.seq_ids.size(), 0);
  for (int32_t s : step.batch.seq) ++count[s];
  for (size_t s = 0; s < step.seq_ids.size(); ++s) {
    Request& r = running_.at(step.seq_ids[s]);
    const bool prefill = !r.next_token;
    r.cached += count[s];
    r.next_token.reset();
    r.draft.clear();
    if (prefill && prefix_caching_) {  // newly filled prompt pages can be shared from now on
      const int64_t P = static_cast<int64_t>(r.prompt.size());
      pool_.register_prefix(r.pages, std::span<const int32_t>(r.prompt).first(static_cast<size_t>(std::min(r.cached, P))));
    }
  }
}

void PagedScheduler::append(int64_t id, int32_t token, std::span<const int32_t> draft) {
  const auto it = running_.find(id);
  LINNET_CHECK(it != running_.end(), "append to a request that is not running");
  Request& r = it->second;
  r.next_token = token;
  // The token goes to position cached, guess i to cached + 1 + i, all below the last
  // reserved position: a guess there would be kept or not by the row before it, and its
  // own row's token could never be emitted (the request ends at that length).
  const int64_t room = std::max<int64_t>(0, r.length - r.cached - 2);
  r.draft.assign(draft.begin(), draft.begin() + std::min<int64_t>(room, static_cast<int64_t>(draft.size())));
}

void PagedScheduler::rewind(int64_t id, int64_t cached) {
  const auto it = running_.find(id);
  LINNET_CHECK(it != running_.end(), "rewind of a request that is not running");
  Request& r = it->second;
  LINNET_CHECK(cached >= static_cast<int64_t>(r.prompt.size()) && cached <= r.cached,
               "rewind to " << cached << " positions outside [prompt, cached = " << r.cached << "]");
  r.cached = cached;
}

void PagedScheduler::finish(int64_t id) {
  const auto it = running_.find(id);
  if (it == running_.end()) {
    // A waiting request holds no pages yet.
    const auto w = std::find_if(waiting_.begin(), waiting_.end(), [id](const Request& r) { return r.id == id; });
    if (w != waiting_.end()) waiting_.erase(w);
    return;
  }
  pool_.release(it->second.pages);
  running_.erase(it);
}

}  // namespace linnet
