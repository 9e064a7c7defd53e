// loss_packed / log_probs_packed with vocab-parallel cross-entropy against transformers
// (tests/data/loss/*.json, made by scripts/make_loss_fixtures.py: labels=input_ids, mean
// over non-ignored targets), at the tp size of the mpirun job (1, 2, 4).
#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "parallel/mpi_communicator.h"
#include "runtime/loss.h"
#include "runtime/model_loader.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

constexpr double kRel = 1e-5;

struct Doc {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // unshifted, as transformers takes them
  double nll_sum = 0;
  int64_t tokens = 0;
  double mean_nll = 0;
  nlohmann::json target_log_probs;
};

// Appends `d` to `batch` as document `segment`: position i predicts labels[i + 1].
void append(PackedBatch& batch, const Doc& d, int32_t segment) {
  for (size_t i = 0; i < d.ids.size(); ++i) {
    batch.tokens.push_back(d.ids[i]);
    batch.positions.push_back(static_cast<int32_t>(i));
    batch.segments.push_back(segment);
    batch.labels.push_back(i + 1 < d.ids.size() ? d.labels[i + 1] : kIgnoreIndex);
  }
}

struct Case {
  std::string golden;  // tests/data/loss/<golden>.json
  std::string model;   // "stories260k" or a fixture name
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.golden; }

class LossTest : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    const auto g = test::read_json(test::test_data_dir() / "loss" / (c.golden + ".json"));
    for (const auto& j : g["documents"]) {
      Doc d;
      d.ids = j["ids"].get<std::vector<int32_t>>();
      d.labels = j.contains("labels") ? j["labels"].get<std::vector<int32_t>>() : d.ids;
      d.nll_sum = j["nll_sum"].get<double>();
      d.tokens = j["tokens"].get<int64_t>();
      d.mean_nll = j["mean_nll"].get<double>();
      d.target_log_probs = j["target_log_probs"];
      docs_.push_back(d);
    }
    const auto dir = c.model == "stories260k" ? test::stories_dir()
                                              : test::test_data_dir() / "fixtures" / c.model / "f32";
    files_ = std::make_unique<ModelFiles>(open_model(dir));
    world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    self_ = std::make_unique<MpiCommunicator>(MPI_COMM_SELF);
    backend_ = make_cpu_backend(1);
    tp_ = make_engine(*files_, ShardPlan::make(files_->config, world_->rank(), world_->size()), *backend_,
                      *world_, 8);
    solo_ = make_engine(*files_, ShardPlan::make(files_->config, 0, 1), *backend_, *self_, 8);
  }

  // Per-document (nll_sum, tokens) from one packed loss.
  static std::vector<std::pair<double, int64_t>> per_doc(const PackedBatch& b, const PackedLoss& l) {
    std::vector<std::pair<double, int64_t>> out;
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      if (static_cast<size_t>(b.segments[i]) >= out.size()) out.resize(b.segments[i] + 1);
      out[b.segments[i]].first += l.nll[i];
      out[b.segments[i]].second += l.scored[i];
    }
    return out;
  }

  std::vector<Doc> docs_;
  std::unique_ptr<ModelFiles> files_;
  std::unique_ptr<MpiCommunicator> world_, self_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Engine> tp_, solo_;
};

TEST_P(LossTest, EachDocumentMatchesTransformers) {
  for (size_t k = 0; k < docs_.size(); ++k) {
    PackedBatch b;
    append(b, docs_[k], 0);
    const auto [sum, tokens] = per_doc(b, loss_packed(*tp_, b))[0];
    EXPECT_EQ(tokens, docs_[k].tokens) << "document " << k;
    EXPECT_NEAR(sum / tokens, docs_[k].mean_nll, kRel * docs_[k].mean_nll) << "document " << k;
    EXPECT_NEAR(sum, docs_[k].nll_sum, kRel * docs_[k].nll_sum) << "document " << k;
  }
}

TEST_P(LossTest, PackingGivesEachDocumentItsOwnLoss) {
  PackedBatch b;
  for (size_t k = 0; k < docs_.size(); ++k) append(b, docs_[k], static_cast<int32_t>(k));
  const auto got = per_doc(b, loss_packed(*tp_, b));
  ASSERT_EQ(got.size(), docs_.size());
  for (size_t k = 0; k < docs_.size(); ++k) {
    EXPECT_EQ(got[k].second, docs_[k].tokens) << "document " << k;
    EXPECT_NEAR(got[k].first / got[k].second, docs_[k].mean_nll, kRel * docs_[k].mean_nll) << "document " << k;
  }
}

TEST_P(LossTest, LogProbsMatchLogSoftmax) {
  for (size_t k = 0; k < docs_.size(); ++k) {
    PackedBatch b;
    append(b, docs_[k], 0);
    const auto lp = log_probs_packed(*tp_, b);
    const auto& expect = docs_[k].target_log_probs;
    ASSERT_EQ(expect.size() + 1, lp.size());
    for (size_t i = 0; i < expect.size(); ++i) {
      if (expect[i].is_null()) {
        EXPECT_TRUE(std::isnan(lp[i])) << "document " << k << " position " << i << " is ignored";
      } else {
        const double e = expect[i].get<double>();
        EXPECT_NEAR(lp[i], e, 1e-5 * std::max(1.0, std::fabs(e))) << "document " << k << " position " << i;
      }
    }
  }
}

// The lm_head runs a block of rows at a time, the cross-entropy taken block by block:
// blocks of 1, 3 and 7 rows (a pack's rows cut mid-document) give the bits of one block.
TEST_P(LossTest, LogitBlocksChangeNoBit) {
  PackedBatch b;
  for (size_t k = 0; k < docs_.size(); ++k) append(b, docs_[k], static_cast<int32_t>(k));
  const PackedLoss whole = loss_packed(*tp_, b);
  for (const int64_t rows : {1, 3, 7}) {
    const PackedLoss blocked = loss_packed(*tp_, b, rows);
    ASSERT_EQ(blocked.nll.size(), whole.nll.size());
    for (size_t i = 0; i < whole.nll.size(); ++i) {
      ASSERT_EQ(blocked.scored[i], whole.scored[i]) << "position " << i;
      ASSERT_EQ(std::bit_cast<uint64_t>(blocked.nll[i]), std::bit_cast<uint64_t>(whole.nll[i]))
          << "blocks of " << rows << " rows, position " << i;
    }
  }
  EXPECT_THROW(loss_packed(*tp_, b, -1), Error);
}

TEST_P(LossTest, TpSizesGiveEqualLosses) {
  PackedBatch b;
  for (size_t k = 0; k < docs_.size(); ++k) append(b, docs_[k], static_cast<int32_t>(k));
  const auto a = per_doc(b, loss_packed(*tp_, b));
  const auto s = per_doc(b, loss_packed(*solo_, b));
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_NEAR(a[k].first, s[k].first, kRel * s[k].first) << "tp " << world_->size() << " vs 1, document " << k;
  }
}

TEST_P(LossTest, IgnoredLabelsAndOutOfRangeLabels) {
  PackedBatch b;
  append(b, docs_.back(), 0);
  const int64_t before = per_doc(b, loss_packed(*tp_, b))[0].second;
  const size_t i = static_cast<size_t>(
      std::find_if(b.labels.begin(), b.labels.end(), [](int32_t y) { return y != kIgnoreIndex; }) - b.labels.begin());
  ASSERT_LT(i, b.labels.size());
  b.labels[i] = kIgnoreIndex;
  EXPECT_EQ(per_doc(b, loss_packed(*tp_, b))[0].second, before - 1);
  b.labels[i] = static_cast<int32_t>(files_->config.vocab_size);
  try {
    loss_packed(*tp_, b);
    FAIL() << "a label of vocab_size must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label out of range"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(files_->config.vocab_size)), std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, LossTest,
                         testing::Values(Case{"stories260k", "stories260k"}, Case{"llama31", "llama31"},
                                         Case{"qwen3", "qwen3"}, Case{"phi3", "phi3"}, Case{"mistral", "mistral"}),
                         [](const testing::TestParamInfo<Case>& i) { return i.param.golden; });

// Prompt top_logprobs (log_probs_packed with top_k) against transformers' logits of the
// fixtures (golden.json "logits_f32", scripts/make_fixtures.py): at each position the k
// largest log_softmax values and their ids, with the candidates picked on each rank's
// vocab shard and gathered (tp = the mpirun job's size).
class PromptTopLogprobs : public testing::TestWithParam<std::string> {};

TEST_P(PromptTopLogprobs, MatchTransformersLogSoftmax) {
  const auto dir = test::test_data_dir() / "fixtures" / GetParam();
  const auto golden = test::read_json(dir / "golden.json");
  const ModelFiles files = open_model(dir / "f32");
  MpiCommunicator world(MPI_COMM_WORLD);
  if (files.config.num_attention_heads % world.size() != 0) GTEST_SKIP() << "heads do not split over tp";
  auto backend = make_cpu_backend(1);
  auto engine = make_engine(files, ShardPlan::make(files.config, world.rank(), world.size()), *backend, world, 64);
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  const int64_t V = files.config.vocab_size;
  PackedBatch b;
  for (size_t i = 0; i < prompt.size(); ++i) {
    b.tokens.push_back(prompt[i]);
    b.positions.push_back(static_cast<int32_t>(i));
    b.segments.push_back(0);
    b.labels.push_back(i + 1 < prompt.size() ? prompt[i + 1] : kIgnoreIndex);
  }
  for (const int64_t k : {0, 1, 5, 20}) {
    const PackedLogprobs out = log_probs_packed(*engine, b, k);
    ASSERT_EQ(out.top.size(), prompt.size());
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      const auto row = golden["logits_f32"][i].get<std::vector<double>>();
      ASSERT_EQ(static_cast<int64_t>(row.size()), V);
      double mx = -INFINITY, sum = 0;
      for (double l : row) mx = std::max(mx, l);
      for (double l : row) sum += std::exp(l - mx);
      std::vector<std::pair<double, int32_t>> ref;
      for (int32_t v = 0; v < V; ++v) ref.emplace_back(row[v] - mx - std::log(sum), v);
      std::sort(ref.begin(), ref.end(),
                [](auto& x, auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
      const double target = row[prompt[i + 1]] - mx - std::log(sum);
      // 1e-4: the fixtures' bound on f32 logits against transformers (test_fixtures).
      EXPECT_NEAR(out.logprob[i], target, 1e-4) << GetParam() << " position " << i;
      ASSERT_EQ(static_cast<int64_t>(out.top[i].size()), k) << GetParam() << " position " << i;
      for (size_t c = 0; c < out.top[i].size(); ++c) {
        EXPECT_NEAR(out.top[i][c].second, ref[c].first, 1e-4) << GetParam() << " position " << i << " rank " << c;
        // The id, unless transformers' own values there are a near tie (within 2 x 1e-4).
        const bool tie = (c > 0 && ref[c - 1].first - ref[c].first < 2e-4) ||
                         (c + 1 < ref.size() && ref[c].first - ref[c + 1].first < 2e-4);
        if (!tie) {
          EXPECT_EQ(out.top[i][c].first, ref[c].second) << GetParam() << " position " << i << " rank " << c;
        }
      }
    }
    EXPECT_TRUE(std::isnan(out.logprob.back()));
    EXPECT_TRUE(out.top.back().empty());
  }
  // Candidates picked a block of 2 rows at a time: the same lists, the same bits.
  const PackedLogprobs whole = log_probs_packed(*engine, b, 5);
  const PackedLogprobs blocked = log_probs_packed(*engine, b, 5, 0, 2);
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint64_t>(blocked.logprob[i]), std::bit_cast<uint64_t>(whole.logprob[i])) << i;
    EXPECT_EQ(blocked.top[i], whole.top[i]) << GetParam() << " position " << i;
  }
  // A tokenizer smaller than the embedding: only its ids are candidates.
  const int64_t limit = V - 40;
  const PackedLogprobs lim = log_probs_packed(*engine, b, 20, limit);
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    ASSERT_EQ(lim.top[i].size(), 20u);
    for (const auto& [id, lp] : lim.top[i]) EXPECT_LT(id, limit) << GetParam() << " position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PromptTopLogprobs, testing::Values("llama31", "qwen3", "phi3", "mistral"));

}  // namespace
}  // namespace linnet
