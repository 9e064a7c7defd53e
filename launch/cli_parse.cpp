#include "launch/cli_parse.h"

#include <cstring>
#include <vector>

#include "common/error.h"

namespace linnet {

std::optional<cxxopts::ParseResult> parse_options(cxxopts::Options& opts, int argc, char** argv,
                                                  const char* subcommand, std::string& help_text) {
  std::vector<char*> args(argv, argv + argc);
  if (subcommand && *subcommand && args.size() > 1 && std::strcmp(args[1], subcommand) == 0) {
    args.erase(args.begin() + 1);
  }
  cxxopts::ParseResult r;
  try {
    r = opts.parse(static_cast<int>(args.size()), args.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw Error(e.what(), "command line");
  }
  if (!r.unmatched().empty()) {
    throw Error("unexpected argument '" + r.unmatched().front() + "'", "command line");
  }
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
  if (out != "auto" && out != "f32" && out != "bf16" && out != "f16") {
    throw Error("invalid value", "--weight-dtype", "auto, f32, bf16 or f16", out);
  }
}

}  // namespace linnet
