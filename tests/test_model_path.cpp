// --model name resolution: path, $LINNET_MODEL_PATH, the Hugging Face hub cache, and
// the error listing every place tried.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "common/error.h"
#include "loader/model_path.h"

namespace linnet {
namespace {
namespace fs = std::filesystem;

class ModelPath : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("linnet_model_path_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  GetEnv env() {
    return [this](const char* name) {
      auto it = vars_.find(name);
      return it == vars_.end() ? std::string() : it->second;
    };
  }
  // A hub cache entry whose refs/main names `revision`.
  fs::path make_hub_snapshot(const fs::path& hub, const std::string& cache_name, const std::string& revision) {
    const fs::path snap = hub / cache_name / "snapshots" / revision;
    fs::create_directories(snap);
    fs::create_directories(hub / cache_name / "refs");
    std::ofstream(hub / cache_name / "refs" / "main") << revision;
    return snap;
  }
  fs::path root_;
  std::map<std::string, std::string> vars_;
};

TEST_F(ModelPath, AnExistingDirectoryWins) {
  EXPECT_EQ(resolve_model_dir(root_.string(), env()), root_);
}

TEST_F(ModelPath, SearchesLinnetModelPathInOrder) {
  fs::create_directories(root_ / "b" / "qwen3-4b");
  fs::create_directories(root_ / "c" / "qwen3-4b");
  vars_["LINNET_MODEL_PATH"] = (root_ / "a").string() + ":" + (root_ / "b").string() + ":" + (root_ / "c").string();
  EXPECT_EQ(resolve_model_dir("qwen3-4b", env()), root_ / "b" / "qwen3-4b");
}

TEST_F(ModelPath, FindsTheHubSnapshotThatRefsMainNames) {
  vars_["HOME"] = (root_ / "home").string();
  const fs::path hub = root_ / "home" / ".cache" / "huggingface" / "hub";
  make_hub_snapshot(hub, "models--meta-llama--Llama-3.1-8B-Instruct", "0e9e39f249a16976918f6564b8830bc894c89659");
  fs::create_directories(hub / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / "older");
  const fs::path expect =
      hub / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / "0e9e39f249a16976918f6564b8830bc894c89659";
  EXPECT_EQ(resolve_model_dir("llama-3.1-8b-instruct", env()), expect);
  EXPECT_EQ(resolve_model_dir("meta-llama/Llama-3.1-8B-Instruct", env()), expect);
}

TEST_F(ModelPath, HubCacheVariablesComeFirst) {
  vars_["HOME"] = (root_ / "home").string();
  vars_["HF_HOME"] = (root_ / "hf_home").string();
  vars_["HF_HUB_CACHE"] = (root_ / "hub_cache").string();
  make_hub_snapshot(root_ / "home" / ".cache" / "huggingface" / "hub", "models--Qwen--Qwen3-4B", "r1");
  make_hub_snapshot(root_ / "hf_home" / "hub", "models--Qwen--Qwen3-4B", "r2");
  EXPECT_EQ(resolve_model_dir("qwen3-4b", env()), root_ / "hf_home" / "hub" / "models--Qwen--Qwen3-4B" / "snapshots" / "r2");
  make_hub_snapshot(root_ / "hub_cache", "models--Qwen--Qwen3-4B", "r3");
  EXPECT_EQ(resolve_model_dir("Qwen/Qwen3-4B", env()), root_ / "hub_cache" / "models--Qwen--Qwen3-4B" / "snapshots" / "r3");
}

TEST_F(ModelPath, NotFoundListsEveryPlaceAndTheDownloadCommand) {
  vars_["HOME"] = (root_ / "home").string();
  vars_["LINNET_MODEL_PATH"] = (root_ / "models").string();
  try {
    resolve_model_dir("phi-3-mini-4k-instruct", env());
    FAIL() << "must not resolve";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("phi-3-mini-4k-instruct (as a path)"), std::string::npos) << m;
    EXPECT_NE(m.find((root_ / "models" / "phi-3-mini-4k-instruct").string()), std::string::npos) << m;
    EXPECT_NE(m.find("models--microsoft--Phi-3-mini-4k-instruct"), std::string::npos) << m;
    EXPECT_NE(m.find("huggingface-cli download microsoft/Phi-3-mini-4k-instruct"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace linnet
