#include "launch/cli_options.h"

#include <cstring>

namespace linnet {
namespace {

// Runs a subcommand's parser: its options, or kHelp with the help text on --help.
template <class Options, class Parse>
CommandLine parse_with(Parse parse, int argc, char** argv, CommandLine::Kind kind, Options CommandLine::*field) {
  CommandLine cl;
  std::optional<Options> options = parse(argc, argv, cl.help_text);
  cl.kind = options ? kind : CommandLine::Kind::kHelp;
  if (options) cl.*field = std::move(*options);
  return cl;
}

}  // namespace

CommandLine parse_command_line(int argc, char** argv) {
  using Kind = CommandLine::Kind;
  const char* word = argc > 1 ? argv[1] : "";
  if (std::strcmp(word, "info") == 0) return parse_with(parse_info_options, argc, argv, Kind::kInfo, &CommandLine::info);
  if (std::strcmp(word, "loss") == 0) return parse_with(parse_loss_options, argc, argv, Kind::kLoss, &CommandLine::loss);
  if (std::strcmp(word, "tokenize") == 0) {
    return parse_with(parse_tokenize_options, argc, argv, Kind::kTokenize, &CommandLine::tokenize);
  }
  if (std::strcmp(word, "bench") == 0) return parse_with(parse_bench_options, argc, argv, Kind::kBench, &CommandLine::bench);
  if (std::strcmp(word, "serve") == 0) return parse_with(parse_serve_options, argc, argv, Kind::kServe, &CommandLine::serve);
  if (std::strcmp(word, "template") == 0) {
    return parse_with(parse_template_options, argc, argv, Kind::kTemplate, &CommandLine::chat_template);
  }
  CommandLine cl;
  bool version = false;
  std::optional<GenerateOptions> g = parse_generate_options(argc, argv, cl.help_text, version);
  cl.kind = version ? Kind::kVersion : g ? Kind::kGenerate : Kind::kHelp;
  if (g) cl.generate = std::move(*g);
  return cl;
}

}  // namespace linnet
