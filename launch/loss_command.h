// `linnet-tp loss`: training-loss evaluation of a checkpoint on a JSONL data set, with
// data parallelism over tensor-parallel groups. Documents are packed into sequences of
// at most --max-seq-len tokens (a longer document is cut into consecutive chunks, each
// scored on its own), the packs are dealt round-robin to the dp groups, each group runs
// loss_packed (vocab-parallel cross-entropy). tp rank 0 of a group sends each pack's
// per-document sums to world rank 0 as soon as it is scored, which journals them
// (driver/journal.h) and at the end adds them up per document, in pack order, so a
// resumed run's sums equal an uninterrupted run's bit for bit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "launch/engine_options.h"

namespace linnet {

class Job;

/// Options of `linnet-tp loss`.
struct LossOptions {
  EngineOptions engine;     // --model, --tp, --max-seq-len (tokens per packed sequence), ... (launch/engine_options.h)
  std::string input;        // --input: JSONL, {"text": ...} or {"ids": [...], "labels": [...]} per line
  std::string output;       // --output: per-document JSONL {"index", "tokens", "nll_sum", "mean_nll"}; a journal beside it meanwhile
  bool resume = false;      // --resume: keep the documents in --output and its journal, score the rest
};

/// Parses `argv` after the word "loss". Sets `help_text` and returns nullopt for --help.
/// @throws Error naming the option on unknown options, bad values or missing ones.
std::optional<LossOptions> parse_loss_options(int argc, char** argv, std::string& help_text);

/// Runs the evaluation; rank 0 prints scored tokens, mean NLL per token, perplexity and
/// tokens/s to stdout and writes --output, journaling each scored pack beside it as it
/// is done. SIGINT/SIGTERM/SIGUSR1 stop it after the packs in flight (exit 130, the
/// finished documents in --output and the journal). Returns the exit code.
int run_loss(const LossOptions& options, Job& job);

}  // namespace linnet
