#include "common/utf8.h"

#include <string>

#include "common/error.h"

namespace linnet {

std::size_t utf8_length_at(std::string_view s, std::size_t i) {
  const std::size_t n = s.size();
  auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  auto cont = [&](std::size_t k) { return k < n && (byte(k) & 0xC0) == 0x80; };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (i + 1 >= n) return 0;
    const unsigned char b1 = byte(i + 1);
    // E0 needs A0..BF (no overlongs); ED needs 80..9F (no surrogates).
    const unsigned char lo = b0 == 0xE0 ? 0xA0 : 0x80;
    const unsigned char hi = b0 == 0xED ? 0x9F : 0xBF;
    return (b1 >= lo && b1 <= hi && cont(i + 2)) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (i + 1 >= n) return 0;
    const unsigned char b1 = byte(i + 1);
    // F0 needs 90..BF (no overlongs); F4 needs 80..8F (<= U+10FFFF).
    const unsigned char lo = b0 == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = b0 == 0xF4 ? 0x8F : 0xBF;
    return (b1 >= lo && b1 <= hi && cont(i + 2) && cont(i + 3)) ? 4 : 0;
  }
  return 0;
}

std::size_t utf8_valid_prefix(std::string_view s) {
  std::size_t i = 0;
  for (std::size_t len; i < s.size() && (len = utf8_length_at(s, i)) != 0;) i += len;
  return i;
}

void check_utf8(std::string_view s, const std::string& where) {
  const std::size_t valid = utf8_valid_prefix(s);
  if (valid < s.size()) throw Error("invalid UTF-8 at byte offset " + std::to_string(valid), where);
}

char32_t utf8_decode_at(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[k])); };
  const char32_t b0 = b(i);
  if (b0 < 0x80) return b0;
  if (b0 < 0xE0) return ((b0 & 0x1F) << 6) | (b(i + 1) & 0x3F);
  if (b0 < 0xF0) return ((b0 & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
  return ((b0 & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) |
         (b(i + 3) & 0x3F);
}

char32_t utf8_decode_before(std::string_view s, std::size_t end) {
  std::size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return utf8_decode_at(s, i);
}

}  // namespace linnet
