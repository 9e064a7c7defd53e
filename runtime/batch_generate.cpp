#include "runtime/batch_generate.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "common/error.h"
#include "runtime/page_pool.h"
#include "runtime/paged_scheduler.h"

namespace linnet {
namespace {

// A running request's sampling state (the KV side is the scheduler's).
struct Running {
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> context;  // prompt + new tokens, for the repetition penalty (tp rank 0)
};

// What tp rank 0 decided for a row, broadcast with its token.
enum Outcome : int32_t { kGoOn = 0, kStopCheck = 1, kFailed = 2 };

}  // namespace

std::vector<GenerationResult> generate_batch(Engine& engine, const std::vector<BatchRequest>& requests,
                                             const RequestDone& on_done, int64_t step_token_budget) {
  BatchOptions options;
  options.on_done = on_done;
  options.step_token_budget = step_token_budget;
  return generate_batch(engine, requests, options);
}

std::vector<GenerationResult> generate_batch(Engine& engine, const std::vector<BatchRequest>& requests,
                                             const BatchOptions& options) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto now_ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); };
  const int64_t L = engine.max_seq_len();
  const int64_t V = engine.config().vocab_size;
  std::vector<GenerationResult> results(requests.size());
  auto finish = [&](size_t i, const std::string& reason) {
    results[i].finish_reason = reason;
    if (options.on_done) options.on_done(i, results[i]);
  };

  PagePool pool(engine.num_pages(), engine.page_size());
  PagedScheduler scheduler(pool, engine.max_batch(), L, std::max<int64_t>(1, options.step_token_budget),
                           options.prefix_caching);
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& p = requests[i].prompt;
    if (!requests[i].error.empty()) {
      results[i].error = requests[i].error;
      finish(i, "error");
    } else if (p.empty() || static_cast<int64_t>(p.size()) > L) {
      results[i].error = p.empty() ? "the prompt has no tokens"
                                   : "the prompt has " + std::to_string(p.size()) +
                                         " tokens; the KV cache holds --max-seq-len = " + std::to_string(L);
      finish(i, "error");
    } else if (std::any_of(p.begin(), p.end(), [V](int32_t t) { return t < 0 || t >= V; })) {
      results[i].error = "a prompt token id is outside [0, vocab_size)";
      finish(i, "error");
    } else if (requests[i].max_new_tokens <= 0 || static_cast<int64_t>(p.size()) == L) {
      finish(i, "length");
    } else if (auto err = scheduler.add(static_cast<int64_t>(i), p, requests[i].max_new_tokens)) {
      results[i].error = *err;  // can never fit in the KV pool
      finish(i, "error");
    }
  }

  std::map<size_t, Running> running;
  Communicator& comm = engine.tp_comm();
  const bool root = comm.rank() == 0;

  // Draws one token per logits row on tp rank 0 (with its logprobs and the caller's
  // stop check), broadcasts {token, outcome} pairs, and advances each request: appends
  // the token, checks the outcome, EOS / stop ids, max_new_tokens and max_seq_len.
  auto sample_step = [&](const std::vector<int64_t>& ids, const std::vector<float>& logits) {
    std::vector<int32_t> drawn(2 * ids.size(), 0);
    if (root) {
      for (size_t k = 0; k < ids.size(); ++k) {
        const size_t i = static_cast<size_t>(ids[k]);
        const BatchRequest& req = requests[i];
        GenerationResult& res = results[i];
        Running& r = running[i];
        if (!r.sampler) {
          r.sampler = std::make_unique<Sampler>(req.sampling);
          if (req.sampling.repetition_penalty != 1.0) r.context = req.prompt;
        }
        const std::span<const float> row = std::span<const float>(logits).subspan(k * V, V);
        try {
          const int32_t token = r.sampler->sample(row, r.context);
          if (req.top_logprobs >= 0) {
            res.logprobs.push_back(Sampler::logprobs(row, token, req.top_logprobs, req.sampling.vocab_limit));
          }
          drawn[2 * k] = token;
          if (options.stop_check && options.stop_check(i, token)) drawn[2 * k + 1] = kStopCheck;
        } catch (const Error& e) {
          drawn[2 * k + 1] = kFailed;
          res.error = std::string(e.what()) + " (at new token " + std::to_string(res.ids.size() + 1) + ")";
        }
      }
    }
    comm.broadcast(drawn.data(), drawn.size() * sizeof(int32_t), 0);
    const double t = now_ms();
    for (size_t k = 0; k < ids.size(); ++k) {
      const size_t i = static_cast<size_t>(ids[k]);
      const BatchRequest& req = requests[i];
      GenerationResult& res = results[i];
      std::string reason;
      if (drawn[2 * k + 1] == kFailed) {
        if (res.error.empty()) res.error = "the sampler on tp rank 0 refused the logits row";
        reason = "error";
      } else {
        const int32_t token = drawn[2 * k];
        res.ids.push_back(token);
        res.token_ms.push_back(t);
        if (root && !running[i].context.empty()) running[i].context.push_back(token);
        // The token would go into the cache at position prompt + new tokens - 1.
        const int64_t cached = static_cast<int64_t>(req.prompt.size() + res.ids.size()) - 1;
        reason = drawn[2 * k + 1] == kStopCheck
                     ? "stop"
                     : finish_reason_after(token, req.eos_ids, static_cast<int64_t>(res.ids.size()),
                                           req.max_new_tokens, cached, L);
        if (reason.empty()) scheduler.append(ids[k], token);
      }
      if (!reason.empty()) {
        scheduler.finish(ids[k]);
        running.erase(i);
        finish(i, reason);
      }
    }
  };

  // Each step: one decode token per running request, prompt chunks of the others (and
  // of newly admitted ones) up to the step's token budget, in one step_paged pass.
  while (!scheduler.idle()) {
    if (options.stop_requested && options.stop_requested()) break;
    const auto step = scheduler.next_step();
    if (!step) break;
    const std::vector<float> logits = engine.step_paged(step->batch);
    scheduler.done_step(*step);
    if (!step->ids.empty()) sample_step(step->ids, logits);
  }
  if (options.kv_stats) *options.kv_stats = scheduler.pool_stats();
  return results;
}

}  // namespace linnet
