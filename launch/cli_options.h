// The command line of linnet-tp: which subcommand, with its options (each declared and
// parsed beside its command, launch/*_command.h; the engine flags in engine_options.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launch/bench_command.h"
#include "launch/generate_command.h"
#include "launch/info_command.h"
#include "launch/loss_command.h"
#include "launch/template_command.h"
#include "launch/serve_command.h"
#include "launch/tokenize_command.h"

namespace linnet {

/// What the command line asked for.
struct CommandLine {
  enum class Kind { kGenerate, kTokenize, kInfo, kLoss, kTemplate, kBench, kServe, kHelp, kVersion } kind = Kind::kGenerate;
  std::string help_text;  // for kHelp
  GenerateOptions generate;
  TokenizeOptions tokenize;  // for kTokenize
  InfoOptions info;          // for kInfo
  LossOptions loss;          // for kLoss
  TemplateOptions chat_template;  // for kTemplate
  BenchOptions bench;             // for kBench
  ServeOptions serve;             // for kServe
};

/// Parses argv. A first argument "generate" selects that subcommand (also the default),
/// "tokenize" the tokenize subcommand (launch/tokenize_command.h), "template" the chat
/// template subcommand (launch/template_command.h).
/// @throws Error naming the option on unknown options, bad values, or a missing
///   --model / --prompt|--input.
CommandLine parse_command_line(int argc, char** argv);

}  // namespace linnet
