// End-to-end: the linnet-tp executable under mpirun (1, 2, 4 ranks, oversubscribed),
// as a user runs it. Greedy text vs llama2.c's documented output and transformers'
// ids; bad input makes every rank exit non-zero within seconds and leaves no --output.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli_harness.h"
#include "tests/test_data.h"

namespace fs = std::filesystem;

namespace linnet {
namespace {

using test::CliTest;
using test::quote;
using test::Result;
using test::slurp;

class Cli : public CliTest {};

constexpr const char* kLlama2cText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";


TEST_F(Cli, VersionAndHelp) {
  Result v = run(1, "--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_EQ(v.out.rfind("linnet-tp ", 0), 0u) << v.out;
  Result h = run(1, "--help");
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("--max-new-tokens"), std::string::npos);
}

TEST_F(Cli, GreedyStoryIsTheSameAtTp124) {
  const auto golden = test::read_json(test::test_data_dir() / "stories260k" / "greedy.json");
  const auto expected_ids = golden["cases"][0]["output_ids"].get<std::vector<int>>();
  ASSERT_EQ(golden["cases"][0]["prompt"], "");
  for (int np : {1, 2, 4}) {
    const fs::path output = tmp_ / ("np" + std::to_string(np) + ".jsonl");
    const Result r = run(np, "--model " + quote(test::stories_dir().string()) +
                                 " --prompt '' --max-new-tokens 60 --temperature 0 --output " +
                                 quote(output.string()));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.rfind(kLlama2cText, 0), 0u) << "np " << np << " printed:\n" << r.out;
    EXPECT_NE(r.err.find("new tokens: 60"), std::string::npos) << r.err;
    const auto line = nlohmann::json::parse(slurp(output));
    EXPECT_EQ(line["completion_ids"].get<std::vector<int>>(), expected_ids) << "np " << np;
    EXPECT_EQ(line["prompt_ids"], nlohmann::json::array({1}));
    EXPECT_EQ(line["finish_reason"], "length");
    EXPECT_EQ(line["completion"].get<std::string>() + "\n", r.out);
  }
}

TEST_F(Cli, CompletionKeepsTheLeadingSpace) {
  const Result r = run(2, "--model " + quote(test::stories_dir().string()) +
                              " --prompt 'Once upon a time' --max-new-tokens 8 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(", there was a little girl", 0), 0u) << r.out;
}

TEST_F(Cli, SeededSamplingRepeatsAcrossRunsAndTpSizes) {
  const std::string args = "--model " + quote(test::stories_dir().string()) +
                           " --prompt 'The cat' --max-new-tokens 40 --temperature 1.0 --top-k 40 --top-p 0.95 --seed 2024";
  const Result a = run(2, args), b = run(2, args), c = run(1, args), d = run(4, args);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out, c.out);
  EXPECT_EQ(a.out, d.out);
  const Result e = run(2, "--model " + quote(test::stories_dir().string()) +
                              " --prompt 'The cat' --max-new-tokens 40 --temperature 1.0 --seed 7");
  EXPECT_NE(a.out, e.out);
}

TEST_F(Cli, InputJsonlKeepsOrderAndWritesEveryField) {
  const fs::path in = tmp_ / "prompts.jsonl", out = tmp_ / "results.jsonl";
  std::ofstream(in) << "{\"prompt\": \"Once upon a time\"}\n\n{\"prompt\": \"Lily and Ben\"}\n";
  const Result r = run(2, "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                              " --output " + quote(out.string()) + " --max-new-tokens 500 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream lines(out);
  std::string l1, l2, l3;
  std::getline(lines, l1);
  std::getline(lines, l2);
  EXPECT_FALSE(std::getline(lines, l3));
  const auto j1 = nlohmann::json::parse(l1), j2 = nlohmann::json::parse(l2);
  EXPECT_EQ(j1["prompt"], "Once upon a time");
  EXPECT_EQ(j2["prompt"], "Lily and Ben");
  for (const auto& j : {j1, j2}) {
    for (const char* k : {"prompt", "completion", "prompt_ids", "completion_ids", "finish_reason"}) {
      EXPECT_TRUE(j.contains(k)) << k;
    }
    // stories260k ends its stories with EOS long before 500 tokens or the 512 context.
    EXPECT_TRUE(j["finish_reason"] == "stop" || j["finish_reason"] == "length");
  }
}

TEST_F(Cli, Rank0ReadsTheInputForEveryRank) {
  // mpirun gives stdin to rank 0 only; the prompts must still reach every rank.
  const fs::path in = tmp_ / "stdin.jsonl";
  std::ofstream(in) << "{\"prompt\": \"Once upon a time\"}\n";
  const Result r = run(2, "--model " + quote(test::stories_dir().string()) +
                              " --input /dev/stdin --max-new-tokens 8 --temperature 0", "", in.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind(", there was a little girl", 0), 0u) << r.out;
}

TEST_F(Cli, UnwritableOutputIsRefusedBeforeGenerating) {
  const Result r = run(2, "--model " + quote(test::stories_dir().string()) +
                              " --prompt hi --output /proc/linnet-no-such-dir/out.jsonl");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.out, "");  // nothing generated
  EXPECT_NE(r.err.find("--output"), std::string::npos) << r.err;
  const Result p = run(1, "--model " + quote(test::stories_dir().string()) + " --prompt hi --output /proc/out.jsonl");
  EXPECT_NE(p.code, 0);
  EXPECT_EQ(p.out, "");
  EXPECT_NE(p.err.find("cannot create a file there"), std::string::npos) << p.err;
}

TEST_F(Cli, TokenizerLargerThanTheEmbeddingIsALoadError) {
  const fs::path m = copy_model();
  auto tok = test::read_json(m / "tokenizer.json");
  tok["added_tokens"].push_back({{"id", 600}, {"content", "<big>"}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", false}});
  std::ofstream(m / "tokenizer.json", std::ios::trunc) << tok.dump();
  expect_clean_failure("--model " + quote(m.string()) + " --prompt 'Once <big>'", "vocab_size = 512");
}

TEST_F(Cli, APromptThatFillsTheContextWarns) {
  const Result r = run(2, "--model " + quote(test::stories_dir().string()) +
                              " --prompt 'Once upon a time' --max-seq-len 5 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("no room is left for new tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("new tokens: 0"), std::string::npos) << r.err;
}

TEST_F(Cli, BatchedInputEqualsOneAtATime) {
  const fs::path in = tmp_ / "prompts.jsonl";
  {
    std::ofstream f(in);
    for (const char* p : {"Once upon a time", "Lily and Ben", "The cat", "Tom had a red ball", "One day"}) {
      f << nlohmann::json{{"prompt", p}}.dump() << "\n";
    }
  }
  std::string outputs[2];
  for (int k = 0; k < 2; ++k) {
    const fs::path out = tmp_ / ("out" + std::to_string(k) + ".jsonl");
    const Result r = run(2, "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                                " --output " + quote(out.string()) + " --max-new-tokens 40 --temperature 0.8 --seed 3" +
                                (k == 0 ? " --max-batch 1" : " --max-batch 4"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("requests: 5 (0 failed)"), std::string::npos) << r.err;
    outputs[k] = slurp(out);
  }
  EXPECT_EQ(outputs[0], outputs[1]);  // each prompt samples with its own seed (seed + index)
}

TEST_F(Cli, TruncatedSafetensorsFile) {
  const fs::path m = copy_model();
  fs::resize_file(m / "model-00002-of-00002.safetensors", 300000);
  expect_clean_failure("--model " + quote(m.string()) + " --prompt hi", "model-00002-of-00002.safetensors");
}

TEST_F(Cli, HeaderLengthPastTheEnd) {
  const fs::path m = copy_model();
  const fs::path f = m / "model-00001-of-00002.safetensors";
  std::string bytes = slurp(f);
  const uint64_t n = 1u << 30;
  std::memcpy(bytes.data(), &n, 8);
  std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
  expect_clean_failure("--model " + quote(m.string()) + " --prompt hi", "model-00001-of-00002.safetensors");
}

TEST_F(Cli, OverlappingRanges) {
  const fs::path m = copy_model();
  edit_header(m / "model-00002-of-00002.safetensors", [](nlohmann::json& h) {
    // Point the final norm's 256 bytes at the start of another tensor's data.
    auto& off = h["model.norm.weight"]["data_offsets"];
    off = nlohmann::json::array({0, 256});
  });
  expect_clean_failure("--model " + quote(m.string()) + " --prompt hi", "overlap");
}

TEST_F(Cli, UnknownDtype) {
  const fs::path m = copy_model();
  edit_header(m / "model-00002-of-00002.safetensors",
              [](nlohmann::json& h) { h["model.norm.weight"]["dtype"] = "I32"; });
  expect_clean_failure("--model " + quote(m.string()) + " --prompt hi", "I32");
}

TEST_F(Cli, MissingTensor) {
  const fs::path m = copy_model();
  edit_header(m / "model-00002-of-00002.safetensors", [](nlohmann::json& h) {
    h["model.norm.renamed"] = h["model.norm.weight"];
    h.erase("model.norm.weight");
  });
  auto index = test::read_json(m / "model.safetensors.index.json");
  index["weight_map"].erase("model.norm.weight");
  std::ofstream(m / "model.safetensors.index.json", std::ios::trunc) << index.dump(2);
  expect_clean_failure("--model " + quote(m.string()) + " --prompt hi", "model.norm.weight");
}

TEST_F(Cli, WrongShape) {
  const fs::path m = copy_model();
  edit_header(m / "model-00002-of-00002.safetensors",
              [](nlohmann::json& h) { h["model.norm.weight"]["shape"] = nlohmann::json::array({2, 32}); });
  expect_clean_failure("--model " + quote(m.string()) + " --prompt hi", "[2, 32]");
}

TEST_F(Cli, HeadsNotDivisibleByTp) {
  expect_clean_failure("--model " + quote(test::stories_dir().string()) + " --prompt hi",
                       "num_attention_heads = 8", /*ranks=*/3);
}

TEST_F(Cli, UnsupportedConfigField) {
  const fs::path m = copy_model();
  auto cfg = test::read_json(m / "config.json");
  cfg["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  std::ofstream(m / "config.json", std::ios::trunc) << cfg.dump(2);
  expect_clean_failure("--model " + quote(m.string()) + " --prompt hi", "rope_scaling");
}

TEST_F(Cli, MemoryPreflightRefusesBeforeLoading) {
  // A context of 2^30 positions needs a KV cache of ~1.3 TB per rank at tp 2.
  const fs::path m = copy_model();
  auto cfg = test::read_json(m / "config.json");
  cfg["max_position_embeddings"] = 1 << 30;
  std::ofstream(m / "config.json", std::ios::trunc) << cfg.dump(2);
  expect_clean_failure("--model " + quote(m.string()) + " --prompt hi --max-seq-len 1073741824",
                       "not enough memory for this rank");
}

TEST_F(Cli, ModelNamesResolveThroughLinnetModelPath) {
  const Result r = run(2, "--model stories260k --prompt '' --max-new-tokens 12 --temperature 0",
                       "env LINNET_MODEL_PATH=" + quote((test::shared_dir() / "models").string()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time, there was", 0), 0u) << r.out;
  const Result missing = run(1, "--model llama-3.1-8b-instruct --prompt hi", "env HOME=" + quote(tmp_.string()));
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("huggingface-cli download meta-llama/Llama-3.1-8B-Instruct"), std::string::npos)
      << missing.err;
}

TEST_F(Cli, PromptLongerThanTheContext) {
  expect_clean_failure("--model " + quote(test::stories_dir().string()) +
                           " --prompt 'Once upon a time there was a dog' --max-seq-len 4",
                       "--max-seq-len");
}

TEST_F(Cli, InvalidUtf8Prompt) {
  expect_clean_failure("--model " + quote(test::stories_dir().string()) + " --prompt \"$(printf 'ab\\377')\"", "offset");
}

TEST_F(Cli, BadFlagValuesAreUsageErrors) {
  const std::string model = "--model " + quote(test::stories_dir().string()) + " --prompt hi ";
  for (const auto& [flags, option] : std::vector<std::pair<std::string, std::string>>{
           {"--temperature -1", "--temperature"},
           {"--top-p 1.5", "--top-p"},
           {"--top-k -5", "--top-k"},
           {"--max-new-tokens -1", "--max-new-tokens"},
           {"--max-seq-len 0", "--max-seq-len"},
           {"--threads 0", "--threads"},
           {"--no-such-flag", "no-such-flag"}}) {
    const Result r = run(2, model + flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.err;
    EXPECT_NE(r.err.find(option), std::string::npos) << flags << ": " << r.err;
  }
}

TEST_F(Cli, InfoPlansTheSeedModelsFromTheirConfigs) {
  for (const char* card : {"llama-3.1-8b-instruct", "qwen3-4b", "phi-3-mini-4k-instruct"}) {
    const fs::path dir = test::shared_dir() / "models" / "cards" / card;
    const Result r = run(1, "info --model " + quote(dir.string()) + " --tp 4");
    ASSERT_EQ(r.code, 0) << card << ": " << r.err;
    EXPECT_NE(r.out.find("sizes below come from config.json"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\n3     [24, 32)"), std::string::npos) << card << ":\n" << r.out;
    const Result bad = run(1, "info --model " + quote(dir.string()) + " --tp 3");
    EXPECT_EQ(bad.code, 1);
    EXPECT_NE(bad.err.find("num_attention_heads = 32 cannot be split over 3"), std::string::npos) << bad.err;
    EXPECT_NE(bad.err.find("tp sizes that work for this model: 1, 2, 4, 8, 16, 32"), std::string::npos) << bad.err;
  }
  // Llama-3.1 at tp 16: 8 KV heads, each on 2 ranks.
  const Result r16 = run(1, "info --model " + quote((test::shared_dir() / "models/cards/llama-3.1-8b-instruct").string()) +
                                " --tp 16");
  EXPECT_NE(r16.out.find("each KV head on 2 ranks"), std::string::npos) << r16.out;
  // With a checkpoint, the headers are checked too.
  const Result s = run(1, "info --model " + quote(test::stories_dir().string()) + " --tp 2");
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_NE(s.out.find("47 F32; all names and shapes match"), std::string::npos) << s.out;
}

TEST_F(Cli, MissingModelDirectory) {
  expect_clean_failure("--model " + quote((tmp_ / "nope").string()) + " --prompt hi", "nope");
}

TEST_F(Cli, ARankThatDiesEndsTheJob) {
  // Rank 1 is killed one second into a long batch; mpirun must end the job quickly.
  const fs::path in = tmp_ / "many.jsonl", output = tmp_ / "out.jsonl";
  {
    std::ofstream f(in);
    for (int i = 0; i < 3000; ++i) f << "{\"prompt\": \"Once upon a time\"}\n";
  }
  const std::string wrapper =
      "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then \"$0\" \"$@\" & p=$!; sleep 1; kill -9 $p; wait $p; "
      "exit 137; else exec \"$0\" \"$@\"; fi'";
  const Result r = run(2, "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                              " --max-new-tokens 200 --output " + quote(output.string()),
                       wrapper);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out";
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_FALSE(fs::exists(output));
}

}  // namespace
}  // namespace linnet
