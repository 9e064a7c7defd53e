// Pre-tokenizers: normalized text -> words. Semantics of huggingface/tokenizers
// pre_tokenizers/{split,byte_level,metaspace,sequence}.rs and the split behaviours of
// tokenizer/normalizer.rs (SplitDelimiterBehavior).
//
// Design choice: each step maps the current list of words to a new one, as tokenizers'
// PreTokenizedString::split does, and empty words are dropped after every step. Regexes
// run through PCRE2 (tokenizer_regex.h); the byte-level alphabet is computed once.
#include <algorithm>

#include "common/error.h"
#include "loader/json_brief.h"
#include "loader/tokenizer/tokenizer_parts.h"

namespace linnet::tok {
namespace {

using Range = std::pair<std::size_t, std::size_t>;

/// GPT-2's pattern, used by ByteLevel with use_regex (pre_tokenizers/byte_level.rs).
const Regex& gpt2_regex() {
  static const Regex regex(
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      "ByteLevel pre-tokenizer");
  return regex;
}

/// Matches of a literal pattern, left to right, non-overlapping.
void find_literal(std::string_view text, std::string_view literal, std::vector<Range>& out) {
  if (literal.empty()) return;
  for (std::size_t pos = text.find(literal); pos != std::string_view::npos;
       pos = text.find(literal, pos + literal.size())) {
    out.emplace_back(pos, pos + literal.size());
  }
}

/// The pieces of `text` for `matches` under `behavior` (normalizer.rs, split): first the
/// matches and the gaps between them, then merged or removed as the behaviour says.
std::vector<Range> apply_behavior(std::size_t n, const std::vector<Range>& matches,
                                  PreTokenizer::Behavior behavior, bool invert) {
  using B = PreTokenizer::Behavior;
  struct Part {
    Range r;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  std::size_t prev = 0;
  for (const Range& m : matches) {
    if (prev != m.first) parts.push_back({{prev, m.first}, invert});
    parts.push_back({m, !invert});
    prev = m.second;
  }
  if (prev != n || parts.empty()) parts.push_back({{prev, n}, invert});

  std::vector<Range> out;
  out.reserve(parts.size());
  bool previous_match = false;
  switch (behavior) {
    case B::kIsolated:
      for (const Part& p : parts) out.push_back(p.r);
      break;
    case B::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) out.push_back(p.r);
      }
      break;
    case B::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().second = p.r.second;
        } else {
          out.push_back(p.r);
        }
        previous_match = p.is_match;
      }
      break;
    case B::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().first = it->r.first;
        } else {
          out.push_back(it->r);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case B::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !out.empty()) {
          out.back().second = p.r.second;
        } else {
          out.push_back(p.r);
        }
        previous_match = p.is_match;
      }
      break;
  }
  return out;
}

PreTokenizer::Behavior parse_behavior(const Json& j, const std::string& where) {
  using B = PreTokenizer::Behavior;
  const std::string b = json_string(j, "behavior", where + " (Split pre_tokenizer)");
  if (b == "Removed") return B::kRemoved;
  if (b == "Isolated") return B::kIsolated;
  if (b == "MergedWithPrevious") return B::kMergedWithPrevious;
  if (b == "MergedWithNext") return B::kMergedWithNext;
  if (b == "Contiguous") return B::kContiguous;
  throw Error("unsupported Split behavior '" + b + "'", where,
              "Removed|Isolated|MergedWithPrevious|MergedWithNext|Contiguous", b);
}

bool flag(const Json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  if (!j.at(key).is_boolean()) {
    throw Error(std::string("'") + key + "' is not a boolean", where, "boolean", json_brief(j.at(key)));
  }
  return j.at(key).get<bool>();
}

}  // namespace

const std::array<std::string, 256>& byte_level_chars() {
  // Printable bytes stand for themselves; the others, in byte order, take U+0100 onwards.
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      std::string& s = t[static_cast<std::size_t>(b)];
      if (c < 0x80) {
        s.push_back(static_cast<char>(c));
      } else {  // every character here is below U+0800: two bytes
        s.push_back(static_cast<char>(0xC0 | (c >> 6)));
        s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
      }
    }
    return t;
  }();
  return table;
}

int byte_level_byte(char32_t c) {
  static const std::vector<int16_t> inverse = [] {
    std::vector<int16_t> inv(0x144, -1);
    const auto& chars = byte_level_chars();
    for (int b = 0; b < 256; ++b) inv[utf8_decode_at(chars[static_cast<std::size_t>(b)], 0)] = static_cast<int16_t>(b);
    return inv;
  }();
  return c < inverse.size() ? inverse[c] : -1;
}

PreTokenizer PreTokenizer::from_json(const Json& j, const std::string& where) {
  PreTokenizer p;
  if (!j.is_null()) p.add(j, where);
  return p;
}

void PreTokenizer::add(const Json& j, const std::string& where) {
  if (!j.is_object()) throw Error("pre_tokenizer is not an object", where, "object", j.type_name());
  const std::string type = json_string(j, "type", where + " (pre_tokenizer)");
  const std::string ctx = where + " (" + type + " pre_tokenizer)";
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j.at("pretokenizers").is_array()) {
      throw Error("pre_tokenizer Sequence without a 'pretokenizers' array", where);
    }
    for (const Json& child : j.at("pretokenizers")) add(child, where);
  } else if (type == "Split") {
    Split s;
    const Json& pattern = j.contains("pattern") ? j.at("pattern") : Json();
    if (pattern.is_object() && pattern.contains("Regex") && pattern.at("Regex").is_string()) {
      s.regex = std::make_shared<const Regex>(pattern.at("Regex").get<std::string>(), ctx);
    } else if (pattern.is_object() && pattern.contains("String") && pattern.at("String").is_string()) {
      s.literal = pattern.at("String").get<std::string>();
    } else {
      throw Error("malformed Split pattern", ctx, "{\"Regex\": ...} or {\"String\": ...}",
                  json_brief(pattern));
    }
    s.behavior = parse_behavior(j, where);
    s.invert = flag(j, "invert", false, ctx);
    steps_.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    steps_.push_back(ByteLevel{flag(j, "add_prefix_space", true, ctx), flag(j, "use_regex", true, ctx)});
  } else if (type == "Metaspace") {
    Metaspace m;
    m.replacement = j.contains("replacement") ? json_string(j, "replacement", ctx) : "\u2581";
    if (m.replacement.empty() || utf8_length_at(m.replacement, 0) != m.replacement.size()) {
      throw Error("Metaspace replacement must be one character", ctx, "one character", m.replacement);
    }
    if (j.contains("prepend_scheme") && !j.at("prepend_scheme").is_null()) {
      const std::string scheme = json_string(j, "prepend_scheme", ctx);
      if (scheme == "always") m.prepend = Metaspace::Prepend::kAlways;
      else if (scheme == "first") m.prepend = Metaspace::Prepend::kFirst;
      else if (scheme == "never") m.prepend = Metaspace::Prepend::kNever;
      else throw Error("unsupported Metaspace prepend_scheme '" + scheme + "'", ctx, "always|first|never", scheme);
    } else if (!flag(j, "add_prefix_space", true, ctx)) {
      m.prepend = Metaspace::Prepend::kNever;  // the pre-0.19 form of the field
    }
    m.split = flag(j, "split", true, ctx);
    steps_.push_back(std::move(m));
  } else {
    throw Error("unsupported pre_tokenizer type '" + type + "'", where);
  }
}

void PreTokenizer::split(std::string_view text, bool at_origin, std::vector<std::string>& out) const {
  if (text.empty()) return;
  if (steps_.empty()) {
    out.emplace_back(text);
    return;
  }
  std::vector<std::string> words{std::string(text)};
  bool first_at_origin = at_origin;  // words[0] starts at byte 0 of the input
  std::vector<std::string> next;
  std::vector<Range> matches;
  for (const Step& step : steps_) {
    next.clear();
    next.reserve(words.size() * 2);
    bool next_first_at_origin = false;
    if (const auto* s = std::get_if<Split>(&step)) {
      for (std::size_t w = 0; w < words.size(); ++w) {
        const std::string_view word = words[w];
        matches.clear();
        if (s->regex) s->regex->find_all(word, matches);
        else find_literal(word, s->literal, matches);
        for (const Range& r : apply_behavior(word.size(), matches, s->behavior, s->invert)) {
          if (r.first == r.second) continue;
          if (next.empty()) next_first_at_origin = w == 0 && first_at_origin && r.first == 0;
          next.emplace_back(word.substr(r.first, r.second - r.first));
        }
      }
    } else if (const auto* b = std::get_if<ByteLevel>(&step)) {
      const auto& chars = byte_level_chars();
      next_first_at_origin = first_at_origin;
      for (std::string& word : words) {
        if (b->add_prefix_space && word.front() != ' ') word.insert(word.begin(), ' ');
        matches.clear();
        if (b->use_regex) gpt2_regex().find_all(word, matches);
        else matches.emplace_back(0, word.size());
        for (const Range& r : apply_behavior(word.size(), matches, Behavior::kIsolated, false)) {
          if (r.first == r.second) continue;
          std::string mapped;
          mapped.reserve((r.second - r.first) * 2);
          for (std::size_t i = r.first; i < r.second; ++i) mapped += chars[static_cast<unsigned char>(word[i])];
          next.push_back(std::move(mapped));
        }
      }
    } else if (const auto* m = std::get_if<Metaspace>(&step)) {
      next_first_at_origin = first_at_origin;
      for (std::size_t w = 0; w < words.size(); ++w) {
        std::string word = replace_all(words[w], " ", m->replacement);
        const bool starts = word.compare(0, m->replacement.size(), m->replacement) == 0;
        if (!starts && (m->prepend == Metaspace::Prepend::kAlways ||
                        (m->prepend == Metaspace::Prepend::kFirst && w == 0 && first_at_origin))) {
          word.insert(0, m->replacement);
        }
        if (!m->split) {
          next.push_back(std::move(word));
          continue;
        }
        matches.clear();
        find_literal(word, m->replacement, matches);
        for (const Range& r : apply_behavior(word.size(), matches, Behavior::kMergedWithNext, false)) {
          if (r.first != r.second) next.push_back(word.substr(r.first, r.second - r.first));
        }
      }
    }
    words.swap(next);
    first_at_origin = next_first_at_origin;
    if (words.empty()) return;
  }
  for (std::string& w : words) out.push_back(std::move(w));
}

}  // namespace linnet::tok
