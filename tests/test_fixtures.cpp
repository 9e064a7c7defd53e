// The seed architectures (Llama-3.1, Qwen3, Phi-3, and Mistral) on tiny checkpoints that keep each
// model's exact structure, against transformers' logits and greedy ids
// (tests/data/fixtures/*/golden.json, made by scripts/make_fixtures.py; golden_quant.json,
// by scripts/make_quant_fixtures.py, for int8 / int4 weights quantized at load), at the tp size
// of the mpirun job: 1, 2, 4, and 8 (KV-head replication; Phi-3's 4 heads cannot split
// over 8 ranks and is refused there, which is checked too).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "kernels/cpu/ops.h"
#include "loader/weight_table.h"
#include "parallel/mpi_communicator.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "runtime/weights.h"
#include "tests/test_data.h"
#include "tests/test_helpers.h"

namespace linnet {
namespace {

constexpr float kAtol = 1e-4f;

struct Fixture {
  std::string name;       // folder under tests/data/fixtures
  std::string variant;    // f32, bf16, f32_sharded
  std::string logits_key; // golden logits of that checkpoint
  std::string greedy_key;
  DType held = DType::kF32;  // the CPU backend's --weight-dtype
  DType kv = DType::kF32;    // the CPU backend's --kv-cache-dtype
  std::string golden = "golden.json";  // golden_quant.json: scripts/make_quant_fixtures.py
  int64_t group = 64;        // --weight-group-size (int8)
  std::string weights_from = {};  // a variant whose model.safetensors this one shares (ct_fp8_dynamic)
};

std::ostream& operator<<(std::ostream& os, const Fixture& f) {
  return os << f.name << "/" << f.variant << (f.held == DType::kBF16 ? " held in bf16" : "")
            << (is_quantized(f.held) ? std::string(" quantized to ") + dtype_name(f.held) + " at load" : "")
            << (f.kv == DType::kBF16 ? " with a bf16 KV cache" : "");
}

std::vector<Fixture> all_fixtures() {
  std::vector<Fixture> out;
  for (const char* name : {"llama31", "qwen3", "phi3", "mistral"}) {
    out.push_back({name, "f32", "logits_f32", "output_ids_f32"});
    // bf16 checkpoint: the CPU backend computes in f32 on the bf16 weights, which is
    // what the golden "logits_bf16_weights" is (transformers, float32 on those weights).
    out.push_back({name, "bf16", "logits_bf16_weights", "output_ids_bf16_weights"});
    // ... and kept in bf16 in memory (--weight-dtype auto on a bf16 checkpoint): the
    // kernels widen each weight exactly, so the same golden holds.
    out.push_back({name, "bf16", "logits_bf16_weights", "output_ids_bf16_weights", DType::kBF16});
    // f32 weights, bf16 KV cache (--kv-cache-dtype bf16): transformers in f32 with every
    // attention layer's key and value states rounded to bf16 ("logits_bf16_kv"), held to
    // the golden's "tolerance_bf16_kv" (2 x the spread f32-level noise before that
    // rounding makes in transformers itself; at least 1e-4).
    out.push_back({name, "f32", "logits_bf16_kv", "output_ids_bf16_kv", DType::kF32, DType::kBF16});
  }
  out.push_back({"phi3", "f32_sharded", "logits_f32", "output_ids_f32"});
  // int8 at load (--weight-dtype int8 --weight-group-size 4) from the f32 and the bf16
  // checkpoints: transformers in f32 on the same weights quantized and dequantized by
  // scripts/make_quant_fixtures.py (numpy).
  // int4 the same way (the least-squares search mirrored in numpy; the embedding and the
  // lm_head in int8).
  for (const char* name : {"llama31", "qwen3", "phi3", "mistral"}) {
    for (const char* variant : {"f32", "bf16"}) {
      for (const auto& [bits, held] : {std::pair{"int8_", DType::kI8}, {"int4_", DType::kI4}}) {
        out.push_back({name, variant, std::string("logits_") + bits + variant, std::string("output_ids_") + bits + variant,
                       held, DType::kF32, "golden_quant.json", 4});
      }
    }
  }
  // Pre-quantized compressed-tensors checkpoints (pack-quantized: int4 symmetric and
  // with zero points in groups of 4, int8 per channel; FP8 weights per channel, alone
  // and as the FP8_DYNAMIC preset, whose dynamic activations are not applied), made by
  // llm-compressor from the f32 checkpoint; the goldens are transformers' logits on the
  // checkpoint as it reads it back (FP8_DYNAMIC: without its input_activations, the
  // weight-only computation) (scripts/make_ct_fixtures.py). The embedding and lm_head
  // stay f32.
  for (const char* name : {"llama31", "qwen3", "phi3", "mistral"}) {
    for (const char* scheme : {"w4a16", "w4a16_asym", "w8a16", "fp8", "fp8_dynamic"}) {
      out.push_back({name, std::string("ct_") + scheme, std::string("logits_") + scheme,
                     std::string("output_ids_") + scheme, DType::kF32, DType::kF32, "golden_ct.json", 64,
                     std::string(scheme) == "fp8_dynamic" ? "ct_fp8" : ""});
    }
  }
  return out;
}

float max_abs_diff(const float* a, const std::vector<float>& b) {
  float d = 0.0f;
  for (size_t i = 0; i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

class FixtureTest : public testing::TestWithParam<Fixture> {
 protected:
  void SetUp() override {
    const Fixture& f = GetParam();
    const auto dir = test::test_data_dir() / "fixtures" / f.name;
    golden_ = test::read_json(dir / f.golden);
    std::filesystem::path model_dir = dir / f.variant;
    if (!f.weights_from.empty()) {  // this variant's config.json with another's weights
      tmp_ = std::filesystem::temp_directory_path() /
             ("linnet_fixture_" + f.name + "_" + f.variant + "_" + std::to_string(::getpid()));
      std::filesystem::create_directories(tmp_);
      for (const char* file : {"config.json", "generation_config.json"})
        std::filesystem::copy_file(model_dir / file, tmp_ / file, std::filesystem::copy_options::overwrite_existing);
      std::filesystem::copy_file(dir / f.weights_from / "model.safetensors", tmp_ / "model.safetensors",
                                 std::filesystem::copy_options::overwrite_existing);
      model_dir = tmp_;
    }
    files_ = std::make_unique<ModelFiles>(open_model(model_dir));
    world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    backend_ = make_cpu_backend(1, f.held, f.kv, f.group);
    const int tp = world_->size();
    if (files_->config.num_attention_heads % tp != 0) {
      EXPECT_THROW(ShardPlan::make(files_->config, world_->rank(), tp), Error);
      GTEST_SKIP() << f << ": " << files_->config.num_attention_heads << " heads cannot split over tp " << tp
                   << " (refusal checked)";
    }
    const ShardPlan plan = ShardPlan::make(files_->config, world_->rank(), tp);
    if (files_->config.quantization) {
      bool fits = true;
      for (int r = 0; r < tp; ++r) {
        try {
          check_quantized_checkpoint(files_->config, ShardPlan::make(files_->config, r, tp));
        } catch (const Error&) {
          fits = false;
        }
      }
      if (!fits) {  // Llama-3.1's down_proj slice at tp 8 is 14 wide: groups of 4 would straddle ranks
        EXPECT_EQ(tp, 8) << f << ": only tp 8 splits a group";
        EXPECT_THROW(make_engine(*files_, plan, *backend_, *world_, 64), Error);
        GTEST_SKIP() << f << ": the checkpoint's groups do not fit every slice at tp " << tp << " (refusal checked)";
      }
    }
    if (is_quantized(f.held)) {
      bool fits = true;
      for (int r = 0; r < tp; ++r) {
        try {
          check_weight_groups(files_->config, ShardPlan::make(files_->config, r, tp), f.group, f.held);
        } catch (const Error&) {
          fits = false;
        }
      }
      if (!fits) {  // Llama-3.1's down_proj slice at tp 8 is 14 wide
        EXPECT_EQ(tp, 8) << f << ": only tp 8 splits a group of " << f.group;
        EXPECT_THROW(make_engine(*files_, plan, *backend_, *world_, 64), Error);
        GTEST_SKIP() << f << ": groups of " << f.group << " do not fit every slice at tp " << tp << " (refusal checked)";
      }
    }
    engine_ = make_engine(*files_, plan, *backend_, *world_, 64);
    vocab_ = files_->config.vocab_size;
    for (const auto& row : golden_[f.logits_key]) expected_.push_back(row.get<std::vector<float>>());
    prompt_ = golden_["prompt_ids"].get<std::vector<int32_t>>();
    if (f.kv == DType::kBF16) atol_ = std::max(kAtol, golden_["tolerance_bf16_kv"].get<float>());
  }

  void TearDown() override {
    if (!tmp_.empty()) std::filesystem::remove_all(tmp_);
  }

  std::filesystem::path tmp_;  // a shared-weights variant's folder (weights_from)
  nlohmann::json golden_;
  std::unique_ptr<ModelFiles> files_;
  std::unique_ptr<MpiCommunicator> world_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Engine> engine_;
  int64_t vocab_ = 0;
  std::vector<std::vector<float>> expected_;
  std::vector<int32_t> prompt_;
  float atol_ = kAtol;
};

TEST_P(FixtureTest, ForwardMatchesTransformers) {
  const auto logits = engine_->forward(prompt_);
  ASSERT_EQ(logits.size(), prompt_.size() * static_cast<size_t>(vocab_));
  for (size_t i = 0; i < prompt_.size(); ++i) {
    EXPECT_LT(max_abs_diff(logits.data() + i * vocab_, expected_[i]), atol_) << GetParam() << " position " << i;
  }
}

TEST_P(FixtureTest, PrefillAndEveryDecodeStepMatchTransformers) {
  // 10 prompt tokens in one pass, then one token at a time past the sliding window.
  const size_t p = 10;
  const auto first = engine_->prefill(std::span(prompt_).first(p), 0);
  EXPECT_LT(max_abs_diff(first.data(), expected_[p - 1]), atol_) << GetParam();
  for (size_t i = p; i < prompt_.size(); ++i) {
    const auto step = engine_->decode(prompt_[i], static_cast<int64_t>(i));
    EXPECT_LT(max_abs_diff(step.data(), expected_[i]), atol_) << GetParam() << " decode position " << i;
  }
}

TEST_P(FixtureTest, GreedyContinuationMatchesTransformers) {
  const auto& g = golden_["greedy"];
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto expected = g[GetParam().greedy_key].get<std::vector<int32_t>>();
  EXPECT_EQ(generate(*engine_, prompt, static_cast<int64_t>(expected.size())).ids, expected)
      << GetParam() << " at tp " << world_->size();
}

INSTANTIATE_TEST_SUITE_P(Seeds, FixtureTest, testing::ValuesIn(all_fixtures()),
                         [](const testing::TestParamInfo<Fixture>& i) {
                           return i.param.name + "_" + i.param.variant +
                                  (i.param.held == DType::kBF16 ? "_held_bf16" : "") +
                                  (is_quantized(i.param.held) ? std::string("_") + dtype_name(i.param.held) : "") +
                                  (i.param.kv == DType::kBF16 ? "_kv_bf16" : "");
                         });

TEST(Llama3Rope, InverseFrequenciesOfTheRealConfigMatchTransformers) {
  const auto g = test::read_json(test::test_data_dir() / "fixtures" / "llama31_inv_freq.json");
  for (const char* which : {"real", "fixture"}) {
    const auto& r = g[which];
    const int64_t head_dim = r["head_dim"].get<int64_t>();
    const auto& rs = r["rope_scaling"];
    std::vector<float> f(static_cast<size_t>(head_dim / 2));
    cpu::rope_inv_freq(r["rope_theta"].get<double>(), head_dim, f.data());
    cpu::rope_scale_llama3(f.data(), head_dim / 2, rs["factor"].get<double>(), rs["low_freq_factor"].get<double>(),
                           rs["high_freq_factor"].get<double>(),
                           rs["original_max_position_embeddings"].get<double>());
    const auto expected = r["inv_freq"].get<std::vector<double>>();
    ASSERT_EQ(expected.size(), f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      EXPECT_NEAR(f[i], expected[i], 1e-6 * std::fabs(expected[i])) << which << " frequency " << i;
    }
  }
}

TEST(CheckpointValidation, EveryMismatchIsReportedAtOnce) {
  // Phi-3 fixture read with a config whose intermediate_size is wrong: both layers'
  // fused gate_up_proj and down_proj mismatch, and all four are listed together.
  const auto dir = test::test_data_dir() / "fixtures" / "phi3" / "f32_sharded";
  ModelConfig c = ModelConfig::load(dir / "config.json");
  c.intermediate_size = 128;
  const Checkpoint ckpt = Checkpoint::open(dir);
  try {
    ckpt.validate(tensor_specs(weight_table(c), c));
    FAIL() << "a wrong intermediate_size must not validate";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("(4 problems)"), std::string::npos) << m;
    for (const char* t : {"model.layers.0.mlp.gate_up_proj.weight", "model.layers.1.mlp.gate_up_proj.weight",
                          "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}) {
      EXPECT_NE(m.find(t), std::string::npos) << t << " in:\n" << m;
    }
    EXPECT_NE(m.find("expected [256, 64], got [320, 64]"), std::string::npos) << m;
  }
}

// A pre-quantized checkpoint read with the wrong scheme, a part of the wrong dtype, an
// integer part read as a float, a wrong weight_shape, and a tp size whose slices would
// split its groups: each is refused naming the tensor (or flag) and the sizes.
TEST(CompressedTensors, MismatchesAreNamed) {
  const auto dir = test::test_data_dir() / "fixtures" / "llama31" / "ct_w4a16";
  const ModelConfig c = ModelConfig::load(dir / "config.json");
  ASSERT_TRUE(c.quantization.has_value());
  const Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_NO_THROW(ckpt.validate(tensor_specs(weight_table(c), c)));
  {  // read as int8: every weight_packed is half the width int8 needs
    ModelConfig c8 = c;
    c8.quantization->num_bits = 8;
    const std::string m = test::error_of([&] { ckpt.validate(tensor_specs(weight_table(c8), c8)); });
    EXPECT_NE(m.find("model.layers.0.self_attn.q_proj.weight_packed' has the wrong shape (expected [64, 16], got [64, 8])"),
              std::string::npos) << m;
  }
  {  // asymmetric: the zero points are missing
    ModelConfig ca = c;
    ca.quantization->symmetric = false;
    const std::string m = test::error_of([&] { ckpt.validate(tensor_specs(weight_table(ca), ca)); });
    EXPECT_NE(m.find("missing tensor 'model.layers.0.mlp.down_proj.weight_zero_point'"), std::string::npos) << m;
  }
  {  // without its quantization_config the float weights are missing
    ModelConfig cd = c;
    cd.quantization.reset();
    const std::string m = test::error_of([&] { ckpt.validate(tensor_specs(weight_table(cd), cd)); });
    EXPECT_NE(m.find("missing tensor 'model.layers.0.self_attn.q_proj.weight'"), std::string::npos) << m;
  }
  const std::string scale = "model.layers.0.self_attn.q_proj.weight_scale";
  EXPECT_NE(test::error_of([&] { ckpt.validate({{scale, {64, 16}, {DType::kI32}}}); })
                .find("'" + scale + "' has the wrong dtype (expected I32, got F32)"),
            std::string::npos);
  std::vector<float> out(8);
  EXPECT_NE(test::error_of([&] {
              ckpt.read("model.layers.0.self_attn.q_proj.weight_packed", Slice2D{0, 1, 0, 8}, DType::kF32, out.data());
            }).find("integer tensors are read as stored"),
            std::string::npos);
  {  // a group size the stored scales do not have
    ModelConfig cs = c;
    cs.quantization->group_size = 8;  // same packed widths; scales [64, 8] where 16 are stored
    const std::string m = test::error_of([&] { ckpt.validate(tensor_specs(weight_table(cs), cs)); });
    EXPECT_NE(m.find(scale + "' has the wrong shape (expected [64, 8], got [64, 16])"), std::string::npos) << m;
  }
  {  // a weight_shape that says another matrix: a copy of the checkpoint with one edited
    const auto tmp = std::filesystem::temp_directory_path() / ("linnet_ct_shape_" + std::to_string(::getpid()));
    std::filesystem::create_directories(tmp);
    std::filesystem::copy_file(dir / "model.safetensors", tmp / "model.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
    std::string bytes = test::read_file(tmp / "model.safetensors");
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    const auto header = nlohmann::json::parse(bytes.substr(8, n));
    const std::string name = "model.layers.1.mlp.down_proj.weight_shape";
    ASSERT_EQ(header[name]["dtype"], "I64");
    const int64_t wrong[2] = {64, 113};
    std::memcpy(bytes.data() + 8 + n + header[name]["data_offsets"][0].get<uint64_t>(), wrong, sizeof wrong);
    {
      std::ofstream f(tmp / "model.safetensors", std::ios::binary | std::ios::trunc);
      f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    const Checkpoint edited = Checkpoint::open(tmp);
    const std::string m = test::error_of([&] { load_weights(edited, c, ShardPlan::make(c, 0, 1)); });
    std::filesystem::remove_all(tmp);
    for (const char* part : {"weight_shape is not the shape the model needs", "model.layers.1.mlp.down_proj.weight_shape",
                             "[64, 112]", "[64, 113]"}) {
      EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
    }
  }
  {  // zero points in the checkpoint while its config says symmetric: refused, not dropped
    const auto asym = test::test_data_dir() / "fixtures" / "llama31" / "ct_w4a16_asym";
    const auto tmp = std::filesystem::temp_directory_path() / ("linnet_ct_sym_" + std::to_string(::getpid()));
    std::filesystem::create_directories(tmp);
    std::filesystem::copy_file(asym / "model.safetensors", tmp / "model.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(asym / "generation_config.json", tmp / "generation_config.json",
                               std::filesystem::copy_options::overwrite_existing);
    nlohmann::json cfg = test::read_json(asym / "config.json");
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = true;
    {
      std::ofstream f(tmp / "config.json");
      f << cfg.dump();
    }
    const std::string m = test::error_of([&] { open_model(tmp); });
    std::filesystem::remove_all(tmp);
    for (const char* part : {"quantization tensors its config.json scheme", "does not use",
                             "model.layers.0.mlp.down_proj.weight_zero_point", "(14 in all)"}) {
      EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
    }
  }
  // tp 8 would cut Llama-3.1's 112-wide down_proj into 14-wide slices: not whole groups of 4.
  const std::string m = test::error_of([&] { check_quantized_checkpoint(c, ShardPlan::make(c, 0, 8)); });
  for (const char* part : {"groups of 4", "down_proj (this rank's intermediate slice) is 14 wide at tp 8", "--tp",
                           "one of 1, 2, 4"}) {
    EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
  }
}

TEST(Transformers5Config, RopeParametersSpellingLoadsTheSameModel) {
  for (const char* name : {"llama31", "qwen3", "phi3", "mistral"}) {
    const auto dir = test::test_data_dir() / "fixtures" / name;
    const ModelConfig a = ModelConfig::load(dir / "f32" / "config.json");
    const ModelConfig b = ModelConfig::load(dir / "config.transformers5.json");
    EXPECT_EQ(a.rope_theta, b.rope_theta) << name;
    EXPECT_EQ(a.rope_scaling.has_value(), b.rope_scaling.has_value()) << name;
    if (a.rope_scaling && b.rope_scaling) {
      EXPECT_EQ(a.rope_scaling->original_max_position_embeddings, b.rope_scaling->original_max_position_embeddings);
      EXPECT_EQ(a.rope_scaling->factor, b.rope_scaling->factor);
    }
    EXPECT_EQ(a.head_dim, b.head_dim) << name;
    EXPECT_EQ(a.sliding_window, b.sliding_window) << name;
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings) << name;
  }
}

}  // namespace
}  // namespace linnet
