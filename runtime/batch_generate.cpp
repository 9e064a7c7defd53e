#include "runtime/batch_generate.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <string>

namespace linnet {
namespace {

// A request occupying a KV cache row.
struct Slot {
  size_t index = 0;
  int32_t row = 0;
  int64_t pos = 0;          // tokens in the row's cache; the newest token goes here next
  int32_t token = 0;        // the newest token, not yet in the cache
  std::unique_ptr<Sampler> sampler;
};

}  // namespace

std::vector<GenerationResult> generate_batch(Engine& engine, const std::vector<BatchRequest>& requests,
                                             const RequestDone& on_done, int64_t prefill_budget) {
  const int64_t L = engine.max_seq_len();
  const int64_t V = engine.config().vocab_size;
  std::vector<GenerationResult> results(requests.size());
  auto finish = [&](size_t i, const std::string& reason) {
    results[i].finish_reason = reason;
    if (on_done) on_done(i, results[i]);
  };

  std::deque<size_t> pending;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& p = requests[i].prompt;
    if (p.empty() || static_cast<int64_t>(p.size()) > L) {
      results[i].error = p.empty() ? "the prompt has no tokens"
                                   : "the prompt has " + std::to_string(p.size()) +
                                         " tokens; the KV cache holds --max-seq-len = " + std::to_string(L);
      finish(i, "error");
    } else if (std::any_of(p.begin(), p.end(), [V](int32_t t) { return t < 0 || t >= V; })) {
      results[i].error = "a prompt token id is outside [0, vocab_size)";
      finish(i, "error");
    } else if (requests[i].max_new_tokens <= 0 || static_cast<int64_t>(p.size()) == L) {
      finish(i, "length");
    } else {
      pending.push_back(i);
    }
  }

  std::vector<int32_t> free_rows;
  for (int64_t r = engine.max_batch() - 1; r >= 0; --r) free_rows.push_back(static_cast<int32_t>(r));
  std::vector<Slot> active;
  Communicator& comm = engine.tp_comm();

  // Draws one token per logits row on tp rank 0, broadcasts them, and advances each
  // slot: appends the token, checks EOS / max_new_tokens / the end of the row.
  auto step = [&](std::vector<Slot*>& slots, const std::vector<float>& logits) {
    std::vector<int32_t> tokens(slots.size());
    if (comm.rank() == 0) {
      for (size_t k = 0; k < slots.size(); ++k) {
        tokens[k] = slots[k]->sampler->sample(std::span<const float>(logits).subspan(k * V, V));
      }
    }
    comm.broadcast(tokens.data(), tokens.size() * sizeof(int32_t), 0);
    for (size_t k = 0; k < slots.size(); ++k) {
      Slot& s = *slots[k];
      const BatchRequest& req = requests[s.index];
      GenerationResult& res = results[s.index];
      s.token = tokens[k];
      res.ids.push_back(s.token);
      const std::string reason = finish_reason_after(s.token, req.eos_ids, static_cast<int64_t>(res.ids.size()),
                                                     req.max_new_tokens, s.pos, L);
      if (!reason.empty()) {
        free_rows.push_back(s.row);
        s.sampler.reset();  // marks the slot finished
        finish(s.index, reason);
      }
    }
    active.erase(std::remove_if(active.begin(), active.end(), [](const Slot& s) { return !s.sampler; }),
                 active.end());
  };

  while (!pending.empty() || !active.empty()) {
    // Admit waiting requests into free rows, prefilled together in one packed pass.
    std::vector<int32_t> tokens, rows, positions, last;
    std::vector<Slot> admitted;
    while (!pending.empty() && !free_rows.empty()) {
      const auto& prompt = requests[pending.front()].prompt;
      if (!admitted.empty() && static_cast<int64_t>(tokens.size() + prompt.size()) > prefill_budget) break;
      Slot s;
      s.index = pending.front();
      s.row = free_rows.back();
      s.pos = static_cast<int64_t>(prompt.size());
      s.sampler = std::make_unique<Sampler>(requests[s.index].sampling);
      pending.pop_front();
      free_rows.pop_back();
      for (size_t i = 0; i < prompt.size(); ++i) {
        tokens.push_back(prompt[i]);
        rows.push_back(s.row);
        positions.push_back(static_cast<int32_t>(i));
      }
      last.push_back(static_cast<int32_t>(tokens.size() - 1));
      admitted.push_back(std::move(s));
    }
    if (!admitted.empty()) {
      const std::vector<float> logits = engine.prefill_packed(tokens, rows, positions, last);
      const size_t before = active.size();
      for (auto& s : admitted) active.push_back(std::move(s));
      std::vector<Slot*> slots;
      for (size_t k = before; k < active.size(); ++k) slots.push_back(&active[k]);
      step(slots, logits);
    }
    if (active.empty()) continue;
    // One token for every active row, each at its own position.
    tokens.clear();
    rows.clear();
    positions.clear();
    std::vector<Slot*> slots;
    for (Slot& s : active) {
      tokens.push_back(s.token);
      rows.push_back(s.row);
      positions.push_back(static_cast<int32_t>(s.pos));
      ++s.pos;
      slots.push_back(&s);
    }
    step(slots, engine.decode_rows(tokens, rows, positions));
  }
  return results;
}

}  // namespace linnet
