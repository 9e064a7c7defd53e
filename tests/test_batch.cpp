// Continuous batching (prefill_packed + decode_rows over KV cache rows) against the
// batch-1 path, at the tp size of the mpirun job (1, 2, 4): 64 varied prompts give the
// same greedy tokens as each generated alone, and a seeded request gives the same
// tokens whatever shares its batch. Also: stop checks and stop requests agree on every
// rank, logprobs equal a log_softmax of forward()'s logits computed here, and the
// repetition penalty gives the same tokens batched as alone.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include <gtest/gtest.h>

#include "loader/tokenizer/tokenizer.h"
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

// Every rank's copy of `v` equals rank 0's.
bool same_on_every_rank(const std::vector<int32_t>& v) {
  std::vector<int32_t> root = v;
  int n = static_cast<int>(root.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  root.resize(static_cast<size_t>(n));
  MPI_Bcast(root.data(), n, MPI_INT, 0, MPI_COMM_WORLD);
  int same = root == v ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

TEST_F(BatchTest, AStopCheckOnRank0EndsTheRequestOnEveryRank) {
  std::vector<BatchRequest> reqs(3);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt = prompts()[i];
    reqs[i].max_new_tokens = 12;
  }
  const auto plain = generate_batch(*batched_, reqs);
  BatchOptions options;
  int calls = 0;
  std::vector<int> seen(reqs.size(), 0);
  options.stop_check = [&](size_t index, int32_t) {
    ++calls;
    return index == 1 && ++seen[index] == 5;  // the 5th token of request 1
  };
  const auto r = generate_batch(*batched_, reqs, options);
  EXPECT_EQ(calls == 0, world_->rank() != 0) << "the stop check runs on tp rank 0 only";
  ASSERT_EQ(r[1].ids.size(), 5u);
  EXPECT_EQ(r[1].finish_reason, "stop");
  EXPECT_EQ(r[1].ids, std::vector<int32_t>(plain[1].ids.begin(), plain[1].ids.begin() + 5));
  EXPECT_EQ(r[0].ids, plain[0].ids);
  EXPECT_EQ(r[2].ids, plain[2].ids);
  EXPECT_EQ(r[0].finish_reason, "length");
  EXPECT_TRUE(same_on_every_rank(r[1].ids));
}

TEST_F(BatchTest, AStopRequestEndsTheRunAndKeepsWhatFinished) {
  std::vector<BatchRequest> reqs(12);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt = prompts()[i];
    reqs[i].max_new_tokens = i < 4 ? 3 : 40;  // the first four finish within a few steps
  }
  const auto full = generate_batch(*batched_, reqs);
  BatchOptions options;
  int steps = 0;
  std::vector<size_t> done;
  options.on_done = [&](size_t i, const GenerationResult&) { done.push_back(i); };
  options.stop_requested = [&] { return ++steps > 6; };  // alike on every rank
  const auto r = generate_batch(*batched_, reqs, options);
  EXPECT_EQ(steps, 7);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const bool finished = !r[i].finish_reason.empty();
    EXPECT_EQ(finished, i < 4) << "request " << i;
    EXPECT_EQ(finished, std::find(done.begin(), done.end(), i) != done.end()) << "request " << i;
    if (finished) {
      EXPECT_EQ(r[i].ids, full[i].ids) << "request " << i;
      EXPECT_EQ(r[i].token_ms.size(), r[i].ids.size());
    } else {
      EXPECT_LT(r[i].ids.size(), full[i].ids.size()) << "request " << i;
    }
  }
}

TEST_F(BatchTest, LogprobsAreTheLogSoftmaxOfTheForwardLogits) {
  BatchRequest req;
  req.prompt = prompts()[9];
  req.max_new_tokens = 4;
  req.top_logprobs = 3;
  BatchRequest other = req;  // a batchmate without logprobs
  other.prompt = prompts()[10];
  other.top_logprobs = -1;
  const auto r = generate_batch(*batched_, {other, req});
  EXPECT_TRUE(r[0].logprobs.empty());
  if (world_->rank() != 0) {
    EXPECT_TRUE(r[1].logprobs.empty()) << "logprobs are made on tp rank 0";
  }
  std::vector<int32_t> seq = req.prompt;
  for (size_t k = 0; k < r[1].ids.size(); ++k) {
    const std::vector<float> all = single_->forward(seq);  // collective: every rank
    const size_t V = all.size() / seq.size();
    const std::span<const float> row = std::span<const float>(all).subspan((seq.size() - 1) * V, V);
    double mx = row[0];
    for (float l : row) mx = std::max(mx, static_cast<double>(l));
    double z = 0.0;
    for (float l : row) z += std::exp(static_cast<double>(l) - mx);
    const double log_z = mx + std::log(z);
    std::vector<int32_t> order(V);
    for (size_t i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    if (world_->rank() == 0) {
      ASSERT_EQ(r[1].logprobs.size(), r[1].ids.size());
      const TokenLogprobs& lp = r[1].logprobs[k];
      EXPECT_NEAR(lp.logprob, row[static_cast<size_t>(r[1].ids[k])] - log_z, 1e-4) << "token " << k;
      ASSERT_EQ(lp.top.size(), 3u);
      for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(lp.top[j].first, order[j]) << "token " << k;
        EXPECT_NEAR(lp.top[j].second, row[static_cast<size_t>(order[j])] - log_z, 1e-4);
      }
      EXPECT_EQ(r[1].ids[k], order[0]) << "greedy takes the most probable";
    }
    seq.push_back(r[1].ids[k]);
  }
}

TEST_F(BatchTest, RepetitionPenaltyAndMinPGiveTheSameTokensBatchedAsAlone) {
  std::vector<BatchRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    BatchRequest r;
    r.prompt = prompts()[static_cast<size_t>(i) * 5];
    r.max_new_tokens = 40;
    r.sampling.repetition_penalty = 1.5;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.9;
      r.sampling.min_p = 0.1;
      r.sampling.seed = 40 + static_cast<uint64_t>(i);
    }
    reqs.push_back(r);
  }
  const auto batched = generate_batch(*batched_, reqs);
  int changed = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerationResult alone =
        generate_until(*single_, reqs[i].prompt, reqs[i].sampling, reqs[i].max_new_tokens, reqs[i].eos_ids);
    EXPECT_EQ(batched[i].ids, alone.ids) << "request " << i;
    SamplingParams plain = reqs[i].sampling;
    plain.repetition_penalty = 1.0;
    changed += generate_until(*single_, reqs[i].prompt, plain, reqs[i].max_new_tokens, {}).ids != alone.ids;
  }
  EXPECT_GT(changed, 0) << "a penalty of 1.5 over 40 tokens should change some story";
}

}  // namespace
}  // namespace linnet
