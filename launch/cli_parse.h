// The shared part of every subcommand's option parsing: drop the subcommand word, run
// cxxopts, turn its errors and stray arguments into linnet::Error, and handle --help.
#pragma once

#include <optional>
#include <string>

#include <cxxopts.hpp>

namespace linnet {

/// Parses `argv` with `opts`. When argv[1] equals `subcommand` (non-empty), it is
/// skipped. Returns nullopt and sets `help_text` when -h/--help is given (`opts` must
/// define "h,help").
/// @throws Error (where "command line") on an unknown option, a bad value, or a
///   positional argument.
std::optional<cxxopts::ParseResult> parse_options(cxxopts::Options& opts, int argc, char** argv,
                                                  const char* subcommand, std::string& help_text);

}  // namespace linnet
