#include "launch/cli_parse.h"

#include <cstdio>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace linnet {
namespace {

// One long option of `opts`, as the help lists it.
struct OptionInfo {
  std::string name;  // without "--"
  bool is_boolean = false;
  bool is_container = false;
};

std::vector<OptionInfo> option_infos(const cxxopts::Options& opts) {
  std::vector<OptionInfo> out;
  for (const auto& group : opts.groups()) {
    for (const auto& o : opts.group_help(group).options) {
      for (const auto& l : o.l) out.push_back({l, o.is_boolean, o.is_container});
    }
  }
  return out;
}

// Whether cxxopts converts `value` for option --`name` (each option parses its text in
// parse(); a failure is an incorrect_argument_type).
bool parses(cxxopts::Options& opts, const std::string& name, const std::string& value) {
  std::string prog = "linnet-tp", arg = "--" + name + "=" + value;
  char* argv[] = {prog.data(), arg.data()};
  try {
    opts.parse(2, argv);
  } catch (const cxxopts::exceptions::incorrect_argument_type&) {
    return false;
  } catch (const cxxopts::exceptions::exception&) {
  }
  return true;
}

// What the value type of --`name` accepts, told by probing cxxopts' own converters (the
// declared C++ type is not visible through cxxopts::Options).
std::string expected_text(cxxopts::Options& opts, const OptionInfo& o) {
  if (o.is_boolean) return "true or false";
  std::string one;
  if (parses(opts, o.name, "0.5")) {
    one = "a finite number";
  } else if (parses(opts, o.name, "-1")) {
    one = parses(opts, o.name, "2147483648") ? "an integer in [-2^63, 2^63-1]" : "an integer in [-2^31, 2^31-1]";
  } else if (parses(opts, o.name, "1")) {
    one = parses(opts, o.name, "4294967296") ? "an integer in [0, 2^64-1]" : "an integer in [0, 2^32-1]";
  } else {
    return "a valid value";
  }
  return o.is_container ? "a comma-separated list, each " + one : one;
}

// The range an option has in every command that takes it (read_comm_timeout, --threads'
// read_in_range), so a value that does not even parse ("nan", "1.5") is told the same
// range as one outside it ("-1"); "" for the others (their type's range is told).
std::string common_range(const std::string& name) {
  if (name == "comm-timeout") return "an integer in [0, " + std::to_string(kMaxCommTimeoutSeconds) + "]";
  if (name == "threads") return "an integer in [1, " + std::to_string(kMaxThreads) + "]";
  return {};
}

// The Error for a value cxxopts could not convert: names the option of `args` whose
// value fails alone, with the value and what its type accepts; `fallback` (cxxopts' own
// message) when none can be found.
Error bad_value_error(cxxopts::Options& opts, const std::vector<char*>& args, const std::string& fallback) {
  const std::vector<OptionInfo> infos = option_infos(opts);
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string arg = args[i];
    if (arg == "--") break;
    if (arg.rfind("--", 0) != 0) continue;
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const auto it = std::find_if(infos.begin(), infos.end(), [&](const OptionInfo& o) { return o.name == name; });
    if (it == infos.end()) continue;
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (it->is_boolean || i + 1 >= args.size()) {
      continue;
    } else {
      value = args[++i];
    }
    if (!parses(opts, name, value)) {
      const std::string range = common_range(name);
      return Error("invalid value", "--" + name, range.empty() ? expected_text(opts, *it) : range, "'" + value + "'");
    }
  }
  return Error(fallback, "command line");
}

// cxxopts reads a floating-point value with operator>>, which stops at the first
// character it cannot use, so "0.5abc" would read as 0.5: every value of a
// floating-point option (one that takes "0.5" but not "x") must be a whole number text.
// Neither kind of number may be hexadecimal.
void check_whole_numbers(cxxopts::Options& opts, const cxxopts::ParseResult& r) {
  const std::vector<OptionInfo> infos = option_infos(opts);
  for (const auto& kv : r.arguments()) {
    const auto it = std::find_if(infos.begin(), infos.end(), [&](const OptionInfo& o) { return o.name == kv.key(); });
    if (it == infos.end() || it->is_boolean || it->is_container) continue;
    const std::string& v = kv.value();
    // Hexadecimal (cxxopts takes "0x10" for an integer, strtod "0x1p-1") is refused:
    // values are decimal, as the help says.
    const bool hex = v.find_first_of("xX") != std::string::npos;
    if (!parses(opts, it->name, "0.5") && parses(opts, it->name, "1") && !parses(opts, it->name, "x")) {
      const std::string range = common_range(it->name);
      if (hex) {
        throw Error("invalid value", "--" + it->name, (range.empty() ? expected_text(opts, *it) : range) + ", in decimal",
                    "'" + v + "'");
      }
      continue;
    }
    if (!parses(opts, it->name, "0.5") || parses(opts, it->name, "x")) continue;
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || hex || end != v.c_str() + v.size() || errno == ERANGE || !std::isfinite(d)) {
      throw Error("invalid value", "--" + it->name, "a finite number", "'" + v + "'");
    }
  }
}

}  // namespace

std::optional<cxxopts::ParseResult> parse_options(cxxopts::Options& opts, int argc, char** argv,
                                                  const char* subcommand, std::string& help_text) {
  std::vector<char*> args(argv, argv + argc);
  if (subcommand && *subcommand && args.size() > 1 && std::strcmp(args[1], subcommand) == 0) {
    args.erase(args.begin() + 1);
  }
  cxxopts::ParseResult r;
  try {
    r = opts.parse(static_cast<int>(args.size()), args.data());
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    throw bad_value_error(opts, args, e.what());
  } catch (const cxxopts::exceptions::exception& e) {
    throw Error(e.what(), "command line");
  }
  if (!r.unmatched().empty()) {
    throw Error("unexpected argument '" + r.unmatched().front() + "'", "command line");
  }
  check_whole_numbers(opts, r);
  if (r.count("help")) {
    help_text = opts.help();
    return std::nullopt;
  }
  return r;
}

void read_backend(const cxxopts::ParseResult& r, std::string& out) {
  if (!r.count("backend")) return;
  out = r["backend"].as<std::string>();
  if (out != "cpu" && out != "cuda") throw Error("invalid value", "--backend", "cpu or cuda", out);
}

void read_weight_dtype(const cxxopts::ParseResult& r, std::string& out) {
  if (!r.count("weight-dtype")) return;
  out = r["weight-dtype"].as<std::string>();
  if (out != "auto" && out != "f32" && out != "bf16" && out != "f16" && out != "int8" && out != "int4") {
    throw Error("invalid value", "--weight-dtype", "auto, f32, bf16, f16, int8 or int4", out);
  }
}

void read_weight_group_size(const cxxopts::ParseResult& r, const std::string& weight_dtype, int64_t& out) {
  if (!r.count("weight-group-size")) return;
  read_in_range(r, "weight-group-size", 1, kMaxWeightGroupSize, out);
  if (weight_dtype != "int8" && weight_dtype != "int4") {
    invalid_value("--weight-group-size", "only with --weight-dtype int8 or int4",
                  std::to_string(out) + " with --weight-dtype " + (weight_dtype.empty() ? "auto" : weight_dtype));
  }
  if (weight_dtype == "int4" && (out % 2 != 0 || out > 1024)) {
    invalid_value("--weight-group-size", "an even size in [2, 1024] with --weight-dtype int4 (two values a byte)",
                  std::to_string(out));
  }
}

void read_comm_timeout(const cxxopts::ParseResult& r, double& seconds) {
  int64_t v = 0;
  if (!r.count("comm-timeout")) return;
  read_in_range(r, "comm-timeout", 0, kMaxCommTimeoutSeconds, v);
  seconds = static_cast<double>(v);
}

void read_kv_cache_dtype(const cxxopts::ParseResult& r, std::string& out) {
  if (!r.count("kv-cache-dtype")) return;
  out = r["kv-cache-dtype"].as<std::string>();
  if (out != "auto" && out != "f32" && out != "bf16") {
    throw Error("invalid value", "--kv-cache-dtype", "auto, f32 or bf16", out);
  }
}

void read_activation_dtype(const cxxopts::ParseResult& r, std::string& out) {
  if (!r.count("activation-dtype")) return;
  out = r["activation-dtype"].as<std::string>();
  if (out != "f32" && out != "int8") throw Error("invalid value", "--activation-dtype", "f32 or int8", out);
}

void invalid_value(const char* option, const std::string& expected, const std::string& actual) {
  throw Error("invalid value", option, expected, actual);
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace linnet
