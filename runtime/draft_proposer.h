// The draft-model proposer of speculative decoding (Leviathan et al. 2023; vLLM's
// "draft_model"): a smaller checkpoint with the target's tokenizer guesses each
// sequence's next k tokens, greedily, with its own Engine and KV pages.
//
// The draft runs on the target's ranks with the target's tp size (each rank holds its
// slice of both models): a sequence's guesses are then known on every rank of the group
// without any message beyond the draft's own collectives (Engine::step_paged_top's
// gathers), and the draft's passes run between the target's on the same backend.
//
// A sequence's draft K/V follow the tokens fed to it. Each call feeds what the draft
// has not seen (the whole prompt the first time; after a verified step the target's
// own token and any accepted guesses its draft had not run), keeping the longest prefix
// whose tokens are unchanged (the rejected guesses' positions are overwritten, never
// read), then k - 1 more passes of one guess each. The guesses are one-hot proposals (the
// draft's argmax), so BatchSession's draw-and-compare rule keeps the target's output
// exactly (runtime/speculative.h).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "runtime/engine.h"
#include "runtime/page_pool.h"

namespace linnet {

/// Greedy guesses from a draft model, batched over the sequences that ask in one step.
/// Every rank of the tp group must make the same calls with the same arguments.
class DraftProposer {
 public:
  /// @param draft        the draft's Engine, on the target's tp communicator, with a
  ///                     paged KV pool (its num_pages x page_size positions).
  /// @param vocab_limit  guesses are ids below min(vocab_limit, draft vocab_size) (the
  ///                     target's vocab_size: a guess among padded ids is never kept,
  ///                     as no request draws one); > 0.
  /// @param token_budget most tokens in one draft pass (a longer catch-up, e.g. a
  ///                     first prompt, is split over passes); >= 1.
  /// @throws Error on a non-positive limit or budget.
  DraftProposer(Engine& draft, int64_t vocab_limit, int64_t token_budget);

  /// What one sequence asks for.
  struct Want {
    int64_t id = 0;                   ///< the request's id (unique among unfinished ones)
    std::span<const int32_t> tokens;  ///< its prompt and generated tokens, the pending one last
    int64_t k = 0;                    ///< guesses wanted (<= 0: none)
    int64_t length = 0;               ///< positions the request may reach (its reserved
                                      ///< length): guesses stop at position length - 1
  };
  /// Up to want.k guesses for each want, in order (as many as fit before want.length - 1
  /// and in the draft's max_seq_len; none when the draft's pool has no pages for the
  /// sequence now, when a token is outside [0, the draft's vocab_size), or after a row
  /// with a non-finite logit). The same on every rank.
  /// A sequence's first call reserves pages for `length` positions; they are kept until
  /// finish(id).
  /// @throws Error from the draft Engine (a collective or backend failure).
  std::vector<std::vector<int32_t>> propose(const std::vector<Want>& wants);

  /// Releases sequence `id`'s pages (a finished or cancelled request); unknown ids are
  /// ignored.
  void finish(int64_t id);

  /// Sequences holding draft pages now.
  int64_t sequences() const { return static_cast<int64_t>(seqs_.size()); }

 private:
  struct Seq {
    std::vector<int32_t> pages;
    std::vector<int32_t> fed;  // the tokens whose K/V the draft holds, position by position
  };

  Engine& engine_;
  int64_t vocab_limit_, token_budget_;
  PagePool pool_;
  std::map<int64_t, Seq> seqs_;
};

}  // namespace linnet
