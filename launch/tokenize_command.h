// `linnet-tp tokenize`: text -> token ids with a model directory's tokenizer, no
// weights loaded and no mpirun needed (an MPI singleton is enough).
#pragma once

#include <optional>
#include <string>

namespace linnet {

class Job;

/// Options of `linnet-tp tokenize`.
struct TokenizeOptions {
  std::string model;                // --model: a directory with tokenizer.json
  std::optional<std::string> text;  // --text: one text; ids printed space-separated
  std::string input;                // --input: JSONL, one {"text": ...} per line
  bool add_special = false;         // --add-special: the post-processor's tokens (BOS)
};

/// Parses `argv` after the word "tokenize" (argv[0] is the program, argv[1] "tokenize").
/// Sets `help_text` and returns nullopt for --help.
/// @throws Error naming the option on unknown options or a missing --model /
///   --text|--input.
std::optional<TokenizeOptions> parse_tokenize_options(int argc, char** argv, std::string& help_text);

/// Loads the tokenizer and prints, on rank 0: for --text one line of ids separated by
/// spaces; for --input one {"ids": [...]} line per input line, in order.
/// Returns the exit code (0, or 1 after printing the error naming the file and line).
int run_tokenize(const TokenizeOptions& options, Job& job);

}  // namespace linnet
