#include "loader/model_path.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace linnet {
namespace fs = std::filesystem;

std::string process_env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string hf_repo_id(const std::string& name) {
  static const std::map<std::string, std::string> kSeeds = {
      {"llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"},
      {"qwen3-4b", "Qwen/Qwen3-4B"},
      {"phi-3-mini-4k-instruct", "microsoft/Phi-3-mini-4k-instruct"},
  };
  const auto it = kSeeds.find(name);
  return it == kSeeds.end() ? name : it->second;
}

fs::path resolve_model_dir(const std::string& name, const GetEnv& env) {
  std::vector<std::string> tried;
  auto is_model_dir = [](const fs::path& p) {
    std::error_code ec;
    return fs::is_directory(p, ec);
  };
  if (name.empty()) throw Error("is empty", "--model");
  if (is_model_dir(name)) return fs::path(name);
  tried.push_back(name + " (as a path)");
  // A name written as a path is only a path: no search, no hub id.
  if (fs::path(name).is_absolute() || name.rfind("./", 0) == 0 || name.rfind("../", 0) == 0) {
    throw Error("model directory not found", "--model " + name);
  }

  std::stringstream search(env("LINNET_MODEL_PATH"));
  for (std::string dir; std::getline(search, dir, ':');) {
    if (dir.empty()) continue;
    const fs::path p = fs::path(dir) / name;
    if (is_model_dir(p)) return p;
    tried.push_back(p.string() + " ($LINNET_MODEL_PATH)");
  }
  if (env("LINNET_MODEL_PATH").empty()) tried.push_back("$LINNET_MODEL_PATH (not set)");

  const std::string repo = hf_repo_id(name);
  std::string cache_name = "models--" + repo;
  for (size_t i = 0; (i = cache_name.find('/', i)) != std::string::npos;) cache_name.replace(i, 1, "--");
  std::vector<std::pair<fs::path, std::string>> hubs;
  if (const std::string v = env("HF_HUB_CACHE"); !v.empty()) hubs.push_back({v, "$HF_HUB_CACHE"});
  if (const std::string v = env("HF_HOME"); !v.empty()) hubs.push_back({fs::path(v) / "hub", "$HF_HOME/hub"});
  if (const std::string v = env("HOME"); !v.empty()) {
    hubs.push_back({fs::path(v) / ".cache" / "huggingface" / "hub", "~/.cache/huggingface/hub"});
  }
  for (const auto& [hub, label] : hubs) {
    const fs::path repo_dir = hub / cache_name;
    std::ifstream ref(repo_dir / "refs" / "main");
    std::string revision;
    if (ref && std::getline(ref, revision) && !revision.empty()) {
      const fs::path snapshot = repo_dir / "snapshots" / revision;
      if (is_model_dir(snapshot)) return snapshot;
      tried.push_back(snapshot.string() + " (" + label + ", refs/main)");
    } else {
      tried.push_back((repo_dir / "refs" / "main").string() + " (" + label + ")");
    }
  }

  std::string msg = "model not found; tried:";
  for (const auto& t : tried) msg += "\n  " + t;
  msg += "\nTo fetch it into the Hugging Face cache: huggingface-cli download " + repo;
  throw Error(msg, "--model " + name);
}

}  // namespace linnet
