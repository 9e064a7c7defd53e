// The decoder chain: token strings -> text. Each step maps the list of token strings
// to a new list (tokenizers' Decoder::decode_chain) and the result is concatenated.
// Semantics: huggingface/tokenizers decoders/{byte_level,metaspace,byte_fallback,fuse,strip,
// sequence}.rs and
// normalizers/replace.rs (Replace is also a decoder).
#include <algorithm>

#include "common/error.h"
#include "loader/json_brief.h"
#include "loader/tokenizer/tokenizer_parts.h"

namespace linnet::tok {
namespace {

std::string join(const std::vector<std::string>& tokens, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out += sep;
    out += tokens[i];
  }
  return out;
}

/// Consecutive byte tokens become the string of their bytes when that is valid UTF-8,
/// else one U+FFFD per byte (the whole run, as byte_fallback.rs does).
std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string run;
  std::size_t run_len = 0;
  auto flush = [&] {
    if (run_len == 0) return;
    if (utf8_valid_prefix(run) == run.size()) {
      out.push_back(std::move(run));
    } else {
      for (std::size_t i = 0; i < run_len; ++i) out.emplace_back("\xEF\xBF\xBD");
    }
    run.clear();
    run_len = 0;
  };
  for (std::string& token : tokens) {
    if (const auto byte = byte_token_value(token)) {
      run.push_back(static_cast<char>(*byte));
      ++run_len;
    } else {
      flush();
      out.push_back(std::move(token));
    }
  }
  flush();
  return out;
}

/// Removes up to `start` leading and `stop` trailing `content` characters of each token.
std::string strip(const std::string& token, char32_t content, std::size_t start, std::size_t stop) {
  std::vector<std::size_t> bounds;  // byte offset of each character, then the end
  for (std::size_t i = 0; i < token.size(); i += std::max<std::size_t>(1, utf8_length_at(token, i))) {
    bounds.push_back(i);
  }
  bounds.push_back(token.size());
  const std::size_t chars = bounds.size() - 1;
  std::size_t first = 0;
  while (first < start && first < chars && utf8_decode_at(token, bounds[first]) == content) ++first;
  std::size_t last = chars;
  for (std::size_t i = 0; i < stop && last > first; ++i) {
    if (utf8_decode_at(token, bounds[last - 1]) != content) break;
    --last;
  }
  return token.substr(bounds[first], bounds[last] - bounds[first]);
}

/// Byte-level tokens -> one string (decoders/byte_level.rs): each token whose characters
/// are all byte-level characters gives those bytes, any other token its own UTF-8; the
/// bytes of all tokens are then read as UTF-8, lossily.
std::string byte_level_decode(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) append_token_bytes(token, bytes);
  std::string out;
  out.reserve(bytes.size());
  append_utf8_lossy_prefix(bytes, /*final=*/true, out);
  return out;
}

}  // namespace

void append_token_bytes(const std::string& token, std::string& bytes) {
  const std::size_t mark = bytes.size();
  for (std::size_t i = 0; i < token.size();) {
    const std::size_t len = std::max<std::size_t>(1, utf8_length_at(token, i));
    const int b = byte_level_byte(utf8_decode_at(token, i));
    if (b < 0) {
      bytes.resize(mark);
      bytes += token;
      return;
    }
    bytes.push_back(static_cast<char>(b));
    i += len;
  }
}

std::size_t append_utf8_lossy_prefix(std::string_view bytes, bool final, std::string& out) {
  for (std::size_t i = 0; i < bytes.size();) {
    const std::size_t len = utf8_length_at(bytes, i);
    if (len > 0) {
      out.append(bytes, i, len);
      i += len;
      continue;
    }
    // How many bytes of a well-formed sequence start here (Unicode's "maximal subpart").
    const auto b0 = static_cast<unsigned char>(bytes[i]);
    std::size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
    else if (b0 >= 0xE0 && b0 <= 0xEF) need = 2, lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    else if (b0 >= 0xF0 && b0 <= 0xF4) need = 3, lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    std::size_t taken = 1;
    bool broken = need == 0;  // a byte that starts no sequence
    for (std::size_t k = 0; k < need; ++k) {
      if (i + taken >= bytes.size()) break;  // the bytes end inside the sequence
      const auto b = static_cast<unsigned char>(bytes[i + taken]);
      if (k == 0 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) {
        broken = true;
        break;
      }
      ++taken;
    }
    if (!broken && !final) return i;  // unfinished: later bytes decide
    out += "\xEF\xBF\xBD";
    i += taken;
  }
  return bytes.size();
}

Decoder Decoder::from_json(const Json& j, const std::string& where) {
  Decoder d;
  if (j.is_null()) return d;
  d.present_ = true;
  d.add(j, where);
  return d;
}

void Decoder::add(const Json& j, const std::string& where) {
  if (!j.is_object()) throw Error("decoder is not an object", where, "object", j.type_name());
  const std::string type = json_string(j, "type", where + " (decoder)");
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j.at("decoders").is_array()) {
      throw Error("decoder Sequence without a 'decoders' array", where);
    }
    for (const Json& child : j.at("decoders")) add(child, where);
  } else if (type == "Replace") {
    const Json& pattern = j.contains("pattern") ? j.at("pattern") : Json();
    if (!pattern.is_object() || !pattern.contains("String") || !pattern.at("String").is_string()) {
      if (pattern.is_object() && pattern.contains("Regex")) {
        throw Error("unsupported Replace pattern type 'Regex' in decoder", where);
      }
      throw Error("malformed Replace pattern in decoder", where, "{\"String\": ...}",
                  json_brief(pattern));
    }
    std::string literal = pattern.at("String").get<std::string>();
    if (literal.empty()) throw Error("empty Replace pattern in decoder", where);
    steps_.push_back(Replace{std::move(literal), json_string(j, "content", where + " (decoder)")});
  } else if (type == "ByteLevel") {
    steps_.emplace_back(std::in_place_type<ByteLevel>);
  } else if (type == "Metaspace") {
    Metaspace m;
    const std::string ctx = where + " (Metaspace decoder)";
    if (j.contains("replacement")) {
      const std::string r = json_string(j, "replacement", ctx);
      if (r.empty() || utf8_length_at(r, 0) != r.size()) {
        throw Error("Metaspace replacement must be one character", ctx, "one character", r);
      }
      m.replacement = utf8_decode_at(r, 0);
    }
    if (j.contains("prepend_scheme") && j.at("prepend_scheme").is_string()) {
      m.strip_first = j.at("prepend_scheme").get<std::string>() != "never";
    } else if (j.contains("add_prefix_space") && j.at("add_prefix_space").is_boolean()) {
      m.strip_first = j.at("add_prefix_space").get<bool>();
    }
    steps_.push_back(m);
  } else if (type == "ByteFallback") {
    steps_.emplace_back(std::in_place_type<ByteFallback>);
  } else if (type == "Fuse") {
    steps_.emplace_back(std::in_place_type<Fuse>);
  } else if (type == "Strip") {
    const std::string content = json_string(j, "content", where + " (Strip decoder)");
    if (content.empty() || utf8_length_at(content, 0) != content.size()) {
      throw Error("Strip decoder content must be one character", where, "one character", content);
    }
    auto count = [&](const char* key) -> std::size_t {  // absent: 0
      if (!j.contains(key)) return 0;
      if (!j.at(key).is_number_unsigned()) {
        throw Error("Strip decoder start/stop must be non-negative integers", where);
      }
      return j.at(key).get<std::size_t>();
    };
    steps_.push_back(Strip{utf8_decode_at(content, 0), count("start"), count("stop")});
  } else {
    throw Error("unsupported decoder type '" + type + "'", where);
  }
}

bool Decoder::byte_level_only() const {
  return present_ && steps_.size() == 1 && std::holds_alternative<ByteLevel>(steps_[0]);
}

bool Decoder::has_byte_fallback() const {
  for (const Step& step : steps_) {
    if (std::holds_alternative<ByteFallback>(step)) return true;
  }
  return false;
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (!present_) return join(tokens, " ");
  for (const Step& step : steps_) {
    if (const auto* r = std::get_if<Replace>(&step)) {
      for (std::string& t : tokens) t = replace_all(t, r->pattern, r->content);
    } else if (std::holds_alternative<ByteFallback>(step)) {
      tokens = byte_fallback(std::move(tokens));
    } else if (std::holds_alternative<Fuse>(step)) {
      std::string fused = join(tokens, "");
      tokens.clear();
      tokens.push_back(std::move(fused));
    } else if (const auto* s = std::get_if<Strip>(&step)) {
      for (std::string& t : tokens) t = strip(t, s->content, s->start, s->stop);
    } else if (std::holds_alternative<ByteLevel>(step)) {
      std::string text = byte_level_decode(tokens);
      tokens.clear();
      tokens.push_back(std::move(text));
    } else if (const auto* m = std::get_if<Metaspace>(&step)) {
      // Every replacement character becomes a space, except in the first token, where
      // (unless the scheme is "never") they are dropped (decoders/metaspace.rs).
      for (std::size_t k = 0; k < tokens.size(); ++k) {
        std::string out;
        const std::string& t = tokens[k];
        for (std::size_t i = 0; i < t.size();) {
          const std::size_t len = std::max<std::size_t>(1, utf8_length_at(t, i));
          if (utf8_decode_at(t, i) != m->replacement) out.append(t, i, len);
          else if (!(k == 0 && m->strip_first)) out += ' ';
          i += len;
        }
        tokens[k] = std::move(out);
      }
    }
  }
  return join(tokens, "");
}

}  // namespace linnet::tok
