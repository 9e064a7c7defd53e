// Paths of the test data: LINNET_SHARED_DIR (../shared) and LINNET_TEST_DATA
// (tests/data), set by ctest; golden JSON loading.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace linnet::test {

inline std::filesystem::path env_path(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::filesystem::path(v) : std::filesystem::path();
}
inline std::filesystem::path shared_dir() { return env_path("LINNET_SHARED_DIR"); }
inline std::filesystem::path test_data_dir() { return env_path("LINNET_TEST_DATA"); }
inline std::filesystem::path stories_dir() { return shared_dir() / "models" / "stories260k"; }

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot open " + p.string());
  return nlohmann::json::parse(in);
}

}  // namespace linnet::test
