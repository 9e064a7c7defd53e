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

/// When --weight-dtype was given: `out` = its value.
/// @throws Error naming --weight-dtype when it is not auto, f32, bf16 or f16.
void read_weight_dtype(const cxxopts::ParseResult& r, std::string& out);

/// The --weight-dtype option's help line, shared by generate, loss and bench.
inline constexpr const char* kWeightDtypeHelp =
    "Weight matrices in memory: auto (the checkpoint's dtype; config.json's torch_dtype for random weights), "
    "f32, bf16 or f16 (CPU backend; CUDA holds bf16). Activations, KV cache and sums stay f32";

}  // namespace linnet
