// The components of the tokenizer pipeline, each built from its tokenizer.json section.
// Internal to loader/tokenizer/ (tokenizer.h is the API).
//
// Each component is a small class holding a list of steps, a std::variant per step
// type; a "Sequence" in the JSON flattens into that list. Supporting another type is one
// more variant alternative and one more branch in from_json. Names and semantics follow
// huggingface/tokenizers: normalizers/, pre_tokenizers/, models/bpe/, processors/,
// decoders/. Unicode comes from ICU (properties, NFC), regexes from PCRE2.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/tokenizer/tokenizer.h"
#include "loader/tokenizer/tokenizer_regex.h"
#include "common/utf8.h"

namespace linnet::tok {

using Json = nlohmann::json;

// ---- UTF-8 and Unicode properties (tokenizer_pipeline.cpp) ----

// The UTF-8 helpers live in common/utf8.h (the chat templates and the server use them too).
using linnet::utf8_length_at;
using linnet::check_utf8;
using linnet::utf8_decode_at;
using linnet::utf8_decode_before;

/// Unicode White_Space (Rust's char::is_whitespace), from ICU.
bool is_unicode_whitespace(char32_t c);

/// A word character as the Rust regex crate's Unicode \w matches it (UTS #18: Alphabetic,
/// marks, decimal digits, connector punctuation, join controls), from ICU.
bool is_word_char(char32_t c);

/// Replaces every non-overlapping occurrence of `from` (non-empty), left to right.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);

/// The JSON string at j[key], or an Error naming `where` and the key.
std::string json_string(const Json& j, const char* key, const std::string& where);

/// j[key] by reference, or a null Json when `j` is not an object or has no `key`.
/// Unlike j.value(key, default) it never copies the subtree (a deep copy recurses).
const Json& json_field(const Json& j, const char* key);

/// Token ids are below this: 16.7M, far above real vocabularies (~150k-260k), and
/// low enough that tables indexed by id stay affordable and id + 1 cannot overflow.
constexpr int64_t kTokenIdLimit = int64_t{1} << 24;

/// Deepest nesting of arrays/objects accepted in tokenizer.json / tokenizer_config.json
/// (real files nest about 5); component Sequences are built recursively.
constexpr std::size_t kMaxJsonDepth = 64;

/// The id `v` of `token` (a vocabulary entry, added token or template token).
/// @throws Error naming `where`, the token and the value unless `v` is an integer in
///   [0, kTokenIdLimit).
int32_t json_token_id(const Json& v, const std::string& token, const std::string& where);

/// The byte of a byte-fallback token: "<0xAB>" (6 bytes, hex as Rust's
/// u8::from_str_radix reads it) -> 0xAB, anything else -> empty (decoders/byte_fallback.rs).
std::optional<uint8_t> byte_token_value(std::string_view token);

// ---- normalizers (tokenizer_pipeline.cpp) ----

/// Text -> normalized text. Types: NFC, NFD, NFKC, NFKD (through ICU), Prepend, Replace
/// (String pattern), Sequence; null is the identity.
class Normalizer {
 public:
  /// @throws Error naming `where` and the type when the type is not supported.
  static Normalizer from_json(const Json& j, const std::string& where);
  std::string normalize(std::string text) const;
  enum class UnicodeFormKind { kNFC, kNFD, kNFKC, kNFKD };

 private:
  struct Prepend {
    std::string prepend;  // added in front of non-empty text
  };
  struct Replace {
    std::string pattern;  // literal, non-empty
    std::string content;
  };
  struct UnicodeForm {
    UnicodeFormKind kind;
  };
  using Step = std::variant<Prepend, Replace, UnicodeForm>;
  void add(const Json& j, const std::string& where);
  std::vector<Step> steps_;
};

// ---- pre-tokenizers (tokenizer_pretokenizer.cpp) ----

/// The byte-level alphabet of GPT-2 (tokenizers pre_tokenizers/byte_level.rs,
/// bytes_char): byte b -> the UTF-8 of the printable character that stands for it.
const std::array<std::string, 256>& byte_level_chars();

/// The byte that byte-level character `c` stands for, or -1 when `c` is not one.
int byte_level_byte(char32_t c);

/// Normalized text -> words, each encoded by the model on its own. Types: Split (Regex
/// or String pattern; behaviors Removed, Isolated, MergedWithPrevious, MergedWithNext,
/// Contiguous; invert), ByteLevel (add_prefix_space, use_regex), Metaspace (replacement,
/// prepend_scheme always/first/never or the older add_prefix_space, split), Sequence;
/// null keeps the text as one word.
class PreTokenizer {
 public:
  /// @throws Error naming `where` and the type when the type is not supported, or a
  ///   Split pattern that does not compile (the error gives PCRE2's message).
  static PreTokenizer from_json(const Json& j, const std::string& where);

  /// Appends the non-empty words of `text` to `out`. `at_origin`: `text` starts at byte
  /// 0 of the input (Metaspace's "first" scheme prepends only there).
  void split(std::string_view text, bool at_origin, std::vector<std::string>& out) const;

  /// False for a null pre-tokenizer (then split gives the text itself).
  bool present() const { return !steps_.empty(); }

  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

 private:
  struct Split {
    std::shared_ptr<const Regex> regex;  // null for a String pattern
    std::string literal;                 // the String pattern
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
  };
  struct ByteLevel {
    bool add_prefix_space = false;
    bool use_regex = true;
  };
  struct Metaspace {
    std::string replacement;  // one character, "▁"
    enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
    bool split = true;
  };
  using Step = std::variant<Split, ByteLevel, Metaspace>;
  void add(const Json& j, const std::string& where);
  std::vector<Step> steps_;
};

// ---- the BPE model (bpe.cpp) ----

/// Byte-pair encoding with byte fallback (tokenizers/src/models/bpe/model.rs and
/// word.rs): a word is split into characters, characters missing from the vocabulary
/// become <0xXX> byte tokens (or the unk token), then merges apply lowest rank first,
/// leftmost first among equal ranks.
class BpeModel {
 public:
  /// Reads vocab, merges ("a b" strings or ["a", "b"] pairs), unk_token, fuse_unk,
  /// byte_fallback, ignore_merges, continuing_subword_prefix, end_of_word_suffix.
  /// @throws Error naming `where` for a malformed field, a merge whose parts or result
  ///   are not in the vocabulary, or dropout > 0. (An unk_token missing from the
  ///   vocabulary is an error only when a word needs it, as in tokenizers.)
  static BpeModel from_json(const Json& j, const std::string& where);

  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  /// Appends the ids of one pre-tokenized word (valid UTF-8) to `out`. Thread-safe
  /// (the cache is shared under a mutex).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// The token of `id`, or nullptr when the vocabulary has none.
  const std::string* id_to_token(int32_t id) const;
  /// Largest id + 1 (0 for an empty vocabulary).
  int64_t id_limit() const { return static_cast<int64_t>(id_to_token_.size()); }

 private:
  struct Cache;
  BpeModel();
  std::vector<int32_t> merge_word(std::string_view word) const;
  // A symbol of a word being merged: a doubly linked list over the word's symbols;
  // len == 0 marks a symbol merged away.
  struct Symbol {
    int32_t id;
    int64_t prev;
    int64_t next;
    std::size_t len;
  };
  // The word's characters as symbols (with the continuing-subword prefix and end-of-word
  // suffix; unknown ones as byte fallback or the unk token, fused when fuse_unk).
  std::vector<Symbol> word_symbols(std::string_view word) const;
  // Applies the merges by rank (lowest first, then leftmost), as model.rs's merge_word.
  void apply_merges(std::vector<Symbol>& symbols) const;

  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::optional<std::string>> id_to_token_;
  struct MergeTarget {
    int32_t rank;
    int32_t new_id;
  };
  std::unordered_map<uint64_t, MergeTarget> merges_;  // key: (left id << 32) | right id
  std::string where_;      // the file, for messages
  std::string unk_token_;  // "" when none
  std::optional<int32_t> unk_id_;  // empty when none or not in the vocabulary
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::vector<int32_t> byte_ids_;  // [256] id of "<0xXX>" or -1
  std::unique_ptr<Cache> cache_;
};

// ---- post-processors (tokenizer_pipeline.cpp) ----

/// Adds the special tokens around an encoded sequence: TemplateProcessing's "single"
/// template (processors/template.rs). ByteLevel (it only trims offsets, which linnet
/// does not track) and null add nothing; a Sequence applies its processors in order.
class PostProcessor {
 public:
  /// One template item: the sequence itself ($A) or a special token's ids.
  struct Piece {
    bool is_sequence = false;
    std::vector<int32_t> ids;  // when !is_sequence
  };
  /// @throws Error naming `where` for an unsupported type or a malformed template.
  static PostProcessor from_json(const Json& j, const std::string& where);
  /// Replaces the single template (the tokenizer_config add_bos/add_eos override).
  void set_single(std::vector<Piece> single) { single_ = std::move(single); }
  std::vector<int32_t> process(std::vector<int32_t> ids) const;
  /// The id of a one-token special piece that starts the template, if any.
  std::optional<int32_t> leading_special() const;

 private:
  void add(const Json& j, const std::string& where);
  std::vector<Piece> single_;  // empty: add nothing
  bool has_template_ = false;
};

// ---- decoders (tokenizer_decoder.cpp) ----

/// Tokens -> text: the decoder chain (decoders/: ByteLevel, Metaspace, Replace with a
/// String pattern, ByteFallback, Fuse, Strip, Sequence). Without a decoder the tokens
/// are joined with " ", as tokenizers does.
class Decoder {
 public:
  /// @throws Error naming `where` and the type when the type is not supported.
  static Decoder from_json(const Json& j, const std::string& where);
  std::string decode(std::vector<std::string> tokens) const;
  /// True when the chain holds ByteFallback (runs of <0xXX> tokens decode together).
  bool has_byte_fallback() const;
  /// True when the chain is ByteLevel alone (GPT-2, Llama-3, Qwen): decode is then the
  /// lossy UTF-8 reading of the tokens' bytes (append_token_bytes) one after another,
  /// which the streaming detokenizer follows byte by byte.
  bool byte_level_only() const;

 private:
  struct Replace {
    std::string pattern;  // literal, non-empty
    std::string content;
  };
  struct ByteFallback {};
  struct Fuse {};
  struct Strip {
    char32_t content = U' ';
    std::size_t start = 0;  // at most this many leading `content` chars removed
    std::size_t stop = 0;   // at most this many trailing ones
  };
  struct ByteLevel {};
  struct Metaspace {
    char32_t replacement = U'\u2581';
    bool strip_first = true;  // prepend_scheme != never: the first token loses its replacements
  };
  using Step = std::variant<Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace>;
  void add(const Json& j, const std::string& where);
  bool present_ = false;
  std::vector<Step> steps_;
};

/// Appends the bytes ByteLevel decoding gives `token`: the bytes its characters stand for
/// when they all are byte-level characters, else its own UTF-8 (decoders/byte_level.rs).
void append_token_bytes(const std::string& token, std::string& bytes);

/// Reads `bytes` as String::from_utf8_lossy does (each maximal invalid subsequence is one
/// U+FFFD) onto `out`, except, unless `final`, a valid but unfinished sequence at the end,
/// which later bytes may complete. Returns the bytes read (the rest is that sequence).
std::size_t append_utf8_lossy_prefix(std::string_view bytes, bool final, std::string& out);

// ---- added tokens (tokenizer.cpp) ----

/// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  int32_t id = 0;
  std::string content;  // what is matched in the text (normalized first if `normalized`)
  std::string token;    // what id_to_token / decode see: content, or for a normalized token
                        // its normalized form (tokenizers' normalized_cache)
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

/// A piece of the text during encoding: either still text, or an added token's id.
struct Piece {
  std::string text;
  int32_t id = -1;          // >= 0: an added token
  std::size_t offset = 0;   // byte offset of `text` in the string that was split
};

/// Finds added tokens in text: leftmost-longest, non-overlapping, then the
/// single_word / lstrip / rstrip rules (tokenizers/src/tokenizer/added_vocabulary.rs,
/// find_matches: a single_word token must not touch a \w character; lstrip / rstrip take
/// in the \s characters around it).
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  /// `patterns[i]` is matched for `tokens[i]` (the content, or the normalized content).
  AddedTokenMatcher(std::vector<const AddedToken*> tokens, std::vector<std::string> patterns);
  /// Splits `text` into pieces (empty text pieces dropped) and appends them to `out`.
  void split(const std::string& text, std::vector<Piece>& out) const;
  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<const AddedToken*> tokens_;
  std::vector<std::string> patterns_;
  std::vector<std::vector<std::size_t>> by_first_byte_;  // [256] -> indices, longest first
};

}  // namespace linnet::tok

namespace linnet {

/// Everything a loaded tokenizer holds (shared by copies of a Tokenizer).
struct Tokenizer::Impl {
  std::string where;  // the tokenizer.json path, for messages
  std::vector<tok::AddedToken> added_tokens;
  tok::Normalizer normalizer;
  tok::PreTokenizer pre_tokenizer;
  tok::BpeModel model;
  tok::PostProcessor post_processor;
  tok::Decoder decoder;
  tok::AddedTokenMatcher raw_matcher;         // added tokens with normalized = false
  tok::AddedTokenMatcher normalized_matcher;  // normalized = true, matched after normalizing
  std::unordered_map<std::string, int32_t> added_by_content;
  std::vector<const std::string*> added_by_id;  // [vocab_size], nullptr where none
  std::vector<uint8_t> special;                 // [vocab_size] 1 for special added tokens
  std::vector<int16_t> byte_value;  // [vocab_size] byte of a <0xXX> token if the decoder
                                    // has ByteFallback, else -1
  int64_t vocab_size = 0;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  std::optional<int32_t> pad_id;
  std::string chat_template;
  std::string chat_template_source;  // where chat_template came from, for error messages

  explicit Impl(tok::BpeModel m) : model(std::move(m)) {}
  /// The token string of `id`; throws Error naming the id when there is none.
  const std::string& token_of(int32_t id) const;
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
};

}  // namespace linnet
