// The shared part of every subcommand's option parsing: drop the subcommand word, run
// cxxopts, turn its errors and stray arguments into linnet::Error, and handle --help.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <cxxopts.hpp>

#include "common/error.h"

namespace linnet {

/// Parses `argv` with `opts`. When argv[1] equals `subcommand` (non-empty), it is
/// skipped. Returns nullopt and sets `help_text` when -h/--help is given (`opts` must
/// define "h,help").
/// @throws Error (where "command line") on an unknown option or a positional argument;
///   Error("invalid value", "--name", what the option's type accepts, "'value'") when
///   cxxopts cannot convert a value (not a number, out of the type's range, NaN/inf).
std::optional<cxxopts::ParseResult> parse_options(cxxopts::Options& opts, int argc, char** argv,
                                                  const char* subcommand, std::string& help_text);

/// Throws Error("invalid value", `option`, `expected`, `actual`): a flag's value out of range.
[[noreturn]] void invalid_value(const char* option, const std::string& expected, const std::string& actual);

/// `v` as printf's %g writes it, for messages about a flag's number.
std::string number_text(double v);

/// When option `name` was given: `out` = its value.
/// @throws Error("invalid value", "--name", ">= min", value) when it is below `min`.
template <class T>
void read_at_least(const cxxopts::ParseResult& r, const char* name, T min, T& out) {
  if (!r.count(name)) return;
  out = r[name].as<T>();
  if (out < min) throw Error("invalid value", std::string("--") + name, ">= " + std::to_string(min), std::to_string(out));
}

/// When option `name` was given (declared as cxxopts::value<int64_t>): `out` = its value.
/// @throws Error("invalid value", "--name", "an integer in [min, max]", value) when it is
///   outside [min, max].
template <class T>
void read_in_range(const cxxopts::ParseResult& r, const char* name, int64_t min, int64_t max, T& out) {
  if (!r.count(name)) return;
  const int64_t v = r[name].as<int64_t>();
  if (v < min || v > max) {
    throw Error("invalid value", std::string("--") + name,
                "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]", std::to_string(v));
  }
  out = static_cast<T>(v);
}

/// Most kernel (OpenMP) threads per rank --threads accepts (more would only spawn idle threads; a
/// huge value would exhaust the process's thread limit).
inline constexpr int64_t kMaxThreads = 4096;
/// Largest --weight-group-size accepted (any divisor of the input widths up to this).
inline constexpr int64_t kMaxWeightGroupSize = int64_t{1} << 20;

/// When --backend was given: `out` = its value.
/// @throws Error naming --backend when it is neither "cpu" nor "cuda".
void read_backend(const cxxopts::ParseResult& r, std::string& out);

/// When --weight-dtype was given: `out` = its value.
/// @throws Error naming --weight-dtype when it is not auto, f32, bf16, f16, int8 or int4.
void read_weight_dtype(const cxxopts::ParseResult& r, std::string& out);

/// Most seconds --comm-timeout accepts (a week).
inline constexpr int64_t kMaxCommTimeoutSeconds = 7 * 24 * 3600;

/// The --comm-timeout option's help line, shared by generate, loss and bench.
inline constexpr const char* kCommTimeoutHelp =
    "Seconds a rank waits for the others (a collective, or the end of the run) without progress before every "
    "rank exits non-zero naming the ranks that did not arrive; 0: wait forever (default 600, as torch's NCCL "
    "watchdog)";

/// When --comm-timeout was given (declared as cxxopts::value<int64_t>): `seconds` = its value.
/// @throws Error naming --comm-timeout when it is outside [0, kMaxCommTimeoutSeconds].
void read_comm_timeout(const cxxopts::ParseResult& r, double& seconds);

/// When --kv-cache-dtype was given: `out` = its value.
/// @throws Error naming --kv-cache-dtype when it is not f32 or bf16.
void read_kv_cache_dtype(const cxxopts::ParseResult& r, std::string& out);

/// The --kv-cache-dtype option's help line, shared by generate, loss and bench.
inline constexpr const char* kKvCacheDtypeHelp =
    "KV cache dtype: auto (default: f32 on the CPU backend, bf16 on CUDA, the dtype its weights "
    "are held in), f32, or bf16 (half the cache bytes; each K/V value rounded to bf16 as it is "
    "stored, widened exactly as attention reads it)";

/// When --activation-dtype was given: `out` = its value.
/// @throws Error naming --activation-dtype when it is not f32 or int8.
void read_activation_dtype(const cxxopts::ParseResult& r, std::string& out);

/// The --activation-dtype option's help line.
inline constexpr const char* kActivationDtypeHelp =
    "What int4 weights multiply: f32 (default) or int8 (each row's activations quantized per 32 inputs, "
    "integer dot products: VNNI + VBMI on AVX-512, else AVX2; faster decode, a small accuracy cost: docs/cpu-kernels.md; "
    "needs --weight-dtype int4 or an int4 checkpoint with groups of a multiple of 32, CPU backend)";

/// When --weight-group-size was given: `out` = its value, in [1, kMaxWeightGroupSize].
/// @throws Error naming --weight-group-size when `weight_dtype` (--weight-dtype's value)
/// is not int8 or int4, or for int4 when the value is odd or above 1024 (whether it
/// divides the model's widths is checked against the model: check_weight_groups).
void read_weight_group_size(const cxxopts::ParseResult& r, const std::string& weight_dtype, int64_t& out);

/// The --weight-dtype option's help line, shared by generate, loss and bench.
inline constexpr const char* kWeightDtypeHelp =
    "Weight matrices in memory: auto (the checkpoint's dtype; config.json's torch_dtype for random weights), "
    "f32, bf16, f16, int8 or int4 (quantized at load: int8 symmetric, one f32 scale per --weight-group-size "
    "inputs; int4 with a scale and a minimum each, searched for the least error, the embedding and lm_head in "
    "int8) (CPU backend; CUDA holds bf16). Activations and sums stay f32";

/// The --weight-group-size option's help line.
inline constexpr const char* kWeightGroupSizeHelp =
    "int8 / int4 weights: input elements per scale (default 64 for int8, 32 for int4; must divide hidden_size "
    "and each rank's o_proj and down_proj input width; even for int4)";

}  // namespace linnet
