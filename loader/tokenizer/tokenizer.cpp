// Tokenizer: loads tokenizer.json (+ tokenizer_config.json) into its components and
// runs the encode / decode pipelines of huggingface/tokenizers
// (tokenizer/mod.rs encode_single_sequence, tokenizer/added_vocabulary.rs).
//
// Design choice: added tokens are cut out of the raw text before normalization (those
// with normalized = false), then out of each normalized piece (normalized = true), so a
// "<s>" typed in the prompt is the token and never "▁<s>" spelled out; every piece is
// normalized on its own, which is why "a<s>b" gets a "▁" before both "a" and "b".
#include <algorithm>

#include "common/error.h"
#include "loader/file_io.h"
#include "loader/json_brief.h"
#include "loader/tokenizer/tokenizer_parts.h"

namespace linnet {
namespace tok {

// ---- added tokens ----

AddedTokenMatcher::AddedTokenMatcher(std::vector<const AddedToken*> tokens,
                                     std::vector<std::string> patterns)
    : tokens_(std::move(tokens)), patterns_(std::move(patterns)), by_first_byte_(256) {
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (patterns_[i].empty()) continue;  // tokenizers never matches empty content
    by_first_byte_[static_cast<unsigned char>(patterns_[i][0])].push_back(i);
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) {
      return patterns_[a].size() > patterns_[b].size();
    });
  }
}

void AddedTokenMatcher::split(const std::string& text, std::vector<Piece>& out) const {
  const std::string_view s = text;
  const std::size_t n = s.size();
  auto push_text = [&](std::size_t begin, std::size_t end) {
    if (begin < end) out.push_back(Piece{text.substr(begin, end - begin), -1, begin});
  };
  std::size_t start_offset = 0;  // end of the last emitted piece
  std::size_t i = 0;             // where the (non-overlapping) match search resumes
  while (i < n) {
    const std::size_t* best = nullptr;
    if (!by_first_byte_.empty()) {
      for (const std::size_t& k : by_first_byte_[static_cast<unsigned char>(s[i])]) {
        if (s.compare(i, patterns_[k].size(), patterns_[k]) == 0) {
          best = &k;  // longest first, so the first hit is the leftmost-longest match
          break;
        }
      }
    }
    if (best == nullptr) {
      ++i;
      continue;
    }
    const AddedToken& token = *tokens_[*best];
    std::size_t start = i;
    std::size_t stop = i + patterns_[*best].size();
    i = stop;
    if (token.single_word) {
      const bool word_before = start > 0 && is_word_char(utf8_decode_before(s, start));
      const bool word_after = stop < n && is_word_char(utf8_decode_at(s, stop));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      // Spaces already taken by the previous piece stay there.
      std::size_t new_start = start;
      while (new_start > start_offset && is_unicode_whitespace(utf8_decode_before(s, new_start))) {
        --new_start;
        while (new_start > 0 && (static_cast<unsigned char>(s[new_start]) & 0xC0) == 0x80) {
          --new_start;
        }
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < n && is_unicode_whitespace(utf8_decode_at(s, stop))) {
        stop += utf8_length_at(s, stop);
      }
    }
    push_text(start_offset, start);
    out.push_back(Piece{{}, token.id, start});
    start_offset = stop;
  }
  push_text(start_offset, n);
}

}  // namespace tok

namespace {

using tok::Json;

/// Parses `text` (the file `where`), refusing nesting deeper than kMaxJsonDepth before
/// any component is built from it (Sequences are built recursively).
Json parse_json_object(std::string_view text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    throw Error(std::string("malformed JSON: ") + e.what(), where);
  }
  check_json_depth(j, tok::kMaxJsonDepth, where);
  if (!j.is_object()) throw Error("top level is not a JSON object", where, "object", j.type_name());
  return j;
}

/// A special-token field of tokenizer_config.json: "<s>", {"content": "<s>", ...} or null.
std::optional<std::string> config_token(const Json& config, const char* key, const std::string& where) {
  if (!config.contains(key) || config.at(key).is_null()) return {};
  const Json& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) return tok::json_string(v, "content", where + " (" + key + ")");
  throw Error(std::string("'") + key + "' is neither a string nor an object", where, "string",
              v.type_name());
}

std::vector<tok::AddedToken> parse_added_tokens(const Json& j, const std::string& where) {
  std::vector<tok::AddedToken> out;
  const Json& list = tok::json_field(j, "added_tokens");  // absent or null: none
  if (!list.is_array() && !list.is_null()) throw Error("'added_tokens' is not an array", where);
  for (const Json& t : list) {
    tok::AddedToken a;
    if (!t.is_object() || !t.contains("id")) {
      throw Error("added token without a valid 'id'", where, "", json_brief(t));
    }
    a.content = tok::json_string(t, "content", where + " (added_tokens)");
    a.id = tok::json_token_id(t.at("id"), a.content, where + " (added_tokens)");
    a.single_word = t.value("single_word", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.special = t.value("special", false);
    a.normalized = t.value("normalized", !a.special);
    out.push_back(std::move(a));
  }
  return out;
}

/// Reads tokenizer_config.json into `impl`: BOS/EOS, the add_bos/add_eos override of
/// the template, the chat template.
void apply_config(Tokenizer::Impl& impl, const Json& c, const std::string& where) {
  auto id_of = [&](const std::string& token, const char* key) {
    auto it = impl.added_by_content.find(token);
    if (it != impl.added_by_content.end()) return it->second;
    if (const auto id = impl.model.token_to_id(token)) return *id;
    throw Error(std::string(key) + " '" + token + "' is not in the vocabulary", where);
  };
  if (c.contains("bos_token")) {
    impl.bos_id.reset();
    if (const auto t = config_token(c, "bos_token", where)) impl.bos_id = id_of(*t, "bos_token");
  }
  if (const auto t = config_token(c, "eos_token", where)) impl.eos_id = id_of(*t, "eos_token");
  if (const auto t = config_token(c, "pad_token", where)) impl.pad_id = id_of(*t, "pad_token");

  if (c.contains("add_bos_token") || c.contains("add_eos_token")) {
    auto flag = [&](const char* key, bool fallback) {
      if (!c.contains(key) || c.at(key).is_null()) return fallback;
      if (!c.at(key).is_boolean()) throw Error(std::string("'") + key + "' is not a boolean", where);
      return c.at(key).get<bool>();
    };
    const bool add_bos = flag("add_bos_token", impl.post_processor.leading_special().has_value());
    const bool add_eos = flag("add_eos_token", false);
    std::vector<tok::PostProcessor::Piece> single;
    if (add_bos) {
      if (!impl.bos_id) throw Error("add_bos_token is true but there is no bos_token", where);
      single.push_back({false, {*impl.bos_id}});
    }
    single.push_back({true, {}});
    if (add_eos) {
      if (!impl.eos_id) throw Error("add_eos_token is true but there is no eos_token", where);
      single.push_back({false, {*impl.eos_id}});
    }
    impl.post_processor.set_single(std::move(single));
  }

  if (c.contains("chat_template") && !c.at("chat_template").is_null()) {
    const Json& t = c.at("chat_template");
    if (t.is_string()) {
      impl.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const Json& entry : t) {
        if (entry.is_object() && entry.value("name", "") == "default") {
          impl.chat_template = tok::json_string(entry, "template", where + " (chat_template)");
        }
      }
    } else {
      throw Error("'chat_template' is neither a string nor a list", where, "string", t.type_name());
    }
    if (!impl.chat_template.empty()) impl.chat_template_source = where + " chat_template";
  }
}

/// Builds the tokenizer from the texts of tokenizer.json (named `where` in errors) and,
/// when given, tokenizer_config.json (named `cwhere`).
std::shared_ptr<Tokenizer::Impl> load(std::string_view tokenizer_json, const std::string& where,
                                      std::optional<std::string_view> config_json, const std::string& cwhere) {
  const Json j = parse_json_object(tokenizer_json, where);
  std::shared_ptr<Tokenizer::Impl> impl;
  try {
    if (!j.contains("model") || !j.at("model").is_object()) {
      throw Error("no 'model' object", where);
    }
    const Json& model = j.at("model");
    const std::string type = model.contains("type") ? tok::json_string(model, "type", where) : "BPE";
    if (type != "BPE") throw Error("unsupported model type '" + type + "'", where);
    impl = std::make_shared<Tokenizer::Impl>(tok::BpeModel::from_json(model, where));
    impl->where = where;
    impl->normalizer = tok::Normalizer::from_json(tok::json_field(j, "normalizer"), where);
    impl->pre_tokenizer = tok::PreTokenizer::from_json(tok::json_field(j, "pre_tokenizer"), where);
    impl->post_processor =
        tok::PostProcessor::from_json(tok::json_field(j, "post_processor"), where);
    impl->decoder = tok::Decoder::from_json(tok::json_field(j, "decoder"), where);
    impl->added_tokens = parse_added_tokens(j, where);
  } catch (const Json::exception& e) {
    throw Error(std::string("malformed tokenizer.json: ") + e.what(), where);
  }
  Tokenizer::Impl& t = *impl;

  t.vocab_size = t.model.id_limit();
  for (const auto& a : t.added_tokens) t.vocab_size = std::max<int64_t>(t.vocab_size, a.id + int64_t{1});
  t.added_by_id.assign(static_cast<std::size_t>(t.vocab_size), nullptr);
  t.special.assign(static_cast<std::size_t>(t.vocab_size), 0);
  std::vector<const tok::AddedToken*> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (auto& a : t.added_tokens) {
    a.token = a.normalized ? t.normalizer.normalize(a.content) : a.content;
    t.added_by_content.emplace(a.content, a.id);
    t.added_by_id[a.id] = &a.token;
    t.special[a.id] = a.special ? 1 : 0;
    if (a.normalized) {
      normalized.push_back(&a);
      normalized_patterns.push_back(a.token);
    } else {
      raw.push_back(&a);
      raw_patterns.push_back(a.content);
    }
  }
  t.raw_matcher = tok::AddedTokenMatcher(std::move(raw), std::move(raw_patterns));
  t.normalized_matcher = tok::AddedTokenMatcher(std::move(normalized), std::move(normalized_patterns));

  for (const int32_t id : t.post_processor.process({})) {
    if (id >= t.vocab_size) {
      throw Error("post_processor special token id " + std::to_string(id) + " is out of range",
                  where, "< " + std::to_string(t.vocab_size), std::to_string(id));
    }
  }
  t.byte_value.assign(static_cast<std::size_t>(t.vocab_size), -1);
  if (t.decoder.has_byte_fallback()) {
    for (int32_t id = 0; id < t.vocab_size; ++id) {
      const std::string* token = t.added_by_id[id] ? t.added_by_id[id] : t.model.id_to_token(id);
      if (token == nullptr) continue;
      if (const auto b = tok::byte_token_value(*token)) t.byte_value[id] = *b;
    }
  }

  t.bos_id = t.post_processor.leading_special();
  if (config_json) {
    const Json c = parse_json_object(*config_json, cwhere);
    try {
      apply_config(t, c, cwhere);
    } catch (const Json::exception& e) {
      throw Error(std::string("malformed tokenizer_config.json: ") + e.what(), cwhere);
    }
  }
  return impl;
}

/// Reads the files and builds the tokenizer; `config_json` may be empty or name a file
/// that does not exist (then: no config).
std::shared_ptr<Tokenizer::Impl> load_files(const std::filesystem::path& tokenizer_json,
                                            const std::filesystem::path& config_json) {
  const std::string text = read_text_file(tokenizer_json, "tokenizer file");
  std::optional<std::string> config;
  if (!config_json.empty() && std::filesystem::exists(config_json)) {
    config = read_text_file(config_json, "tokenizer config");
  }
  return load(text, tokenizer_json.string(), config ? std::optional<std::string_view>(*config) : std::nullopt,
              config_json.string());
}

}  // namespace

// ---- pipeline ----

const std::string& Tokenizer::Impl::token_of(int32_t id) const {
  if (id < 0 || id >= vocab_size) {
    throw Error("token id " + std::to_string(id) + " out of range", where,
                "0 <= id < " + std::to_string(vocab_size), std::to_string(id));
  }
  if (const std::string* added = added_by_id[id]) return *added;
  if (const std::string* token = model.id_to_token(id)) return *token;
  throw Error("no token has id " + std::to_string(id), where);
}

std::vector<int32_t> Tokenizer::Impl::encode(std::string_view text, bool add_special_tokens) const {
  tok::check_utf8(text, "tokenizer input");
  std::vector<tok::Piece> raw_pieces;
  if (raw_matcher.empty()) {
    if (!text.empty()) raw_pieces.push_back(tok::Piece{std::string(text), -1, 0});
  } else {
    raw_matcher.split(std::string(text), raw_pieces);
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<tok::Piece> pieces;
  std::vector<std::string> words;
  for (const tok::Piece& raw : raw_pieces) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    std::string normalized = normalizer.normalize(raw.text);
    pieces.clear();
    if (normalized_matcher.empty()) {
      pieces.push_back(tok::Piece{std::move(normalized), -1, 0});
    } else {
      normalized_matcher.split(normalized, pieces);
    }
    for (const tok::Piece& piece : pieces) {
      if (piece.id >= 0) {
        ids.push_back(piece.id);
        continue;
      }
      if (!pre_tokenizer.present()) {
        model.tokenize(piece.text, ids);
        continue;
      }
      words.clear();
      pre_tokenizer.split(piece.text, raw.offset == 0 && piece.offset == 0, words);
      for (const std::string& word : words) model.tokenize(word, ids);
    }
  }
  return add_special_tokens ? post_processor.process(std::move(ids)) : ids;
}

std::string Tokenizer::Impl::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const std::string& token = token_of(id);
    // By id: tokenizers looks the token string up in its set of special contents, which
    // misses a special token with normalized = true (its string is the normalized form).
    if (skip_special_tokens && special[id]) continue;
    tokens.push_back(token);
  }
  return decoder.decode(std::move(tokens));
}

// ---- public API ----

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_files(const std::filesystem::path& tokenizer_json,
                                const std::filesystem::path& tokenizer_config_json) {
  return Tokenizer(load_files(tokenizer_json, tokenizer_config_json));
}

Tokenizer Tokenizer::from_json_text(std::string_view tokenizer_json,
                                    std::optional<std::string_view> tokenizer_config_json,
                                    const std::string& tokenizer_where, const std::string& config_where) {
  return Tokenizer(load(tokenizer_json, tokenizer_where, tokenizer_config_json, config_where));
}

Tokenizer Tokenizer::from_dir(const std::filesystem::path& model_dir) {
  auto impl = load_files(model_dir / "tokenizer.json", model_dir / "tokenizer_config.json");
  const auto jinja = model_dir / "chat_template.jinja";
  if (impl->chat_template.empty() && std::filesystem::exists(jinja)) {
    impl->chat_template = read_text_file(jinja, "chat template");
    impl->chat_template_source = jinja.string();
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const std::string& token = impl_->token_of(id);
  if (impl_->added_by_id[static_cast<size_t>(id)] != nullptr) return token;
  if (const std::optional<unsigned char> b = fallback_byte(id)) return std::string(1, static_cast<char>(*b));
  if (impl_->decoder.byte_level_only()) {
    std::string bytes;
    tok::append_token_bytes(token, bytes);
    return bytes;
  }
  // After a token of its own ("a"), as a later token: a first token's leading space is
  // what decoders drop (Metaspace's prepend scheme, Strip after Fuse).
  const std::string text = impl_->decoder.decode({"a", token});
  return text.rfind('a', 0) == 0 ? text.substr(1) : text;
}

std::optional<unsigned char> Tokenizer::fallback_byte(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size) return std::nullopt;
  const int16_t b = impl_->byte_value[static_cast<size_t>(id)];
  return b >= 0 ? std::optional<unsigned char>(static_cast<unsigned char>(b)) : std::nullopt;
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->added_by_content.find(std::string(token));
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->model.token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const { return impl_->token_of(id); }

std::optional<int32_t> Tokenizer::bos_token_id() const { return impl_->bos_id; }

std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos_id; }

std::optional<int32_t> Tokenizer::pad_token_id() const { return impl_->pad_id; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id] != 0;
}

const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

const std::string& Tokenizer::chat_template_source() const { return impl_->chat_template_source; }

}  // namespace linnet
