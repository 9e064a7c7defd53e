// JsonlOutput: the --output file of generate and loss, and the rank-0 side of it: the
// lines of an earlier run (--resume). Results are kept in memory and written to a temp
// file beside the target, then renamed over it, so a failed run never leaves a partial
// output file behind (finished work survives a crash in the journal, driver/journal.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace linnet {

/// The file --output `path` names: every symbolic link followed, also one whose target
/// does not exist yet (that target is the file written; the link stays), the folder made
/// canonical. Resolved once, so the temp file, the rename and the journal (with its
/// one-writer lock, driver/journal.h) all use the file every route to it reaches.
/// @throws Error naming --output when it is empty, its directory does not exist, it names
///   a directory, device, FIFO or socket (a rename would replace those), or its links
///   loop or chain more than 40 deep.
std::string resolve_output_path(const std::string& path);

/// resolve_output_path, then a probe that a file can be created beside it.
/// @throws Error naming --output, with the system's reason, or when it is the same file
///   as `input` (the --input file, when given).
void check_output_path(const std::string& path, const std::string& input = {});

/// Collects one JSON line per prompt and writes them atomically on commit().
/// Destroyed without commit(), it leaves nothing on disk.
class JsonlOutput {
 public:
  /// @throws Error as resolve_output_path.
  explicit JsonlOutput(const std::string& path);
  ~JsonlOutput();
  JsonlOutput(const JsonlOutput&) = delete;
  JsonlOutput& operator=(const JsonlOutput&) = delete;

  /// Adds {"prompt", "completion", "prompt_ids", "completion_ids", "finish_reason"}.
  /// With finish_reason "error", `error` is added as {"error": ...}.
  void add(const std::string& prompt, const std::string& completion, const std::vector<int32_t>& prompt_ids,
           const std::vector<int32_t>& completion_ids, const std::string& finish_reason,
           const std::string& error = {});
  /// Adds one line of JSON text (no newline).
  void add_line(std::string line) { lines_.push_back(std::move(line)); }
  /// Writes path.tmp.<pid> and renames it to path.
  /// @throws Error naming the file on I/O failure (the temp file is removed).
  void commit();

 private:
  std::string path_;
  std::string tmp_path_;
  std::vector<std::string> lines_;
};

/// The "index" of an output line (the 0-based input line it answers).
/// @throws Error naming `where` when it has no integer "index" >= 0.
int64_t output_line_index(const nlohmann::ordered_json& line, const std::string& where);

/// The lines of an earlier --output file for --resume, by their "index" field (the
/// 0-based input line), each kept as its exact text. A missing file gives none.
/// `line_numbers`, when given, receives each index's 1-based line in the file.
/// @throws Error naming "path:line" when a line is not a JSON object with a
///   non-negative integer "index", or an index appears twice.
std::map<int64_t, std::string> read_output_lines(const std::string& path,
                                                std::map<int64_t, int>* line_numbers = nullptr);

}  // namespace linnet
