// Journal: the crash-safe record of a batch run's finished work, `<output>.journal`
// beside --output. World rank 0 appends each finished request (generate) or pack of
// documents (loss) as one JSON line, by one write(2), the moment it has it; so kill -9
// of any rank or of mpirun, or a second signal, loses only the work in flight. Lines are
// fdatasync'd at least every 2 s while they come, and when the journal closes. The
// first line is a header: which command wrote it and what a resume must match. The
// ordered --output is still written by rename at the end; then the journal is removed.
// --resume reads it back (read_journal), and a last line cut by a crash is ignored.
//
// Design choice: when the journal's path no longer leads to the open file (its folder
// was removed or renamed mid-run) or a write to it fails (a full disk), it is copied to
// the temp folder (TMPDIR, else /tmp) and continued there, so a lost output folder or a
// full disk loses nothing finished; the warning and the final error name the copy and
// how to resume from it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace linnet {

/// What read_journal found in a journal file.
struct JournalContents {
  bool exists = false;               // false: no file (nothing to resume)
  nlohmann::ordered_json header;     // the first line; null when the file holds no whole line
  std::vector<std::pair<int, std::string>> lines;  // (line number, text) after the header
  uint64_t whole_bytes = 0;          // bytes up to the end of the last line kept
  std::string dropped;               // what was ignored at the end (a torn last line), else ""
};

/// `<output>.journal` for --output `output`, beside the real file (through symlinks,
/// as resolve_output_path).
/// @throws Error as resolve_output_path.
std::string journal_path(const std::string& output);

/// Reads the journal at `path` written by `command` ("generate" or "loss"). Its last
/// line is dropped (and described in `dropped`) when it has no newline or is not a JSON
/// object: a write cut by kill -9 or a crash.
/// @throws Error naming "path:line" when an earlier line is not a JSON object, and
///   naming `path` when the header is not a linnet-tp journal of `command` or the file
///   cannot be read.
JournalContents read_journal(const std::string& path, const std::string& command);

/// Waits while another process holds the writer's lock on the journal at `path` (a run
/// whose mpirun was killed: its ranks go on for a few seconds, appending), at most
/// `seconds`; returns at once when there is no journal or nobody holds it. Call before
/// read_journal, so what is read is what the old run left.
/// @throws Error naming `path` when the lock is still held after `seconds`, or when it
///   is not a plain file (a FIFO would block, a symlink lead into another run's journal).
void wait_for_journal_writer(const std::string& path, double seconds = 30);

/// True when a live process holds the writer's lock on the journal at `path` (a run is
/// writing it now), false when nobody does or there is no journal.
bool journal_in_use(const std::string& path);

/// Checks that a run resuming from `journal` has the settings of the run that wrote it:
/// `settings` (an object: model folder, dtypes, the defaults each request samples with,
/// ...) must equal the header's "settings" key by key, else the resumed file would mix
/// lines of two different runs. A header without "settings" (an older journal) passes.
/// @throws Error naming "path:1", the first key that differs or that only one side has,
///   and both values ("none" for the missing side).
void check_journal_settings(const JournalContents& journal, const nlohmann::ordered_json& settings,
                            const std::string& path);

/// `<output>.run.json` beside the real file of --output `output`: the header of the run
/// that wrote it (its journal's first line: the command, the seed, the settings, ...).
/// A run writes it when it has finished --output and removes its journal, so a later
/// --resume over that file can still check it has the same settings (and refuses
/// without it). A run removes it when it starts writing a journal.
/// @throws Error as resolve_output_path.
std::string run_record_path(const std::string& output);

/// Writes `header` as the run record of `output` (a temp file renamed over it).
/// @throws Error naming the record when it cannot be written.
void write_run_record(const std::string& output, const nlohmann::ordered_json& header);

/// For --resume when --output holds lines and no journal is left: the header of the run
/// that wrote them, from its run record.
/// @throws Error naming --output when there is no record (the lines' settings cannot be
///   checked, so they would be kept blindly), or naming the record when it is not a JSON
///   object of a linnet-tp run of `command`.
nlohmann::ordered_json read_run_record(const std::string& output, const std::string& command);

/// An open journal (world rank 0 only). Its writer holds an exclusive flock(2) on it
/// while it is open, so two runs never append to one journal.
class Journal {
 public:
  /// Starts a fresh journal at `path` whose first line is `header` (the file must not
  /// exist), or, when `resumed` is given (read_journal's result for `path`, exists),
  /// continues it: cut after its last whole line, then appended to.
  /// @throws Error naming the journal when it cannot be created or opened, or when
  ///   another process holds its lock.
  Journal(std::string path, const nlohmann::ordered_json& header, const JournalContents* resumed = nullptr);
  /// Syncs and closes; the file stays (remove() deletes it).
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  /// Appends one line (no newline in `line`) with one write(2); fdatasync when the last
  /// one is 2 s old. A failed write warns once and stops the journal (the run goes on).
  void append(const std::string& line);

  /// Call now and then (every poll): fdatasync when lines wait and the last sync is 2 s
  /// old, and when the path no longer leads to the file, moves it to the temp folder.
  void tick();

  /// Syncs now and checks the path (tick without waiting for the 2 s).
  void sync();

  /// Deletes the journal (after --output was written).
  void remove();

  /// Where the journal is now (the temp-folder copy after a move).
  const std::string& path() const { return path_; }
  /// True when the journal had to move from beside --output (the original path).
  bool moved() const { return moved_; }
  /// Why it moved ("its folder vanished ...", "a write to it failed (...)"), once moved().
  const std::string& moved_because() const { return moved_because_; }
  /// The path it was created at, beside --output.
  const std::string& original_path() const { return original_; }
  /// False once a write failed: the journal no longer keeps anything.
  bool ok() const { return fd_ >= 0; }

 private:
  void write_all(const std::string& bytes);
  void check_path();
  // Continues the journal in the temp folder (a copy of its whole lines); false, with
  // the journal failed, when no copy can be made. `why`: what happened to it.
  bool move_to_temp(const std::string& why);
  void fail(const std::string& what);

  std::string path_, original_, moved_because_;
  int fd_ = -1;
  uint64_t bytes_ = 0;  // file size as written
  bool dirty_ = false, moved_ = false;
  std::chrono::steady_clock::time_point last_sync_;
};

/// The end of a journaled run (rank 0, after --output is committed): unless the run was
/// interrupted (`exit_code` kInterruptedExit: the journal stays for --resume), writes the run record
/// of `output` from `header` and removes the journal. Nothing when `journal` is null.
/// @throws Error as write_run_record.
void retire_journal(Journal* journal, const std::string& output, const nlohmann::ordered_json& header, int exit_code);

/// What rank 0 adds to an error message about `journal` (null: nothing): where the
/// finished work is kept and how to resume from it (also after it moved).
std::string journal_note(Journal* journal);

}  // namespace linnet
