// Command-line options of linnet-tp's subcommands (parsed with cxxopts).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "launch/info_command.h"
#include "launch/loss_command.h"
#include "launch/template_command.h"
#include "launch/tokenize_command.h"

namespace linnet {

/// Options of `linnet-tp [generate]`.
struct GenerateOptions {
  std::string model;                 // --model: a model directory
  std::optional<std::string> prompt; // --prompt
  std::string input;                 // --input: JSONL, one {"prompt": ...} or {"messages": [...]} per line
  bool chat = false;                 // --chat: a prompt is one user message, put in the chat template
  std::string output;                // --output: JSONL results (written atomically at the end)
  int64_t max_new_tokens = 256;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<uint64_t> seed;
  int64_t max_seq_len = 0;           // 0: min(max_position_embeddings, 8192)
  int threads = 0;                   // BLAS threads per rank; 0: cores / ranks on the node
  int64_t max_batch = 16;            // --max-batch: prompts of --input decoded together
  bool verbose = false;
};

/// What the command line asked for.
struct CommandLine {
  enum class Kind { kGenerate, kTokenize, kInfo, kLoss, kTemplate, kHelp, kVersion } kind = Kind::kGenerate;
  std::string help_text;  // for kHelp
  GenerateOptions generate;
  TokenizeOptions tokenize;  // for kTokenize
  InfoOptions info;          // for kInfo
  LossOptions loss;          // for kLoss
  TemplateOptions chat_template;  // for kTemplate
};

/// Parses argv. A first argument "generate" selects that subcommand (also the default),
/// "tokenize" the tokenize subcommand (launch/tokenize_command.h), "template" the chat
/// template subcommand (launch/template_command.h).
/// @throws Error naming the option on unknown options, bad values, or a missing
///   --model / --prompt|--input.
CommandLine parse_command_line(int argc, char** argv);

}  // namespace linnet
