#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

namespace linnet {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Draws on tp rank 0 and broadcasts, so every rank continues with one token even if a
// logit differed in its last bit.
int32_t draw(Engine& engine, Sampler& sampler, const std::vector<float>& logits) {
  int32_t token = 0;
  if (engine.tp_comm().rank() == 0) token = sampler.sample(logits);
  engine.tp_comm().broadcast(&token, sizeof(token), 0);
  return token;
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
                                std::span<const int64_t> eos_ids, const TokenCallback& on_token) {
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
  int32_t token = draw(engine, sampler, logits);
  result.prefill_ms = ms_since(t0);
  auto t1 = Clock::now();
  while (true) {
    result.ids.push_back(token);
    if (on_token) on_token(token);
    const std::string reason = finish_reason_after(token, eos_ids, static_cast<int64_t>(result.ids.size()),
                                                   max_new_tokens, pos, max_seq_len);
    if (!reason.empty()) {
      result.finish_reason = reason;
      break;
    }
    logits = engine.decode(token, pos++);
    token = draw(engine, sampler, logits);
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
