// Speculative decoding (issue 27): the prompt-lookup proposer, the scheduler's guess
// rows and rewind, and the claim that matters: greedy output with speculation is the
// output without it, token for token and logprob for logprob, at tp 1, 2 and 4 (run
// under mpirun), for the real stories260k model and every architecture fixture, alone
// and in a batch, through the shard path and the full-logits path.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "loader/tokenizer/tokenizer.h"
#include "parallel/mpi_communicator.h"
#include "runtime/batch_generate.h"
#include "runtime/draft_proposer.h"
#include "runtime/model_loader.h"
#include "runtime/page_pool.h"
#include "runtime/paged_scheduler.h"
#include "runtime/speculative.h"
#include "runtime/weights.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

using Ids = std::vector<int32_t>;

TEST(PromptLookup, TakesWhatFollowedTheLatestEarlierOccurrence) {
  // "1 2 3" occurs at 0 and 4; the latest earlier one (4) is followed by 9 8.
  const Ids t = {1, 2, 3, 7, 1, 2, 3, 9, 8, 5, 1, 2, 3};
  EXPECT_EQ(propose_ngram(t, 1, 3, 2), (Ids{9, 8}));
  EXPECT_EQ(propose_ngram(t, 1, 3, 5), (Ids{9, 8, 5, 1, 2}));
  EXPECT_EQ(propose_ngram(t, 1, 3, 0), Ids{});
  // The longest n first: "5 1 2 3" never recurs, but with n_max 3 "1 2 3" does.
  EXPECT_EQ(propose_ngram(t, 4, 4, 3), Ids{});
  // Down to n_min: the last token 4 alone recurs.
  const Ids u = {4, 6, 7, 8, 5, 4};
  EXPECT_EQ(propose_ngram(u, 1, 3, 2), (Ids{6, 7}));
  EXPECT_EQ(propose_ngram(u, 2, 3, 2), Ids{});
  // Near the end: fewer guesses; an occurrence must be followed by a token.
  EXPECT_EQ(propose_ngram(Ids{3, 3, 3}, 1, 2, 4), (Ids{3}));
  EXPECT_EQ(propose_ngram(Ids{3}, 1, 2, 4), Ids{});
  EXPECT_EQ(propose_ngram(Ids{}, 1, 2, 4), Ids{});
  EXPECT_THROW(propose_ngram(t, 0, 3, 2), Error);
  EXPECT_THROW(propose_ngram(t, 3, 2, 2), Error);
  EXPECT_THROW(propose_ngram(t, 1, 2, -1), Error);
}

// Guess rows follow the pending token at consecutive positions, each with a logits row;
// they stop at the request's reserved length and at the step budget; rewind keeps the
// accepted positions only.
TEST(PagedScheduler, GuessRowsFollowThePendingTokenAndRewind) {
  PagePool pool(8, 4);
  PagedScheduler sched(pool, 2, 64, /*token_budget=*/6);
  ASSERT_FALSE(sched.add(7, Ids{1, 2, 3}, /*max_new_tokens=*/4));  // reserved length 7
  auto prefill = sched.next_step();
  ASSERT_TRUE(prefill);
  sched.done_step(*prefill);
  // Room for 2 guesses, positions 4 and 5: the token drawn at position 5 is the last
  // the request may have (position 6 would hold it), so no row runs at 6.
  sched.append(7, 10, Ids{11, 12, 13, 14, 15});
  auto step = sched.next_step();
  ASSERT_TRUE(step);
  EXPECT_EQ(step->batch.tokens, (Ids{10, 11, 12}));
  EXPECT_EQ(step->batch.positions, (Ids{3, 4, 5}));
  EXPECT_EQ(step->batch.last, (Ids{0, 1, 2}));
  EXPECT_EQ(step->ids, (std::vector<int64_t>{7, 7, 7}));
  sched.done_step(*step);
  // 11 was kept, 12 was not: positions 3 (10) and 4 (11) hold valid K/V; the model's
  // token after 11 runs next at position 5.
  sched.rewind(7, 5);
  EXPECT_THROW(sched.rewind(7, 2), Error) << "below the prompt";
  EXPECT_THROW(sched.rewind(7, 6), Error) << "past what is cached";
  sched.append(7, 20);
  step = sched.next_step();
  ASSERT_TRUE(step);
  EXPECT_EQ(step->batch.tokens, (Ids{20}));
  EXPECT_EQ(step->batch.positions, (Ids{5}));
  sched.done_step(*step);
  // Position 6 is the request's last: no room for a guess.
  sched.append(7, 21, Ids{1, 2, 3});
  step = sched.next_step();
  ASSERT_TRUE(step);
  EXPECT_EQ(step->batch.tokens, (Ids{21}));
  sched.finish(7);
  // The step budget caps the guesses (the pending token itself always runs).
  PagedScheduler tight(pool, 2, 64, /*token_budget=*/3);
  ASSERT_FALSE(tight.add(9, Ids{1, 2}, 20));
  auto p = tight.next_step();
  ASSERT_TRUE(p);
  tight.done_step(*p);
  tight.append(9, 5, Ids{6, 7, 8, 9});
  step = tight.next_step();
  ASSERT_TRUE(step);
  EXPECT_EQ(step->batch.tokens, (Ids{5, 6, 7}));
  EXPECT_EQ(step->batch.positions, (Ids{2, 3, 4}));
  tight.done_step(*step);
  tight.rewind(9, 3);
  // Two requests, a budget of 4: every pending token is counted before any guess (the
  // first gets 4 - 2 = 2 guesses, the second none, both pending tokens run).
  PagePool big(16, 4);
  PagedScheduler two(big, 2, 64, /*token_budget=*/4);
  ASSERT_FALSE(two.add(10, Ids{1, 2}, 20));
  ASSERT_FALSE(two.add(11, Ids{3, 4}, 20));
  auto pre = two.next_step();
  ASSERT_TRUE(pre);
  two.done_step(*pre);
  two.append(10, 7, Ids{8, 9, 10});
  two.append(11, 17, Ids{18, 19, 20});
  step = two.next_step();
  ASSERT_TRUE(step);
  EXPECT_EQ(step->batch.tokens, (Ids{7, 8, 9, 17}));
  EXPECT_EQ(step->ids, (std::vector<int64_t>{10, 10, 10, 11}));
}

// Prompt lookup with k guesses (prompt_lookup_min 1), a step budget, and its counters
// to `stats`.
BatchOptions ngram_options(int64_t k, int64_t budget, int64_t lookup_max, SpeculativeStats* stats) {
  BatchOptions o;
  o.step_token_budget = budget;
  o.speculative.method = "ngram";
  o.speculative.num_speculative_tokens = k;
  o.speculative.prompt_lookup_min = 1;
  o.speculative.prompt_lookup_max = lookup_max;
  o.speculative_stats = stats;
  return o;
}

// The draft model with k guesses (greedy guesses from `draft`), a step budget, and its
// counters to `stats`.
BatchOptions draft_options(Engine& draft, int64_t k, int64_t budget, SpeculativeStats* stats) {
  BatchOptions o;
  o.step_token_budget = budget;
  o.speculative.method = "draft_model";
  o.speculative.model = "(test)";
  o.speculative.num_speculative_tokens = k;
  o.draft = &draft;
  o.speculative_stats = stats;
  return o;
}

// Runs `reqs` with `spec` (speculative options and their stats) and without speculation
// on one engine and expects the same results (ids, finish reasons, errors, logprobs).
void expect_same_as_plain(Engine& engine, const std::vector<BatchRequest>& reqs, const BatchOptions& spec,
                          const std::string& what, int tp) {
  BatchOptions plain;
  plain.step_token_budget = spec.step_token_budget;
  const std::vector<GenerationResult> want = generate_batch(engine, reqs, plain);
  const std::vector<GenerationResult> got = generate_batch(engine, reqs, spec);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].ids, want[i].ids) << what << " request " << i << " at tp " << tp;
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << what << " request " << i;
    EXPECT_EQ(got[i].error, want[i].error) << what << " request " << i;
    EXPECT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << what << " request " << i;
    for (size_t t = 0; t < std::min(got[i].logprobs.size(), want[i].logprobs.size()); ++t) {
      EXPECT_EQ(got[i].logprobs[t].logprob, want[i].logprobs[t].logprob) << what << " request " << i << " token " << t;
      EXPECT_EQ(got[i].logprobs[t].top, want[i].logprobs[t].top) << what << " request " << i << " token " << t;
    }
  }
  if (spec.speculative_stats) {
    EXPECT_LE(spec.speculative_stats->accepted, spec.speculative_stats->proposed) << what;
  }
}

// expect_same_as_plain with prompt lookup; returns the speculation's counters.
SpeculativeStats expect_same(Engine& engine, const std::vector<BatchRequest>& reqs, const std::string& what, int tp,
                             int64_t k = 4, int64_t budget = 4096, int64_t lookup_max = 3) {
  SpeculativeStats stats;
  expect_same_as_plain(engine, reqs, ngram_options(k, budget, lookup_max, &stats), what, tp);
  return stats;
}

// expect_same_as_plain with a draft model; returns the speculation's counters.
SpeculativeStats expect_same_drafted(Engine& engine, Engine& draft, const std::vector<BatchRequest>& reqs,
                                     const std::string& what, int tp, int64_t k = 4, int64_t budget = 4096) {
  SpeculativeStats stats;
  expect_same_as_plain(engine, reqs, draft_options(draft, k, budget, &stats), what, tp);
  return stats;
}

// A draft made of a checkpoint's first `layers` layers with its embedding, final norm and
// lm_head (an early-exit model: the target's vocabulary, its guesses partly right), or
// the whole checkpoint again (layers 0: the target as its own draft), on the target's
// ranks and backend with a pool of `pages` pages of 16.
std::unique_ptr<Engine> draft_engine(const ModelFiles& files, const ShardPlan& plan, Backend& backend,
                                     Communicator& comm, int64_t layers, int64_t max_seq_len, int64_t max_batch,
                                     int64_t pages) {
  ModelConfig config = files.config;
  ModelWeights w = load_weights(files.checkpoint, config, plan, backend.host_weight_dtype(files.checkpoint.dominant_dtype()));
  if (layers > 0) {
    w.layers.resize(static_cast<size_t>(layers));
    config.num_hidden_layers = layers;
  }
  return std::make_unique<Engine>(config, plan, std::move(w), backend, comm, max_seq_len, max_batch, 16, pages);
}

// stories260k, its tokenizer, this rank's slice and a CPU backend, once for the suite.
class SpeculativeTest : public testing::Test {
 protected:
  static constexpr int64_t kMaxSeqLen = 256;
  static void SetUpTestSuite() {
    world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    files_ = std::make_unique<ModelFiles>(open_model(test::stories_dir()));
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_dir(test::stories_dir()));
    plan_ = std::make_unique<ShardPlan>(ShardPlan::make(files_->config, world_->rank(), world_->size()));
    backend_ = make_cpu_backend(1);
  }
  static void TearDownTestSuite() {
    backend_.reset();
    plan_.reset();
    tok_.reset();
    files_.reset();
    world_.reset();
  }
  // The target on this suite's backend: `pages` KV pages of 16 for up to `max_batch` rows.
  static std::unique_ptr<Engine> target(int64_t max_batch, int64_t pages) {
    return make_engine(*files_, *plan_, *backend_, *world_, kMaxSeqLen, max_batch, /*page_size=*/16, pages);
  }
  // draft_engine of stories260k (its first `layers` layers; 0: all of them).
  static std::unique_ptr<Engine> draft(int64_t layers, int64_t max_batch, int64_t pages) {
    return draft_engine(*files_, *plan_, *backend_, *world_, layers, kMaxSeqLen, max_batch, pages);
  }
  static std::unique_ptr<MpiCommunicator> world_;
  static std::unique_ptr<ModelFiles> files_;
  static std::unique_ptr<Tokenizer> tok_;
  static std::unique_ptr<ShardPlan> plan_;
  static std::unique_ptr<Backend> backend_;
};
std::unique_ptr<MpiCommunicator> SpeculativeTest::world_;
std::unique_ptr<ModelFiles> SpeculativeTest::files_;
std::unique_ptr<Tokenizer> SpeculativeTest::tok_;
std::unique_ptr<ShardPlan> SpeculativeTest::plan_;
std::unique_ptr<Backend> SpeculativeTest::backend_;

// The real stories260k model retells its own story: prompt lookup guesses well. A batch
// of greedy requests (EOS, short and long max_new_tokens, logprobs through the shard
// path, a repetition penalty, logprobs with a penalty through the full-logits path) and
// a sampled one that does not speculate; then each greedy request alone.
TEST_F(SpeculativeTest, GreedyStoriesAreTheSameWithPromptLookup) {
  auto engine = target(/*max_batch=*/4, 96);
  const Tokenizer& tok = *tok_;
  const Ids story = tok.encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
      "saw a big red ball. Once upon a time, there was a little girl named Lily. She loved to");
  std::vector<BatchRequest> reqs(6);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt.assign(story.begin(), story.end() - static_cast<long>(3 * i));
    reqs[i].max_new_tokens = i == 1 ? 3 : 120;
    reqs[i].eos_ids = {2};
  }
  reqs[2].top_logprobs = 2;                         // shard path logprobs
  reqs[3].sampling.repetition_penalty = 1.3;        // penalties over the guess rows
  reqs[4].top_logprobs = 1;                         // logprobs with a penalty: the full path
  reqs[4].sampling.presence_penalty = 0.4;
  reqs[5].sampling.temperature = 0.8, reqs[5].sampling.seed = 9;  // sampled
  const int tp = world_->size();
  const SpeculativeStats batch = expect_same(*engine, reqs, "batch", tp);
  EXPECT_GT(batch.accepted, 20) << "proposed " << batch.proposed;
  EXPECT_GT(batch.proposed, batch.accepted) << "some guesses are rejected";
  for (size_t i = 0; i < 5; ++i) expect_same(*engine, {reqs[i]}, "alone " + std::to_string(i), tp);
  // A step budget smaller than the guesses: they are cut, the output is the same.
  expect_same(*engine, reqs, "budget 3", tp, 4, 3);
  expect_same(*engine, reqs, "one guess", tp, 1);
}

// The draft proposer keeps each sequence's K/V across calls, rewinding to the tokens
// still valid: its guesses must be those of a proposer that starts afresh on the same
// tokens, whatever was kept, rejected or skipped in between. Three sequences, a budget
// of 5 (prompts split over passes), random acceptance, calls skipped (longer catch-ups),
// a sequence finished and another taking its place.
TEST_F(SpeculativeTest, DraftProposerGuessesAsIfItStartedAfresh) {
  auto kept = draft(4, 4, 64);
  auto fresh = draft(4, 4, 64);
  DraftProposer proposer(*kept, files_->config.vocab_size, 5);
  const Tokenizer& tok = *tok_;
  std::vector<Ids> seqs = {tok.encode("Once upon a time, there was a little girl"), tok.encode("One day, a big dog"),
                           tok.encode("Tom and Sue went to the park. They")};
  std::vector<int64_t> ids = {0, 1, 2};
  std::mt19937 rng(5);  // the same stream on every rank
  int64_t kept_guesses = 0, rewound = 0;
  for (int round = 0; round < 24; ++round) {
    std::vector<DraftProposer::Want> wants;
    std::vector<size_t> which;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (rng() % 4 == 0) continue;  // not guessing this step: the draft falls behind
      wants.push_back({ids[i], seqs[i], 1 + static_cast<int64_t>(rng() % 4), 200});
      which.push_back(i);
    }
    const auto got = proposer.propose(wants);
    ASSERT_EQ(got.size(), wants.size());
    for (size_t j = 0; j < wants.size(); ++j) {
      DraftProposer alone(*fresh, files_->config.vocab_size, 4096);
      const auto want = alone.propose({wants[j]});
      ASSERT_EQ(got[j], want.at(0)) << "round " << round << " sequence " << which[j];
      ASSERT_EQ(static_cast<int64_t>(got[j].size()), wants[j].k);
    }
    // The target keeps a random prefix of each sequence's guesses, then adds a token of
    // its own (a random one); sequences that did not guess get 1-3 tokens.
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto j = std::find(which.begin(), which.end(), i);
      if (j != which.end()) {
        const Ids& g = got[static_cast<size_t>(j - which.begin())];
        const size_t a = rng() % (g.size() + 1);
        seqs[i].insert(seqs[i].end(), g.begin(), g.begin() + static_cast<long>(a));
        kept_guesses += static_cast<int64_t>(a);
        rewound += a < g.size() ? 1 : 0;
      }
      for (uint32_t n = j == which.end() ? 1 + rng() % 3 : 1; n > 0; --n) seqs[i].push_back(static_cast<int32_t>(3 + rng() % 400));
    }
    if (round == 12) {  // sequence 1 ends; a new one takes its place
      proposer.finish(ids[1]);
      ids[1] = 7;
      seqs[1] = tok.encode("The sun was hot");
    }
  }
  EXPECT_GT(kept_guesses, 10);
  EXPECT_GT(rewound, 10);
  EXPECT_EQ(proposer.sequences(), 3);
  // Room: no guess at or past the request's last position (length - 1).
  DraftProposer tight(*fresh, files_->config.vocab_size, 4096);
  const Ids t = seqs[0];
  const int64_t n = static_cast<int64_t>(t.size());
  EXPECT_EQ(tight.propose({{9, t, 4, n + 3}}).at(0).size(), 2u);
  EXPECT_EQ(tight.propose({{10, t, 4, n + 1}}).at(0).size(), 0u);
  // An id the draft has no row for (a target with more rows): no guesses, no pages, and
  // the other sequences of the call still guess.
  const int64_t pages_before = tight.sequences();
  const auto mixed = tight.propose({{11, Ids{5, 600, 7}, 3, 100}, {12, Ids{5, 6, 7}, 3, 100}});
  EXPECT_TRUE(mixed.at(0).empty());
  EXPECT_EQ(mixed.at(1).size(), 3u);
  EXPECT_EQ(tight.sequences(), pages_before + 1);
}

// The draft model (issue 27): the same batch and each request alone, with an early-exit
// draft (stories260k's first 4 of 5 layers: 30% of its guesses kept), with the
// target as its own draft (every guess of an unpenalized greedy request kept, but those
// past its end), and with a draft pool that holds one request at a time (the others go
// without guesses until it is free).
TEST_F(SpeculativeTest, GreedyStoriesAreTheSameWithADraftModel) {
  auto engine = target(/*max_batch=*/4, 96);
  auto early = draft(4, 4, 96);
  auto self = draft(0, 4, 96);
  auto small = draft(4, 4, 8);
  const Tokenizer& tok = *tok_;
  const Ids story = tok.encode("Once upon a time, there was a little girl named Lily. She loved to play outside");
  std::vector<BatchRequest> reqs(6);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt.assign(story.begin(), story.end() - static_cast<long>(2 * i));
    reqs[i].max_new_tokens = i == 1 ? 3 : 100;
    reqs[i].eos_ids = {2};
  }
  reqs[2].top_logprobs = 2;
  reqs[3].sampling.repetition_penalty = 1.3;
  reqs[4].top_logprobs = 1;
  reqs[4].sampling.presence_penalty = 0.4;
  reqs[5].sampling.temperature = 0.8, reqs[5].sampling.seed = 9;
  const int tp = world_->size();
  const SpeculativeStats batch = expect_same_drafted(*engine, *early, reqs, "early-exit draft", tp);
  EXPECT_GT(batch.accepted, 20) << "proposed " << batch.proposed;
  EXPECT_GT(batch.proposed, batch.accepted) << "some guesses are rejected";
  for (size_t i = 0; i < reqs.size(); ++i) expect_same_drafted(*engine, *early, {reqs[i]}, "alone " + std::to_string(i), tp);
  expect_same_drafted(*engine, *early, reqs, "budget 3", tp, 4, 3);
  expect_same_drafted(*engine, *early, reqs, "one guess", tp, 1);
  const SpeculativeStats crowded = expect_same_drafted(*engine, *small, reqs, "a one-request draft pool", tp);
  EXPECT_GT(crowded.accepted, 0);
  // The target as its own draft: unpenalized greedy requests lose at most the guesses
  // made past their last token (k a request).
  const std::vector<BatchRequest> greedy(reqs.begin(), reqs.begin() + 3);
  const SpeculativeStats all = expect_same_drafted(*engine, *self, greedy, "its own draft", tp, 5);
  EXPECT_GT(all.accepted, 40);
  EXPECT_LE(all.proposed - all.accepted, static_cast<int64_t>(greedy.size()) * 5) << "accepted " << all.accepted;
  expect_same_drafted(*engine, *self, reqs, "its own draft, every kind", tp, 3);
}

// Sampled requests with speculation draw each row as without it (the same sampler and
// random stream) and keep a guess when the row before drew it: the output is plain
// decoding's, seed for seed, whatever the batch, the budget or k; so the tokens'
// distribution is the target's. Checked on 400 seeds of one prompt (temperature 1.5, no
// cut, but for three requests with top-p, top-k, a penalty): every request's tokens
// equal plain decoding's, guesses are kept, and the first token's histogram fits the
// model's softmax at that temperature (Pearson's chi-square over the ids
// expected at least 5 times, the rest pooled, below the 0.9999 quantile).
TEST_F(SpeculativeTest, SampledOutputIsPlainDecodingsAndFollowsTheSoftmax) {
  auto engine = target(/*max_batch=*/16, 64);
  const Tokenizer& tok = *tok_;
  const Ids story =
      tok.encode("Once upon a time, there was a girl. She had a dog. Once upon a time, there was a girl. She had a");
  std::vector<BatchRequest> reqs(400);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt = story;
    reqs[i].max_new_tokens = 6;
    reqs[i].sampling.temperature = 1.5;
    reqs[i].sampling.seed = i;
  }
  reqs[1].sampling.top_p = 0.9, reqs[2].sampling.top_k = 5, reqs[3].sampling.repetition_penalty = 1.2;
  const auto plain = generate_batch(*engine, reqs, BatchOptions{});
  for (const int64_t k : {int64_t{4}, int64_t{1}}) {
    SpeculativeStats stats;  // k 1 with a budget that cuts guesses: that changes nothing either
    const auto got = generate_batch(*engine, reqs, ngram_options(k, k == 1 ? 20 : 4096, 4, &stats));
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got[i].ids, plain[i].ids) << "seed " << i << " k " << k << " at tp " << world_->size();
    }
    EXPECT_GT(stats.accepted, 10) << "k " << k;  // 34 and 29 at the time of writing
  }
  {  // the draft model: an early-exit draft's greedy guesses, kept by the same rule
    auto early = draft(4, 16, 64);
    SpeculativeStats stats;
    const auto got = generate_batch(*engine, reqs, draft_options(*early, 3, 4096, &stats));
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got[i].ids, plain[i].ids) << "seed " << i << " with a draft model at tp " << world_->size();
    }
    EXPECT_GT(stats.accepted, 10) << "with a draft model";
  }
  const std::vector<float> logits = engine->next_token(story);  // a collective: every rank
  double mx = -1e30;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  std::vector<double> p(logits.size());
  double z = 0.0;
  for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp((static_cast<double>(logits[i]) - mx) / 1.5);
  std::vector<int> count(p.size(), 0);
  for (size_t i = 4; i < plain.size(); ++i) count[static_cast<size_t>(plain[i].ids.at(0))]++;  // no cut, no penalty
  const double n = static_cast<double>(plain.size() - 4);
  double chi2 = 0.0, pooled_e = 0.0, pooled_o = 0.0;
  int df = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = n * p[i] / z;
    if (e >= 5.0) {
      chi2 += (count[i] - e) * (count[i] - e) / e;
      ++df;
    } else {
      pooled_e += e;
      pooled_o += count[i];
    }
  }
  if (pooled_e > 0.0) {
    chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++df;
  }
  ASSERT_GE(df, 1);
  // The 0.9999 quantile of chi-square by Wilson-Hilferty (z = 3.719; 16.2 at 1 df, the
  // exact 15.1: a little above).
  const double a = 2.0 / (9.0 * df), q = df * std::pow(1.0 - a + 3.719 * std::sqrt(a), 3.0);
  EXPECT_LT(chi2, q) << df << " degrees of freedom";
}

// Every architecture fixture (llama3 rope, Qwen3 QK-norm, Phi-3 and Mistral sliding
// window 16), 32 prompts that repeat a random segment so that guesses are made, greedy,
// in one batch of 32 through chunked prefill (a 40-token budget).
class SpeculativeFixtureTest : public testing::TestWithParam<std::string> {};

TEST_P(SpeculativeFixtureTest, GreedyOutputIsTheSame) {
  const ModelFiles files = open_model(test::test_data_dir() / "fixtures" / GetParam() / "f32");
  MpiCommunicator world(MPI_COMM_WORLD);
  if (files.config.num_attention_heads % world.size() != 0) GTEST_SKIP() << "heads do not split over this tp";
  auto backend = make_cpu_backend(1);
  const ShardPlan plan = ShardPlan::make(files.config, world.rank(), world.size());
  auto engine = make_engine(files, plan, *backend, world, 192, /*max_batch=*/32, /*page_size=*/16, 200);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(files.config.vocab_size - 1));
  std::vector<BatchRequest> reqs(32);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Ids seg(8 + 2 * (i % 8));
    for (auto& t : seg) t = id(rng);
    for (int r = 0; r < 3; ++r) reqs[i].prompt.insert(reqs[i].prompt.end(), seg.begin(), seg.end());
    reqs[i].max_new_tokens = 24;
    reqs[i].top_logprobs = i == 0 ? 3 : -1;
  }
  const SpeculativeStats stats = expect_same(*engine, reqs, GetParam(), world.size(), 3, 40, 4);
  EXPECT_GT(stats.proposed, 0) << GetParam();
  // The draft model: the fixture as its own draft (every guess kept but those past a
  // request's last token), and its first layer alone (random weights: mostly rejected).
  auto self = draft_engine(files, plan, *backend, world, 0, 192, 32, 200);
  const SpeculativeStats own = expect_same_drafted(*engine, *self, reqs, GetParam() + " as its own draft", world.size(), 3, 40);
  EXPECT_GT(own.accepted, 0) << GetParam();
  EXPECT_LE(own.proposed - own.accepted, static_cast<int64_t>(reqs.size()) * 3) << GetParam();
  auto one = draft_engine(files, plan, *backend, world, 1, 192, 32, 200);
  const SpeculativeStats first = expect_same_drafted(*engine, *one, reqs, GetParam() + " one-layer draft", world.size(), 3, 40);
  EXPECT_GT(first.proposed, 0) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Architectures, SpeculativeFixtureTest, testing::Values("llama31", "qwen3", "phi3", "mistral"));

}  // namespace
}  // namespace linnet
