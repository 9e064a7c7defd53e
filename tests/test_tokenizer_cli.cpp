// End-to-end: `linnet-tp tokenize`, run directly (no mpirun), on the three model cards
// and stories260k. Expected ids are the goldens from the Hugging Face `tokenizers`
// (tests/data/tokenizers/*.json, tests/data/stories260k/tokenizer_cases.json).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "tests/cli_harness.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::quote;
using test::Result;

using test::run_direct;

std::string ids_line(const std::vector<int32_t>& ids) {
  std::string s;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s + "\n";
}

class TokenizeCli : public testing::Test {
 protected:
  void SetUp() override {
    if (test::env_path("LINNET_BIN").empty()) GTEST_SKIP() << "LINNET_BIN not set (run via ctest)";
    tmp_ = fs::temp_directory_path() / ("linnet_tokcli_" + std::to_string(::getpid()));
    fs::create_directories(tmp_);
  }
  void TearDown() override { fs::remove_all(tmp_); }
  fs::path tmp_;
};

struct Golden {
  fs::path model_dir;
  json cases;  // [{"text", "ids"}]
};

std::vector<Golden> goldens() {
  std::vector<Golden> out;
  for (const char* name : {"llama-3.1", "qwen3", "phi-3"}) {
    const json g = test::read_json(test::test_data_dir() / "tokenizers" / (std::string(name) + ".json"));
    out.push_back({test::shared_dir() / g.at("model_dir").get<std::string>(), g.at("cases")});
  }
  json stories = test::read_json(test::test_data_dir() / "stories260k" / "tokenizer_cases.json").at("cases");
  for (json& c : stories) c["ids"] = c.at("ids_no_special");
  out.push_back({test::stories_dir(), stories});
  return out;
}

TEST_F(TokenizeCli, TextPrintsIdsOfEachModel) {
  for (const Golden& g : goldens()) {
    int checked = 0;
    for (const json& c : g.cases) {
      const std::string text = c.at("text").get<std::string>();
      if (text.empty() || text.find('\'') != std::string::npos || ++checked > 4) continue;
      const Result r = run_direct("tokenize --model " + quote(g.model_dir.string()) + " --text " + quote(text),
                           tmp_ / "err");
      EXPECT_EQ(r.code, 0) << g.model_dir;
      EXPECT_EQ(r.out, ids_line(c.at("ids").get<std::vector<int32_t>>())) << g.model_dir << " " << text;
    }
  }
}

TEST_F(TokenizeCli, InputGivesOneIdsLinePerTextInOrder) {
  for (const Golden& g : goldens()) {
    std::ofstream in(tmp_ / "in.jsonl", std::ios::binary);
    std::string expected;
    for (const json& c : g.cases) {
      in << json{{"text", c.at("text")}}.dump() << "\n";
      expected += json{{"ids", c.at("ids")}}.dump() + "\n";
    }
    in.close();
    const Result r = run_direct("tokenize --model " + quote(g.model_dir.string()) + " --input " +
                             quote((tmp_ / "in.jsonl").string()),
                         tmp_ / "err");
    EXPECT_EQ(r.code, 0) << g.model_dir;
    EXPECT_EQ(r.out, expected) << g.model_dir;
  }
}

TEST_F(TokenizeCli, AddSpecialAddsBos) {
  const fs::path llama = test::shared_dir() / "models" / "cards" / "llama-3.1-8b-instruct";
  EXPECT_EQ(run_direct("tokenize --model " + quote(llama.string()) + " --text Hello", tmp_ / "err").out, "9906\n");
  EXPECT_EQ(run_direct("tokenize --model " + quote(llama.string()) + " --text Hello --add-special", tmp_ / "err").out,
            "128000 9906\n");
}

TEST_F(TokenizeCli, ErrorsExitNonZeroAndNameTheProblem) {
  const fs::path llama = test::shared_dir() / "models" / "cards" / "llama-3.1-8b-instruct";
  auto err = [&] {
    std::ifstream in(tmp_ / "err");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  Result r = run_direct("tokenize --model " + quote(llama.string()) + " --text \"$(printf 'ab\\377')\"", tmp_ / "err");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(err().find("invalid UTF-8 at byte offset 2"), std::string::npos) << err();

  std::ofstream(tmp_ / "bad.jsonl") << "{\"text\": \"ok\"}\n{\"prompt\": \"x\"}\n";
  r = run_direct("tokenize --model " + quote(llama.string()) + " --input " + quote((tmp_ / "bad.jsonl").string()),
          tmp_ / "err");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");  // nothing printed before the bad line is found
  EXPECT_NE(err().find("bad.jsonl:2"), std::string::npos) << err();

  r = run_direct("tokenize --model " + quote((tmp_ / "nowhere").string()) + " --text x", tmp_ / "err");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(err().find("model directory not found"), std::string::npos) << err();
  EXPECT_NE(err().find("nowhere"), std::string::npos) << err();

  r = run_direct("tokenize --model " + quote(tmp_.string()) + " --text x", tmp_ / "err");  // a dir without one
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(err().find("tokenizer.json"), std::string::npos) << err();

  r = run_direct("tokenize --text x", tmp_ / "err");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(err().find("--model"), std::string::npos) << err();
}

}  // namespace
}  // namespace linnet
