#include "driver/jsonl_output.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "requests/jsonl_input.h"

namespace linnet {

std::string resolve_output_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) throw Error("is empty", "--output");
  std::error_code ec;
  // Through every symlink to the real file, a dangling one too (weakly_canonical stops at
  // one, and the rename then replaced the link with a file and left its target alone):
  // the temp file is made beside the target and the rename replaces the target.
  fs::path p = path;
  for (int hops = 0;; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) break;
    if (hops == 40) throw Error("its symbolic links loop or chain more than 40 deep", "--output " + path);
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) throw Error("cannot read the symbolic link: " + ec.message(), "--output " + path);
    p = target.is_absolute() ? target : (p.has_parent_path() ? p.parent_path() : fs::path(".")) / target;
  }
  const std::string named = p.string() == path ? path : path + " (-> " + p.string() + ")";
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) throw Error("its directory does not exist", "--output " + named);
  const fs::path canon = fs::canonical(dir, ec);
  if (!ec && p.has_filename()) p = canon / p.filename();
  const fs::file_status st = fs::status(p, ec);
  if (fs::is_directory(st)) throw Error("is a directory", "--output " + named);
  // A rename over a device, FIFO or socket would replace it (as root, /dev/null too).
  if (fs::exists(st) && !fs::is_regular_file(st)) {
    throw Error("is not a regular file (a device, FIFO or socket); give a file path", "--output " + named);
  }
  return p.string();
}

void check_output_path(const std::string& given, const std::string& input) {
  const std::string path = resolve_output_path(given);
  std::error_code ec;
  if (!input.empty() && std::filesystem::equivalent(input, path, ec)) {
    throw Error("--output is the --input file (" + input + "); the run would replace its own input",
                "--output " + given);
  }
  // Probe now that the file can be created there, rather than after the whole run.
  const std::string probe = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  if (!f) throw Error(std::string("cannot create a file there: ") + std::strerror(errno), "--output " + given);
  std::fclose(f);
  std::remove(probe.c_str());
}

JsonlOutput::JsonlOutput(const std::string& path)
    : path_(resolve_output_path(path)), tmp_path_(path_ + ".tmp." + std::to_string(::getpid())) {}

JsonlOutput::~JsonlOutput() { std::remove(tmp_path_.c_str()); }

void JsonlOutput::add(const std::string& prompt, const std::string& completion,
                      const std::vector<int32_t>& prompt_ids, const std::vector<int32_t>& completion_ids,
                      const std::string& finish_reason, const std::string& error) {
  nlohmann::ordered_json j;
  j["prompt"] = prompt;
  j["completion"] = completion;
  j["prompt_ids"] = prompt_ids;
  j["completion_ids"] = completion_ids;
  j["finish_reason"] = finish_reason;
  if (!error.empty()) j["error"] = error;
  lines_.push_back(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void JsonlOutput::commit() {
  std::FILE* f = std::fopen(tmp_path_.c_str(), "wb");
  if (!f) throw Error(std::string("cannot create the output file: ") + std::strerror(errno), "--output " + path_);
  bool ok = true;
  for (const auto& line : lines_) {
    ok = ok && std::fwrite(line.data(), 1, line.size(), f) == line.size() && std::fputc('\n', f) != EOF;
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp_path_.c_str());
    throw Error(std::string("cannot write the output file: ") + std::strerror(err), "--output " + path_);
  }
}

int64_t output_line_index(const nlohmann::ordered_json& j, const std::string& where) {
  const auto it = j.find("index");
  if (it == j.end() || !(it->is_number_unsigned() || (it->is_number_integer() && it->get<int64_t>() >= 0))) {
    throw Error("an output line to resume from needs an integer \"index\" >= 0 (written by linnet-tp)", where);
  }
  return it->get<int64_t>();
}

std::map<int64_t, std::string> read_output_lines(const std::string& path, std::map<int64_t, int>* line_numbers) {
  std::map<int64_t, std::string> lines;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return lines;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open the output file to resume", path);
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    if (!text.empty() && text.back() == '\r') text.pop_back();  // a CR LF line: copied on without its CR
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    const int64_t index = output_line_index(parse_jsonl_line(text, where), where);
    if (!lines.emplace(index, std::move(text)).second) {
      throw Error("index " + std::to_string(index) + " appears twice", where);
    }
    if (line_numbers) (*line_numbers)[index] = n;
  }
  return lines;
}

}  // namespace linnet
