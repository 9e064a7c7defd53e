// Regex: the Split patterns of tokenizer.json, matched with PCRE2.
//
// tokenizers compiles these patterns with Oniguruma. PCRE2 (UTF + UCP mode, JIT when
// available) reads the same syntax, with one difference that changes the seed models'
// splits: PCRE2's Unicode \s also matches U+180E, Oniguruma's is exactly the Unicode
// White_Space property. So \s, \S, \w, \W and \h (Oniguruma: a hex digit) are rewritten
// into explicit property classes before compiling; everything else is PCRE2's own.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;  // pcre2.h's pcre2_code

namespace linnet::tok {

/// A compiled pattern. Immutable; safe to share between threads.
class Regex {
 public:
  /// Compiles `pattern` (Oniguruma syntax as written in tokenizer.json).
  /// @throws Error naming `where`, the pattern's offset and PCRE2's message when the
  ///   pattern does not compile, or when it uses \S inside a character class.
  Regex(std::string_view pattern, const std::string& where);

  /// Appends the [begin, end) byte ranges of the successive non-overlapping matches in
  /// `text` (valid UTF-8), left to right, as Oniguruma's find_iter gives them. An empty
  /// match is reported, and the next search starts one character later.
  /// @throws Error naming the pattern's source when matching fails (not on no-match).
  void find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& out) const;

  /// The pattern rewritten for PCRE2 (see the file comment); for tests and messages.
  static std::string to_pcre2(std::string_view pattern, const std::string& where);

 private:
  std::shared_ptr<pcre2_real_code_8> code_;
  std::string where_;
  bool jit_ = false;
};

}  // namespace linnet::tok
