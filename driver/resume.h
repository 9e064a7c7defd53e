// --resume for generate --input and loss: what world rank 0 reads of --output, its
// journal and the finished run's record before a run (read_resume_state), and what it
// checks of a line it keeps before that line reaches the new --output: that it is
// linnet-tp's output line of the input line with its index, unedited. The journal's
// format and writing: driver/journal.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "driver/journal.h"

#include "loader/tokenizer/tokenizer.h"
#include "requests/request.h"

namespace linnet {

/// What world rank 0 knows of --output and its journal before a run.
struct ResumeState {
  std::string journal_file;                 // <output>.journal (empty: no --output, or a run without one)
  std::map<int64_t, std::string> kept;      // --resume: --output's lines by their "index"
  std::map<int64_t, int> kept_line;         // their line numbers in --output
  JournalContents journal;                  // --resume: the journal, or the finished run's record as its header
  std::string settings_file;                // where journal.header came from (the journal or the run record)
};

/// How a command words its resume state in messages.
struct ResumeWords {
  const char* command;  // "generate" or "loss": whose journal and run record these must be
  const char* keeps;    // "its finished requests and run only the rest"
  const char* redone;   // "that request runs again": what happens to a damaged last journal line
};

/// World rank 0 before a run with `output` (empty: none) over `input`: checks --output
/// (check_output_path), names the journal when `journaled`, and with `resume` waits for a
/// killed run's ranks to let go of the journal, then reads --output, the journal and (when
/// the journal is gone but --output is there) the run record. Without `resume` a journal
/// left behind is refused. Warns once when the journal's last line was cut (it is redone).
/// @throws Error naming the file: --output over --input, a journal in use by another run
///   or left by an unfinished one (without --resume), or what read_output_lines,
///   read_journal and read_run_record refuse.
ResumeState read_resume_state(const std::string& output, const std::string& input, bool resume, bool journaled,
                              const ResumeWords& words);

/// Checks kept output `line` (a JSON object; `where`: its "file:line (index i)") against
/// `r`, the request of its index: only the keys linnet-tp writes; its prompt is r's;
/// prompt_ids and completion_ids are token ids of this model (< `vocab_size`); the counts
/// are those of its ids; its completion is the text of its completion_ids (completion_text);
/// its finish_reason is stop, length or error and fits its ids ("length" at the request's
/// limit, min(max_new_tokens, `max_seq_len` - prompt tokens); "stop" at an `eos` or stop
/// token id, or a stop string); "error" exactly with an "error" string.
/// @throws Error naming `where` and what differs (the run refuses to resume).
void check_kept_output_line(const std::string& line, const std::string& where, const Request& r, const Tokenizer& tok,
                            int64_t vocab_size, int64_t max_seq_len, const std::vector<int64_t>& eos);

}  // namespace linnet
