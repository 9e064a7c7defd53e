// Continuous batching (prefill_packed + decode_rows over KV cache rows) against the
// batch-1 path, at the tp size of the mpirun job (1, 2, 4): 64 varied prompts give the
// same greedy tokens as each generated alone, and a seeded request gives the same
// tokens whatever shares its batch.
#include <mpi.h>

#include <memory>
#include <random>

#include <gtest/gtest.h>

#include "loader/tokenizer.h"
#include "parallel/mpi_communicator.h"
#include "runtime/batch_generate.h"
#include "runtime/model_loader.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

class BatchTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    files_ = std::make_unique<ModelFiles>(open_model(test::stories_dir()));
    backend_ = make_cpu_backend(1);
    world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    const ShardPlan plan = ShardPlan::make(files_->config, world_->rank(), world_->size());
    batched_ = make_engine(*files_, plan, *backend_, *world_, 128, /*max_batch=*/8);
    single_ = make_engine(*files_, plan, *backend_, *world_, 128);
  }
  static void TearDownTestSuite() {
    batched_.reset();
    single_.reset();
    world_.reset();
    backend_.reset();
    files_.reset();
  }

  // 64 prompts of 1 to ~20 tokens: story openings cut at different words.
  static std::vector<std::vector<int32_t>> prompts() {
    const Tokenizer tok = Tokenizer::from_dir(test::stories_dir());
    const std::vector<std::string> texts = {
        "Once upon a time, there was a little dog named Max who loved to run",
        "Lily and Ben went to the park to play on the swings and the slide",
        "The sun was hot and the children wanted to eat a big cold ice cream",
        "Tom had a red ball. He liked to throw it high in the sky every day"};
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < 64; ++i) {
      std::vector<int32_t> ids = tok.encode(texts[i % 4]);
      ids.resize(std::min(ids.size(), static_cast<size_t>(1 + (i * 7) % 19)));
      out.push_back(ids);
    }
    return out;
  }

  static inline std::unique_ptr<ModelFiles> files_;
  static inline std::unique_ptr<Backend> backend_;
  static inline std::unique_ptr<MpiCommunicator> world_;
  static inline std::unique_ptr<Engine> batched_, single_;
};

TEST_F(BatchTest, SixtyFourGreedyPromptsMatchEachAlone) {
  std::vector<BatchRequest> reqs;
  for (const auto& p : prompts()) {
    BatchRequest r;
    r.prompt = p;
    r.max_new_tokens = 20 + static_cast<int64_t>(p.size()) % 7;  // rows finish at different steps
    r.eos_ids = {2};
    reqs.push_back(r);
  }
  size_t done = 0;
  const auto results = generate_batch(*batched_, reqs, [&](size_t, const GenerationResult&) { ++done; });
  EXPECT_EQ(done, reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerationResult alone =
        generate_until(*single_, reqs[i].prompt, SamplingParams{}, reqs[i].max_new_tokens, reqs[i].eos_ids);
    EXPECT_EQ(results[i].ids, alone.ids) << "request " << i << " at tp " << world_->size();
    EXPECT_EQ(results[i].finish_reason, alone.finish_reason) << "request " << i;
  }
}

TEST_F(BatchTest, ASeededRequestIgnoresItsBatchmates) {
  BatchRequest a;
  a.prompt = prompts()[5];
  a.max_new_tokens = 30;
  a.sampling.temperature = 1.0;
  a.sampling.top_k = 40;
  a.sampling.seed = 77;
  const auto alone = generate_batch(*batched_, {a})[0].ids;
  std::vector<BatchRequest> crowd;
  for (int i = 0; i < 11; ++i) {
    BatchRequest o = a;
    o.prompt = prompts()[static_cast<size_t>(i) * 3];
    o.sampling.seed = 1000 + static_cast<uint64_t>(i);
    o.max_new_tokens = 5 + i * 3;
    crowd.push_back(o);
  }
  crowd.insert(crowd.begin() + 4, a);
  const auto together = generate_batch(*batched_, crowd);
  EXPECT_EQ(together[4].ids, alone);
  EXPECT_EQ(alone.size(), 30u);
}

TEST_F(BatchTest, RequestsThatCannotRunFailAloneAndTheRestGoOn) {
  std::vector<BatchRequest> reqs(3);
  reqs[0].prompt = std::vector<int32_t>(129, 5);  // longer than the 128-position rows
  reqs[1].prompt = {1, 403};
  reqs[1].max_new_tokens = 4;
  reqs[2].prompt = {};
  const auto r = generate_batch(*batched_, reqs);
  EXPECT_EQ(r[0].finish_reason, "error");
  EXPECT_NE(r[0].error.find("--max-seq-len"), std::string::npos) << r[0].error;
  EXPECT_EQ(r[1].ids.size(), 4u);
  EXPECT_EQ(r[1].finish_reason, "length");
  EXPECT_EQ(r[2].finish_reason, "error");
}

}  // namespace
}  // namespace linnet
