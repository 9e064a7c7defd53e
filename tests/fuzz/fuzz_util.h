// Helpers shared by the libFuzzer targets of tests/fuzz/ (see scripts/fuzz.sh).
//
// Every target feeds untrusted bytes to one loader or parser. A linnet::Error is the
// expected way to refuse bad input; anything else is a finding: another exception
// escapes (std::terminate aborts), an internal LINNET_CHECK fails, a sanitizer fires,
// an invariant the API documents is broken (fuzz::fail aborts), or the input runs past
// libFuzzer's -timeout / -rss_limit_mb.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/utf8.h"

namespace linnet::fuzz {

/// Prints `what` and aborts: libFuzzer saves the input as a crash.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// Handles a caught Error: an internal check (LINNET_CHECK) is a finding, any other
/// Error is the loader refusing bad input.
inline void refused(const Error& e) {
  // LINNET_CHECK throws Error("... [check failed: cond]", "<source file>:<line>").
  const std::string& where = e.where();
  const bool from_source = where.find(".cpp:") != std::string::npos || where.find(".h:") != std::string::npos;
  if (from_source && std::strstr(e.what(), "check failed") != nullptr) fail(std::string("internal check: ") + e.what());
}

/// The directory given by environment variable `env`, else `fallback` (the path CMake
/// baked in).
inline std::filesystem::path dir_from(const char* env, const char* fallback) {
  const char* v = std::getenv(env);
  return v && *v ? std::filesystem::path(v) : std::filesystem::path(fallback);
}

/// tests/data of the source tree ($LINNET_TEST_DATA overrides).
inline std::filesystem::path test_data() { return dir_from("LINNET_TEST_DATA", LINNET_FUZZ_TEST_DATA); }

/// ../shared beside the source tree ($LINNET_SHARED_DIR overrides).
inline std::filesystem::path shared_dir() { return dir_from("LINNET_SHARED_DIR", LINNET_FUZZ_SHARED_DIR); }

/// The content of `path`; aborts naming it when it cannot be read (a target's fixed
/// inputs must exist).
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// True when `s` is valid UTF-8 (common/utf8.h: as Rust's str).
inline bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_length_at(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace linnet::fuzz
