// `linnet-tp template`: renders chat requests with a model directory's own chat template
// (tokenizer_config.json / chat_template.jinja), as transformers' apply_chat_template
// (tokenize=False) does; no weights loaded, no mpirun needed.
#pragma once

#include <optional>
#include <string>

namespace linnet {

class Job;

/// Options of `linnet-tp template`.
struct TemplateOptions {
  std::string model;  // --model: a directory with tokenizer.json and a chat template
  std::string input;  // --input: JSONL, one {"messages": [...], "add_generation_prompt": ..., ...} per line
};

/// Parses `argv` after the word "template" (argv[0] is the program, argv[1] "template").
/// Sets `help_text` and returns nullopt for --help.
/// @throws Error naming the option on unknown options or a missing --model / --input.
std::optional<TemplateOptions> parse_template_options(int argc, char** argv, std::string& help_text);

/// Prints, on rank 0, one {"text": ...} line per input line, in order. Every key of a line
/// other than "messages", "add_generation_prompt" and "tools" is passed to the template as
/// an extra variable (enable_thinking, date_string, ...).
/// Returns the exit code (0, or 1 after printing the error naming the file and line).
int run_template(const TemplateOptions& options, Job& job);

}  // namespace linnet
