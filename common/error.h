// linnet::Error: the one exception type of the libraries.
//
// Every error carries what went wrong, where (a file, tensor, field or option),
// and, when it is a mismatch, what was expected and what was found. launch/
// catches it, prints one line prefixed with the rank, and ends the job with
// MPI_Abort so that no rank is left waiting in a collective.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace linnet {

/// The exception thrown by every linnet library on bad input or a failed call.
///
/// what() is the full message: "<where>: <what> (expected <expected>, got <actual>)",
/// with the parts that are empty left out.
class Error : public std::runtime_error {
 public:
  /// @param what      what went wrong, e.g. "shape mismatch"
  /// @param where     the file / tensor / field / option it concerns (may be empty)
  /// @param expected  the expected value (may be empty)
  /// @param actual    the value found (may be empty)
  explicit Error(std::string what, std::string where = {}, std::string expected = {},
                 std::string actual = {});

  /// This error located at `where` (a file:line, an option): the message gets the
  /// prefix unless it already starts with it, so nested handlers do not repeat it.
  Error at(const std::string& where) const;

  const std::string& what_part() const { return what_; }
  const std::string& where() const { return where_; }
  const std::string& expected() const { return expected_; }
  const std::string& actual() const { return actual_; }

 private:
  std::string what_, where_, expected_, actual_;
};

namespace detail {
[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace linnet

/// Throws linnet::Error naming the condition, file:line and `msg` (a stream expression)
/// when `cond` is false. For internal invariants; user-facing checks throw Error directly
/// with the file/tensor/field they concern.
#define LINNET_CHECK(cond, msg)                                                 \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::ostringstream linnet_check_os_;                                      \
      linnet_check_os_ << msg;                                                  \
      ::linnet::detail::check_failed(#cond, __FILE__, __LINE__, linnet_check_os_.str()); \
    }                                                                           \
  } while (0)
