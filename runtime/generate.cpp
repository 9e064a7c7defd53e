#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"

namespace linnet {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Marks a failed draw in the broadcast token.
constexpr int32_t kDrawFailed = -1;

// Draws on tp rank 0 and broadcasts, so every rank continues with one token even if a
// logit differed in its last bit. A row the sampler refuses (non-finite logits) gives
// kDrawFailed on every rank and the reason in `error` (the full message on tp rank 0).
// `stopped` carries tp rank 0's stop check of the token to every rank.
int32_t draw(Engine& engine, Sampler& sampler, const std::vector<float>& logits, std::span<const int32_t> context,
             const TokenStopCheck& stop_check, std::string& error, bool& stopped, int64_t top_logprobs,
             int64_t vocab_limit, std::vector<TokenLogprobs>& logprobs) {
  int32_t msg[2] = {0, 0};  // token, stopped
  if (engine.tp_comm().rank() == 0) {
    try {
      msg[0] = sampler.sample(logits, context);
      if (top_logprobs >= 0) logprobs.push_back(Sampler::logprobs(logits, msg[0], top_logprobs, vocab_limit));
      msg[1] = stop_check && stop_check(msg[0]) ? 1 : 0;
    } catch (const Error& e) {
      msg[0] = kDrawFailed;
      error = e.what();
    }
  }
  engine.tp_comm().broadcast(msg, sizeof msg, 0);
  if (msg[0] == kDrawFailed && error.empty()) error = "the sampler on tp rank 0 refused the logits row";
  stopped = msg[1] != 0;
  return msg[0];
}

}  // namespace

std::string finish_reason_after(int32_t token, std::span<const int64_t> eos_ids, int64_t new_tokens,
                                int64_t max_new_tokens, int64_t cached, int64_t max_seq_len) {
  if (std::find(eos_ids.begin(), eos_ids.end(), static_cast<int64_t>(token)) != eos_ids.end()) return "stop";
  if (new_tokens >= max_new_tokens || cached + 1 >= max_seq_len) return "length";
  return {};
}

GenerationResult generate_until(Engine& engine, std::span<const int32_t> prompt,
                                const SamplingParams& params, int64_t max_new_tokens,
                                std::span<const int64_t> eos_ids, const TokenCallback& on_token,
                                const TokenStopCheck& stop_check, int64_t top_logprobs) {
  GenerationResult result;
  result.finish_reason = "length";  // when nothing is generated
  Sampler sampler(params);
  const int64_t max_seq_len = engine.max_seq_len();
  if (static_cast<int64_t>(prompt.size()) > max_seq_len) {
    engine.prefill(prompt, 0);  // throws the error that names --max-seq-len
  }
  if (max_new_tokens <= 0 || static_cast<int64_t>(prompt.size()) == max_seq_len) {
    return result;
  }
  auto t0 = Clock::now();
  std::vector<float> logits = engine.prefill(prompt, 0);
  int64_t pos = static_cast<int64_t>(prompt.size());  // tokens in the KV cache
  // The repetition penalty's context: the prompt, then every new token.
  std::vector<int32_t> context(prompt.begin(), prompt.end());
  bool stopped = false;
  int32_t token = draw(engine, sampler, logits, context, stop_check, result.error, stopped, top_logprobs,
                       params.vocab_limit, result.logprobs);
  result.prefill_ms = ms_since(t0);
  auto t1 = Clock::now();
  while (true) {
    if (token == kDrawFailed) {
      result.finish_reason = "error";
      break;
    }
    result.ids.push_back(token);
    result.token_ms.push_back(ms_since(t0));
    context.push_back(token);
    if (on_token) on_token(token);
    const std::string reason =
        stopped ? std::string("stop")
                : finish_reason_after(token, eos_ids, static_cast<int64_t>(result.ids.size()), max_new_tokens, pos,
                                      max_seq_len);
    if (!reason.empty()) {
      result.finish_reason = reason;
      break;
    }
    logits = engine.decode(token, pos++);
    token = draw(engine, sampler, logits, context, stop_check, result.error, stopped, top_logprobs, params.vocab_limit,
                 result.logprobs);
  }
  result.decode_ms = ms_since(t1);
  return result;
}

GenerationResult generate(Engine& engine, std::span<const int32_t> prompt, int64_t steps) {
  return generate_until(engine, prompt, SamplingParams{}, steps, {});
}

GenerationResult sample(Engine& engine, std::span<const int32_t> prompt, int64_t steps,
                        const SamplingParams& params) {
  return generate_until(engine, prompt, params, steps, {});
}

}  // namespace linnet
