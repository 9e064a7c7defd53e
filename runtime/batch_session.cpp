#include "runtime/batch_session.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "common/error.h"

namespace linnet {
namespace {

// What tp rank 0 decided for a row, broadcast with its token.
// kRejected: a guess row not drawn (the guess before it was not the model's token, or
// the request ended earlier): nothing is emitted.
enum Outcome : int32_t { kGoOn = 0, kStopCheck = 1, kFailed = 2, kRejected = 3 };

}  // namespace

BatchSession::BatchSession(Engine& engine, SessionOptions options)
    : engine_(engine),
      options_(std::move(options)),
      t0_(std::chrono::steady_clock::now()),
      pool_(engine.num_pages(), engine.page_size()),
      scheduler_(pool_, engine.max_batch(), engine.max_seq_len(), std::max<int64_t>(1, options_.step_token_budget),
                 options_.prefix_caching) {
  if (options_.speculative.method == "draft_model") {
    LINNET_CHECK(options_.draft != nullptr, "speculative method draft_model without a draft engine");
    LINNET_CHECK(options_.draft->tp_comm().size() == engine.tp_comm().size(),
                 "the draft engine's tp group must be the target's");
    draft_ = std::make_unique<DraftProposer>(*options_.draft, engine.config().vocab_size,
                                             std::max<int64_t>(1, options_.step_token_budget));
  }
}

double BatchSession::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
}

const GenerationResult* BatchSession::result(int64_t id) const {
  const auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second.result;
}

void BatchSession::finish(int64_t id, const std::string& reason) {
  const auto it = entries_.find(id);
  if (it == entries_.end()) return;
  scheduler_.finish(id);
  if (draft_) draft_->finish(id);
  GenerationResult result = std::move(it->second.result);
  entries_.erase(it);
  result.finish_reason = reason;
  if (options_.on_done) options_.on_done(id, result);
  release_deferred(id);
}

void BatchSession::release_deferred(int64_t id) {
  const auto it = deferred_.find(id);
  if (it == deferred_.end()) return;
  const std::vector<int64_t> waiting = std::move(it->second);
  deferred_.erase(it);
  deferred_count_ -= static_cast<int64_t>(waiting.size());
  for (int64_t w : waiting) queue(w);
}

void BatchSession::add(int64_t id, BatchRequest request, std::optional<int64_t> after) {
  LINNET_CHECK(!entries_.count(id), "request id " << id << " is already in the session");
  Entry& e = entries_[id];
  e.request = std::move(request);
  if (after && entries_.count(*after) && *after != id) {
    deferred_[*after].push_back(id);
    ++deferred_count_;
    return;
  }
  queue(id);
}

void BatchSession::queue(int64_t id) {
  Entry& e = entries_.at(id);
  const BatchRequest& req = e.request;
  const auto& p = req.prompt;
  const int64_t L = engine_.max_seq_len();
  const int64_t V = engine_.config().vocab_size;
  if (!req.error.empty()) {
    e.result.error = req.error;
    finish(id, "error");
  } else if (p.empty() || static_cast<int64_t>(p.size()) > L) {
    e.result.error = p.empty() ? "the prompt has no tokens"
                               : "the prompt has " + std::to_string(p.size()) +
                                     " tokens; the KV cache holds --max-seq-len = " + std::to_string(L);
    finish(id, "error");
  } else if (std::any_of(p.begin(), p.end(), [V](int32_t t) { return t < 0 || t >= V; })) {
    e.result.error = "a prompt token id is outside [0, vocab_size)";
    finish(id, "error");
  } else if (req.max_new_tokens <= 0 || static_cast<int64_t>(p.size()) == L) {
    finish(id, "length");
  } else if (auto err = scheduler_.add(id, p, req.max_new_tokens)) {
    e.result.error = *err;  // can never fit in the KV pool
    finish(id, "error");
  }
}

bool BatchSession::cancel(int64_t id) {
  if (!entries_.count(id)) return false;
  // A deferred request leaves its parent's list.
  for (auto it = deferred_.begin(); it != deferred_.end(); ++it) {
    auto& list = it->second;
    const auto k = std::find(list.begin(), list.end(), id);
    if (k == list.end()) continue;
    list.erase(k);
    --deferred_count_;
    if (list.empty()) deferred_.erase(it);
    break;
  }
  finish(id, "cancelled");
  return true;
}

// On tp rank 0, each row's token from draw_row(k, entry, prior) (which throws Error to
// fail the request, and leaves the row's logprobs in row_logprobs_[k] when asked;
// `prior`: the tokens drawn from the request's rows before k in this step) and the
// caller's stop check; then advance() broadcasts and applies them on every
// rank. The Sampler is made here, inside the try, so settings it refuses fail the
// request on rank 0 while every rank still reaches the broadcast. A guess row is drawn
// only when the row before it drew exactly that guess and does not end the request:
// otherwise it and the rest of its request's rows are kRejected (never emitted).
template <class DrawRow>
void BatchSession::draw_rows(const std::vector<int64_t>& ids, const DrawRow& draw_row) {
  std::vector<int32_t> drawn(2 * ids.size(), 0);
  row_logprobs_.assign(ids.size(), std::nullopt);
  if (engine_.tp_comm().rank() == 0) {
    std::vector<int32_t> prior;
    for (size_t k = 0; k < ids.size(); ++k) {
      Entry& e = entries_.at(ids[k]);
      if (guess_[k] >= 0) {
        const int32_t before = drawn[2 * (k - 1)], outcome = drawn[2 * (k - 1) + 1];
        if (outcome != kGoOn || before != guess_[k] ||
            ends(e, before, static_cast<int64_t>(e.result.ids.size() + prior.size()))) {
          drawn[2 * k + 1] = kRejected;
          continue;
        }
      } else {
        prior.clear();
      }
      try {
        if (!e.sampler) e.sampler = std::make_unique<Sampler>(e.request.sampling);
        const int32_t token = draw_row(k, e, std::span<const int32_t>(prior));
        drawn[2 * k] = token;
        prior.push_back(token);
        if (options_.stop_check && options_.stop_check(ids[k], token)) drawn[2 * k + 1] = kStopCheck;
      } catch (const Error& err) {
        drawn[2 * k + 1] = kFailed;
        e.result.error = std::string(err.what()) + " (at new token " +
                         std::to_string(e.result.ids.size() + prior.size() + 1) + ")";
      }
    }
  }
  advance(ids, drawn);
}

bool BatchSession::ends(const Entry& e, int32_t token, int64_t n) const {
  const int64_t cached = static_cast<int64_t>(e.request.prompt.size()) + n - 1;
  return !finish_reason_after(token, e.request.eos_ids, n, e.request.max_new_tokens, cached, engine_.max_seq_len())
              .empty();
}

bool BatchSession::wants_guesses(Entry& e) const {
  const SpeculativeConfig& c = options_.speculative;
  if (!c.enabled()) return false;
  if (e.spec_skip > 0) {
    --e.spec_skip;
    return false;
  }
  return c.disable_by_batch_size <= 0 || scheduler_.running() <= c.disable_by_batch_size;
}

void BatchSession::append_pending(const std::vector<std::pair<int64_t, int32_t>>& pending) {
  const SpeculativeConfig& c = options_.speculative;
  const auto p0 = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> next(pending.size());
  std::vector<std::vector<int32_t>> tokens(pending.size());  // prompt + generated, per request asking
  std::vector<DraftProposer::Want> wants;
  std::vector<size_t> asking;
  for (size_t i = 0; i < pending.size(); ++i) {
    Entry& e = entries_.at(pending[i].first);
    if (!wants_guesses(e)) continue;
    tokens[i] = e.request.prompt;
    tokens[i].insert(tokens[i].end(), e.result.ids.begin(), e.result.ids.end());
    if (draft_) {
      const int64_t P = static_cast<int64_t>(e.request.prompt.size());
      // The request's reserved length, as PagedScheduler::add sets it.
      const int64_t length = P + std::min<int64_t>(e.request.max_new_tokens, engine_.max_seq_len() - P);
      wants.push_back({pending[i].first, tokens[i], c.num_speculative_tokens, length});
      asking.push_back(i);
    } else {
      next[i] = propose_ngram(tokens[i], c.prompt_lookup_min, c.prompt_lookup_max, c.num_speculative_tokens);
    }
  }
  if (!wants.empty()) {
    std::vector<std::vector<int32_t>> got = draft_->propose(wants);
    for (size_t j = 0; j < asking.size(); ++j) next[asking[j]] = std::move(got[j]);
  }
  if (c.enabled()) {
    spec_stats_.propose_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p0).count();
  }
  for (size_t i = 0; i < pending.size(); ++i) scheduler_.append(pending[i].first, pending[i].second, next[i]);
}

// The full path: each row from its gathered logits (with its logprobs).
void BatchSession::sample(const std::vector<int64_t>& ids, const std::vector<float>& logits) {
  const int64_t V = engine_.config().vocab_size;
  draw_rows(ids, [&](size_t k, Entry& e, std::span<const int32_t> prior) {
    const BatchRequest& req = e.request;
    GenerationResult& res = e.result;
    const std::span<const float> row = std::span<const float>(logits).subspan(k * V, V);
    // The tokens generated before this row: the request's, then those drawn from its
    // earlier rows in this step (speculation).
    std::vector<int32_t> generated(res.ids);
    generated.insert(generated.end(), prior.begin(), prior.end());
    // The repetition penalty's context, prompt + generated, made from what every path
    // keeps (a request may have drawn earlier tokens through sample_top).
    std::vector<int32_t> context;
    if (req.sampling.repetition_penalty != 1.0 && !req.prompt.empty()) {
      context.reserve(req.prompt.size() + generated.size());
      context.assign(req.prompt.begin(), req.prompt.end());
      context.insert(context.end(), generated.begin(), generated.end());
    }
    const int32_t token = e.sampler->sample(row, context, generated);
    if (req.top_logprobs >= 0) row_logprobs_[k] = Sampler::logprobs(row, token, req.top_logprobs, req.sampling.vocab_limit);
    return token;
  });
}

// Each row's draw from its merged candidates (Engine::step_paged_top), as
// Sampler::sample would draw from the full row: the same token and random stream; a
// row the candidates cannot decide (plan.always_full, or a nucleus reaching past them)
// came with its whole penalized row. Logprobs rows have no penalties (shard_step), so
// their candidates and whole rows are the raw logits.
void BatchSession::sample_top(const std::vector<int64_t>& ids, const std::vector<Engine::TopCandidates>& cands,
                              const ShardStep& plan) {
  draw_rows(ids, [&](size_t k, Entry& e, std::span<const int32_t> /*prior: in the penalties already*/) {
    const Engine::TopCandidates& c = cands[k];
    if (c.bad_id >= 0 || c.ids.empty()) {
      throw Error("non-finite logits (NaN or inf): no token can be drawn", "logits row", "finite values",
                  "id " + std::to_string(c.bad_id));
    }
    const int64_t top_n = e.request.top_logprobs;
    if (!c.full.empty()) {
      const int32_t token = e.sampler->sample_penalized(c.full);
      if (top_n >= 0) row_logprobs_[k] = Sampler::logprobs(c.full, token, top_n, e.request.sampling.vocab_limit);
      return token;
    }
    const int nucleus = plan.nucleus_sum[k];
    const int32_t token = e.sampler->sample_top(c.ids, c.logits, nucleus >= 0 ? c.sums.at(nucleus) : -1.0);
    if (top_n >= 0) row_logprobs_[k] = Sampler::logprobs_top(c.ids, c.logits, token, top_n, c.sums.at(plan.logprob_sum[k]));
    return token;
  });
}

BatchSession::ShardStep BatchSession::shard_step(const std::vector<int64_t>& ids) const {
  static const bool enabled = [] {
    const char* v = std::getenv("LINNET_SHARD_SAMPLING");
    return !(v && std::string(v) == "0");
  }();
  ShardStep plan;
  if (!enabled || ids.empty()) return plan;
  const int64_t V = engine_.config().vocab_size;
  int64_t k = 1;
  plan.nucleus_sum.assign(ids.size(), -1);
  plan.logprob_sum.assign(ids.size(), -1);
  plan.always_full.assign(ids.size(), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const BatchRequest& req = entries_.at(ids[i]).request;
    const SamplingParams& s = req.sampling;
    if (i == 0) plan.vocab_limit = s.vocab_limit;
    if (s.vocab_limit != plan.vocab_limit) return {};
    const int64_t limit = s.vocab_limit > 0 ? std::min(s.vocab_limit, V) : V;
    int sums = 0;  // this row's sums so far
    // A temperature the Sampler refuses fails its request in draw_rows (the full path),
    // never the step.
    if (!(s.temperature >= 0.0) || std::isinf(s.temperature)) return {};
    if (s.temperature != 0.0) {
      if (s.top_k >= 1 && s.top_k <= kMaxShardTopK) {
        k = std::max(k, s.top_k);
      } else if (s.top_k == 0 || s.top_k >= limit) {  // no top-k cut
        if (s.top_p < 1.0 || s.min_p > 0.0) {
          k = kMaxShardTopK;
          plan.nucleus_sum[i] = sums++;
          plan.sums.push_back({static_cast<int32_t>(i), s.temperature});
        } else {
          plan.always_full[i] = 1;
        }
      } else {
        return {};
      }
    }
    if (req.top_logprobs >= 0) {
      const bool penalized =
          s.repetition_penalty != 1.0 || s.presence_penalty != 0.0 || s.frequency_penalty != 0.0;
      if (penalized || req.top_logprobs > kMaxShardTopK) return {};
      k = std::max(k, req.top_logprobs);
      if (plan.nucleus_sum[i] >= 0 && s.temperature == 1.0) {
        plan.logprob_sum[i] = plan.nucleus_sum[i];  // the same normalizer
      } else {
        plan.logprob_sum[i] = sums++;
        plan.sums.push_back({static_cast<int32_t>(i), 1.0});
      }
    }
  }
  plan.k = k;
  return plan;
}

void add_sampler_penalties(const SamplingParams& s, std::span<const int32_t> prompt,
                           std::span<const int32_t> generated, int32_t row, std::vector<Backend::Penalty>& out) {
  std::map<int32_t, Backend::Penalty> pen;
  if (s.repetition_penalty != 1.0 && !prompt.empty()) {
    const float p = static_cast<float>(s.repetition_penalty);
    for (const int32_t id : prompt) pen[id].repetition = p;
    for (const int32_t id : generated) pen[id].repetition = p;
  }
  if ((s.presence_penalty != 0.0 || s.frequency_penalty != 0.0) && !generated.empty()) {
    std::map<int32_t, int64_t> count;
    for (const int32_t id : generated) ++count[id];
    for (const auto& [id, c] : count) {
      pen[id].subtract = static_cast<float>(s.presence_penalty + s.frequency_penalty * static_cast<double>(c));
    }
  }
  for (auto& [id, p] : pen) {
    if (id < 0) continue;
    p.row = row;
    p.id = id;
    out.push_back(p);
  }
}

std::vector<Backend::Penalty> BatchSession::penalties(const std::vector<int64_t>& ids) const {
  std::vector<Backend::Penalty> out;
  std::vector<int32_t> generated;
  for (size_t k = 0; k < ids.size(); ++k) {
    const Entry& e = entries_.at(ids[k]);
    // A guess row is used only when the guesses before it were drawn: its generated
    // tokens are the request's and those guesses.
    if (guess_[k] < 0) {
      generated = e.result.ids;
    } else {
      generated.push_back(guess_[k]);
    }
    add_sampler_penalties(e.request.sampling, e.request.prompt, generated, static_cast<int32_t>(k), out);
  }
  return out;
}

// Broadcasts rank 0's {token, outcome} pairs and advances each request: appends the
// token, checks the outcome, EOS / stop ids, max_new_tokens and max_seq_len.
void BatchSession::advance(const std::vector<int64_t>& ids, std::vector<int32_t>& drawn) {
  Communicator& comm = engine_.tp_comm();
  const int64_t L = engine_.max_seq_len();
  comm.broadcast(drawn.data(), drawn.size() * sizeof(int32_t), 0);
  // Speculation's counts: each request's rows after its first carried a guess; a guess
  // row that was drawn means the guess before it was kept.
  for (size_t k = 0; k < ids.size(); ++k) {
    if (guess_[k] < 0) {
      if (k + 1 < ids.size() && guess_[k + 1] >= 0) ++spec_stats_.steps;
      continue;
    }
    ++spec_stats_.proposed;
    // Kept: the row before drew exactly this guess (even when that token then ended the
    // request, so this row itself was not drawn).
    if (drawn[2 * (k - 1) + 1] != kFailed && drawn[2 * (k - 1) + 1] != kRejected && drawn[2 * (k - 1)] == guess_[k]) {
      ++spec_stats_.accepted;
    }
  }
  const double t = now_ms();
  // The requests that go on, with their newest token: after the loop they get their
  // guesses (the draft model's for all of them in one batched call) and go to the
  // scheduler.
  std::vector<std::pair<int64_t, int32_t>> pending;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int64_t id = ids[k];
    const auto it = entries_.find(id);
    // A rejected guess row, or a row of a request that ended at an earlier row.
    if (it == entries_.end() || drawn[2 * k + 1] == kRejected) continue;
    Entry& e = it->second;
    const BatchRequest& req = e.request;
    GenerationResult& res = e.result;
    std::string reason;
    if (drawn[2 * k + 1] == kFailed) {
      if (res.error.empty()) res.error = "the sampler on tp rank 0 refused the logits row";
      reason = "error";
    } else {
      const int32_t token = drawn[2 * k];
      // tp rank 0: the row's logprobs, appended with its token (a guess row drawn but
      // not emitted never adds one).
      if (row_logprobs_.size() == ids.size() && row_logprobs_[k]) res.logprobs.push_back(std::move(*row_logprobs_[k]));
      res.ids.push_back(token);
      res.token_ms.push_back(t);
      // The token would go into the cache at position prompt + new tokens - 1.
      const int64_t cached = static_cast<int64_t>(req.prompt.size() + res.ids.size()) - 1;
      reason = drawn[2 * k + 1] == kStopCheck
                   ? "stop"
                   : finish_reason_after(token, req.eos_ids, static_cast<int64_t>(res.ids.size()),
                                         req.max_new_tokens, cached, L);
      const bool more = k + 1 < ids.size() && ids[k + 1] == id && drawn[2 * (k + 1) + 1] != kRejected;
      if (reason.empty() && !more) {
        // The request's last token this step: the K/V of the positions before it are
        // valid (a guess row's rejected successors are not), it runs next, with guesses.
        if (guess_[k] >= 0 || (k + 1 < ids.size() && ids[k + 1] == id)) {
          scheduler_.rewind(id, cached);
          // Back off after a step whose guesses were all rejected (this row is the
          // request's first: none was kept).
          if (guess_[k] < 0) {
            e.spec_backoff = std::min(kMaxSpecBackoff, std::max<int64_t>(1, 2 * e.spec_backoff));
            e.spec_skip = e.spec_backoff;
          } else {
            e.spec_backoff = 0;
          }
        }
        pending.emplace_back(id, token);
      }
      if (options_.on_token) options_.on_token(id, res);
    }
    // Its prompt is in the cache now: requests deferred behind it can share its pages.
    if (res.ids.size() <= 1) release_deferred(id);
    if (!reason.empty()) finish(id, reason);
  }
  // A callback may have cancelled a request meanwhile.
  std::erase_if(pending, [&](const auto& p) { return !entries_.count(p.first); });
  append_pending(pending);
}

bool BatchSession::step() {
  if (scheduler_.idle()) return false;
  const auto step = scheduler_.next_step();
  if (!step) return false;
  last_step_sequences_ = static_cast<int64_t>(step->seq_ids.size());
  guess_.assign(step->ids.size(), -1);
  bool guessed = false;
  for (size_t k = 1; k < step->ids.size(); ++k) {
    if (step->ids[k] == step->ids[k - 1]) {
      guess_[k] = step->batch.tokens[static_cast<size_t>(step->batch.last[k])];
      guessed = true;
    }
  }
  // A step that carried guesses: its pass and draws count as verification time (the
  // proposer's next guesses, made inside advance(), count as propose time only).
  struct VerifyClock {
    SpeculativeStats* stats;
    double propose0 = stats ? stats->propose_ms : 0.0;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~VerifyClock() {
      if (!stats) return;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      stats->verify_ms += ms - (stats->propose_ms - propose0);
    }
  } verify_clock{guessed ? &spec_stats_ : nullptr};
  if (const ShardStep plan = shard_step(step->ids); plan.k > 0) {  // the shards' k best candidates
    const auto want_full = [&](int64_t row, const Engine::TopCandidates& c) {
      const size_t r = static_cast<size_t>(row);
      if (plan.always_full[r]) return true;
      return plan.nucleus_sum[r] >= 0 &&
             !Sampler::nucleus_within(entries_.at(step->ids[r]).request.sampling, c.logits, c.sums.at(plan.nucleus_sum[r]));
    };
    const std::vector<Engine::TopCandidates> cands =
        engine_.step_paged_top(step->batch, plan.vocab_limit, plan.k, penalties(step->ids), plan.sums, want_full);
    scheduler_.done_step(*step);
    sample_top(step->ids, cands, plan);
    return true;
  }
  const std::vector<float> logits = engine_.step_paged(step->batch);
  scheduler_.done_step(*step);
  if (!step->ids.empty()) sample(step->ids, logits);
  return true;
}

}  // namespace linnet
