#include "runtime/draft_proposer.h"

#include <algorithm>

#include "common/error.h"

namespace linnet {

DraftProposer::DraftProposer(Engine& draft, int64_t vocab_limit, int64_t token_budget)
    : engine_(draft),
      vocab_limit_(std::min(vocab_limit, draft.config().vocab_size)),
      token_budget_(token_budget),
      pool_(draft.num_pages(), draft.page_size()) {
  LINNET_CHECK(vocab_limit > 0 && token_budget >= 1, "a draft proposer needs a vocab limit and a token budget");
}

void DraftProposer::finish(int64_t id) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  pool_.release(it->second.pages);
  seqs_.erase(it);
}

std::vector<std::vector<int32_t>> DraftProposer::propose(const std::vector<Want>& wants) {
  std::vector<std::vector<int32_t>> out(wants.size());
  // The sequences this call runs: the tokens still to feed (from `next` to the end of
  // `feed`), the guesses still wanted, and where the newest guess goes.
  struct Work {
    size_t want = 0;
    Seq* seq = nullptr;
    std::vector<int32_t> feed;  // tokens to feed at positions start, start + 1, ...
    int64_t start = 0, next = 0;
    int64_t guesses = 0;        // still wanted
  };
  std::vector<Work> work;
  const int64_t page = engine_.page_size();
  for (size_t i = 0; i < wants.size(); ++i) {
    const Want& w = wants[i];
    const int64_t n = static_cast<int64_t>(w.tokens.size());
    const int64_t reserve = std::min(w.length, engine_.max_seq_len());
    // The target runs the pending token at position n - 1 and guess j at n - 1 + j,
    // below its last position (PagedScheduler::append's room); the draft feeds guess j
    // (j < k) at n - 1 + j, within its own reserve.
    const int64_t k = std::min({w.k, w.length - n - 1, reserve - n + 1});
    if (k <= 0 || n < 1) continue;
    // An id the draft has no row for (a target with a larger vocab_size; the target
    // checked the ids against its own): no guesses for this sequence.
    const int64_t V = engine_.config().vocab_size;
    if (std::any_of(w.tokens.begin(), w.tokens.end(), [V](int32_t t) { return t < 0 || t >= V; })) continue;
    auto it = seqs_.find(w.id);
    if (it == seqs_.end()) {
      const auto pages = pool_.allocate((reserve + page - 1) / page);
      if (!pages) continue;  // no room in the draft's pool now: no guesses, try again later
      it = seqs_.emplace(w.id, Seq{*pages, {}}).first;
    }
    Seq& s = it->second;
    // The longest prefix the draft holds whose tokens are still the sequence's; the
    // pending token (position n - 1) is always fed, its logits give the first guess.
    size_t c = 0;
    const size_t keep = std::min(s.fed.size(), static_cast<size_t>(n - 1));
    while (c < keep && s.fed[c] == w.tokens[c]) ++c;
    s.fed.resize(c);
    Work wk;
    wk.want = i;
    wk.seq = &s;
    wk.feed.assign(w.tokens.begin() + static_cast<long>(c), w.tokens.end());
    wk.start = wk.next = static_cast<int64_t>(c);
    wk.guesses = k;
    work.push_back(std::move(wk));
  }
  // Passes until every sequence has its guesses: each feeds every unfinished sequence's
  // next tokens within the budget (at least one token a pass); a sequence whose feed is
  // done in the pass gets its next guess from its last row, which it feeds next.
  while (true) {
    Engine::PagedBatch batch;
    std::vector<Work*> rows;
    int64_t budget = token_budget_;
    for (Work& wk : work) {
      if (wk.guesses <= 0) continue;
      if (budget <= 0 && !batch.tokens.empty()) break;
      const int64_t end = wk.start + static_cast<int64_t>(wk.feed.size());
      const int64_t m = std::min(end - wk.next, std::max<int64_t>(budget, 1));
      const auto seq = static_cast<int32_t>(batch.page_tables.size());
      batch.page_tables.push_back(wk.seq->pages);
      for (int64_t p = wk.next; p < wk.next + m; ++p) {
        batch.tokens.push_back(wk.feed[static_cast<size_t>(p - wk.start)]);
        batch.seq.push_back(seq);
        batch.positions.push_back(static_cast<int32_t>(p));
      }
      wk.next += m;
      budget -= m;
      if (wk.next == end) {
        batch.last.push_back(static_cast<int32_t>(batch.tokens.size() - 1));
        rows.push_back(&wk);
      }
    }
    if (batch.tokens.empty()) break;
    const std::vector<Engine::TopCandidates> best = engine_.step_paged_top(batch, vocab_limit_, 1);
    for (size_t r = 0; r < rows.size(); ++r) {
      Work& wk = *rows[r];
      Seq& s = *wk.seq;
      s.fed.insert(s.fed.end(), wk.feed.begin(), wk.feed.end());  // fed.size() was wk.start
      const Engine::TopCandidates& c = best[r];
      if (c.bad_id >= 0 || c.ids.empty()) {  // a non-finite draft row: no more guesses
        wk.guesses = 0;
        continue;
      }
      const int32_t guess = c.ids[0];
      std::vector<int32_t>& g = out[wk.want];
      g.push_back(guess);
      if (--wk.guesses > 0) {  // the guess goes through the draft for the next one
        wk.feed.assign(1, guess);
        wk.start = wk.next;
      }
    }
  }
  return out;
}

}  // namespace linnet
