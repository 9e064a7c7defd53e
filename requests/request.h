// The request side of `linnet-tp generate`: one input line (or --prompt) as a Request
// with its settings, its prompt text (raw or rendered by the chat template), and its
// output line; stop strings checked as tokens arrive.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "requests/request_settings.h"
#include "loader/chat/chat_template.h"
#include "loader/generation_config.h"
#include "loader/tokenizer/tokenizer.h"
#include "runtime/batch_session.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"

namespace linnet {

/// One request: an --input line (or --prompt) with its rendered text, ids and settings.
struct Request {
  int64_t index = 0;      // 0-based input line number: the output's "index"
  std::string where;      // "file:line" or "--prompt", for messages
  std::string text;       // the prompt text (a chat request rendered by the template)
  std::vector<int32_t> ids;
  RequestSettings settings;
  std::string error;      // non-empty: the request fails alone with this message, untokenized
};

/// Fewest bytes-per-token bound prompt_bytes_per_token returns.
inline constexpr int64_t kMinPromptBytesPerToken = 64;

/// An upper bound on the prompt bytes one token can stand for: the longest vocabulary
/// entry's bytes (byte-level and SentencePiece entries are never shorter than the text
/// they cover), at least kMinPromptBytesPerToken. A prompt of more than max_seq_len times
/// this many bytes has more than max_seq_len tokens (assuming the normalizer does not
/// shrink text, which no Llama-family tokenizer's does), so it is refused untokenized.
int64_t prompt_bytes_per_token(const Tokenizer& tok);

/// {"messages": [{"role": "user", "content": prompt}], "add_generation_prompt": true}.
std::string user_message_request(const std::string& prompt);

/// Every request's defaults from generation_config.json (do_sample false or absent:
/// greedy; with sampling, transformers' defaults temperature 1, top_k 50, top_p 1;
/// max_new_tokens 256); the command's flags override them (launch/engine_options.h).
RequestSettings generation_defaults(const GenerationConfig& g);

/// The model's EOS ids: generation_config.json's, else config.json's, else the
/// tokenizer's EOS token.
std::vector<int64_t> resolve_eos(const ModelFiles& files, const Tokenizer& tok);

/// The prompt text of one input line: raw text, or a chat request rendered by the
/// model's template (loaded into `chat` on first use); `is_chat` says which.
/// @throws Error naming `where`: "prompt" and "messages" both or neither, an unknown
///   key on a "prompt" line, a template error.
std::string prompt_text(const nlohmann::ordered_json& line, bool chat_flag, const Tokenizer& tok,
                        const std::filesystem::path& model_dir, std::unique_ptr<ModelChatTemplate>& chat,
                        const std::string& where, bool& is_chat);

/// Reads one request line into `r`, as `generate` does for each --input line (and for
/// {"prompt": --prompt}): r.settings = `defaults` with the line's keys applied
/// (apply_request_keys), its stop_token_ids checked against `vocab_size` (config.json's),
/// and r.text = prompt_text(...) (raw, or rendered by the chat template, loaded into
/// `chat` from `model_dir` on first use; `is_chat` says which). r.where names the line.
/// Tokenizing r.text is left to the caller (it first bounds the text's bytes).
/// @throws Error naming r.where and the key as apply_request_keys and prompt_text do; for
///   a stop token id >= vocab_size, naming the line's key, or --stop-token-ids when the
///   ids are the flag's (the line did not set them).
void read_request_line(const nlohmann::ordered_json& line, const RequestSettings& defaults, int64_t vocab_size,
                       bool chat_flag, const Tokenizer& tok, const std::filesystem::path& model_dir,
                       std::unique_ptr<ModelChatTemplate>& chat, Request& r, bool& is_chat);

/// The completion text of `ids` after the request's prompt, cut before the first stop
/// string it holds (vLLM's rule); `stopped` tells whether one was found.
std::string completion_text(const Tokenizer& tok, const Request& r, const std::vector<int32_t>& ids, bool& stopped);

/// One id's text (special tokens kept), or "" when it cannot be decoded alone.
std::string token_text(const Tokenizer& tok, int32_t id);

/// One output line: {index, prompt, completion, prompt_ids, completion_ids,
/// finish_reason, [error], prompt_tokens, completion_tokens, [logprobs]}; `completion`
/// receives the completion text.
nlohmann::ordered_json output_line(const Tokenizer& tok, const Request& r, const GenerationResult& g,
                                   std::string& completion);

/// A JSONL line of `j` (invalid UTF-8 replaced, never thrown on).
std::string dump_line(const nlohmann::ordered_json& j);

/// The BatchRequest that runs `r`: its ids, sampling settings with `seed`,
/// max_new_tokens, `eos` plus its stop_token_ids, top_logprobs and error.
BatchRequest batch_request(const Request& r, const std::vector<int64_t>& eos, uint64_t seed);

/// Finds a request's stop strings in a text that grows at its end, in time linear in the
/// text for each stop string (Knuth-Morris-Pratt: no byte is compared twice, however
/// long a stop string the text keeps almost matching).
class StopFinder {
 public:
  /// `stops`: non-empty strings.
  explicit StopFinder(const std::vector<std::string>& stops);
  /// Appends `more` to the text; returns the offset in the whole text where the earliest
  /// stop string that ends inside `more` starts, or npos.
  size_t feed(std::string_view more);

 private:
  struct Stop {
    std::string text;
    std::vector<uint32_t> fail;  // KMP: longest proper prefix of text[0..i] that is also its suffix
    size_t matched = 0;          // bytes of text matched at the end of what was fed
  };
  std::vector<Stop> stops_;
  size_t fed_ = 0;  // bytes fed so far
};

/// The completion text of one request as its tokens arrive, for streaming: complete
/// UTF-8 characters only (StreamingDetokenizer), text held back while it could be the
/// start of one of the request's stop strings, and nothing from the first stop string
/// on. The concatenation of every push() and finish() equals completion_text().
class CompletionStream {
 public:
  CompletionStream(const Tokenizer& tok, const Request& r);
  /// Appends generated `token`; returns the text that can be shown now (often "").
  /// @throws Error when the id is out of the tokenizer's range.
  std::string push(int32_t token);
  /// Once generation has ended: the text still held (the detokenizer flushed), up to a
  /// stop string.
  std::string finish();
  /// A stop string has appeared in the text.
  bool stopped() const { return cut_ != std::string::npos; }

 private:
  std::string release(bool final);

  StreamingDetokenizer stream_;
  StopFinder stops_;
  size_t hold_ = 0;                // longest stop string - 1
  std::string text_;               // everything decoded so far
  size_t shown_ = 0;               // bytes of text_ already returned
  size_t cut_ = std::string::npos; // where the first stop string starts
};

/// The stop-string check of one request on tp rank 0: detokenizes the new tokens as
/// they come and tells when the text holds one of the request's stop strings.
class StopScan {
 public:
  /// Appends `token`; true when a stop string now ends inside the text.
  bool push(const Tokenizer& tok, const Request& r, int32_t token);

 private:
  std::unique_ptr<StreamingDetokenizer> stream_;
  std::unique_ptr<StopFinder> stops_;
};

}  // namespace linnet
