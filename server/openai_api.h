// The OpenAI API surface of `linnet-tp serve` that needs no engine: request bodies of
// /v1/completions and /v1/chat/completions turned into generate's Requests (the same
// keys, checks and chat rendering as an --input line: apply_request_keys, prompt_text),
// and the response, chunk and error objects, as OpenAI's API reference and vLLM's
// OpenAI server write them.
#pragma once

#include <cstdint>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "requests/request.h"
#include "loader/chat/chat_template.h"
#include "loader/tokenizer/tokenizer.h"
#include "runtime/sampler.h"

namespace linnet {

/// A request the API refuses: the HTTP status and OpenAI's error object
/// {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string type = {}, std::string code = {});
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  /// {"error": {...}}; param and code are null when empty. type defaults by status:
  /// invalid_request_error (4xx but 401/404/429), authentication_error (401),
  /// not_found_error (404), rate_limit_exceeded (429), server_error (5xx).
  nlohmann::ordered_json body() const;

 private:
  int status_;
  std::string param_, type_, code_;
};

/// Limits of the request parser.
struct ApiLimits {
  int64_t max_seq_len = 0;        // positions a request may reach (prompt + max_tokens)
  int64_t max_n = 16;             // most choices per prompt ("n")
  int64_t max_choices = 64;       // most prompts x n in one request
  int64_t prompt_byte_limit = 0;  // a longer prompt text is refused untokenized (0: none)
};

/// What the parser needs of the model.
struct ApiModel {
  const Tokenizer* tokenizer = nullptr;
  std::filesystem::path model_dir;
  const ModelChatTemplate* chat = nullptr;  // null: the model has no chat template
  std::string chat_error;                   // why, for the chat endpoint's 400
  std::string served_name;                  // the only "model" accepted
  RequestSettings defaults;                 // generation_config.json's sampling defaults
  int64_t vocab_size = 0;                   // ids of token prompts and stop_token_ids must be below
};

/// One parsed completions or chat request.
struct ApiRequest {
  bool chat = false;
  std::vector<Request> prompts;   // each with text, ids and settings (max_new_tokens set)
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool echo = false;              // completions: the prompt before the completion
  int64_t logprobs = -1;          // -1: none; else alternatives per token (completions:
                                  // "logprobs"; chat: "top_logprobs" with "logprobs": true)
  std::optional<uint64_t> seed;   // choice k of a prompt samples with seed + k
  std::vector<bool> prompt_given_as_text;  // per prompt: a string (echo shows it as given)
};

/// Parses a /v1/completions (chat false) or /v1/chat/completions body: parse_jsonl_line's
/// checks first (NUL bytes, nesting deeper than kMaxJsonlDepth found by a scan before
/// parsing, so a deeply nested body cannot exhaust the stack; duplicate keys).
/// @throws ApiError 400 naming the parameter (invalid JSON, too deep, unknown or
///   unsupported keys, values out of range, a prompt longer than the context,
///   prompt + max_tokens over it, template errors), 404 for another "model".
ApiRequest parse_api_request(const std::string& body, bool chat, const ApiModel& model, const ApiLimits& limits);

/// True when `a` equals `b`, in time that depends only on their lengths (for API keys).
bool constant_time_equal(const std::string& a, const std::string& b);

/// What one choice produced, for its response object.
struct ChoiceResult {
  std::vector<int32_t> ids;                     // new tokens
  std::vector<TokenLogprobs> logprobs;          // per new token, when asked for
  std::vector<double> prompt_logprobs;          // echo with logprobs: log p(prompt[i+1]), [P-1]
  std::string finish_reason;                    // stop | length (error/cancelled never reach here)
};

/// POST /tokenize, as vLLM offers it: a body {"prompt": TEXT} (add_special_tokens,
/// default true) or {"messages": [...]} rendered by the chat template
/// (add_generation_prompt default true, chat_template_kwargs, add_special_tokens default
/// false: the template writes its own BOS), with optional "model" and
/// "return_token_strs". Returns the response body {"count", "max_model_len", "tokens",
/// "token_strs"} (token_strs null unless asked for: each id's vocabulary string).
/// @throws ApiError 400 naming the parameter (not a JSON object, unknown keys, bad values,
///   a text longer than the context can hold, no chat template), 404 for another model.
std::string tokenize_response(const std::string& body, const ApiModel& model, const ApiLimits& limits);

/// POST /detokenize, as vLLM's: {"tokens": [ids]} (and "model") -> {"prompt": TEXT},
/// special tokens kept. At most max_seq_len ids, each in [0, vocab_size).
/// @throws ApiError 400 naming "tokens" (or the key at fault), 404 for another model.
std::string detokenize_response(const std::string& body, const ApiModel& model, const ApiLimits& limits);

/// A token as the API lists it (completions' tokens and top_logprobs keys, chat's
/// "token"): its text in context (Tokenizer::token_bytes: " the", not "the"), or, when its
/// bytes are no valid UTF-8 alone (part of a character), "bytes:\xe4\xb8" as OpenAI writes
/// such tokens, so that distinct byte tokens never share a top_logprobs key. "" for an id
/// the tokenizer does not have.
std::string api_token(const Tokenizer& tok, int32_t id);

/// Characters (code points) in UTF-8 `text`: its bytes that are not continuation bytes.
size_t utf8_chars(std::string_view text);

/// text_offset of completions logprobs: each token's position, in characters (code
/// points, as OpenAI and vLLM count), in the text the response returns: the echoed prompt
/// (its ids decoded from the start, special tokens counting nothing) and then the
/// completion. A token is placed after the characters the tokens before it completed, so
/// the tokens of one character of several bytes all get that character's position and
/// no offset runs past the text; cap() bounds them by a text cut short (a stop string).
class TextOffsets {
 public:
  /// `prompt_ids`: the request's prompt; with `echo`, the returned text starts with the
  /// prompt text, `prompt_chars` characters long.
  TextOffsets(const Tokenizer& tok, const std::vector<int32_t>& prompt_ids, bool echo, size_t prompt_chars);
  /// The next prompt token's offset (echo), then moves past it.
  size_t prompt(int32_t id);
  /// The next completion token's offset, then moves past it.
  size_t completion(int32_t id);
  /// No offset exceeds `chars` from now on (the returned text's length).
  void cap(size_t chars) { cap_ = chars; }

 private:
  // One text's detokenizer and the characters its tokens completed so far. The
  // detokenizer holds a run of byte-fallback tokens (<0xE4>...) until it ends, so the
  // complete characters inside a held run are counted from its bytes.
  struct Stream {
    StreamingDetokenizer detok;
    size_t chars = 0;       // characters emitted
    std::string held;       // bytes of the byte tokens pushed since the last emitted text
    size_t next(const Tokenizer& tok, int32_t id);  // the offset of `id`, then past it
  };
  Tokenizer tok_;
  Stream prompt_, completion_;
  size_t prompt_chars_, base_;  // the echoed prompt's length; where the completion starts
  size_t cap_ = SIZE_MAX;
};

/// The logprobs object of completions for `ids` (tokens, token_logprobs,
/// top_logprobs, text_offset), the prompt's first when `prompt_logprobs` is given (its
/// first token null; `prompt_top`, when given, the alternatives of each scored prompt
/// token, [P - 1], listed as the new tokens' are: up to `top_n`, and the token itself).
/// `offsets` places each token (and moves on, so a stream's chunks continue it); with
/// `id_offsets`, ids[k] is placed at (*id_offsets)[k] instead (a stream's, placed as the
/// tokens came), and `offsets` places only the prompt's.
nlohmann::ordered_json completion_logprobs(
    const Tokenizer& tok, const std::vector<int32_t>& prompt_ids, const std::vector<double>* prompt_logprobs,
    const std::vector<std::vector<std::pair<int32_t, float>>>* prompt_top, const std::vector<int32_t>& ids,
    const std::vector<TokenLogprobs>& lps, int64_t top_n, TextOffsets& offsets,
    const std::vector<size_t>* id_offsets = nullptr);

/// The logprobs object of chat for `ids`: {"content": [{token, logprob, bytes, top_logprobs}]}.
nlohmann::ordered_json chat_logprobs(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                     const std::vector<TokenLogprobs>& lps, int64_t top_n);

/// {"prompt_tokens", "completion_tokens", "total_tokens"}.
nlohmann::ordered_json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

/// One Server-Sent Events frame: "data: <json>\n\n".
std::string sse_frame(const nlohmann::ordered_json& j);

/// A JSON text of `j` with invalid UTF-8 replaced (never throws).
std::string dump_json(const nlohmann::ordered_json& j);

}  // namespace linnet
