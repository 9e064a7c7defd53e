// JSONL input of the subcommands: rank 0 reads the file (under mpirun, stdin and local
// files exist only there) and broadcasts the lines (parallel/text_broadcast.h), so every
// rank parses the same text. Reading and parsing only: no MPI.
#pragma once

#include <initializer_list>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>


namespace linnet {

/// Deepest JSON nesting accepted in an input line (chat tools' JSON schemas stay far below).
inline constexpr std::size_t kMaxJsonlDepth = 128;

/// Longest input line accepted, in bytes (64 MiB): a longer one is never held whole in
/// memory, let alone parsed or tokenized.
inline constexpr std::uint64_t kMaxJsonlLineBytes = std::uint64_t{64} << 20;

/// One non-blank line of a JSONL file, parsed (keys in file order), with its 1-based
/// line number.
struct JsonlLine {
  int line = 0;
  nlohmann::ordered_json value;
};

/// Parses one line into a JSON object, keys in file order (tojson in chat templates
/// shows them).
/// @throws Error naming `where` when the line holds a NUL byte, nests deeper than
///   kMaxJsonlDepth, is not valid JSON, repeats a key in an object ("duplicate key ..."),
///   or is not an object.
nlohmann::ordered_json parse_jsonl_line(const std::string& text, const std::string& where);

/// Refuses a key of the object `line` that is not one of `known`: a misspelt key would
/// otherwise silently fall back to its default. `kind` names the line in the message,
/// e.g. "a \"prompt\" line".
/// @throws Error "unknown key \"k\" (<kind> may have: <known, comma-separated>)" naming
///   `where`.
void check_known_keys(const nlohmann::ordered_json& line, std::initializer_list<const char*> known,
                      const std::string& kind, const std::string& where);

/// Reads `path` (a regular file, or a FIFO / pipe such as /dev/stdin), skipping blank lines.
/// Returns the raw lines and their numbers. A line longer than kMaxJsonlLineBytes is
/// skipped without being kept: with `oversized` given it is listed there (its number and
/// byte count) and left out of the result, so the caller can fail it alone.
/// `stop` (when given) is asked at least every 100 ms, also while a pipe's writer is
/// silent; once it says true the reading ends with an Error (a caught stop signal).
/// @throws Error naming the file when it cannot be opened, is a directory or another
///   kind of file than a regular file or a FIFO (a device such as /dev/zero, a socket),
///   cannot be read, has no non-blank line (nor oversized one), or `stop` said true;
///   naming "file:line" and the byte count for a line over kMaxJsonlLineBytes when
///   `oversized` is null.
std::vector<std::pair<int, std::string>> read_jsonl_lines(const std::string& path,
                                                          std::vector<std::pair<int, std::uint64_t>>* oversized = nullptr,
                                                          const std::function<bool()>& stop = {});

/// Parses lines read by read_jsonl_lines; each must be a JSON object.
/// @throws Error naming "file:line" when a line is not a JSON object, holds a NUL byte,
///   repeats a key, or nests deeper than kMaxJsonlDepth.
std::vector<JsonlLine> parse_jsonl(const std::string& path, const std::vector<std::pair<int, std::string>>& lines);

}  // namespace linnet
