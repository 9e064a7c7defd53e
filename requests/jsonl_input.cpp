#include "requests/jsonl_input.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "loader/json_brief.h"

namespace linnet {
namespace {

// The lines of one input, read through a file descriptor: each read waits at most 100 ms
// (poll), so `stop` is asked while a pipe's writer is silent too.
class LineReader {
 public:
  LineReader(const std::string& path, const std::function<bool()>& stop) : path_(path), stop_(stop) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw Error(std::string("cannot open the input file: ") + std::strerror(errno), path);
    if (S_ISDIR(st.st_mode)) throw Error("is a directory, not a JSONL file", path);
    if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
      const char* kind = S_ISCHR(st.st_mode)    ? "a character device"
                         : S_ISBLK(st.st_mode)  ? "a block device"
                         : S_ISSOCK(st.st_mode) ? "a socket"
                                                : "not a regular file";
      throw Error(std::string("is ") + kind + ", not a JSONL file (give a regular file, or a FIFO / pipe)", path);
    }
    // Non-blocking: opening a FIFO whose writer has not come yet must not block a signal.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) throw Error(std::string("cannot open the input file: ") + std::strerror(errno), path);
  }
  ~LineReader() { ::close(fd_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // One line into `line` (without its '\n'), keeping at most `limit` bytes; `bytes` is
  // the line's whole length. False at the end of the input with nothing read.
  bool next(std::string& line, uint64_t limit, uint64_t& bytes) {
    line.clear();
    bytes = 0;
    bool any = false;
    for (;;) {
      if (at_ == end_ && !fill()) return any;
      any = true;
      const char* nl = static_cast<const char*>(std::memchr(buf_ + at_, '\n', end_ - at_));
      const size_t n = nl ? static_cast<size_t>(nl - (buf_ + at_)) : end_ - at_;
      const uint64_t keep = bytes < limit ? std::min<uint64_t>(n, limit - bytes) : 0;
      line.append(buf_ + at_, keep);
      bytes += n;
      at_ += n;
      if (nl) {
        ++at_;
        return true;
      }
    }
  }

 private:
  // Refills the buffer; false at the end of the input.
  bool fill() {
    at_ = end_ = 0;
    for (;;) {
      if (stop_ && stop_()) {
        throw Error("interrupted: a stop signal came while the input " + path_ + " was read; nothing ran");
      }
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, 100);
      if (ready < 0 && errno != EINTR) throw Error(std::string("cannot read: ") + std::strerror(errno), path_);
      if (ready <= 0) continue;
      const ssize_t got = ::read(fd_, buf_, sizeof buf_);
      if (got > 0) {
        end_ = static_cast<size_t>(got);
        return true;
      }
      if (got == 0) return false;  // (a FIFO no writer has opened yet is not readable: poll waits)
      if (errno != EAGAIN && errno != EINTR) throw Error(std::string("cannot read: ") + std::strerror(errno), path_);
    }
  }

  std::string path_;
  const std::function<bool()>& stop_;
  int fd_ = -1;
  char buf_[1 << 16];
  size_t at_ = 0, end_ = 0;
};

}  // namespace

std::vector<std::pair<int, std::string>> read_jsonl_lines(const std::string& path,
                                                          std::vector<std::pair<int, uint64_t>>* oversized,
                                                          const std::function<bool()>& stop) {
  LineReader in(path, stop);
  std::vector<std::pair<int, std::string>> lines;
  std::string line;
  uint64_t bytes = 0;
  for (int n = 1; in.next(line, kMaxJsonlLineBytes, bytes); ++n) {
    if (bytes > kMaxJsonlLineBytes) {
      if (!oversized) {
        throw Error("the line is longer than " + std::to_string(kMaxJsonlLineBytes) + " bytes (64 MiB)",
                    path + ":" + std::to_string(n), "", std::to_string(bytes) + " bytes");
      }
      oversized->emplace_back(n, bytes);
      continue;
    }
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.emplace_back(n, std::move(line));
  }
  if (lines.empty() && (!oversized || oversized->empty())) throw Error("no lines in the input file", path);
  return lines;
}

std::vector<JsonlLine> parse_jsonl(const std::string& path, const std::vector<std::pair<int, std::string>>& lines) {
  std::vector<JsonlLine> out;
  out.reserve(lines.size());
  for (const auto& [n, text] : lines) out.push_back({n, parse_jsonl_line(text, path + ":" + std::to_string(n))});
  return out;
}

nlohmann::ordered_json parse_jsonl_line(const std::string& text, const std::string& where) {
  if (text.find('\0') != std::string::npos) throw Error("a NUL byte inside the line", where);
  // Nesting beyond any real request would only cost stack further on.
  check_json_text_depth(text, kMaxJsonlDepth, where);
  nlohmann::ordered_json value;
  try {
    value = parse_ordered_json_unique_keys(text, where);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("not valid JSON: ") + e.what(), where);
  }
  if (!value.is_object()) throw Error("each line must be a JSON object", where);
  return value;
}

void check_known_keys(const nlohmann::ordered_json& line, std::initializer_list<const char*> known,
                      const std::string& kind, const std::string& where) {
  for (const auto& [key, value] : line.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string names;
    for (const char* k : known) names += std::string(names.empty() ? "" : ", ") + k;
    throw Error("unknown key \"" + key + "\" (" + kind + " may have: " + names + ")", where);
  }
}

}  // namespace linnet
