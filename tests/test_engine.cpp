// The decoder under tensor parallelism against outside oracles, at the tp size of the
// mpirun job (1, 2, 4): logits vs transformers (tests/data/stories260k/forward.json,
// made by scripts/make_fixtures.py), greedy ids vs transformers' generate, prefill +
// decode through the KV cache vs forward, and tp invariance against a tp = 1 engine
// built on MPI_COMM_SELF inside the same job.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include <gtest/gtest.h>

#include "common/error.h"
#include "parallel/mpi_communicator.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

constexpr float kLogitsAtol = 1e-4f;

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// One model loaded twice: over the whole job (tp = world size) and alone on this rank.
class EngineTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    files_ = std::make_unique<ModelFiles>(open_model(test::stories_dir()));
    backend_ = make_cpu_backend(1);
    world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    self_ = std::make_unique<MpiCommunicator>(MPI_COMM_SELF);
    const uint64_t before = files_->checkpoint.bytes_read();
    tp_ = make_engine(*files_, ShardPlan::make(files_->config, world_->rank(), world_->size()), *backend_,
                      *world_, 256);
    tp_bytes_read_ = files_->checkpoint.bytes_read() - before;
    solo_ = make_engine(*files_, ShardPlan::make(files_->config, 0, 1), *backend_, *self_, 256);
  }
  static void TearDownTestSuite() {
    tp_.reset();
    solo_.reset();
    self_.reset();
    world_.reset();
    backend_.reset();
    files_.reset();
  }

  static std::vector<int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

  static inline std::unique_ptr<ModelFiles> files_;
  static inline std::unique_ptr<Backend> backend_;
  static inline std::unique_ptr<MpiCommunicator> world_, self_;
  static inline std::unique_ptr<Engine> tp_, solo_;
  static inline uint64_t tp_bytes_read_ = 0;
};

TEST_F(EngineTest, EachRankReadsOnlyItsSlices) {
  // The ranks together read the checkpoint once, plus one copy of the replicated norm
  // weights (2 per layer + the final norm, 64 f32 each) per extra rank.
  uint64_t sum = 0;
  MPI_Allreduce(&tp_bytes_read_, &sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  const uint64_t norms = (2 * 5 + 1) * 64 * 4;
  EXPECT_EQ(sum, files_->checkpoint.total_bytes() + (world_->size() - 1) * norms);
  if (world_->size() > 1) {
    EXPECT_LT(tp_bytes_read_, files_->checkpoint.total_bytes() / 2 + norms);
  }
}

TEST_F(EngineTest, ForwardMatchesTransformers) {
  const auto golden = test::read_json(test::test_data_dir() / "stories260k" / "forward.json");
  ASSERT_GE(golden["cases"].size(), 3u);
  for (const auto& c : golden["cases"]) {
    const auto ids = ids_of(c["input_ids"]);
    std::vector<float> expected;
    for (const auto& row : c["logits"]) {
      for (const auto& v : row) expected.push_back(v.get<float>());
    }
    const std::vector<float> logits = tp_->forward(ids);
    ASSERT_EQ(logits.size(), ids.size() * 512) << c["name"];
    EXPECT_LT(max_abs_diff(logits, expected), kLogitsAtol) << c["name"] << " at tp " << world_->size();
  }
}

TEST_F(EngineTest, NextTokenIsLastRowOfForward) {
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378};
  const auto all = tp_->forward(ids);
  const std::vector<float> last(all.end() - 512, all.end());
  EXPECT_LT(max_abs_diff(tp_->next_token(ids), last), 1e-5f);
}

TEST_F(EngineTest, PrefillDecodeMatchesForward) {
  const auto golden = test::read_json(test::test_data_dir() / "stories260k" / "forward.json");
  std::vector<int32_t> ids;
  for (const auto& c : golden["cases"]) {
    if (c["name"] == "long") ids = ids_of(c["input_ids"]);
  }
  ASSERT_GT(ids.size(), 20u);
  const auto full = tp_->forward(ids);
  auto row = [&](size_t i) { return std::vector<float>(full.begin() + i * 512, full.begin() + (i + 1) * 512); };

  // A prompt of 7 tokens in one pass, a second chunk of 5, then one token at a time.
  const size_t p1 = 7, p2 = 12;
  EXPECT_LT(max_abs_diff(tp_->prefill(std::span(ids).first(p1), 0), row(p1 - 1)), kLogitsAtol);
  EXPECT_LT(max_abs_diff(tp_->prefill(std::span(ids).subspan(p1, p2 - p1), p1), row(p2 - 1)), kLogitsAtol);
  for (size_t i = p2; i < ids.size(); ++i) {
    EXPECT_LT(max_abs_diff(tp_->decode(ids[i], static_cast<int64_t>(i)), row(i)), kLogitsAtol) << "pos " << i;
  }
}

TEST_F(EngineTest, GreedyMatchesTransformersGenerate) {
  const auto golden = test::read_json(test::test_data_dir() / "stories260k" / "greedy.json");
  for (const auto& c : golden["cases"]) {
    const auto prompt = ids_of(c["input_ids"]);
    const auto expected = ids_of(c["output_ids"]);
    const GenerationResult r = generate(*tp_, prompt, static_cast<int64_t>(expected.size()));
    EXPECT_EQ(r.ids, expected) << "prompt '" << c["prompt"].get<std::string>() << "' at tp " << world_->size();
  }
}

// Equal up to f32 rounding: the row-parallel GEMMs (o_proj, down_proj) sum each output
// over k in per-rank parts that the all_reduce then adds, another order than one
// rank's single chain (logits here reach ~15, so 2e-5 is ~1e-6 relative).
TEST_F(EngineTest, LogitsAreTpInvariant) {
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
  EXPECT_LT(max_abs_diff(tp_->forward(ids), solo_->forward(ids)), 2e-5f);
}

TEST_F(EngineTest, SeededSamplingIsReproducibleAndTpInvariant) {
  const std::vector<int32_t> prompt = {1};
  SamplingParams params;
  params.temperature = 1.0;
  params.top_k = 40;
  params.top_p = 0.9;
  params.seed = 1234;
  const auto a = sample(*tp_, prompt, 48, params).ids;
  const auto b = sample(*tp_, prompt, 48, params).ids;
  const auto solo = sample(*solo_, prompt, 48, params).ids;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, solo) << "tp " << world_->size() << " vs tp 1";
  params.seed = 99;
  EXPECT_NE(sample(*tp_, prompt, 48, params).ids, a) << "another seed should give another story";
  // Every rank holds the same tokens.
  std::vector<int> mine(a.begin(), a.end()), root = mine;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_INT, 0, MPI_COMM_WORLD);
  EXPECT_EQ(mine, root);
}

TEST_F(EngineTest, GenerateUntilStopsAtEos) {
  // The first greedy token after BOS is 403; calling it an EOS stops at once.
  const std::vector<int64_t> eos = {403};
  const GenerationResult r = generate_until(*tp_, std::vector<int32_t>{1}, SamplingParams{}, 50, eos);
  EXPECT_EQ(r.ids, std::vector<int32_t>{403});
  EXPECT_EQ(r.finish_reason, "stop");
  const GenerationResult l = generate_until(*tp_, std::vector<int32_t>{1}, SamplingParams{}, 5, {});
  EXPECT_EQ(l.ids.size(), 5u);
  EXPECT_EQ(l.finish_reason, "length");
  // Prompt + new tokens never exceed the cache (256 here); a full prompt gets none.
  const GenerationResult cap = generate_until(*tp_, std::vector<int32_t>(250, 300), SamplingParams{}, 100, {});
  EXPECT_EQ(cap.ids.size(), 6u);
  EXPECT_EQ(cap.finish_reason, "length");
  EXPECT_TRUE(generate_until(*tp_, std::vector<int32_t>(256, 300), SamplingParams{}, 100, {}).ids.empty());
}

TEST_F(EngineTest, BadTokensAndOverlongPromptsAreRefused) {
  EXPECT_THROW(tp_->forward(std::vector<int32_t>{1, 512}), Error);
  EXPECT_THROW(tp_->forward(std::vector<int32_t>{-1}), Error);
  EXPECT_THROW(tp_->prefill(std::vector<int32_t>(300, 5), 0), Error);
  EXPECT_THROW(tp_->forward(std::vector<int32_t>{}), Error);
}

}  // namespace
}  // namespace linnet
