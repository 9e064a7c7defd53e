// One request's generation settings and the keys of an --input line (or of a serve
// request) that set them. Needs no model, engine, MPI or command line, so the fuzz
// targets (tests/fuzz/) and unit tests link it alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"

namespace linnet {

/// Most alternatives per token that --top-logprobs / "top_logprobs" may ask for (vLLM's
/// and OpenAI's cap).
inline constexpr int64_t kMaxTopLogprobs = 20;

/// One request's generation settings: what an --input line may set. Each key defaults
/// to the command-line flag, which defaults to generation_config.json.
struct RequestSettings {
  SamplingParams sampling;                // temperature, top_k, top_p, min_p, repetition_penalty
  std::optional<uint64_t> seed;           // the line's own seed; else the run's seed + line index
  int64_t max_new_tokens = 256;
  std::vector<std::string> stop;          // stop strings: the completion is cut before the first one
  std::vector<int64_t> stop_token_ids;    // on top of the model's EOS ids
  int64_t top_logprobs = -1;              // -1: no logprobs; else the alternatives per token
};

// The ranges of the sampling settings, shared by the flags and the per-line keys.
/// A temperature is finite and >= 0 (0: greedy).
bool temperature_ok(double t);
/// top_p is in (0, 1].
bool top_p_ok(double p);
/// min_p is in [0, 1].
bool min_p_ok(double p);
/// A repetition penalty is finite and > 0 (1: off).
bool penalty_ok(double p);
/// An OpenAI presence / frequency penalty is in [-2, 2].
bool openai_penalty_ok(double p);

/// `defaults` with the keys of one --input line applied: temperature, top_k, top_p,
/// min_p, repetition_penalty, presence_penalty, frequency_penalty, seed, max_new_tokens, stop (a string or a list of
/// strings), stop_token_ids (a list of ids), logprobs (true/false), top_logprobs (N,
/// implies logprobs). A null value counts as absent; other keys are ignored.
/// @throws Error naming `where` (file:line) and the key when a value has the wrong JSON
///   type or is out of range (the ranges of Sampler, max_new_tokens >= 0, ids >= 0,
///   non-empty stop strings, top_logprobs in [0, kMaxTopLogprobs]).
RequestSettings apply_request_keys(const nlohmann::ordered_json& line, RequestSettings defaults,
                                   const std::string& where);

}  // namespace linnet
