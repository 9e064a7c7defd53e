// JSONL input of the subcommands: rank 0 reads the file (under mpirun, stdin and local
// files exist only there) and broadcasts the lines, so every rank parses the same text.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/communicator.h"

namespace linnet {

/// One non-blank line of a JSONL file, parsed, with its 1-based line number.
struct JsonlLine {
  int line = 0;
  nlohmann::json value;
};

/// Reads `path` (a regular file, or a pipe such as /dev/stdin), skipping blank lines.
/// Returns the raw lines and their numbers.
/// @throws Error naming the file when it cannot be opened, is a directory, or has no
///   non-blank line.
std::vector<std::pair<int, std::string>> read_jsonl_lines(const std::string& path);

/// Parses lines read by read_jsonl_lines; each must be a JSON object.
/// @throws Error naming "file:line" when a line is not a JSON object.
std::vector<JsonlLine> parse_jsonl(const std::string& path, const std::vector<std::pair<int, std::string>>& lines);

/// Copies rank 0's `strings` to every rank of `comm` (a collective).
void broadcast_strings(Communicator& comm, std::vector<std::string>& strings);

/// Copies rank 0's numbered lines to every rank of `comm` (a collective).
void broadcast_lines(Communicator& comm, std::vector<std::pair<int, std::string>>& lines);

}  // namespace linnet
