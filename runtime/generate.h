// The generation loops over an Engine (batch 1): generate (greedy, fixed steps),
// sample (seeded sampling, fixed steps) and generate_until (stop at an EOS id or at
// max_new_tokens). The prompt goes through prefill in one pass, then one decode per
// new token. Every rank of the tp group runs the loop; the token is drawn on tp rank 0
// and broadcast, so all ranks continue with the same token. A logits row with a NaN or
// inf ends the request with finish_reason "error" on every rank (never a silent token).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace linnet {

/// What a generation loop produced.
struct GenerationResult {
  std::vector<int32_t> ids;   // new tokens only (an EOS that stopped the loop included)
  std::string finish_reason;  // "stop" (an EOS id), "length" (max_new_tokens or cache full), "error"
  std::string error;          // why, when finish_reason is "error" (the full message on tp rank 0)
  double prefill_ms = 0.0;    // wall time of the prompt's prefill, incl. its first token
  double decode_ms = 0.0;     // wall time of the decode steps after it
  std::vector<double> token_ms;  // [ids.size()] when each new token was drawn, ms since the
                                 // loop started (generate_batch: since its call), so
                                 // token_ms[0] is the time to first token
  std::vector<TokenLogprobs> logprobs;  // [ids.size()] on tp rank 0 when asked for (batch), else empty
};

/// The stop rule shared by every generation loop, after `token` became new token number
/// `new_tokens` with `cached` tokens already in the KV cache row (the token itself goes at
/// position `cached`): "stop" when it is an EOS id, "length" when max_new_tokens is
/// reached or prompt + new tokens fill max_seq_len, else empty (go on).
std::string finish_reason_after(int32_t token, std::span<const int64_t> eos_ids, int64_t new_tokens,
                                int64_t max_new_tokens, int64_t cached, int64_t max_seq_len);

/// Called with each new token as it is drawn (on every rank).
using TokenCallback = std::function<void(int32_t)>;

/// Called on tp rank 0 only with each new token as it is drawn; true ends generation
/// with finish_reason "stop" (e.g. the text now holds a stop string). The decision is
/// broadcast with the token, so every rank stops at the same token.
using TokenStopCheck = std::function<bool(int32_t)>;

/// Greedy decoding of `steps` tokens after `prompt` (no stop token).
GenerationResult generate(Engine& engine, std::span<const int32_t> prompt, int64_t steps);

/// Seeded sampling of `steps` tokens after `prompt` (no stop token).
GenerationResult sample(Engine& engine, std::span<const int32_t> prompt, int64_t steps,
                        const SamplingParams& params);

/// Decodes after `prompt` until a token in `eos_ids` (finish "stop"), `max_new_tokens`
/// tokens, or prompt + new tokens reaching the KV cache length (finish "length"; a
/// prompt that fills the cache gets no new token). A logits row with a NaN or inf
/// ends it with finish "error" and the reason in `error`. `stop_check` (tp rank 0)
/// may end it with "stop" after any token. `top_logprobs` >= 0: each new token's
/// logprob and that many alternatives (GenerationResult::logprobs, tp rank 0).
/// @throws Error when the prompt does not fit in the KV cache (from Engine::prefill).
GenerationResult generate_until(Engine& engine, std::span<const int32_t> prompt,
                                const SamplingParams& params, int64_t max_new_tokens,
                                std::span<const int64_t> eos_ids, const TokenCallback& on_token = {},
                                const TokenStopCheck& stop_check = {}, int64_t top_logprobs = -1);

}  // namespace linnet
