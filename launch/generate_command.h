// `linnet-tp generate`: load this rank's slice, generate for each prompt, stream the
// completion on rank 0, write --output JSONL atomically.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "driver/job.h"
#include "launch/engine_options.h"

namespace linnet {

/// Options of `linnet-tp [generate]`.
struct GenerateOptions {
  EngineOptions engine;              // --model, --tp, --max-batch, ... (launch/engine_options.h)
  std::optional<std::string> prompt; // --prompt
  std::string input;                 // --input: JSONL, one {"prompt": ...} or {"messages": [...]} per line
  bool chat = false;                 // --chat: a prompt is one user message, put in the chat template
  std::string output;                // --output: JSONL results (written atomically at the end; a journal beside it meanwhile)
  bool resume = false;               // --resume: keep the lines already in --output and its journal, run the rest
  std::optional<int64_t> max_new_tokens;  // default: generation_config.json, else 256
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::vector<std::string> stop;     // --stop (repeatable): stop strings
  std::vector<int64_t> stop_token_ids;  // --stop-token-ids, on top of the model's EOS ids
  bool logprobs = false;             // --logprobs: each new token's log-probability
  int64_t top_logprobs = 0;          // --top-logprobs N (<= kMaxTopLogprobs; implies --logprobs)
  std::optional<uint64_t> seed;
  bool progress = false;             // --progress: draw the bar even when stderr is not a terminal (mpirun)
};

/// Parses `argv` (after the word "generate" when it is there). Sets `help_text` and
/// returns nullopt for --help; sets `version` for --version.
/// @throws Error naming the option on unknown options, bad values, or a missing
///   --model / --prompt|--input.
std::optional<GenerateOptions> parse_generate_options(int argc, char** argv, std::string& help_text, bool& version);

/// Runs the generate subcommand on this rank. Returns the process exit code.
int run_generate(const GenerateOptions& options, Job& job);

}  // namespace linnet
