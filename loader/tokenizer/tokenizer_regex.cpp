// Split patterns through PCRE2: the Oniguruma -> PCRE2 rewrite of the class escapes,
// compilation (JIT when the platform has it), and find_iter with Oniguruma's rule for
// empty matches (onig crate, FindMatches::next).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "loader/tokenizer/tokenizer_regex.h"

#include <pcre2.h>

#include <algorithm>

#include "common/error.h"
#include "loader/tokenizer/tokenizer_parts.h"

namespace linnet::tok {
namespace {

// Unicode White_Space (what Oniguruma's \s is) as properties: the C0 controls
// TAB..CR, NEL, and the separators (Zs, Zl, Zp).
constexpr std::string_view kSpaceItems = "\\t-\\r\\x{85}\\p{Z}";
// Oniguruma's Unicode \w: letters, marks, decimal digits, connector punctuation.
constexpr std::string_view kWordItems = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kHexItems = "0-9a-fA-F";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string Regex::to_pcre2(std::string_view p, const std::string& where) {
  std::string out;
  out.reserve(p.size() + 32);
  int depth = 0;  // nesting of [...] (Oniguruma allows nested classes)
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      std::string_view items;
      bool negated = false;
      switch (e) {
        case 's': items = kSpaceItems; break;
        case 'S': items = kSpaceItems; negated = true; break;
        case 'w': items = kWordItems; break;
        case 'W': items = kWordItems; negated = true; break;
        case 'h': items = kHexItems; break;
        case 'H': items = kHexItems; negated = true; break;
        default: break;
      }
      if (items.empty()) {
        out += c;
        out += e;
      } else if (depth == 0) {
        out += negated ? "[^" : "[";
        out += items;
        out += ']';
      } else if (!negated) {
        out += items;
      } else {
        throw Error(std::string("unsupported \\") + e + " inside a character class in Split pattern",
                    where, "", std::string(p.substr(0, 200)));
      }
      ++i;
      continue;
    }
    out += c;
    if (c == '[') {
      ++depth;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
    } else if (c == ']' && depth > 0) {
      --depth;
    }
  }
  return out;
}

Regex::Regex(std::string_view pattern, const std::string& where) : where_(where) {
  const std::string translated = to_pcre2(pattern, where);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    throw Error("Split pattern does not compile: " + pcre2_message(error) + " at offset " +
                    std::to_string(offset) + " of the PCRE2 form",
                where, "", translated.substr(0, 200));
  }
  code_ = std::shared_ptr<pcre2_code>(code, pcre2_code_free);
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

void Regex::find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& out) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
  if (!md) throw Error("out of memory for PCRE2 match data", where_);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const std::size_t n = text.size();
  std::size_t pos = 0;
  bool has_last = false;
  std::size_t last_end = 0;
  while (pos <= n) {
    int rc = jit_ ? pcre2_jit_match(code_.get(), subject, n, pos, 0, md.get(), nullptr)
                  : PCRE2_ERROR_JIT_STACKLIMIT;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The interpreter keeps its backtracking state on the heap: no stack limit.
      rc = pcre2_match(code_.get(), subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(),
                       nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error("Split pattern failed to match: " + pcre2_message(rc), where_);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const std::size_t begin = ov[0];
    const std::size_t end = ov[1];
    if (begin == end && has_last && last_end == end) {
      // An empty match right where the last match ended is skipped (no endless loop).
      pos = end < n ? end + std::max<std::size_t>(1, utf8_length_at(text, end)) : n + 1;
      continue;
    }
    out.emplace_back(begin, end);
    pos = end;
    last_end = end;
    has_last = true;
  }
}

}  // namespace linnet::tok
