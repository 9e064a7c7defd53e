// UTF-8 validity and decoding, as Rust's str (and so Hugging Face tokenizers) define them:
// overlong forms, surrogates (U+D800..U+DFFF) and code points above U+10FFFF are invalid.
// Used by the tokenizer, the chat templates (their output must be valid UTF-8) and the
// streaming paths that may only emit complete characters.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace linnet {

/// Length of the valid UTF-8 sequence that starts at s[i] (1..4), or 0 when the bytes
/// there are not one (overlong forms, surrogates and > U+10FFFF are invalid, as in Rust).
std::size_t utf8_length_at(std::string_view s, std::size_t i);

/// Bytes of the longest valid UTF-8 prefix of `s`: s.size() when `s` is valid, else the
/// offset of the first byte that starts no valid sequence.
std::size_t utf8_valid_prefix(std::string_view s);

/// @throws Error "invalid UTF-8 at byte offset N" (where = `where`) unless `s` is valid.
void check_utf8(std::string_view s, const std::string& where);

/// The code point at s[i]; s must hold a valid sequence there.
char32_t utf8_decode_at(std::string_view s, std::size_t i);

/// The code point that ends at s[end-1]; s[..end) must be valid UTF-8 and end > 0.
char32_t utf8_decode_before(std::string_view s, std::size_t end);

}  // namespace linnet
