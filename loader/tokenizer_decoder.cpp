// The decoder chain: token strings -> text. Each step maps the list of token strings
// to a new list (tokenizers' Decoder::decode_chain) and the result is concatenated.
// Semantics: huggingface/tokenizers decoders/{byte_fallback,fuse,strip,sequence}.rs and
// normalizers/replace.rs (Replace is also a decoder).
#include <algorithm>

#include "common/error.h"
#include "loader/json_brief.h"
#include "loader/tokenizer_parts.h"

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
    bool valid = true;
    for (std::size_t i = 0; i < run.size();) {
      const std::size_t len = utf8_length_at(run, i);
      if (len == 0) {
        valid = false;
        break;
      }
      i += len;
    }
    if (valid) {
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

}  // namespace

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
  } else if (type == "ByteFallback") {
    steps_.emplace_back(std::in_place_type<ByteFallback>);
  } else if (type == "Fuse") {
    steps_.emplace_back(std::in_place_type<Fuse>);
  } else if (type == "Strip") {
    const std::string content = json_string(j, "content", where + " (Strip decoder)");
    if (content.empty() || utf8_length_at(content, 0) != content.size()) {
      throw Error("Strip decoder content must be one character", where, "one character", content);
    }
    const Json start = j.value("start", Json(0));
    const Json stop = j.value("stop", Json(0));
    if (!start.is_number_unsigned() || !stop.is_number_unsigned()) {
      throw Error("Strip decoder start/stop must be non-negative integers", where);
    }
    steps_.push_back(Strip{utf8_decode_at(content, 0), start.get<std::size_t>(),
                           stop.get<std::size_t>()});
  } else {
    throw Error("unsupported decoder type '" + type + "'", where);
  }
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
    }
  }
  return join(tokens, "");
}

}  // namespace linnet::tok
