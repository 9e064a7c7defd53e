// Helpers the test suites share: the message of the linnet::Error a call throws, a
// file's bytes, and a UTF-8 validity check of the tests' own (independent of
// common/utf8.h, the code under test).
#pragma once

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"

namespace linnet::test {

/// The message of the linnet::Error that `f()` throws; "" plus a test failure when it
/// throws nothing or another exception.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const linnet::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-linnet exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no linnet::Error thrown";
  return {};
}

/// The bytes of file `p`.
/// @throws std::runtime_error when it cannot be opened.
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Whether `s` is well-formed UTF-8 by lead and continuation bytes (RFC 3629's lengths;
/// enough for the tests' use: decoded text and streamed chunks).
inline bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const std::size_t len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

}  // namespace linnet::test
