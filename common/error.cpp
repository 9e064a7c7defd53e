#include "common/error.h"

namespace linnet {
namespace {
std::string compose(const std::string& what, const std::string& where, const std::string& expected,
                    const std::string& actual) {
  std::string s;
  if (!where.empty()) s += where + ": ";
  s += what;
  if (!expected.empty() || !actual.empty()) {
    s += " (";
    if (!expected.empty()) s += "expected " + expected;
    if (!expected.empty() && !actual.empty()) s += ", ";
    if (!actual.empty()) s += "got " + actual;
    s += ")";
  }
  return s;
}
}  // namespace

Error::Error(std::string what, std::string where, std::string expected, std::string actual)
    : std::runtime_error(compose(what, where, expected, actual)),
      what_(std::move(what)),
      where_(std::move(where)),
      expected_(std::move(expected)),
      actual_(std::move(actual)) {}

Error Error::at(const std::string& where) const {
  const std::string msg = what();
  if (msg.rfind(where, 0) == 0) return *this;
  return Error(msg, where);
}

namespace detail {
void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(msg.empty() ? std::string("check failed: ") + expr
                          : msg + " [check failed: " + expr + "]",
              std::string(file) + ":" + std::to_string(line));
}
}  // namespace detail
}  // namespace linnet
