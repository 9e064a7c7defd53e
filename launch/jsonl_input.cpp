#include "launch/jsonl_input.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "loader/json_brief.h"

namespace linnet {
namespace {

// Reads one line of `in` into `line` (without its '\n'), keeping at most `limit` bytes;
// `bytes` is the line's whole length. False at the end of the input with nothing read.
bool read_line_bounded(std::istream& in, std::string& line, uint64_t limit, uint64_t& bytes) {
  line.clear();
  bytes = 0;
  std::streambuf* sb = in.rdbuf();
  bool any = false;
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) return any;
    any = true;
    if (c == '\n') return true;
    if (++bytes <= limit) line.push_back(static_cast<char>(c));
  }
}

}  // namespace

std::vector<std::pair<int, std::string>> read_jsonl_lines(const std::string& path,
                                                          std::vector<std::pair<int, uint64_t>>* oversized) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error("is a directory, not a JSONL file", path);
  std::ifstream in(path);
  if (!in) throw Error("cannot open the input file", path);
  std::vector<std::pair<int, std::string>> lines;
  std::string line;
  uint64_t bytes = 0;
  for (int n = 1; read_line_bounded(in, line, kMaxJsonlLineBytes, bytes); ++n) {
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

void broadcast_strings(Communicator& comm, std::vector<std::string>& strings) {
  uint64_t count = strings.size();
  comm.broadcast(&count, sizeof count, 0);
  if (count == 0) {
    strings.clear();
    return;
  }
  std::vector<uint64_t> lengths(count);
  std::string bytes;
  if (comm.rank() == 0) {
    for (size_t i = 0; i < count; ++i) lengths[i] = strings[i].size();
    for (const auto& s : strings) bytes += s;
  }
  comm.broadcast(lengths.data(), lengths.size() * sizeof(uint64_t), 0);
  uint64_t total = 0;
  for (uint64_t n : lengths) total += n;
  bytes.resize(total);
  if (total > 0) comm.broadcast(bytes.data(), bytes.size(), 0);
  if (comm.rank() != 0) {
    strings.clear();
    uint64_t at = 0;
    for (uint64_t n : lengths) {
      strings.push_back(bytes.substr(at, n));
      at += n;
    }
  }
}

void broadcast_lines(Communicator& comm, std::vector<std::pair<int, std::string>>& lines) {
  std::vector<std::string> texts;
  std::vector<std::string> numbers;
  for (const auto& [n, t] : lines) {
    texts.push_back(t);
    numbers.push_back(std::to_string(n));
  }
  broadcast_strings(comm, texts);
  broadcast_strings(comm, numbers);
  lines.clear();
  for (size_t i = 0; i < texts.size(); ++i) lines.emplace_back(std::stoi(numbers[i]), std::move(texts[i]));
}

}  // namespace linnet
