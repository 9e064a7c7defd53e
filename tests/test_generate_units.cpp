// The pieces of `linnet-tp generate` that need no model: per-line request keys over
// the command-line defaults, the --resume reader of an earlier --output file, and the
// latency percentiles of the stats line (numpy.percentile's linear rule, by hand).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "launch/cli_options.h"
#include "launch/engine_options.h"
#include "requests/request.h"
#include "requests/jsonl_input.h"
#include "driver/jsonl_output.h"
#include "requests/loss_document.h"
#include "driver/progress.h"
#include "runtime/kv_cache.h"
#include "runtime/model_loader.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

RequestSettings defaults() {
  RequestSettings d;
  d.sampling.temperature = 0.7;
  d.sampling.top_k = 40;
  d.sampling.top_p = 0.9;
  d.max_new_tokens = 64;
  d.stop = {"END"};
  d.stop_token_ids = {7};
  return d;
}

// The message of the Error that apply_request_keys throws for `line`, or "".
std::string request_keys_error(const std::string& line) {
  try {
    apply_request_keys(ordered_json::parse(line), defaults(), "in.jsonl:3");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RequestKeys, AbsentOrNullKeysKeepTheDefaults) {
  const RequestSettings s = apply_request_keys(ordered_json::parse(R"({"prompt": "x", "top_k": null, "id": 5})"),
                                               defaults(), "in.jsonl:1");
  EXPECT_EQ(s.sampling.temperature, 0.7);
  EXPECT_EQ(s.sampling.top_k, 40);
  EXPECT_EQ(s.sampling.top_p, 0.9);
  EXPECT_EQ(s.sampling.min_p, 0.0);
  EXPECT_EQ(s.sampling.repetition_penalty, 1.0);
  EXPECT_FALSE(s.seed);
  EXPECT_EQ(s.max_new_tokens, 64);
  EXPECT_EQ(s.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(s.stop_token_ids, std::vector<int64_t>{7});
  EXPECT_EQ(s.top_logprobs, -1);
}

TEST(RequestKeys, EveryKeyOverridesItsDefault) {
  const RequestSettings s = apply_request_keys(
      ordered_json::parse(R"({"prompt": "x", "temperature": 0, "top_k": 3, "top_p": 0.5, "min_p": 0.05,
        "repetition_penalty": 1.3, "seed": 18446744073709551615, "max_new_tokens": 2,
        "stop": ["a", "b,c"], "stop_token_ids": [], "top_logprobs": 4})"),
      defaults(), "in.jsonl:1");
  EXPECT_EQ(s.sampling.temperature, 0.0);
  EXPECT_EQ(s.sampling.top_k, 3);
  EXPECT_EQ(s.sampling.top_p, 0.5);
  EXPECT_EQ(s.sampling.min_p, 0.05);
  EXPECT_EQ(s.sampling.repetition_penalty, 1.3);
  EXPECT_EQ(*s.seed, 18446744073709551615ull);
  EXPECT_EQ(s.max_new_tokens, 2);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"a", "b,c"}));
  EXPECT_TRUE(s.stop_token_ids.empty());
  EXPECT_EQ(s.top_logprobs, 4);
  // A single stop string; logprobs true alone asks for no alternatives; false turns off.
  const RequestSettings t = apply_request_keys(ordered_json::parse(R"({"stop": "x", "logprobs": true})"),
                                               defaults(), "in.jsonl:1");
  EXPECT_EQ(t.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(t.top_logprobs, 0);
  RequestSettings on = defaults();
  on.top_logprobs = 5;
  EXPECT_EQ(apply_request_keys(ordered_json::parse(R"({"logprobs": false})"), on, "x").top_logprobs, -1);
}

TEST(RequestKeys, BadValuesNameTheLineAndTheKey) {
  for (const auto& [line, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"temperature": -1})", "temperature"},
           {R"({"temperature": "hot"})", "temperature"},
           {R"({"top_k": -2})", "top_k"},
           {R"({"top_k": 1.5})", "top_k"},
           {R"({"top_p": 0})", "top_p"},
           {R"({"top_p": 1.01})", "top_p"},
           {R"({"min_p": 1.5})", "min_p"},
           {R"({"min_p": -0.1})", "min_p"},
           {R"({"repetition_penalty": 0})", "repetition_penalty"},
           {R"({"repetition_penalty": -1.2})", "repetition_penalty"},
           {R"({"seed": -1})", "seed"},
           {R"({"seed": "7"})", "seed"},
           {R"({"max_new_tokens": -1})", "max_new_tokens"},
           {R"({"stop": 5})", "stop"},
           {R"({"stop": ["ok", 5]})", "stop"},
           {R"({"stop": ""})", "stop"},
           {R"({"stop_token_ids": 2})", "stop_token_ids"},
           {R"({"stop_token_ids": [2, -1]})", "stop_token_ids"},
           {R"({"logprobs": 1})", "logprobs"},
           {R"({"top_logprobs": 21})", "top_logprobs"},
           {R"({"top_logprobs": -1})", "top_logprobs"}}) {
    const std::string e = request_keys_error(line);
    EXPECT_NE(e.find("in.jsonl:3"), std::string::npos) << line << ": " << e;
    EXPECT_NE(e.find("\"" + key + "\""), std::string::npos) << line << ": " << e;
  }
}

// The message of parse_command_line's error for `args` (after "linnet-tp --model m
// --prompt hi"), "" when it parses.
std::string command_line_error(std::vector<std::string> args) {
  std::vector<std::string> words = {"linnet-tp", "--model", "m", "--prompt", "hi"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  try {
    parse_command_line(static_cast<int>(argv.size()), argv.data());
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// Issue 14: a value cxxopts cannot convert is named with its option and the value
// (cxxopts alone says "Argument 'X' failed to parse"), and NaN/inf never reach a
// floating option.
TEST(CommandLine, UnparsableValuesNameTheOptionAndTheValue) {
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--max-new-tokens", "1e12"}, "--max-new-tokens: invalid value (expected an integer"},
           {{"--temperature", "nan"}, "--temperature: invalid value (expected a finite number, got 'nan')"},
           {{"--temperature=inf"}, "--temperature: invalid value (expected a finite number, got 'inf')"},
           // operator>> would stop at the first bad character: "0.5abc" read as 0.5.
           {{"--temperature", "0.5abc"}, "--temperature: invalid value (expected a finite number, got '0.5abc')"},
           {{"--top-p=0.9x"}, "--top-p: invalid value (expected a finite number, got '0.9x')"},
           {{"--kv-cache-memory-fraction", "1e400"}, "--kv-cache-memory-fraction: invalid value (expected a finite"},
           {{"--top-p", "nan"}, "--top-p: invalid value (expected a finite number, got 'nan')"},
           {{"--min-p", "-inf"}, "--min-p: invalid value (expected a finite number, got '-inf')"},
           {{"--repetition-penalty", "NaN"}, "--repetition-penalty: invalid value (expected a finite number"},
           {{"--kv-cache-memory-fraction", "nan"}, "--kv-cache-memory-fraction: invalid value (expected a finite"},
           {{"--seed", "-1"}, "--seed: invalid value (expected an integer in [0, 2^64-1], got '-1')"},
           {{"--stop-token-ids", "a,b"}, "--stop-token-ids: invalid value (expected a comma-separated list"},
           {{"--threads", "2147483648"}, "--threads: invalid value (expected an integer in [1, 4096], got 2147483648)"},
           {{"--tp", "x"}, "--tp: invalid value (expected an integer"},
           // The range a value out of it is told, also for one that does not parse.
           {{"--comm-timeout", "nan"}, "--comm-timeout: invalid value (expected an integer in [0, 604800], got 'nan')"},
           {{"--comm-timeout", "-1"}, "--comm-timeout: invalid value (expected an integer in [0, 604800], got -1)"},
           {{"--comm-timeout", "1.5"}, "--comm-timeout: invalid value (expected an integer in [0, 604800], got '1.5')"},
           {{"--threads", "x"}, "--threads: invalid value (expected an integer in [1, 4096], got 'x')"},
           // Decimal only: cxxopts reads "0x10" as 16, strtod "0x1p-1" as 0.5.
           {{"--max-new-tokens", "0x10"}, "--max-new-tokens: invalid value (expected an integer in [-2^63, 2^63-1], in decimal, got '0x10')"},
           {{"--seed=0X10"}, "--seed: invalid value (expected an integer in [0, 2^64-1]"},
           {{"--temperature", "0x1p-1"}, "--temperature: invalid value (expected a finite number, got '0x1p-1')"},
           {{"--verbose=maybe"}, "--verbose: invalid value (expected true or false, got 'maybe')"}}) {
    const std::string e = command_line_error(args);
    EXPECT_EQ(e.rfind(message, 0), 0u) << args[0] << ": " << e;
  }
  // The option is found however the values before it are spelt.
  EXPECT_EQ(command_line_error({"--top-k", "5", "--seed=7", "--temperature", "0.5", "--seed", "x"})
                .rfind("--seed: invalid value", 0),
            0u);
  EXPECT_EQ(command_line_error({"--seed", "18446744073709551615", "--temperature", "0.5"}), "");
}

// Issue 14: every size flag has a range checked before anything multiplies it.
TEST(CommandLine, SizeFlagsOutOfRangeNameTheFlag) {
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--threads", "5000"}, "--threads: invalid value (expected an integer in [1, 4096], got 5000)"},
           {{"--kv-cache-tokens", "4611686018427387904"}, "--kv-cache-tokens: invalid value (expected an integer in [1, 281474976710656]"},
           {{"--max-batch", "100000"}, "--max-batch: invalid value (expected an integer in [1, 65536], got 100000)"},
           {{"--max-seq-len", "3000000000"}, "--max-seq-len: invalid value (expected an integer in [1, 2147483647]"}}) {
    const std::string e = command_line_error(args);
    EXPECT_EQ(e.rfind(message, 0), 0u) << args[0] << ": " << e;
  }
  EXPECT_EQ(command_line_error({"--max-new-tokens", "9223372036854775807", "--kv-cache-tokens", "281474976710656"}),
            "");
}

// Issue 27: --speculative-config takes vLLM's keys; anything else names the key.
TEST(CommandLine, SpeculativeConfigKeysAndErrors) {
  const SpeculativeConfig c = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 5})");
  EXPECT_EQ(c.method, "ngram");
  EXPECT_EQ(c.num_speculative_tokens, 5);
  EXPECT_EQ(c.prompt_lookup_min, 2);
  EXPECT_EQ(c.prompt_lookup_max, 4);
  EXPECT_EQ(c.disable_by_batch_size, 0);
  const SpeculativeConfig d = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 1, "disable_by_batch_size": 8})");
  EXPECT_EQ(d.prompt_lookup_min, 1);  // follows a smaller max
  EXPECT_EQ(d.prompt_lookup_max, 1);
  EXPECT_EQ(d.disable_by_batch_size, 8);
  const SpeculativeConfig m =
      parse_speculative_config(R"({"method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 4})");
  EXPECT_EQ(m.method, "draft_model");
  EXPECT_EQ(m.model, "/m/draft");
  EXPECT_EQ(m.num_speculative_tokens, 4);
  EXPECT_EQ(m.quantization, "");
  EXPECT_EQ(parse_speculative_config(R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 2, )"
                                     R"("quantization": "int4"})")
                .quantization,
            "int4");
  EXPECT_EQ(parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 6})")
                .prompt_lookup_max,
            6);  // follows a larger min
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"ngram", "--speculative-config: invalid value (expected a JSON object"},
           {R"({"method": "ngram", "num_speculative_tokens": 3, "lookahead": 2})",
            "--speculative-config: unknown key (expected method, num_speculative_tokens"},
           {R"({"num_speculative_tokens": 3})", "--speculative-config key \"method\": is required"},
           {R"({"method": "eagle", "num_speculative_tokens": 3})", "--speculative-config key \"method\": invalid value"},
           {R"({"method": "draft_model", "num_speculative_tokens": 3})",
            "--speculative-config key \"model\": is required with method \"draft_model\""},
           {R"({"method": "draft_model", "model": 7, "num_speculative_tokens": 3})",
            "--speculative-config key \"model\": is required with method \"draft_model\""},
           {R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 3, "quantization": "awq"})",
            "--speculative-config key \"quantization\": invalid value (expected the draft's weight dtype"},
           {R"({"method": "ngram", "num_speculative_tokens": 3, "quantization": "int4"})",
            "--speculative-config key \"quantization\": invalid key"},
           {R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 3, "prompt_lookup_max": 3})",
            "--speculative-config key \"prompt_lookup_max\": invalid key (expected only with method \"ngram\""},
           {R"({"method": "ngram"})", "--speculative-config key \"num_speculative_tokens\": is required"},
           {R"({"method": "ngram", "num_speculative_tokens": 0})",
            "--speculative-config key \"num_speculative_tokens\": invalid value (expected an integer in [1, 16], got 0)"},
           {R"({"method": "ngram", "num_speculative_tokens": 2.5})",
            "--speculative-config key \"num_speculative_tokens\": invalid value"},
           {R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3})",
            "--speculative-config key \"prompt_lookup_min\": invalid value (expected <= prompt_lookup_max (3), got 5)"},
           {R"({"method": "ngram", "num_speculative_tokens": 2, "model": "d"})",
            "--speculative-config key \"model\": invalid key"}}) {
    try {
      parse_speculative_config(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(message, 0), 0u) << text << ": " << e.what();
    }
  }
  EXPECT_EQ(command_line_error({"--speculative-config", R"({"method": "ngram", "num_speculative_tokens": 4})"}), "");
  EXPECT_NE(command_line_error({"--speculative-config", "{}"}), "");
}

// Issue 14: KV sizes saturate instead of wrapping, so the memory preflight refuses a huge
// pool with the numbers (it read as 0.00 MiB and then failed to allocate).
TEST(KvCacheSize, HugePoolsSaturateAndTheMemoryPreflightRefusesThem) {
  EXPECT_EQ(KvCache::bytes_for(2, 1, 4, 8), 2 * 2 * 1 * 4 * 8 * 4);
  EXPECT_EQ(KvCache::bytes_for(32, int64_t{1} << 54, 8, 128), INT64_MAX);
  EXPECT_EQ(KvCache::bytes_for(32, int64_t{1} << 62, 8, 128), INT64_MAX);
  const RankMemory need{1 << 20, KvCache::bytes_for(32, int64_t{1} << 54, 8, 128), DType::kF32};
  EXPECT_EQ(need.total(), INT64_MAX);
  try {
    check_memory(need, int64_t{8} << 30, 1);
    ADD_FAILURE() << "a pool of 2^54 positions passed the memory preflight";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not enough memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("8.00 GiB"), std::string::npos) << e.what();
  }
}

// Issue 14: a line over kMaxJsonlLineBytes is never kept whole: listed (number, bytes)
// for the caller to fail alone, or refused naming file:line.
TEST(JsonlInput, OversizedLinesAreListedOrRefused) {
  const fs::path dir = fs::temp_directory_path() / ("linnet_jsonl_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path in = dir / "in.jsonl";
  const std::string big = "{\"prompt\": \"" + std::string(kMaxJsonlLineBytes, 'x') + "\"}";
  {
    std::ofstream f(in, std::ios::binary);
    f << R"({"prompt": "a"})" << "\n" << big << "\n\n" << R"({"prompt": "b"})";  // no final newline
  }
  std::vector<std::pair<int, uint64_t>> oversized;
  const auto lines = read_jsonl_lines(in.string(), &oversized);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].first, 1);
  EXPECT_EQ(lines[1].first, 4);
  EXPECT_EQ(lines[1].second, R"({"prompt": "b"})");
  ASSERT_EQ(oversized.size(), 1u);
  EXPECT_EQ(oversized[0].first, 2);
  EXPECT_EQ(oversized[0].second, big.size());
  try {
    read_jsonl_lines(in.string());
    ADD_FAILURE() << "an oversized line was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(in.string() + ":2: the line is longer than 67108864 bytes", 0), 0u)
        << e.what();
  }
  fs::remove_all(dir);
}

// Issue 14: a repeated key would let the last value win silently (nlohmann keeps it),
// so a line that repeats one, at any depth, is refused naming the line and the key.
TEST(JsonlInput, DuplicateKeysNameTheLineAndTheKey) {
  const std::vector<std::pair<int, std::string>> ok = {{1, R"({"prompt": "a", "top_k": 5})"},
                                                      {2, R"({"messages": [{"role": "user"}, {"role": "assistant"}]})"}};
  EXPECT_EQ(parse_jsonl("in.jsonl", ok).size(), 2u);
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "a", "temperature": 0, "prompt": "b"})", "in.jsonl:4: duplicate key \"prompt\""},
           {R"({"messages": [{"role": "user", "content": "x", "role": "system"}]})",
            "in.jsonl:4: duplicate key \"role\" in \"messages\""},
           {R"({"ids": [1], "labels": [1], "ids": [2]})", "in.jsonl:4: duplicate key \"ids\""}}) {
    try {
      parse_jsonl("in.jsonl", {{1, R"({"prompt": "a"})"}, {4, text}});
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(message, 0), 0u) << e.what();
    }
  }
}

TEST(JsonlInput, ParseTimeIsLinearInTheNumberOfKeys) {
  // ordered_json's parser inserted each key through a search of the keys before it: a
  // line of 300000 keys took minutes.
  std::string line = R"({"prompt": "x")";
  for (int k = 0; k < 300000; ++k) line += ", \"k" + std::to_string(k) + "\": " + std::to_string(k);
  const auto start = std::chrono::steady_clock::now();
  const ordered_json j = parse_jsonl_line(line + "}", "in.jsonl:1");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  ASSERT_EQ(j.size(), 300001u);
  EXPECT_EQ(j.begin().key(), "prompt");
  EXPECT_EQ(j.back(), 299999);
  EXPECT_EQ(j.at("k1234"), 1234);
  try {
    parse_jsonl_line(line + R"(, "k7": 1})", "in.jsonl:1");
    ADD_FAILURE() << "accepted a repeated key";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("in.jsonl:1: duplicate key \"k7\"", 0), 0u) << e.what();
  }
}

TEST(JsonlInput, UnknownKeysListTheKnownOnes) {
  const ordered_json line = ordered_json::parse(R"({"ids": [1], "label": [1]})");
  EXPECT_NO_THROW(check_known_keys(ordered_json::parse(R"({"ids": [1]})"), {"text", "ids", "labels"}, "a loss line",
                                   "in.jsonl:2"));
  try {
    check_known_keys(line, {"text", "ids", "labels"}, "a loss line", "in.jsonl:2");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "in.jsonl:2: unknown key \"label\" (a loss line may have: text, ids, labels)");
  }
}

TEST(RequestLine, SettingsPromptTextAndStopIdsOfOneLine) {
  const Tokenizer tok = Tokenizer::from_dir(test::stories_dir());
  auto chat = std::make_unique<ModelChatTemplate>(
      ModelChatTemplate{ChatTemplate::parse("{% for m in messages %}[{{ m.content }}]{% endfor %}", "t.jinja"), {}});
  Request r;
  r.where = "in.jsonl:2";
  bool is_chat = true;
  read_request_line(ordered_json::parse(R"({"prompt": "Once", "top_k": 3})"), defaults(), 512, false, tok, "/none",
                    chat, r, is_chat);
  EXPECT_EQ(r.text, "Once");
  EXPECT_FALSE(is_chat);
  EXPECT_EQ(r.settings.sampling.top_k, 3);
  EXPECT_EQ(r.settings.stop_token_ids, std::vector<int64_t>{7});
  read_request_line(ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"), defaults(), 512,
                    false, tok, "/none", chat, r, is_chat);
  EXPECT_EQ(r.text, "[hi]");
  EXPECT_TRUE(is_chat);
  // A stop id past the vocabulary names the line's key, or the flag when the line did not set it.
  const auto error = [&](const std::string& line, RequestSettings d) {
    try {
      read_request_line(ordered_json::parse(line), d, 512, false, tok, "/none", chat, r, is_chat);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(R"({"prompt": "x", "stop_token_ids": [512]})", defaults()).rfind("in.jsonl:2: key \"stop_token_ids\"", 0), 0u);
  RequestSettings big = defaults();
  big.stop_token_ids = {600};
  EXPECT_EQ(error(R"({"prompt": "x"})", big).rfind("--stop-token-ids: invalid value", 0), 0u);
  EXPECT_EQ(error(R"({"prompt": "x", "temprature": 1})", defaults()).rfind("in.jsonl:2: unknown key \"temprature\"", 0), 0u);
}

TEST(LossDocument, TextOrIdsWithLabels) {
  const Tokenizer tok = Tokenizer::from_dir(test::stories_dir());
  const LossDocument t = parse_loss_document(ordered_json::parse(R"({"text": "Once upon a time"})"), "l:1", &tok, 512);
  EXPECT_EQ(t.ids, tok.encode("Once upon a time"));
  EXPECT_EQ(t.labels, t.ids);
  const LossDocument d = parse_loss_document(ordered_json::parse(R"({"ids": [1, 5, 9], "labels": [-100, 5, 9]})"), "l:2",
                                             nullptr, 512);
  EXPECT_EQ(d.ids, (std::vector<int32_t>{1, 5, 9}));
  EXPECT_EQ(d.labels, (std::vector<int32_t>{-100, 5, 9}));
  for (const auto& [line, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"ids": [1], "label": [1]})", "l:3: unknown key \"label\""},
           {R"({"ids": [1], "text": "a"})", "l:3: each line needs exactly one of"},
           {R"({"ids": [1, 512]})", "l:3: ids[1]: token id out of range"},
           {R"({"ids": [1, 2], "labels": [1]})", "l:3: \"labels\" and \"ids\" differ in length"},
           {R"({"ids": [1], "labels": [-5]})", "l:3: labels[0]: label out of range"},
           {R"({"ids": [1, 4294967296]})", "l:3: ids: integer out of range"},
           {R"({"text": "a"})", "l:3: \"text\" needs the model's tokenizer.json"}}) {
    try {
      parse_loss_document(ordered_json::parse(line), "l:3", nullptr, 512);
      ADD_FAILURE() << "accepted " << line;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(message, 0), 0u) << e.what();
    }
  }
}

class ResumeFile : public testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() / ("linnet_resume_" + std::to_string(::getpid()) + ".jsonl");
  }
  void TearDown() override { fs::remove(path_); }
  void write(const std::string& text) { std::ofstream(path_, std::ios::binary) << text; }
  fs::path path_;
};

TEST_F(ResumeFile, LinesAreKeptByIndexAndVerbatim) {
  const std::string a = R"({"index":3,"prompt":"x","completion":"caf\u00e9 "})";
  const std::string b = R"({"prompt":"y","index":0})";
  write(a + "\n\n" + b + "\n");
  const auto lines = read_output_lines(path_.string());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines.at(3), a);
  EXPECT_EQ(lines.at(0), b);
  fs::remove(path_);
  EXPECT_TRUE(read_output_lines(path_.string()).empty());  // no file yet: nothing to keep
}

TEST_F(ResumeFile, MalformedLinesNameTheFileAndLine) {
  for (const std::string& text : {std::string(R"({"index":0})" "\n" R"({"index":0})" "\n"),
                                  std::string(R"({"index":0})" "\n" R"({"prompt":"no index"})" "\n"),
                                  std::string(R"({"index":0})" "\n" R"({"index":-4})" "\n"),
                                  std::string(R"({"index":0})" "\n" R"({"index":0)" "\n")}) {
    write(text);
    try {
      read_output_lines(path_.string());
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path_.string() + ":2"), std::string::npos) << e.what();
    }
  }
}

TEST(Percentile, InterpolatesBetweenRanksLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], q): q50 -> 2.5, q90 -> 3.7, q99 -> 3.97, q0 -> 1.
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_NEAR(percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 90), 7.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
  EXPECT_EQ(percentiles_ms({10, 20, 30}), "20.0/28.0/29.8");
}

}  // namespace
}  // namespace linnet
