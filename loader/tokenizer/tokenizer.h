// Tokenizer: text <-> token ids from a Hugging Face tokenizer.json, in C++.
//
// The pipeline is the one of the `tokenizers` library (huggingface/tokenizers,
// tokenizers/src/tokenizer/mod.rs), built component by component from the JSON:
// added tokens are cut out of the raw text first, then each remaining piece goes
// through normalizer -> pre-tokenizer -> model (BPE) -> post-processor; ids go back
// through the decoder chain. Every component type is a small class in
// tokenizer_parts.h; a type the file names but this code does not know is a load error
// naming the type and the file, never a silent fallback.
//
// Design choice: behaviour follows `tokenizers` exactly, quirks included (a run of
// byte tokens that is not valid UTF-8 decodes to one U+FFFD per byte), so the ids
// and text agree with what the model was trained on and with the goldens.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace linnet {

/// A loaded tokenizer. Immutable after load; cheap to copy (the tables are shared),
/// and safe to use from several threads at once.
class Tokenizer {
 public:
  /// Loads `model_dir`/tokenizer.json and, when present, `model_dir`/tokenizer_config.json
  /// (and `model_dir`/chat_template.jinja when the config has no chat_template).
  /// @throws Error naming the file when tokenizer.json is missing, is not valid JSON,
  ///   has a field of the wrong type, names a component type that is not supported
  ///   (the error names the type), or is inconsistent (a merge or special token that is
  ///   not in the vocabulary); likewise for a malformed tokenizer_config.json.
  static Tokenizer from_dir(const std::filesystem::path& model_dir);

  /// Loads the two files directly. `tokenizer_config_json` may name a file that does
  /// not exist (then: no config). Config fields read: pad_token, add_bos_token / add_eos_token
  /// (when either is present the single-sequence template becomes
  /// [bos_token if add_bos_token] A [eos_token if add_eos_token], as transformers'
  /// LlamaTokenizerFast.update_post_processor does), bos_token / eos_token / unk_token
  /// (a string or {"content": ...}), chat_template (a string, or the "default" entry
  /// of a list of {name, template}).
  /// Without a config bos_token_id() is the special token that starts the template,
  /// if any, and eos_token_id() is empty.
  /// @throws Error as from_dir.
  static Tokenizer from_files(const std::filesystem::path& tokenizer_json,
                              const std::filesystem::path& tokenizer_config_json);

  /// The same from the files' texts, held in memory: `tokenizer_json` is a tokenizer.json,
  /// `tokenizer_config_json` a tokenizer_config.json or nullopt (no config).
  /// `tokenizer_where` / `config_where` name them in errors (from_files passes the paths).
  /// @throws Error as from_files, naming `tokenizer_where` or `config_where`.
  static Tokenizer from_json_text(std::string_view tokenizer_json,
                                  std::optional<std::string_view> tokenizer_config_json,
                                  const std::string& tokenizer_where = "tokenizer.json",
                                  const std::string& config_where = "tokenizer_config.json");

  /// Token ids of `text` (UTF-8). Added tokens (e.g. "<s>") written in the text are
  /// matched as tokens whether or not add_special_tokens is set; add_special_tokens adds
  /// the post-processor's tokens (BOS for Llama). Semantics of tokenizers'
  /// Tokenizer::encode(text, add_special_tokens).
  /// @throws Error "invalid UTF-8 at byte offset N" when `text` is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  /// Text of `ids` through the decoder chain (tokenizers' Tokenizer::decode). With
  /// skip_special_tokens, ids of special added tokens contribute nothing. Invalid byte
  /// sequences from byte-fallback tokens become U+FFFD, one per byte of the run.
  /// @throws Error naming the id when an id is negative, >= vocab_size(), or has no token.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;

  /// The bytes token `id` stands for in a text, after other tokens: the decoder chain
  /// applied to it in a position that is not the first, so a SentencePiece "▁the" gives
  /// " the" (decode of the id alone drops that space), and a byte-fallback (<0xE4>) or
  /// byte-level token its raw bytes even when they are no valid UTF-8 alone (decode makes
  /// those U+FFFD). An added token gives its content. What an API lists per token
  /// (OpenAI's tokens and top_logprobs keys, the "bytes" of chat logprobs).
  /// @throws Error naming the id when it is out of range or has no token.
  std::string token_bytes(int32_t id) const;

  /// The byte of a byte-fallback token ("<0xE4>" in a vocabulary whose decoder has
  /// ByteFallback), else nothing (also for an id out of range).
  std::optional<unsigned char> fallback_byte(int32_t id) const;

  /// Number of ids the tokenizer knows: the largest id of the vocabulary or of the added
  /// tokens, plus one. (The model's embedding may be larger, padded.)
  int64_t vocab_size() const;

  /// The id of `token` (the vocabulary string, e.g. "▁the" or "<0x0A>"): added tokens
  /// first, then the model vocabulary. Empty if unknown.
  std::optional<int32_t> token_to_id(std::string_view token) const;

  /// The vocabulary string of `id`.
  /// @throws Error naming the id when it is out of range or has no token.
  std::string id_to_token(int32_t id) const;

  /// BOS / EOS ids from tokenizer_config.json (see from_files for the fallback).
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  /// The pad_token of tokenizer_config.json (Phi-3, Qwen3: <|endoftext|>), if any.
  std::optional<int32_t> pad_token_id() const;

  /// True for ids of added tokens marked "special" (<s>, </s>, <unk> for Llama-2).
  /// False for ids out of range.
  bool is_special(int32_t id) const;

  /// The Jinja chat template from the config, or "" when there is none.
  const std::string& chat_template() const;

  /// Where chat_template() came from, as template errors name it: "<tokenizer_config.json>
  /// chat_template" or the path of chat_template.jinja; "" when there is no template.
  const std::string& chat_template_source() const;

  struct Impl;  // tokenizer_parts.h

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
  friend class StreamingDetokenizer;
};

/// Incremental detokenizer for generation: push generated ids one at a time and get
/// the text they complete.
///
/// Guarantees: the concatenation of every push() and the final flush() equals
/// decode(prompt + generated) with decode(prompt) removed from its front (whenever
/// decode(prompt) is a prefix of it); text is only ever emitted at UTF-8 character
/// boundaries, so a character split over several byte tokens never appears as U+FFFD
/// piecewise. Text inside an unfinished run of byte-fallback tokens is held until the
/// run ends, since `tokenizers` turns a whole run into U+FFFDs when any byte of it
/// is invalid.
///
/// Method: vLLM's prefix_offset / read_offset scheme (vllm/transformers_utils/
/// detokenizer_utils.py): each step decodes only the window from prefix_offset,
/// and emits what it adds over the window's already-emitted part. The window start is
/// kept where decoding is local (not inside a byte run, and with non-empty text before
/// read_offset so decoders that strip a leading space treat both decodes alike). Text
/// held because it ends in U+FFFD restarts the window where the held ids decode in two
/// independent halves, so a run of invalid bytes costs linear time, not quadratic.
/// A decoder that is ByteLevel alone (Llama-3, Qwen) decodes the bytes of all tokens as
/// one lossy UTF-8 string, so it is streamed byte by byte: each push emits every
/// character (or U+FFFD) its bytes complete and holds only an unfinished one, at most 3
/// bytes, in constant time per byte however the tokens split the characters.
class StreamingDetokenizer {
 public:
  /// @param prompt_ids  ids already shown to the user (their text is not emitted).
  /// @param skip_special_tokens  as in Tokenizer::decode (special ids emit nothing).
  /// @throws Error naming the id when a prompt id is out of range.
  StreamingDetokenizer(const Tokenizer& tok, std::vector<int32_t> prompt_ids,
                       bool skip_special_tokens = true);

  /// Appends `id`; returns the text it completes (often "", e.g. mid-character).
  /// @throws Error naming the id when it is out of range.
  std::string push(int32_t id);

  /// Returns everything still held (an unfinished character comes out as U+FFFD, as in
  /// decode). Call at the end of generation.
  std::string flush();

 private:
  std::string emit(bool force);
  std::string emit_settled(const std::string& new_text);
  std::string take_bytes(bool final);
  bool is_window_start(std::size_t i) const;
  std::string decode_range(std::size_t begin, std::size_t end) const;

  Tokenizer tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;   // prompt + generated, special ids dropped when skipped
  std::size_t prefix_offset_;  // start of the decode window
  std::size_t read_offset_;    // ids_[0, read_offset_) have been emitted
  std::string prefix_text_;    // decode(ids_[prefix_offset_, read_offset_))
  bool bytes_ = false;         // the decoder is ByteLevel alone: stream bytes instead
  std::string pending_;        // bytes mode: the bytes of an unfinished character
  bool prompt_pending_ = false;  // bytes mode: pending_ starts with the prompt's last bytes
};

}  // namespace linnet
