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
#include <regex>
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

// Started without mpirun on a machine with no ssh / rsh (many containers; simulated by
// pointing Open MPI's rsh agent at nothing): MPI_Init of a singleton still succeeds.
TEST_F(Cli, SingletonStartsWithoutSshOrRsh) {
  const Result r = test::run_direct("--version", tmp_ / "err.txt", "OMPI_MCA_plm_rsh_agent=does-not-exist");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("linnet-tp ", 0), 0u) << r.out;
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

// Issue 26, item 1: the rows drawn from the vocab shards' candidates (top-k, top-p /
// min-p over the whole vocabulary, greedy, logprobs) and those that need their whole
// row (a temperature with no cut) write the same file, logprobs included, as every row
// drawn from the gathered logits (LINNET_SHARD_SAMPLING=0), batched, at tp 1, 2 and 4,
// penalties on a nucleus row and on a whole-row one.
TEST_F(Cli, ShardSamplingWritesWhatTheFullLogitsPathWrites) {
  const fs::path in = tmp_ / "prompts.jsonl";
  {
    std::ofstream f(in);
    f << R"({"prompt": "Once upon a time", "temperature": 1.3, "top_k": 0, "top_p": 0.9, "top_logprobs": 3})" "\n"
      << R"({"prompt": "Lily and Ben", "temperature": 2.0, "top_k": 0, "min_p": 0.05, "repetition_penalty": 1.3})" "\n"
      << R"({"prompt": "The cat", "temperature": 1.0, "top_k": 0, "logprobs": true})" "\n"
      << R"({"prompt": "The dog", "temperature": 1.0, "top_k": 0, "presence_penalty": 0.6})" "\n"
      << R"({"prompt": "Sue", "temperature": 1.0, "top_k": 0, "top_p": 0.9, "top_logprobs": 1})" "\n"
      << R"({"prompt": "Tom had a red ball", "temperature": 0, "top_logprobs": 5})" "\n"
      << R"({"prompt": "One day", "temperature": 1.2, "top_k": 20, "top_logprobs": 2})" "\n";
  }
  for (const int tp : {1, 2, 4}) {  // the logits differ across tp in the last bits: compare within one
    std::string outputs[2];
    for (int k = 0; k < 2; ++k) {
      const fs::path out = tmp_ / ("out" + std::to_string(tp) + std::to_string(k) + ".jsonl");
      const Result r = run(tp, "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                                   " --output " + quote(out.string()) + " --max-new-tokens 30 --seed 3 --max-batch 7",
                           k == 0 ? "env LINNET_SHARD_SAMPLING=0" : "");
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_NE(r.err.find("requests: 7 (0 failed)"), std::string::npos) << r.err;
      outputs[k] = slurp(out);
    }
    EXPECT_EQ(outputs[0], outputs[1]) << "tp " << tp;
    EXPECT_NE(outputs[1].find("\"top_logprobs\""), std::string::npos) << outputs[1];
  }
}

// Issue 27: --speculative-config with prompt lookup writes what plain decoding writes
// (greedy and sampled, logprobs included), at tp 1 and 2, for --input (batched) and
// --prompt, and says how many guesses it made and kept.
TEST_F(Cli, SpeculativeDecodingWritesWhatPlainDecodingWrites) {
  const fs::path in = tmp_ / "prompts.jsonl";
  {
    std::ofstream f(in);
    f << R"({"prompt": "Once upon a time, there was a little girl named Lily. She loved to play. Once upon a time"})" "\n"
      << R"({"prompt": "Lily and Ben", "top_logprobs": 2})" "\n"
      << R"({"prompt": "The cat sat. The cat sat. The cat", "max_new_tokens": 7})" "\n"
      << R"({"prompt": "Tom and Tom and Tom", "temperature": 0.9, "seed": 4, "top_logprobs": 1})" "\n";
  }
  const std::string spec = R"( --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}')";
  for (const int tp : {1, 2}) {
    std::string outputs[2];
    for (int k = 0; k < 2; ++k) {
      const fs::path out = tmp_ / ("out" + std::to_string(tp) + std::to_string(k) + ".jsonl");
      const Result r = run(tp, "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                                   " --output " + quote(out.string()) + " --max-new-tokens 60 --temperature 0" +
                                   (k == 1 ? spec : ""));
      ASSERT_EQ(r.code, 0) << r.err;
      outputs[k] = slurp(out);
      const std::regex stats(R"(speculation \(ngram, k 4\): (\d+) guesses, (\d+) accepted)");
      std::smatch m;
      if (k == 1) {
        ASSERT_TRUE(std::regex_search(r.err, m, stats)) << r.err;
        EXPECT_GT(std::stoll(m[2].str()), 0) << r.err;
      } else {
        EXPECT_EQ(r.err.find("speculation"), std::string::npos) << r.err;
      }
    }
    EXPECT_EQ(outputs[0], outputs[1]) << "tp " << tp;
    std::string printed[2], lines[2];
    for (int k = 0; k < 2; ++k) {
      const fs::path line = tmp_ / ("prompt" + std::to_string(k) + ".jsonl");
      const Result r = run(tp, "--model " + quote(test::stories_dir().string()) +
                                   " --prompt 'Once upon a time, there was a little girl. Once upon a time' "
                                   "--max-new-tokens 40 --temperature 0 --top-logprobs 2 --output " +
                                   quote(line.string()) + (k == 1 ? spec : ""));
      ASSERT_EQ(r.code, 0) << r.err;
      printed[k] = r.out;
      lines[k] = slurp(line);
      if (k == 1) {
        EXPECT_NE(r.err.find("speculation (ngram, k 4)"), std::string::npos) << r.err;
      }
    }
    EXPECT_EQ(printed[0], printed[1]) << "tp " << tp;
    EXPECT_EQ(lines[0], lines[1]) << "tp " << tp;  // logprobs included
    EXPECT_NE(lines[0].find("\"top_logprobs\""), std::string::npos) << lines[0];
  }
  const Result bad = run(1, "--model " + quote(test::stories_dir().string()) +
                                " --prompt hi --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"n\": 1}'");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--speculative-config: unknown key"), std::string::npos) << bad.err;
}

// Issue 27's draft model: an early-exit draft of stories260k (a copy whose config.json
// keeps its first 4 of 5 layers; the fifth's tensors go unused) gives what plain
// decoding gives, --input and --prompt, tp 1 and 2; a draft whose tokenizer maps an id
// to another token, or a folder that is not there, fails every rank with the reason.
TEST_F(Cli, DraftModelWritesWhatPlainDecodingWrites) {
  const fs::path draft = copy_model();
  auto config = test::read_json(draft / "config.json");
  config["num_hidden_layers"] = 4;
  std::ofstream(draft / "config.json") << config.dump();
  const fs::path in = tmp_ / "prompts.jsonl";
  {
    std::ofstream f(in);
    f << R"({"prompt": "Once upon a time, there was a little girl named Lily."})" "\n"
      << R"({"prompt": "Lily and Ben", "top_logprobs": 2})" "\n"
      << R"({"prompt": "Tom had a red ball", "temperature": 0.9, "seed": 4, "top_logprobs": 1})" "\n";
  }
  const std::string model = "--model " + quote(test::stories_dir().string());
  // --speculative-config with the draft in `dir` (k 3), and `quantization` when given.
  const auto draft_config = [](const fs::path& dir, const std::string& quantization = "") {
    nlohmann::json c = {{"method", "draft_model"}, {"model", dir.string()}, {"num_speculative_tokens", 3}};
    if (!quantization.empty()) c["quantization"] = quantization;
    return " --speculative-config " + quote(c.dump());
  };
  const std::string spec = draft_config(draft);
  for (const int tp : {1, 2}) {
    std::string outputs[2], printed[2];
    for (int k = 0; k < 2; ++k) {
      const fs::path out = tmp_ / ("out" + std::to_string(tp) + std::to_string(k) + ".jsonl");
      const Result r = run(tp, model + " --input " + quote(in.string()) + " --output " + quote(out.string()) +
                                   " --max-new-tokens 50 --temperature 0" + (k == 1 ? spec : ""));
      ASSERT_EQ(r.code, 0) << r.err;
      outputs[k] = slurp(out);
      const Result p = run(tp, model + " --prompt 'Once upon a time' --max-new-tokens 40 --temperature 0" +
                                   (k == 1 ? spec : ""));
      ASSERT_EQ(p.code, 0) << p.err;
      printed[k] = p.out;
      if (k == 1) {
        const std::regex stats(R"(speculation \(draft_model, k 3\): (\d+) guesses, (\d+) accepted)");
        std::smatch m;
        ASSERT_TRUE(std::regex_search(r.err, m, stats)) << r.err;
        EXPECT_GT(std::stoll(m[2].str()), 0) << r.err;
        EXPECT_NE(r.err.find("draft model " + draft.string() + ": 4 layers"), std::string::npos) << r.err;
      }
    }
    EXPECT_EQ(outputs[0], outputs[1]) << "tp " << tp;
    EXPECT_EQ(printed[0], printed[1]) << "tp " << tp;
    if (tp == 1) {  // the draft held in bf16 (a CPU backend of its own): the same output
      const fs::path out = tmp_ / "out_bf16.jsonl";
      const Result r = run(tp, model + " --input " + quote(in.string()) + " --output " + quote(out.string()) +
                                   " --max-new-tokens 50 --temperature 0" + draft_config(draft, "bf16"));
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_NE(r.err.find(" (bf16), KV cache"), std::string::npos) << r.err;
      EXPECT_EQ(slurp(out), outputs[0]);
    }
  }
  // Another tokenizer: two ids' tokens swapped.
  const fs::path other = tmp_ / "other";
  fs::copy(draft, other);
  auto tokenizer = test::read_json(other / "tokenizer.json");
  auto& vocab = tokenizer["model"]["vocab"];
  std::string a, b;
  for (const auto& [token, id] : vocab.items()) {
    if (id == 300) a = token;
    if (id == 301) b = token;
  }
  vocab[a] = 301, vocab[b] = 300;
  std::ofstream(other / "tokenizer.json") << tokenizer.dump();
  expect_clean_failure(model + " --prompt hi" + draft_config(other),
                       "tokenizer.json id 300: the draft model's tokenizer differs from the target's");
  expect_clean_failure(model + " --prompt hi" + draft_config(tmp_ / "absent"),
                       "--speculative-config key \"model\" (the draft model)");
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
           {"--min-p 1.5", "--min-p"},
           {"--repetition-penalty 0", "--repetition-penalty"},
           {"--top-logprobs 21", "--top-logprobs"},
           {"--tp 0", "--tp"},
           // Issue 14: values cxxopts cannot convert name the option and the value.
           {"--seed -1", "--seed: invalid value (expected an integer in [0, 2^64-1], got '-1')"},
           {"--temperature nan", "--temperature: invalid value (expected a finite number, got 'nan')"},
           {"--max-new-tokens 1e12", "--max-new-tokens: invalid value"},
           {"--stop-token-ids a,b", "--stop-token-ids: invalid value"},
           {"--threads 2147483648", "--threads: invalid value (expected an integer in [1, 4096], got 2147483648)"},
           {"--kv-cache-tokens 4611686018427387904", "--kv-cache-tokens: invalid value"},
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

// A pre-quantized checkpoint: info names its scheme, counts its packed tensors and the
// tp sizes whose slices hold whole groups; at another tp size, and with --weight-dtype
// int4, it refuses naming the flag (exit 1: valid flags that do not fit this model).
TEST_F(Cli, InfoAndTheFlagsOfAPreQuantizedCheckpoint) {
  const std::string ct = quote((test::test_data_dir() / "fixtures" / "llama31" / "ct_w4a16").string());
  const Result r = run(1, "info --model " + ct + " --tp 2");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* part : {"layers quantized: compressed-tensors pack-quantized int4, groups of 4, symmetric",
                           "7 F32, 14 int4 (packed I32); all names and shapes match", "tp sizes that work: 1, 2, 4)",
                           "weights(int4+f32)"}) {
    EXPECT_NE(r.out.find(part), std::string::npos) << part << " in:\n" << r.out;
  }
  const Result tp8 = run(1, "info --model " + ct + " --tp 8");
  EXPECT_EQ(tp8.code, 1);
  EXPECT_NE(tp8.err.find("--tp: compressed-tensors pack-quantized int4, groups of 4, symmetric: a rank's slice would "
                         "split a quantization group: down_proj (this rank's intermediate slice) is 14 wide at tp 8"),
            std::string::npos)
      << tp8.err;
  EXPECT_NE(tp8.err.find("(expected one of 1, 2, 4, got 8)"), std::string::npos) << tp8.err;
  const Result int4 = run(1, "info --model " + ct + " --weight-dtype int4");
  EXPECT_EQ(int4.code, 1);
  EXPECT_NE(int4.err.find("--weight-dtype: the checkpoint is quantized already (compressed-tensors pack-quantized int4"),
            std::string::npos)
      << int4.err;
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

// The JSON lines of an --output file.
std::vector<nlohmann::json> output_lines(const fs::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// 64 varied prompts: story openings cut after 1 to 9 words, in a varied order.
void write_64_prompts(const fs::path& in) {
  const std::vector<std::string> words = {"Once", "upon", "a", "time,", "there", "was", "a", "little", "dog"};
  const std::vector<std::string> starts = {"", "Lily and Ben ", "The sun was hot. ", "Tom had a red ball. "};
  std::ofstream f(in);
  for (int i = 0; i < 64; ++i) {
    std::string p = starts[static_cast<size_t>(i % 4)];
    for (int w = 0; w < 1 + (i * 5) % 9; ++w) p += (w ? " " : "") + words[static_cast<size_t>(w)];
    f << nlohmann::json{{"prompt", p}}.dump() << "\n";
  }
}

// Acceptance 1 at the command line: with world = D x T, the D data-parallel groups split
// the prompts, and every output equals the prompt generated alone (one row at a time
// on one rank, and a --prompt run for a few).
TEST_F(Cli, DataParallelGroupsMatchEachPromptAlone) {
  const fs::path in = tmp_ / "prompts.jsonl";
  write_64_prompts(in);
  const std::string common = "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                             " --max-new-tokens 12 --temperature 0 --output ";
  const fs::path alone = tmp_ / "alone.jsonl";
  const Result a = run(1, common + quote(alone.string()) + " --max-batch 1");
  ASSERT_EQ(a.code, 0) << a.err;
  const auto expected = output_lines(alone);
  ASSERT_EQ(expected.size(), 64u);
  for (const auto& [np, tp] : std::vector<std::pair<int, int>>{{2, 1}, {4, 2}}) {
    const fs::path out = tmp_ / ("np" + std::to_string(np) + ".jsonl");
    const Result r = run(np, common + quote(out.string()) + " --tp " + std::to_string(tp) + " --max-batch 8");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("requests: 64 (0 failed), dp groups: 2 x tp " + std::to_string(tp)), std::string::npos)
        << r.err;
    const auto got = output_lines(out);
    ASSERT_EQ(got.size(), 64u);
    for (size_t i = 0; i < 64; ++i) {
      EXPECT_EQ(got[i]["index"], i);
      EXPECT_EQ(got[i]["completion_ids"], expected[i]["completion_ids"]) << "prompt " << i << " at -np " << np;
      EXPECT_EQ(got[i]["completion"], expected[i]["completion"]) << "prompt " << i;
      EXPECT_EQ(got[i]["finish_reason"], expected[i]["finish_reason"]) << "prompt " << i;
    }
    // stdout: the completions, in input order.
    std::string lines;
    for (const auto& e : expected) lines += e["completion"].get<std::string>() + "\n";
    EXPECT_EQ(r.out, lines);
  }
  for (size_t i : {5u, 42u}) {
    const Result p = run(1, "--model " + quote(test::stories_dir().string()) + " --prompt " +
                                quote(expected[i]["prompt"].get<std::string>()) + " --max-new-tokens 12 --temperature 0");
    ASSERT_EQ(p.code, 0) << p.err;
    EXPECT_EQ(p.out, expected[i]["completion"].get<std::string>() + "\n") << "prompt " << i;
  }
}

// Prompts sharing a 2-page prefix reuse its KV pages (the stats line counts the tokens
// not recomputed), and the completions equal a run that computes every prompt in full,
// and a run whose small pool (4 pages) holds only two requests at a time.
TEST_F(Cli, SharedPromptPrefixesReuseKvPages) {
  const fs::path in = tmp_ / "prompts.jsonl";
  {
    std::ofstream f(in);
    const std::string base =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day, she saw a big red ball under a tree. She ran to get it, but a small dog got there "
        "first. The dog wagged its tail and looked at Lily. Lily smiled and said, let us play together. They "
        "played all day until the sun went down.";
    const std::vector<std::string> tails = {" Then", " The dog", " Lily said", " Mom came", " One more"};
    for (int i = 0; i < 16; ++i) f << nlohmann::json{{"prompt", base + tails[i % 5] + " " + std::to_string(i)}}.dump() << "\n";
  }
  const std::string common = "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                             " --max-new-tokens 16 --temperature 0 --max-seq-len 256 --max-batch 4 --output ";
  const fs::path shared = tmp_ / "shared.jsonl", full = tmp_ / "full.jsonl", tight = tmp_ / "tight.jsonl";
  const Result a = run(2, common + quote(shared.string()));
  ASSERT_EQ(a.code, 0) << a.err;
  const Result b = run(2, common + quote(full.string()) + " --no-prefix-caching");
  ASSERT_EQ(b.code, 0) << b.err;
  const Result c = run(2, common + quote(tight.string()) + " --kv-cache-tokens 512");
  ASSERT_EQ(c.code, 0) << c.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(a.err, m, std::regex("prefix cache hits: (\\d+) tokens"))) << a.err;
  EXPECT_GE(std::stoll(m[1]), 12 * 128) << "the 12 prompts after the first 4 share 2 pages each";
  EXPECT_NE(b.err.find("prefix cache hits: 0 tokens"), std::string::npos) << b.err;
  EXPECT_NE(c.err.find("of 8 (64 positions each)"), std::string::npos) << c.err;
  const auto want = output_lines(full);
  ASSERT_EQ(want.size(), 16u);
  for (const fs::path& p : {shared, tight}) {
    const auto got = output_lines(p);
    ASSERT_EQ(got.size(), 16u);
    for (size_t i = 0; i < 16; ++i) EXPECT_EQ(got[i]["completion_ids"], want[i]["completion_ids"]) << p << " " << i;
  }
  // A pool smaller than one request of --max-seq-len could never run.
  expect_clean_failure(common.substr(0, common.size() - std::string(" --output ").size()) + " --kv-cache-tokens 100",
                       "--kv-cache-tokens: the KV pool holds fewer positions than one request of --max-seq-len");
}

TEST_F(Cli, PerLineKeysOverrideTheFlags) {
  // Greedy from "Once upon a time": ", there was a little girl named Lily. She loved to
  // play outside in the park." (llama2.c's documented story; token 426 is ".").
  const fs::path in = tmp_ / "in.jsonl", out = tmp_ / "out.jsonl";
  {
    std::ofstream f(in);
    f << R"({"prompt": "Once upon a time"})" << "\n";
    f << R"({"prompt": "Once upon a time", "max_new_tokens": 3})" << "\n";
    f << R"({"prompt": "Once upon a time", "stop": ["Lily", "park"]})" << "\n";
    f << R"({"prompt": "Once upon a time", "stop": "nowhere", "stop_token_ids": [426]})" << "\n";
    f << R"({"prompt": "Once upon a time", "top_logprobs": 2, "max_new_tokens": 4})" << "\n";
    f << R"({"prompt": "Once upon a time", "temperature": 1.0, "seed": 11})" << "\n";
    f << R"({"prompt": "Once upon a time", "repetition_penalty": 1.6, "max_new_tokens": 40})" << "\n";
    f << R"({"prompt": "Once upon a time", "max_new_tokens": 40})" << "\n";
  }
  const Result r = run(2, "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                              " --output " + quote(out.string()) + " --max-new-tokens 20 --temperature 0 --seed 5");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto l = output_lines(out);
  ASSERT_EQ(l.size(), 8u);
  for (size_t i = 0; i < l.size(); ++i) {
    EXPECT_EQ(l[i]["index"], i);
    EXPECT_EQ(l[i]["prompt_tokens"], l[i]["prompt_ids"].size());
    EXPECT_EQ(l[i]["completion_tokens"], l[i]["completion_ids"].size());
    EXPECT_EQ(l[i].contains("logprobs"), i == 4) << i;
  }
  // 20 greedy tokens: a prefix of llama2.c's documented story.
  EXPECT_EQ(std::string(kLlama2cText).rfind("Once upon a time" + l[0]["completion"].get<std::string>(), 0), 0u)
      << l[0]["completion"];
  EXPECT_EQ(l[0]["completion_ids"].size(), 20u);
  EXPECT_EQ(l[0]["finish_reason"], "length");
  EXPECT_EQ(l[1]["completion_ids"].size(), 3u);
  EXPECT_EQ(l[2]["completion"], ", there was a little girl named ");  // cut before the stop string
  EXPECT_EQ(l[2]["finish_reason"], "stop");
  EXPECT_EQ(l[3]["completion"], ", there was a little girl named Lily.");
  EXPECT_EQ(l[3]["completion_ids"].back(), 426);
  EXPECT_EQ(l[3]["finish_reason"], "stop");
  const auto& lp = l[4]["logprobs"];
  ASSERT_EQ(lp.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(lp[k]["id"], l[4]["completion_ids"][k]);
    ASSERT_EQ(lp[k]["top_logprobs"].size(), 2u);
    EXPECT_EQ(lp[k]["top_logprobs"][0]["id"], lp[k]["id"]);  // greedy: the most probable
    EXPECT_LE(lp[k]["logprob"].get<double>(), 0.0);
    EXPECT_GE(lp[k]["top_logprobs"][0]["logprob"].get<double>(), lp[k]["top_logprobs"][1]["logprob"].get<double>());
  }
  EXPECT_NE(l[5]["completion_ids"], l[0]["completion_ids"]);  // sampled with its own seed
  EXPECT_NE(l[6]["completion_ids"], l[7]["completion_ids"]) << "the penalty should change the greedy story";
  // A --prompt run stops at a stop string too.
  const Result p = run(2, "--model " + quote(test::stories_dir().string()) +
                              " --prompt 'Once upon a time' --stop park --max-new-tokens 60 --temperature 0");
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_EQ(p.out, ", there was a little girl named Lily. She loved to play outside in the \n");
  EXPECT_NE(p.err.find("finish: stop"), std::string::npos) << p.err;
  EXPECT_NE(r.err.find("time to first token p50/p90/p99: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("inter-token latency p50/p90/p99: "), std::string::npos) << r.err;
}

TEST_F(Cli, BadPerLineValuesNameTheLineAndKey) {
  const fs::path in = tmp_ / "in.jsonl";
  for (const auto& [line, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "hi", "top_p": 1.5})", "top_p"},
           {R"({"prompt": "hi", "stop_token_ids": [100000]})", "stop_token_ids"},
           {R"({"prompt": "hi", "min_p": "x"})", "min_p"}}) {
    std::ofstream(in) << R"({"prompt": "fine"})" << "\n\n" << line << "\n";
    // The bad line fails alone (exit 3), its output line says why; the good one runs.
    const Result r = run(2, "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                                " --max-new-tokens 4 --output " + quote((tmp_ / "out.jsonl").string()));
    EXPECT_EQ(r.code, 3) << r.err;
    std::ifstream out(tmp_ / "out.jsonl");
    std::string first, second;
    std::getline(out, first);
    std::getline(out, second);
    EXPECT_EQ(nlohmann::json::parse(first)["finish_reason"], "length") << first;
    const nlohmann::json bad = nlohmann::json::parse(second);
    EXPECT_EQ(bad["finish_reason"], "error") << second;
    EXPECT_EQ(bad["error"].get<std::string>().rfind(in.string() + ":3: key \"" + key + "\"", 0), 0u) << second;
  }
  // A bad line of JSON, and a chat line its template refuses, fail alone too.
  std::ofstream(in) << R"({"prompt": "fine"})" << "\n" << R"({"prompt": )" << "\n"
                    << R"({"messages": [{"role": "user", "content": "hi"}]})" << "\n";
  const Result r = run(2, "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                              " --max-new-tokens 4 --output " + quote((tmp_ / "out.jsonl").string()));
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("requests: 3 (2 failed)"), std::string::npos) << r.err;
  // The flag's own value fails the run, naming the flag.
  fs::remove(tmp_ / "out.jsonl");
  fs::remove(tmp_ / "out.jsonl.run.json");  // the finished runs' record (driver/journal.h)
  expect_clean_failure("--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                           " --stop-token-ids 100000",
                       "--stop-token-ids");
}

TEST_F(Cli, ResumeRunsOnlyTheMissingLines) {
  const fs::path in = tmp_ / "in.jsonl", out = tmp_ / "out.jsonl";
  {
    std::ofstream f(in);
    for (const char* p : {"Once upon a time", "Lily and Ben", "The cat", "Tom had a red ball", "One day", "The sun"}) {
      f << nlohmann::json{{"prompt", p}}.dump() << "\n";
    }
  }
  const std::string args = "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                           " --output " + quote(out.string()) + " --max-new-tokens 10 --temperature 0.8 --seed 9";
  const Result full = run(2, args);
  ASSERT_EQ(full.code, 0) << full.err;
  std::vector<std::string> lines;
  {
    std::ifstream f(out);
    for (std::string l; std::getline(f, l);) lines.push_back(l);
  }
  ASSERT_EQ(lines.size(), 6u);
  // Keep lines 4, 0 and 2 (out of order); mark them so a regenerated line would show: a
  // space after each key (the same values, so they pass the kept-line checks; a kept line
  // is copied as it is, a regenerated one would be compact).
  auto marked = [](const std::string& l) {
    std::string out;
    for (size_t i = 0; i < l.size(); ++i) {
      out += l[i];
      if (l[i] == ':' && i > 0 && l[i - 1] == '"') out += ' ';
    }
    return out;
  };
  const std::string kept[3] = {marked(lines[4]), marked(lines[0]), marked(lines[2])};
  std::ofstream(out) << kept[0] << "\n" << kept[1] << "\n" << kept[2] << "\n";
  const Result r = run(2, args + " --resume --tp 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("requests: 3 (0 failed), 3 kept from --output"), std::string::npos) << r.err;
  std::vector<std::string> now;
  {
    std::ifstream f(out);
    for (std::string l; std::getline(f, l);) now.push_back(l);
  }
  ASSERT_EQ(now.size(), 6u);
  EXPECT_EQ(now[0], kept[1]);
  EXPECT_EQ(now[2], kept[2]);
  EXPECT_EQ(now[4], kept[0]);
  for (size_t i : {1u, 3u, 5u}) EXPECT_EQ(now[i], lines[i]) << "line " << i << " (same seed: same tokens)";
  // Nothing left to do: no generation, the file stays as it is.
  const Result again = run(1, args + " --resume");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("requests: 0 (0 failed), 6 kept from --output"), std::string::npos) << again.err;
  EXPECT_EQ(slurp(out), kept[1] + "\n" + lines[1] + "\n" + kept[2] + "\n" + lines[3] + "\n" + kept[0] + "\n" +
                            lines[5] + "\n");
  // An output of another input is refused, naming the line, and left as it is.
  const std::string other = R"({"index":1,"prompt":"something else","completion":""})" "\n";
  std::ofstream(out) << other;
  const Result bad = run(2, args + " --resume");
  EXPECT_EQ(bad.code, 1) << bad.err;
  EXPECT_NE(bad.err.find("its prompt differs from " + in.string() + ":2"), std::string::npos) << bad.err;
  EXPECT_EQ(slurp(out), other);
  // A kept line without its completion is refused too (it would be copied as it is).
  nlohmann::json cut = nlohmann::json::parse(kept[0]);
  cut.erase("completion");
  std::ofstream(out) << cut.dump() << "\n";
  const Result partial = run(1, args + " --resume");
  EXPECT_EQ(partial.code, 1) << partial.err;
  EXPECT_NE(partial.err.find("a kept line needs a string \"completion\""), std::string::npos) << partial.err;
}

TEST_F(Cli, SigtermOnOneRankStopsEveryRankAndKeepsFinishedRequests) {
  // Rank 1 (dp group 1 of 2) gets SIGTERM two seconds into a batch of ~10 minutes'
  // work: every rank stops at its next step, rank 0 writes the finished requests and
  // every rank exits non-zero.
  const fs::path in = tmp_ / "many.jsonl", output = tmp_ / "out.jsonl";
  {
    std::ofstream f(in);
    for (int i = 0; i < 20000; ++i) f << "{\"prompt\": \"Once upon a time\"}\n";
  }
  const std::string wrapper =
      "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then \"$0\" \"$@\" & p=$!; sleep 2; kill -TERM $p; wait $p; "
      "exit $?; else exec \"$0\" \"$@\"; fi'";
  const Result r = run(2, "--model " + quote(test::stories_dir().string()) + " --input " + quote(in.string()) +
                              " --tp 1 --max-new-tokens 200 --output " + quote(output.string()),
                       wrapper);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out";
  EXPECT_LT(r.seconds, 30.0);
  const size_t at = r.err.find("interrupted: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const size_t done = std::stoul(r.err.substr(at + 13));
  EXPECT_NE(r.err.find(" of 20000 requests done (kept in --output and in the journal " + (tmp_ / "out.jsonl.journal").string() +
                       "); rerun with --resume"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.code, 130) << "every rank exits 130, and mpirun reports it";
  EXPECT_EQ(r.out, "");
  ASSERT_TRUE(fs::exists(output));
  const auto lines = output_lines(output);
  EXPECT_EQ(lines.size(), done);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(lines[i - 1]["index"].get<int64_t>(), lines[i]["index"].get<int64_t>());
    }
    EXPECT_TRUE(lines[i]["finish_reason"] == "stop" || lines[i]["finish_reason"] == "length");
  }
  for (const auto& e : fs::directory_iterator(tmp_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

TEST_F(Cli, NonFiniteLogitsFailOnlyThatRequest) {
  const fs::path in = tmp_ / "in.jsonl";
  std::ofstream(in) << R"({"prompt": "Lily and Ben"})" << "\n"
                    << R"({"prompt": "Once upon a time"})" << "\n"
                    << R"({"prompt": "The cat"})" << "\n";
  const std::string args = " --input " + quote(in.string()) + " --max-new-tokens 12 --temperature 0 --output ";
  const Result clean = run(1, "--model " + quote(test::stories_dir().string()) + args + quote((tmp_ / "a.jsonl").string()));
  ASSERT_EQ(clean.code, 0) << clean.err;
  const auto expected = output_lines(tmp_ / "a.jsonl");
  // NaN in the embedding row of "upon" (id 407): only the prompt holding it sees NaN
  // logits. stories260k ties lm_head to the embedding, so the copy gets an untied
  // lm_head.weight (the clean embedding, in a third shard): the other prompts' logits
  // stay exactly as before.
  constexpr int kPoisoned = 407;
  ASSERT_NE(std::find(expected[1]["prompt_ids"].begin(), expected[1]["prompt_ids"].end(), kPoisoned),
            expected[1]["prompt_ids"].end());
  for (size_t i : {0u, 2u}) {
    for (const auto& id : expected[i]["completion_ids"]) ASSERT_NE(id, kPoisoned) << "precondition";
    for (const auto& id : expected[i]["prompt_ids"]) ASSERT_NE(id, kPoisoned) << "precondition";
  }
  const fs::path model = model_with_nan_embedding_row(kPoisoned);
  for (int np : {1, 2}) {
    const fs::path out = tmp_ / ("nan" + std::to_string(np) + ".jsonl");
    const Result r = run(np, "--model " + quote(model.string()) + args + quote(out.string()));
    // Issue 14: the output is complete, the failure marked, and the exit code says so.
    ASSERT_EQ(r.code, 3) << r.err;
    EXPECT_NE(r.err.find("requests: 3 (1 failed)"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(in.string() + ":2: "), std::string::npos) << r.err;
    const auto got = output_lines(out);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[1]["finish_reason"], "error");
    EXPECT_NE(got[1]["error"].get<std::string>().find("non-finite logits"), std::string::npos) << got[1];
    EXPECT_TRUE(got[1]["completion_ids"].empty()) << "never a silent token";
    for (size_t i : {0u, 2u}) EXPECT_EQ(got[i], expected[i]) << "prompt " << i;
  }
  // A run whose only request fails exits 3 on every rank (it exited 0).
  const Result single =
      run(2, "--model " + quote(model.string()) + " --prompt 'Once upon a time' --max-new-tokens 4 --temperature 0");
  EXPECT_EQ(single.code, 3) << single.err;
  EXPECT_NE(single.err.find("non-finite logits"), std::string::npos) << single.err;
}

// Issue 14: max_new_tokens up to INT64_MAX (a flag or a line's key) is capped at what
// the context leaves, as vLLM ends a sequence at max_model_len; prompt + max_new_tokens
// overflowed and MPI_Aborted the run, losing the valid lines.
TEST_F(Cli, HugeMaxNewTokensIsCappedAtTheContext) {
  const fs::path in = tmp_ / "in.jsonl", out = tmp_ / "out.jsonl";
  std::ofstream(in) << R"({"prompt": "Once upon a time", "max_new_tokens": 9223372036854775807})" << "\n"
                    << R"({"prompt": "The cat", "max_new_tokens": 3})" << "\n";
  const std::string model = "--model " + quote(test::stories_dir().string());
  const Result r = run(2, model + " --input " + quote(in.string()) + " --max-seq-len 48 --temperature 0 --output " +
                              quote(out.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto got = output_lines(out);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0]["finish_reason"], "length") << got[0];
  EXPECT_EQ(got[0]["prompt_tokens"].get<int64_t>() + got[0]["completion_tokens"].get<int64_t>(), 48) << got[0];
  EXPECT_EQ(got[1]["completion_tokens"], 3) << got[1];
  const Result flag = run(2, model + " --prompt 'Once upon a time' --max-seq-len 48 --temperature 0 "
                                     "--max-new-tokens 9223372036854775807");
  ASSERT_EQ(flag.code, 0) << flag.err;
  EXPECT_NE(flag.err.find("finish: length"), std::string::npos) << flag.err;
}

// Issue 14: a huge --kv-cache-tokens is refused by the memory preflight with the numbers
// (its size wrapped to "0.00 MiB", then the allocation segfaulted or threw bad_alloc).
TEST_F(Cli, HugeKvCachePoolIsRefusedByTheMemoryPreflight) {
  const std::string model = "--model " + quote(test::stories_dir().string()) + " --prompt hi --kv-cache-tokens ";
  const Result flag = run(2, model + "18014398509481984");  // 2^54: over the flag's range
  EXPECT_EQ(flag.code, 2) << flag.err;
  EXPECT_NE(flag.err.find("--kv-cache-tokens: invalid value (expected an integer in [1, 281474976710656]"),
            std::string::npos)
      << flag.err;
  const Result r = run(2, model + "281474976710656");  // 2^48: in range, but no memory holds it
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("memory preflight: not enough memory for this rank: it needs 167772160.00 GiB"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("KV cache 167772160.00 GiB) but has"), std::string::npos) << r.err;
}

// Issue 14: a prompt is refused by its byte length before it is tokenized (a 50 MB line
// was tokenized whole on every rank first), and a line over 64 MiB is never held whole;
// in --input each fails alone, the other lines complete, and the exit code is 3.
TEST_F(Cli, OverlongPromptsFailAloneBeforeTokenizing) {
  const std::string model = "--model " + quote(test::stories_dir().string());
  // --prompt: more than --max-seq-len x 64 bytes.
  const Result one = run(2, model + " --prompt " + std::string(2000, 'a') + " --max-seq-len 16");
  EXPECT_EQ(one.code, 1) << one.err;
  EXPECT_NE(one.err.find("--prompt: the prompt has 2000 bytes, more than --max-seq-len = 16 tokens can hold"),
            std::string::npos)
      << one.err;
  const fs::path in = tmp_ / "in.jsonl", out = tmp_ / "out.jsonl";
  {
    std::ofstream f(in, std::ios::binary);
    f << R"({"prompt": "Once upon a time"})" << "\n"
      << R"({"prompt": ")" << std::string(4 << 20, 'a') << "\"}\n"
      << R"({"prompt": ")" << std::string(65 << 20, 'b') << "\"}\n"
      << R"({"prompt": "The cat"})" << "\n";
  }
  const Result r = run(2, model + " --input " + quote(in.string()) + " --max-new-tokens 4 --temperature 0 --output " +
                              quote(out.string()));
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_NE(r.err.find("requests: 4 (2 failed)"), std::string::npos) << r.err;
  const auto got = output_lines(out);
  ASSERT_EQ(got.size(), 4u);
  for (size_t i : {0u, 3u}) EXPECT_EQ(got[i]["completion_tokens"], 4) << got[i];
  EXPECT_EQ(got[1]["finish_reason"], "error");
  EXPECT_NE(got[1]["error"].get<std::string>().find("the prompt has 4194304 bytes, more than --max-seq-len = 512 "
                                                    "tokens can hold (64 bytes per token at most); it was not tokenized"),
            std::string::npos)
      << got[1]["error"];
  EXPECT_TRUE(got[1]["prompt_ids"].empty());
  EXPECT_EQ(got[2]["finish_reason"], "error");
  EXPECT_EQ(got[2]["index"], 2);
  EXPECT_NE(got[2]["error"].get<std::string>().find("the line has 68157454 bytes; an --input line may have at most "
                                                    "67108864 (64 MiB)"),
            std::string::npos)
      << got[2]["error"];
  EXPECT_NE(r.err.find(in.string() + ":3: the line has 68157454 bytes"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace linnet
