// `linnet-tp bench` end to end on the CPU backend: a small random-weight config at tp 1
// and 2, and a real checkpoint (stories260k); every result line is printed with a
// positive number, and bad option combinations are refused.
#include <cmath>
#include <regex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/cli_harness.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

using test::CliTest;
using test::quote;
using test::Result;

// The number after `label` on its line, or -1 when the line is missing.
double value_of(const std::string& out, const std::string& label) {
  const std::regex re("(^|\\n)" + label + ": ([0-9.]+)");
  std::smatch m;
  return std::regex_search(out, m, re) ? std::stod(m[2]) : -1.0;
}

void expect_results(const Result& r) {
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* label : {"prefill tokens/s", "decode tokens/s", "decode ms/step", "weight bytes per decode step",
                            "achieved GB/s"}) {
    EXPECT_GT(value_of(r.out, label), 0.0) << label << " in:\n" << r.out;
  }
  EXPECT_NE(r.out.find("bench: cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv cache: "), std::string::npos) << r.out;
}

class BenchCli : public CliTest {};

TEST_F(BenchCli, RandomWeightsFromAConfigAtTp1And2) {
  const auto config = test::test_data_dir() / "fixtures" / "llama31" / "f32" / "config.json";
  const std::string args = "bench --config " + quote(config.string()) +
                           " --random-weights --backend cpu --batch 2 --prompt-len 8 --new-tokens 4";
  const Result one = run(1, args);
  expect_results(one);
  EXPECT_NE(one.out.find("batch 2, prompt 8 tokens, 4 new tokens"), std::string::npos) << one.out;
  // llama31 fixture: 2 layers of 64 hidden, 8 q / 2 kv heads of 8, 112 inter, 301 vocab,
  // f32: (96*64 + 64*64 + 3*112*64) * 2 + 301*64 = 82752 floats.
  EXPECT_EQ(value_of(one.out, "weight bytes per decode step"), 4.0 * 82752) << one.out;
  expect_results(run(2, args + " --tp 2"));
  // The CPU backend never waits on a device: no step split line.
  EXPECT_EQ(one.out.find("decode step split"), std::string::npos) << one.out;
}

// --loss (issue 26): loss_packed over the prompts as documents, with the forward pass
// alone beside it, at tp 1 and 2.
TEST_F(BenchCli, LossTimesThePromptsAsDocuments) {
  const auto config = test::test_data_dir() / "fixtures" / "llama31" / "f32" / "config.json";
  const std::string args = "bench --config " + quote(config.string()) +
                           " --random-weights --backend cpu --batch 3 --prompt-len 16 --new-tokens 2 --loss";
  for (int np : {1, 2}) {
    const Result r = run(np, args);
    expect_results(r);
    EXPECT_GT(value_of(r.out, "loss tokens/s"), 0.0) << r.out;
    EXPECT_NE(r.out.find("(3 documents of 16 tokens, 45 scored, in "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("loss split: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" ms lm_head + cross-entropy"), std::string::npos) << r.out;
  }
}

// --weight-dtype: random weights made in bf16 / f16 are held so (half the bytes a step
// reads); an unknown dtype is refused by name.
TEST_F(BenchCli, WeightDtypeHalvesTheWeightBytes) {
  const auto config = test::test_data_dir() / "fixtures" / "llama31" / "f32" / "config.json";
  const std::string args = "bench --config " + quote(config.string()) +
                           " --random-weights --backend cpu --batch 2 --prompt-len 8 --new-tokens 4";
  for (const char* dt : {"bf16", "f16"}) {
    const Result r = run(1, args + " --weight-dtype " + dt);
    expect_results(r);
    EXPECT_EQ(value_of(r.out, "weight bytes per decode step"), 2.0 * 82752) << r.out;
    EXPECT_NE(r.out.find(std::string("weights: random (") + dt), std::string::npos) << r.out;
  }
  const Result bad = run(1, args + " --weight-dtype fp8");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--weight-dtype"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("fp8"), std::string::npos) << bad.err;
}

// --weight-dtype int8 / int4: the matrices quantized at load; a step reads each packed matrix
// (a 64-byte header, one byte a weight with the rows padded to 16, then an f32 scale per
// 16 rows and group) as kernels/cpu/gemm.h lays it out. Group sizes that would split a
// row are refused naming the ones that work; --weight-group-size needs int8.
TEST_F(BenchCli, QuantizedWeightsCountTheirPackedBytes) {
  const auto config = test::test_data_dir() / "fixtures" / "llama31" / "f32" / "config.json";
  const std::string args = "bench --config " + quote(config.string()) +
                           " --random-weights --backend cpu --batch 2 --prompt-len 8 --new-tokens 4";
  const Result r = run(1, args + " --weight-dtype int8 --weight-group-size 16");
  expect_results(r);
  auto packed = [](double n, double k, double g) {
    const double rows = std::ceil(n / 16) * 16;
    return 64 + std::ceil(rows * k / 64) * 64 + rows * (k / g) * 4;
  };
  const double layer = packed(96, 64, 16) + packed(64, 64, 16) + packed(224, 64, 16) + packed(64, 112, 16);
  EXPECT_EQ(value_of(r.out, "weight bytes per decode step"), 2 * layer + packed(301, 64, 16)) << r.out;
  EXPECT_NE(r.out.find("weights: random (int8, groups of 16"), std::string::npos) << r.out;
  expect_results(run(2, args + " --tp 2 --weight-dtype int8 --weight-group-size 8"));

  const Result split = run(1, args + " --weight-dtype int8 --weight-group-size 32");  // down_proj is 112 wide
  EXPECT_NE(split.code, 0);
  EXPECT_NE(split.err.find("--weight-group-size"), std::string::npos) << split.err;
  EXPECT_NE(split.err.find("down_proj"), std::string::npos) << split.err;
  EXPECT_NE(split.err.find("one of 1, 2, 4, 8, 16"), std::string::npos) << split.err;
  const Result alone = run(1, args + " --weight-group-size 16");
  EXPECT_NE(alone.code, 0);
  EXPECT_NE(alone.err.find("only with --weight-dtype int8 or int4, got 16 with --weight-dtype auto"), std::string::npos)
      << alone.err;

  // int4: the layers' matrices half a byte a weight with an f32 scale and offset per 16
  // rows and group; the lm_head in int8.
  const Result four = run(1, args + " --weight-dtype int4 --weight-group-size 16");
  expect_results(four);
  auto packed4 = [](double n, double k, double g) {
    const double rows = std::ceil(n / 16) * 16;
    return 64 + std::ceil(rows * k / 2 / 64) * 64 + 2 * rows * (k / g) * 4;
  };
  const double layer4 = packed4(96, 64, 16) + packed4(64, 64, 16) + packed4(224, 64, 16) + packed4(64, 112, 16);
  EXPECT_EQ(value_of(four.out, "weight bytes per decode step"), 2 * layer4 + packed(301, 64, 16)) << four.out;
  EXPECT_NE(four.out.find("weights: random (int4, groups of 16, embedding and lm_head int8"), std::string::npos)
      << four.out;
  const Result odd = run(1, args + " --weight-dtype int4 --weight-group-size 1");
  EXPECT_NE(odd.code, 0);
  EXPECT_NE(odd.err.find("even"), std::string::npos) << odd.err;
}

// "kv cache: 24.00 KiB per rank (...)" -> bytes.
double kv_cache_bytes(const std::string& out) {
  const size_t at = out.find("kv cache: ");
  if (at == std::string::npos) return -1;
  std::istringstream in(out.substr(at + 10));
  double v = 0;
  std::string unit;
  in >> v >> unit;
  for (const auto& [name, scale] : {std::pair{"B", 1.0}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}}) {
    if (unit == name) return v * scale;
  }
  return -1;
}

TEST_F(BenchCli, KvCacheDtypeBf16HalvesTheCacheBytes) {
  const auto config = test::test_data_dir() / "fixtures" / "llama31" / "f32" / "config.json";
  // 16 rows of 128 positions: 0.50 MiB in f32 (sizes the line prints exactly).
  const std::string args = "bench --config " + quote(config.string()) +
                           " --random-weights --backend cpu --batch 16 --prompt-len 8 --new-tokens 4 --max-seq-len 128";
  const Result f32 = run(1, args), bf16 = run(1, args + " --kv-cache-dtype bf16");
  // (Not expect_results: on this tiny model "achieved GB/s" can print 0.0 on a loaded machine.)
  ASSERT_EQ(f32.code, 0) << f32.err;
  ASSERT_EQ(bf16.code, 0) << bf16.err;
  EXPECT_NE(f32.out.find("positions, f32)"), std::string::npos) << f32.out;
  EXPECT_NE(bf16.out.find("positions, bf16)"), std::string::npos) << bf16.out;
  EXPECT_EQ(kv_cache_bytes(f32.out), 0.5 * 1048576) << f32.out;
  EXPECT_EQ(kv_cache_bytes(bf16.out), kv_cache_bytes(f32.out) / 2) << bf16.out;
  const Result bad = run(1, args + " --kv-cache-dtype fp8");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--kv-cache-dtype"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("fp8"), std::string::npos) << bad.err;
}

TEST_F(BenchCli, CheckpointWeights) {
  expect_results(run(1, "bench --model " + quote(test::stories_dir().string()) +
                            " --backend cpu --batch 1 --prompt-len 16 --new-tokens 4"));
}

TEST_F(BenchCli, RefusesAConfigWithoutRandomWeightsAndTooLongRuns) {
  const auto config = test::test_data_dir() / "fixtures" / "llama31" / "f32" / "config.json";
  Result r = run(1, "bench --config " + quote(config.string()) + " --backend cpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--random-weights"), std::string::npos) << r.err;
  r = run(1, "bench --config " + quote(config.string()) +
                 " --random-weights --backend cpu --prompt-len 200 --new-tokens 100");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--prompt-len + --new-tokens is longer than the model's context"), std::string::npos) << r.err;
  r = run(1, "bench --config " + quote(config.string()) +
                 " --random-weights --backend cpu --prompt-len 20 --new-tokens 10 --max-seq-len 16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--max-seq-len"), std::string::npos) << r.err;
}

// --gemm: the GEMM alone, no model: one line per shape with its GFLOP/s and the share
// of the fma peak, in every weight dtype; a malformed shape is refused naming --gemm.
TEST_F(BenchCli, GemmMicrobenchmarkPrintsEachShape) {
  for (const char* dt : {"f32", "bf16", "int8", "int4"}) {
    const Result r = run(1, std::string("bench --gemm 24x64x40,1x64x40 --threads 1 --weight-dtype ") + dt);
    ASSERT_EQ(r.code, 0) << dt << ": " << r.err;
    EXPECT_NE(r.out.find("fma peak"), std::string::npos) << r.out;
    for (const char* shape : {"24x64x40", "1x64x40"}) {
      const std::regex re(std::string("gemm ") + shape + ": ([0-9.]+) GFLOP/s \\(([0-9]+)% of the fma peak\\)");
      std::smatch m;
      ASSERT_TRUE(std::regex_search(r.out, m, re)) << dt << " " << shape << " in:\n" << r.out;
      EXPECT_GT(std::stod(m[1]), 0.0);
    }
  }
  for (const char* bad : {"24x64", "0x4x4", "4x4x4x", "axbxc", "4x4x4,,"}) {
    const Result r = run(1, std::string("bench --gemm ") + bad);
    EXPECT_NE(r.code, 0) << bad;
    EXPECT_NE(r.err.find("--gemm"), std::string::npos) << bad << ": " << r.err;
  }
}

}  // namespace
}  // namespace linnet
