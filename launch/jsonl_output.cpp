#include "launch/jsonl_output.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace linnet {

std::string resolve_output_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) throw Error("is empty", "--output");
  std::error_code ec;
  // Through symlinks to the real file, so the temp file is made beside it and the
  // rename replaces the file, not the link.
  const fs::path real = fs::weakly_canonical(fs::path(path), ec);
  const fs::path p = ec ? fs::path(path) : real;
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) throw Error("its directory does not exist", "--output " + path);
  const fs::file_status st = fs::status(p, ec);
  if (fs::is_directory(st)) throw Error("is a directory", "--output " + path);
  // A rename over a device, FIFO or socket would replace it (as root, /dev/null too).
  if (fs::exists(st) && !fs::is_regular_file(st)) {
    throw Error("is not a regular file (a device, FIFO or socket); give a file path", "--output " + path);
  }
  return p.string();
}

void check_output_path(const std::string& given) {
  const std::string path = resolve_output_path(given);
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

}  // namespace linnet
