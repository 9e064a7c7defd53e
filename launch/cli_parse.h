// The shared part of every subcommand's option parsing: drop the subcommand word, run
// cxxopts, turn its errors and stray arguments into linnet::Error, and handle --help.
#pragma once

#include <optional>
#include <string>

#include <cxxopts.hpp>

#include "common/error.h"

namespace linnet {

/// Parses `argv` with `opts`. When argv[1] equals `subcommand` (non-empty), it is
/// skipped. Returns nullopt and sets `help_text` when -h/--help is given (`opts` must
/// define "h,help").
/// @throws Error (where "command line") on an unknown option, a bad value, or a
///   positional argument.
std::optional<cxxopts::ParseResult> parse_options(cxxopts::Options& opts, int argc, char** argv,
                                                  const char* subcommand, std::string& help_text);

/// When option `name` was given: `out` = its value.
/// @throws Error("invalid value", "--name", ">= min", value) when it is below `min`.
template <class T>
void read_at_least(const cxxopts::ParseResult& r, const char* name, T min, T& out) {
  if (!r.count(name)) return;
  out = r[name].as<T>();
  if (out < min) throw Error("invalid value", std::string("--") + name, ">= " + std::to_string(min), std::to_string(out));
}

/// When --backend was given: `out` = its value.
/// @throws Error naming --backend when it is neither "cpu" nor "cuda".
void read_backend(const cxxopts::ParseResult& r, std::string& out);

}  // namespace linnet
