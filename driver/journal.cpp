#include "driver/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "driver/job.h"
#include "requests/jsonl_input.h"
#include "driver/jsonl_output.h"

namespace linnet {
namespace {

constexpr auto kSyncEvery = std::chrono::seconds(2);

std::string errno_text() { return std::strerror(errno); }

// A journal is a plain file beside --output: a FIFO would block its open(2) forever, a
// device or a folder cannot be one, and a symlink would send this run's lines into
// another run's journal. Nothing there: fine.
void check_plain_file(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISLNK(st.st_mode)) throw Error("the journal is a symbolic link; a journal is a plain file of this run", path);
  if (!S_ISREG(st.st_mode)) throw Error("the journal is not a regular file (a FIFO, a folder or a device?)", path);
}

// Takes the writer's lock on an open journal, or throws naming it.
void lock_writer(int fd, const std::string& path) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return;
  throw Error("another linnet-tp run is writing this journal (flock); wait for it to end, or stop it", path);
}

}  // namespace

void wait_for_journal_writer(const std::string& path, double seconds) {
  check_plain_file(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return;  // no journal: nobody writes it
  const auto start = std::chrono::steady_clock::now();
  bool told = false;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (errno != EWOULDBLOCK || waited >= seconds) {
      ::close(fd);
      throw Error("another linnet-tp run is still writing this journal after " + std::to_string(int(waited)) +
                      " s of waiting; wait for it to end, or stop it, then rerun",
                  path);
    }
    if (!told) {
      warn_once("waiting for the run that still writes " + path +
                " to end (the ranks of a run whose mpirun was killed go on for a few seconds)");
      told = true;
    }
    ::usleep(50 * 1000);
  }
  ::close(fd);  // releases the lock: the caller reads the journal and continues it
}

bool journal_in_use(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // releases the lock if this process took it
  return held;
}

std::string journal_path(const std::string& output) {
  std::error_code ec;
  const std::string real = resolve_output_path(output) + ".journal";
  const std::filesystem::path abs = std::filesystem::absolute(real, ec);  // messages name it wherever they are read
  return ec ? real : abs.lexically_normal().string();
}

JournalContents read_journal(const std::string& path, const std::string& command) {
  JournalContents c;
  std::error_code ec;
  check_plain_file(path);
  if (!std::filesystem::exists(path, ec)) return c;
  c.exists = true;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open the journal to resume: " + errno_text(), path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // Whole lines, each with its number, end offset and parse.
  struct Line {
    int number;
    size_t end;  // offset after its newline
    std::string text;
  };
  std::vector<Line> lines;
  size_t at = 0;
  int number = 0;
  while (at < text.size()) {
    ++number;
    const size_t nl = text.find('\n', at);
    if (nl == std::string::npos) {
      c.dropped = path + ":" + std::to_string(number) + ": a last line without its newline (" +
                  std::to_string(text.size() - at) + " bytes: the run was killed while writing it)";
      break;
    }
    lines.push_back({number, nl + 1, text.substr(at, nl - at)});
    at = nl + 1;
  }
  std::vector<nlohmann::ordered_json> parsed(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string where = path + ":" + std::to_string(lines[i].number);
    try {
      parsed[i] = parse_jsonl_line(lines[i].text, where);
    } catch (const Error& e) {
      // The last line can be cut and still end in a newline only after a crash of the
      // machine (zeros in the tail); anywhere else it is damage, refused.
      if (i + 1 == lines.size() && c.dropped.empty()) {
        c.dropped = where + ": a last line that is not JSON (" + std::to_string(lines[i].text.size()) +
                    " bytes: cut by a crash)";
        lines.pop_back();
        parsed.pop_back();
        break;
      }
      throw Error("the journal is damaged (only its last line may be cut): " + std::string(e.what()), where);
    }
  }
  c.whole_bytes = lines.empty() ? 0 : lines.back().end;
  if (lines.empty()) return c;  // not even the header is whole: nothing was finished
  c.header = parsed[0];
  const auto kind = c.header.find("linnet-tp journal");
  if (kind == c.header.end() || !kind->is_string()) {
    throw Error("not a linnet-tp journal (its first line has no \"linnet-tp journal\" key)", path + ":1");
  }
  if (kind->get<std::string>() != command) {
    throw Error("a journal of `linnet-tp " + kind->get<std::string>() + "`, not of `linnet-tp " + command +
                    "`; is --output the file of another run?",
                path + ":1");
  }
  // A line ending in CR LF (an editor's, another system's) is kept without its CR: the
  // kept lines are copied into --output as they are.
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string& t = lines[i].text;
    if (!t.empty() && t.back() == '\r') t.pop_back();
    c.lines.emplace_back(lines[i].number, std::move(t));
  }
  return c;
}

Journal::Journal(std::string path, const nlohmann::ordered_json& header, const JournalContents* resumed)
    : path_(std::move(path)), original_(path_), last_sync_(std::chrono::steady_clock::now()) {
  if (resumed && resumed->exists) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) throw Error("cannot open the journal to continue it: " + errno_text(), path_);
    lock_writer(fd_, path_);
    // Drop a torn tail so that appended lines start on a line of their own.
    if (::ftruncate(fd_, static_cast<off_t>(resumed->whole_bytes)) != 0) {
      throw Error("cannot cut the journal's torn last line: " + errno_text(), path_);
    }
    bytes_ = resumed->whole_bytes;
    if (::lseek(fd_, 0, SEEK_END) < 0) throw Error("cannot seek in the journal: " + errno_text(), path_);
    if (bytes_ == 0) write_all(header.dump() + "\n");
  } else {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot create the journal: " + errno_text(), path_);
    lock_writer(fd_, path_);
    write_all(header.dump() + "\n");
  }
  if (fd_ >= 0) {
    ::fdatasync(fd_);
    // The new name itself survives a crash of the machine only once its folder is synced.
    const std::string dir = std::filesystem::path(path_).parent_path().string();
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  dirty_ = false;
}

Journal::~Journal() {
  if (fd_ < 0) return;
  if (dirty_) ::fdatasync(fd_);
  ::close(fd_);
}

void Journal::fail(const std::string& what) {
  warn_once("cannot write the journal " + path_ + ": " + what +
            "; finished work is no longer journaled (a crash now loses it; --output is still written at the end)");
  ::close(fd_);
  fd_ = -1;
}

void Journal::write_all(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      // A full disk or a failing device: the lines so far (bytes_, whole lines) go on in
      // the temp folder, and this write is made there again from its start.
      if (moved_ || !move_to_temp("a write to it failed (" + why + ")")) {
        if (fd_ >= 0) fail(why);
        return;
      }
      done = 0;
      continue;
    }
    done += static_cast<size_t>(n);
  }
  bytes_ += bytes.size();
  dirty_ = true;
}

void Journal::append(const std::string& line) {
  if (fd_ < 0) return;
  write_all(line + "\n");
  tick();
}

void Journal::tick() {
  if (fd_ < 0) return;
  if (std::chrono::steady_clock::now() - last_sync_ < kSyncEvery) return;
  sync();
}

void Journal::sync() {
  if (fd_ < 0) return;
  check_path();
  if (fd_ >= 0 && dirty_ && ::fdatasync(fd_) != 0) fail("fdatasync: " + errno_text());
  dirty_ = false;
  last_sync_ = std::chrono::steady_clock::now();
}

void Journal::check_path() {
  struct stat open_st {}, path_st {};
  if (::fstat(fd_, &open_st) != 0) return;
  if (::stat(path_.c_str(), &path_st) == 0 && path_st.st_dev == open_st.st_dev && path_st.st_ino == open_st.st_ino) {
    return;
  }
  move_to_temp("its folder vanished (removed or renamed?)");
}

bool Journal::move_to_temp(const std::string& why) {
  std::error_code ec;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  const std::string to = (ec ? std::filesystem::path("/tmp") : tmp) /
                         (std::filesystem::path(original_).filename().string() + "." + std::to_string(::getpid()));
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    fail(why + ", and no copy can be made at " + to + ": " + errno_text());
    return false;
  }
  // The open file still holds every line: copy it whole.
  char buf[1 << 16];
  bool ok = true;
  for (off_t off = 0; ok && off < static_cast<off_t>(bytes_);) {
    // Only the whole lines: a write cut by a full disk left a part of one beyond bytes_.
    const size_t want = std::min(sizeof buf, static_cast<size_t>(static_cast<off_t>(bytes_) - off));
    const ssize_t n = ::pread(fd_, buf, want, off);
    if (n <= 0) {
      ok = false;
      break;
    }
    for (ssize_t w = 0; w < n;) {
      const ssize_t m = ::write(out, buf + w, static_cast<size_t>(n - w));
      if (m <= 0) {
        ok = false;
        break;
      }
      w += m;
    }
    off += n;
  }
  if (!ok || ::fsync(out) != 0) {
    ::close(out);
    fail(why + ", and copying it to " + to + " failed: " + errno_text());
    return false;
  }
  ::flock(out, LOCK_EX | LOCK_NB);  // a fresh file of this process: nobody else holds it
  ::close(fd_);
  fd_ = out;
  const std::string from = path_;
  path_ = to;
  moved_ = true;
  moved_because_ = why;
  dirty_ = false;
  warn_once("the journal " + from + ": " + why + "; it goes on at " + to + " with every finished line");
  return true;
}

void Journal::remove() {
  std::remove(path_.c_str());  // before the lock goes: a waiting run then finds no journal
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void check_journal_settings(const JournalContents& journal, const nlohmann::ordered_json& settings,
                            const std::string& path) {
  if (!journal.header.is_object() || !journal.header.contains("settings")) return;
  const nlohmann::ordered_json& had = journal.header["settings"];
  for (const auto& [key, value] : settings.items()) {
    const bool same = had.is_object() && had.contains(key) && had[key] == value;
    if (!same) {
      throw Error("--output was written by a run with other settings: " + key + " is " + value.dump() +
                      " in this run and was " + (had.is_object() && had.contains(key) ? had[key].dump() : "none") +
                      " in that one; resume with the flags, model and --input of that run, or start over "
                      "without --resume",
                  path + ":1");
    }
  }
  // A setting this run does not have (another version's journal, or an edited one).
  for (const auto& [key, value] : had.items()) {
    if (!settings.contains(key)) {
      throw Error("--output was written by a run with other settings: " + key + " was " + value.dump() +
                      " in that run and is not a setting of this one; start over without --resume",
                  path + ":1");
    }
  }
}

std::string run_record_path(const std::string& output) {
  std::error_code ec;
  const std::string real = resolve_output_path(output) + ".run.json";
  const std::filesystem::path abs = std::filesystem::absolute(real, ec);
  return ec ? real : abs.lexically_normal().string();
}

void write_run_record(const std::string& output, const nlohmann::ordered_json& header) {
  const std::string path = run_record_path(output);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  const std::string text = header.dump() + "\n";
  bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f) ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    std::remove(tmp.c_str());
    throw Error("cannot write the run record: " + why, path);
  }
}

nlohmann::ordered_json read_run_record(const std::string& output, const std::string& command) {
  const std::string path = run_record_path(output);
  check_plain_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error("holds lines but neither its journal nor its run record (" + path +
                    ") is there, so nothing tells which model and settings wrote them; rerun without --resume "
                    "to write it anew",
                "--output " + output);
  }
  std::string text;
  std::getline(in, text);
  nlohmann::ordered_json header = parse_jsonl_line(text, path + ":1");
  const auto kind = header.find("linnet-tp journal");
  if (kind == header.end() || !kind->is_string() || kind->get<std::string>() != command) {
    throw Error("not the run record of a `linnet-tp " + command + "` run; is --output the file of another run?",
                path + ":1");
  }
  return header;
}

void retire_journal(Journal* journal, const std::string& output, const nlohmann::ordered_json& header, int exit_code) {
  if (!journal || exit_code == kInterruptedExit) return;  // the finished lines stay in the journal
  write_run_record(output, header);
  journal->remove();
}

std::string journal_note(Journal* journal) {
  if (!journal || !journal->ok()) return {};
  journal->sync();  // notices a journal whose folder vanished
  if (!journal->ok()) return {};
  if (journal->moved()) {
    return "; the finished work is kept in the journal " + journal->path() +
           " (moved there: " + journal->moved_because() + "): put it back as " + journal->original_path() +
           " and rerun with --resume";
  }
  return "; the finished work is kept in the journal " + journal->path() + ": rerun with --resume to keep it";
}

}  // namespace linnet
