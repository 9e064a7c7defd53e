// `linnet-tp generate`: load this rank's slice, generate for each prompt, stream the
// completion on rank 0, write --output JSONL atomically.
#pragma once

#include "launch/cli_options.h"
#include "launch/job.h"

namespace linnet {

/// Runs the generate subcommand on this rank. Returns the process exit code.
int run_generate(const GenerateOptions& options, Job& job);

}  // namespace linnet
