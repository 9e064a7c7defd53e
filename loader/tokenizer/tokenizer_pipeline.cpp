// Encode-side pieces of the tokenizer pipeline: UTF-8 checks, Unicode properties (from
// ICU, no hand-written tables), normalizers, pre-tokenizers and post-processors, each
// built from its tokenizer.json section. Semantics: huggingface/tokenizers
// normalizers/{unicode,prepend,replace}.rs, processors/{template,sequence}.rs.
// (Pre-tokenizers: tokenizer_pretokenizer.cpp.)
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "common/error.h"
#include "loader/json_brief.h"
#include "loader/tokenizer/tokenizer_parts.h"

namespace linnet::tok {

// ---- UTF-8 ----

bool is_unicode_whitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

bool is_word_char(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  if (u_isUAlphabetic(cp) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) return true;
  switch (u_charType(cp)) {
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  std::size_t pos = 0;
  while (true) {
    const std::size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s, pos, std::string_view::npos);
  return out;
}

std::string json_string(const Json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || !j.at(key).is_string()) {
    throw Error(std::string("field '") + key + "' missing or not a string", where, "string",
                j.is_object() && j.contains(key) ? j.at(key).type_name() : "nothing");
  }
  return j.at(key).get<std::string>();
}

const Json& json_field(const Json& j, const char* key) {
  static const Json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

int32_t json_token_id(const Json& v, const std::string& token, const std::string& where) {
  // Unsigned first: get<int64_t> of an integer above 2^63-1 would wrap negative.
  bool ok = false;
  if (v.is_number_unsigned()) {
    ok = v.get<uint64_t>() < static_cast<uint64_t>(kTokenIdLimit);
  } else if (v.is_number_integer()) {
    ok = v.get<int64_t>() >= 0 && v.get<int64_t>() < kTokenIdLimit;
  }
  if (!ok) {
    throw Error("id of token " + json_brief(Json(token)) + " is not an integer in [0, " +
                    std::to_string(kTokenIdLimit) + ")",
                where, "0 <= id < " + std::to_string(kTokenIdLimit), json_brief(v));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

std::optional<uint8_t> byte_token_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token.back() != '>') return {};
  // Rust's u8::from_str_radix(s, 16) on token[3..5]: an optional '+', then hex digits.
  std::string_view digits = token.substr(3, 2);
  if (digits[0] == '+') digits.remove_prefix(1);
  unsigned value = 0;
  for (char c : digits) {
    unsigned d;
    if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
    else return {};
    value = value * 16 + d;
  }
  return static_cast<uint8_t>(value);
}

namespace {

/// The "type" of a component, or an Error naming the section.
std::string type_of(const Json& j, const char* section, const std::string& where) {
  if (!j.is_object()) {
    throw Error(std::string(section) + " is not an object", where, "object", j.type_name());
  }
  return json_string(j, "type", where + " (" + section + ")");
}

/// The literal of a {"String": "..."} pattern; Error for {"Regex": ...} or anything else.
std::string string_pattern(const Json& j, const char* section, const std::string& where) {
  const Json& pattern = j.contains("pattern") ? j.at("pattern") : Json();
  if (pattern.is_object() && pattern.contains("String") && pattern.at("String").is_string()) {
    std::string literal = pattern.at("String").get<std::string>();
    if (literal.empty()) {
      throw Error(std::string("empty Replace pattern in ") + section, where);
    }
    return literal;
  }
  if (pattern.is_object() && pattern.contains("Regex")) {
    throw Error(std::string("unsupported Replace pattern type 'Regex' in ") + section, where);
  }
  throw Error(std::string("malformed Replace pattern in ") + section, where,
              "{\"String\": ...}", json_brief(pattern));
}

/// `text` (valid UTF-8) in the Unicode normalization form `kind`, through ICU's
/// Normalizer2 (the same forms as the unicode-normalization crate tokenizers uses).
std::string unicode_normalize(const std::string& text, Normalizer::UnicodeFormKind kind) {
  bool ascii = true;  // ASCII is invariant under every form: the common case costs nothing
  for (const char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return text;
  UErrorCode status = U_ZERO_ERROR;
  using K = Normalizer::UnicodeFormKind;
  const UNormalizer2* norm = kind == K::kNFC    ? unorm2_getNFCInstance(&status)
                             : kind == K::kNFD  ? unorm2_getNFDInstance(&status)
                             : kind == K::kNFKC ? unorm2_getNFKCInstance(&status)
                                                : unorm2_getNFKDInstance(&status);
  auto check = [&](const char* step) {
    if (U_FAILURE(status)) {
      throw Error(std::string("ICU normalization failed (") + step + "): " + u_errorName(status),
                  "normalizer");
    }
  };
  check("instance");
  std::u16string utf16(text.size(), u'\0');  // UTF-16 never has more units than UTF-8 bytes
  int32_t len16 = 0;
  u_strFromUTF8(utf16.data(), static_cast<int32_t>(utf16.size()), &len16, text.data(),
                static_cast<int32_t>(text.size()), &status);
  check("from UTF-8");
  utf16.resize(static_cast<std::size_t>(len16));
  if (unorm2_isNormalized(norm, utf16.data(), len16, &status) && U_SUCCESS(status)) return text;
  status = U_ZERO_ERROR;
  std::u16string out(utf16.size() * 3 + 16, u'\0');
  int32_t out_len = unorm2_normalize(norm, utf16.data(), len16, out.data(),
                                     static_cast<int32_t>(out.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    status = U_ZERO_ERROR;
    out.assign(static_cast<std::size_t>(out_len), u'\0');
    out_len = unorm2_normalize(norm, utf16.data(), len16, out.data(), out_len, &status);
  }
  check("normalize");
  std::string result(static_cast<std::size_t>(out_len) * 3, '\0');
  int32_t len8 = 0;
  u_strToUTF8(result.data(), static_cast<int32_t>(result.size()), &len8, out.data(), out_len, &status);
  check("to UTF-8");
  result.resize(static_cast<std::size_t>(len8));
  return result;
}

}  // namespace

// ---- normalizers ----

Normalizer Normalizer::from_json(const Json& j, const std::string& where) {
  Normalizer n;
  if (!j.is_null()) n.add(j, where);
  return n;
}

void Normalizer::add(const Json& j, const std::string& where) {
  const std::string type = type_of(j, "normalizer", where);
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j.at("normalizers").is_array()) {
      throw Error("normalizer Sequence without a 'normalizers' array", where);
    }
    for (const Json& child : j.at("normalizers")) add(child, where);
  } else if (type == "Prepend") {
    steps_.push_back(Prepend{json_string(j, "prepend", where + " (Prepend normalizer)")});
  } else if (type == "Replace") {
    steps_.push_back(Replace{string_pattern(j, "Replace normalizer", where),
                             json_string(j, "content", where + " (Replace normalizer)")});
  } else if (type == "NFC") {
    steps_.push_back(UnicodeForm{UnicodeFormKind::kNFC});
  } else if (type == "NFD") {
    steps_.push_back(UnicodeForm{UnicodeFormKind::kNFD});
  } else if (type == "NFKC") {
    steps_.push_back(UnicodeForm{UnicodeFormKind::kNFKC});
  } else if (type == "NFKD") {
    steps_.push_back(UnicodeForm{UnicodeFormKind::kNFKD});
  } else {
    throw Error("unsupported normalizer type '" + type + "'", where);
  }
}

std::string Normalizer::normalize(std::string text) const {
  for (const Step& step : steps_) {
    if (const auto* p = std::get_if<Prepend>(&step)) {
      if (!text.empty()) text = p->prepend + text;
    } else if (const auto* r = std::get_if<Replace>(&step)) {
      text = replace_all(text, r->pattern, r->content);
    } else if (const auto* u = std::get_if<UnicodeForm>(&step)) {
      text = unicode_normalize(text, u->kind);
    }
  }
  return text;
}

// ---- post-processors ----

PostProcessor PostProcessor::from_json(const Json& j, const std::string& where) {
  PostProcessor p;
  if (!j.is_null()) p.add(j, where);
  return p;
}

void PostProcessor::add(const Json& j, const std::string& where) {
  const std::string type = type_of(j, "post_processor", where);
  if (type == "Sequence") {
    if (!j.contains("processors") || !j.at("processors").is_array()) {
      throw Error("post_processor Sequence without a 'processors' array", where);
    }
    for (const Json& child : j.at("processors")) add(child, where);
    return;
  }
  if (type == "ByteLevel") return;  // changes offsets only
  if (type != "TemplateProcessing") {
    throw Error("unsupported post_processor type '" + type + "'", where);
  }
  const std::string ctx = where + " (TemplateProcessing)";
  if (has_template_) throw Error("more than one TemplateProcessing in the post_processor", ctx);
  has_template_ = true;
  if (!j.contains("single") || !j.at("single").is_array()) {
    throw Error("'single' template missing or not an array", ctx);
  }
  const Json& specials = json_field(j, "special_tokens");
  for (const Json& item : j.at("single")) {
    if (item.contains("Sequence")) {
      const std::string seq = json_string(item.at("Sequence"), "id", ctx);
      if (seq != "A") throw Error("single template uses sequence '" + seq + "'", ctx, "A", seq);
      single_.push_back(Piece{true, {}});
    } else if (item.contains("SpecialToken")) {
      const std::string name = json_string(item.at("SpecialToken"), "id", ctx);
      if (!specials.is_object() || !specials.contains(name)) {
        throw Error("template special token '" + name + "' not in special_tokens", ctx);
      }
      const Json& ids = specials.at(name).at("ids");
      Piece piece;
      for (const Json& id : ids) piece.ids.push_back(json_token_id(id, name, ctx));
      single_.push_back(std::move(piece));
    } else {
      throw Error("template item is neither Sequence nor SpecialToken", ctx, "", json_brief(item));
    }
  }
}

std::vector<int32_t> PostProcessor::process(std::vector<int32_t> ids) const {
  if (single_.empty()) return ids;
  std::vector<int32_t> out;
  out.reserve(ids.size() + single_.size());
  for (const Piece& piece : single_) {
    if (piece.is_sequence) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), piece.ids.begin(), piece.ids.end());
    }
  }
  return out;
}

std::optional<int32_t> PostProcessor::leading_special() const {
  if (single_.empty() || single_[0].is_sequence || single_[0].ids.size() != 1) return {};
  return single_[0].ids[0];
}

}  // namespace linnet::tok
