// The paged KV cache: PagePool bookkeeping (unit), and at the tp size of the mpirun job
// (1, 2, 4) the paged entries against the contiguous ones on stories260k: shuffled page
// tables and chunked prefill give the same logits; PagedScheduler-driven greedy
// generation with a shared prompt prefix gives each prompt's tokens alone, and the
// shared pages show in the pool's stats.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "common/error.h"
#include "loader/tokenizer/tokenizer.h"
#include "parallel/mpi_communicator.h"
#include "runtime/batch_generate.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "runtime/page_pool.h"
#include "runtime/paged_scheduler.h"
#include "runtime/batch_session.h"
#include "runtime/sampler.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

TEST(PagePool, AllocatesReleasesAndSharesWholePages) {
  PagePool pool(4, 2);
  auto a = pool.allocate(3);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(pool.allocate(2)) << "only one page is left";
  EXPECT_EQ(pool.available_pages(), 1);
  // Pages 0 and 1 hold the tokens 5 6 | 7 8; the third page is partial (not shared).
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9};
  pool.register_prefix(*a, tokens);
  const std::vector<int32_t> same = {5, 6, 7, 8, 9, 10};
  EXPECT_EQ(pool.match_prefix(same, 6), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(pool.stats().prefix_hit_tokens, 4);
  // A different second page shares only the first.
  const std::vector<int32_t> other = {5, 6, 7, 0};
  EXPECT_EQ(pool.match_prefix(other, 4), (std::vector<int32_t>{0}));
  // max_tokens cuts the match to whole pages inside it.
  EXPECT_EQ(pool.match_prefix(same, 3), (std::vector<int32_t>{0}));
  // The same page tokens after a different first page do not match (prefix identity).
  const std::vector<int32_t> shifted = {1, 1, 7, 8};
  EXPECT_TRUE(pool.match_prefix(shifted, 4).empty());
  pool.release(std::vector<int32_t>{0, 0, 0, 1});  // the three matches
  pool.release(*a);
  EXPECT_EQ(pool.available_pages(), 4);
  // Unheld registered pages stay cached until fresh pages run out.
  EXPECT_EQ(pool.match_prefix(same, 6), (std::vector<int32_t>{0, 1}));
  pool.release(std::vector<int32_t>{0, 1});
  auto all = pool.allocate(4);  // takes the two free pages, then evicts 0 and 1
  ASSERT_TRUE(all);
  EXPECT_EQ(pool.stats().evicted_pages, 2);
  EXPECT_TRUE(pool.match_prefix(same, 6).empty()) << "evicted pages are forgotten";
  EXPECT_EQ(pool.stats().peak_used_pages, 4);
}

class PagedTest : public testing::Test {
 protected:
  static constexpr int64_t kMaxSeqLen = 256;
  static void SetUpTestSuite() {
    files_ = std::make_unique<ModelFiles>(open_model(test::stories_dir()));
    backend_ = make_cpu_backend(1);
    world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    const ShardPlan plan = ShardPlan::make(files_->config, world_->rank(), world_->size());
    // 24 pages of 64 positions: fewer than 8 full-length requests need.
    paged_ = make_engine(*files_, plan, *backend_, *world_, kMaxSeqLen, /*max_batch=*/1, kKvPageSize, 24);
    single_ = make_engine(*files_, plan, *backend_, *world_, kMaxSeqLen);
  }
  static void TearDownTestSuite() {
    paged_.reset();
    single_.reset();
    world_.reset();
    backend_.reset();
    files_.reset();
  }
  static std::vector<int32_t> story(size_t n) {
    const Tokenizer tok = Tokenizer::from_dir(test::stories_dir());
    std::vector<int32_t> ids = tok.encode(
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
        "friends. One day, she saw a big red ball under a tree. She ran to get it, but a small dog got there "
        "first. The dog wagged its tail and looked at Lily. Lily smiled and said, let us play together. They "
        "played all day until the sun went down, and then Lily went home to eat dinner with her mom and dad.");
    while (ids.size() < n) ids.insert(ids.end(), ids.begin() + 1, ids.end());
    ids.resize(n);
    return ids;
  }
  static void expect_near(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    float worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LT(worst, 1e-4) << what;
  }

  static inline std::unique_ptr<ModelFiles> files_;
  static inline std::unique_ptr<Backend> backend_;
  static inline std::unique_ptr<MpiCommunicator> world_;
  static inline std::unique_ptr<Engine> paged_, single_;
};

// A 150-token prompt over pages {17, 3, 9} (out of order), prefilled in three chunks of
// 70 / 50 / 30, then two decode steps: each logits row equals the contiguous engine's.
TEST_F(PagedTest, ChunkedPrefillOverShuffledPagesMatchesContiguous) {
  const std::vector<int32_t> prompt = story(152);
  const std::vector<std::vector<int32_t>> table = {{17, 3, 9}};
  const int64_t V = files_->config.vocab_size;
  int64_t pos = 0;
  for (int64_t n : {70, 50, 30}) {
    Engine::PagedBatch b;
    b.page_tables = table;
    for (int64_t i = 0; i < n; ++i) {
      b.tokens.push_back(prompt[pos + i]);
      b.seq.push_back(0);
      b.positions.push_back(static_cast<int32_t>(pos + i));
    }
    const std::vector<float> got = paged_->prefill_paged(b);
    pos += n;
    const std::vector<float> want = single_->next_token(std::span<const int32_t>(prompt).first(pos));
    ASSERT_EQ(static_cast<int64_t>(got.size()), V);
    expect_near(got, want, "after " + std::to_string(pos) + " prompt tokens");
  }
  for (int k = 0; k < 2; ++k) {
    const int32_t token = prompt[pos];
    const int32_t p = static_cast<int32_t>(pos);
    const std::vector<float> got = paged_->decode_paged(std::span<const int32_t>(&token, 1),
                                                        std::span<const int32_t>(&p, 1), table);
    ++pos;
    expect_near(got, single_->next_token(std::span<const int32_t>(prompt).first(pos)), "decode step " + std::to_string(k));
  }
  // A page outside the pool is refused, naming the entry.
  Engine::PagedBatch bad;
  bad.tokens = {1};
  bad.seq = {0};
  bad.positions = {0};
  bad.page_tables = {{24}};
  EXPECT_THROW(paged_->prefill_paged(bad), Error);
}

// prefill_slots: three prompts padded to 40 (junk in the padding) into rows 2, 0, 1 of
// a row-addressed engine; each logits row equals the prompt's own next_token.
TEST_F(PagedTest, PrefillSlotsIgnoresThePaddingAndFillsEachRow) {
  auto rows = make_engine(*files_, ShardPlan::make(files_->config, world_->rank(), world_->size()), *backend_, *world_,
                          kMaxSeqLen, /*max_batch=*/3);
  const std::vector<int32_t> story_ids = story(120);
  const int64_t S = 40, V = files_->config.vocab_size;
  const std::vector<int32_t> lengths = {40, 7, 23}, slots = {2, 0, 1};
  std::vector<int32_t> tokens(3 * S, 5);  // padding: token 5
  for (int m = 0; m < 3; ++m) std::copy_n(story_ids.begin() + 30 * m, lengths[m], tokens.begin() + m * S);
  const std::vector<float> got = rows->prefill_slots(tokens, slots, lengths);
  ASSERT_EQ(static_cast<int64_t>(got.size()), 3 * V);
  for (int m = 0; m < 3; ++m) {
    const std::vector<int32_t> prompt(story_ids.begin() + 30 * m, story_ids.begin() + 30 * m + lengths[m]);
    expect_near(std::vector<float>(got.begin() + m * V, got.begin() + (m + 1) * V), single_->next_token(prompt),
                "prompt " + std::to_string(m));
  }
  // Decoding continues in each slot: row 0 holds prompt 1 (7 tokens).
  const int32_t next = story_ids[30 + 7], row = 0, pos = 7;
  const std::vector<float> step = rows->decode_rows(std::span<const int32_t>(&next, 1), std::span<const int32_t>(&row, 1),
                                                    std::span<const int32_t>(&pos, 1));
  expect_near(step, single_->next_token(std::vector<int32_t>(story_ids.begin() + 30, story_ids.begin() + 38)),
              "decode after prefill_slots");
  const std::vector<int32_t> bad_len = {41, 7, 23};
  EXPECT_THROW(rows->prefill_slots(tokens, slots, bad_len), Error);
}

// Greedy generation driven by PagedScheduler: 10 prompts, 8 of them sharing a 140-token
// prefix (two full pages), with a 48-token step budget (chunked prefill) and at most 4
// running. Each result equals the prompt generated alone; the later prompts reuse the
// prefix pages.
TEST_F(PagedTest, SchedulerSharesPrefixPagesAndMatchesEachAlone) {
  const std::vector<int32_t> base = story(200);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> p;
    if (i % 5 == 4) {  // two prompts without the shared prefix
      p = std::vector<int32_t>(base.begin() + 30, base.begin() + 60 + i);
    } else {
      p = std::vector<int32_t>(base.begin(), base.begin() + 140);
      p.insert(p.end(), base.begin() + 150 + i, base.begin() + 155 + 2 * i);  // a distinct tail
    }
    prompts.push_back(p);
  }
  const int64_t max_new = 12;
  PagePool pool(paged_->num_pages(), paged_->page_size());
  PagedScheduler sched(pool, /*max_batch=*/4, kMaxSeqLen, /*token_budget=*/48);
  for (size_t i = 0; i < prompts.size(); ++i) ASSERT_FALSE(sched.add(static_cast<int64_t>(i), prompts[i], max_new));
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<std::vector<float>> first_logits(prompts.size());
  const int64_t V = files_->config.vocab_size;
  int steps = 0;
  while (auto step = sched.next_step()) {
    ++steps;
    const std::vector<float> logits = paged_->step_paged(step->batch);
    sched.done_step(*step);
    for (size_t k = 0; k < step->ids.size(); ++k) {
      const int64_t id = step->ids[k];
      const std::span<const float> row = std::span<const float>(logits).subspan(k * V, V);
      if (out[id].empty()) first_logits[id].assign(row.begin(), row.end());
      int32_t token = Sampler::argmax(row);
      world_->broadcast(&token, sizeof token, 0);
      out[id].push_back(token);
      if (static_cast<int64_t>(out[id].size()) == max_new) {
        sched.finish(id);
      } else {
        sched.append(id, token);
      }
    }
  }
  EXPECT_TRUE(sched.idle());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GenerationResult alone = generate_until(*single_, prompts[i], SamplingParams{}, max_new, {});
    EXPECT_EQ(out[i], alone.ids) << "prompt " << i << " at tp " << world_->size();
    expect_near(first_logits[i], single_->next_token(prompts[i]), "prompt " + std::to_string(i) + " logits");
  }
  // The first four run together (none cached yet); the next shared-prefix prompts find
  // the two full prefix pages (128 tokens) registered.
  EXPECT_GE(sched.pool_stats().prefix_hit_pages, 2 * 4) << "steps " << steps;
  EXPECT_EQ(sched.pool_stats().prefix_hit_tokens, sched.pool_stats().prefix_hit_pages * kKvPageSize);
  EXPECT_LE(sched.pool_stats().peak_used_pages, 24);
  // A request longer than the whole pool is refused at add().
  PagePool small(2, kKvPageSize);
  PagedScheduler tight(small, 4, kMaxSeqLen, 48);
  const auto err = tight.add(99, std::vector<int32_t>(200, 1), 2000);
  ASSERT_TRUE(err);
  EXPECT_NE(err->find("--kv-cache-tokens"), std::string::npos) << *err;
}

// Issue 26, item 1: a greedy step's argmax on each rank's vocab shard, merged from 3
// numbers a row (Engine::step_paged_top with k = 1), picks the token Sampler's greedy argmax
// picks from the gathered row, bit for bit, at every tp size and with a vocab limit
// inside a shard. Each pass runs twice on the same batch (the second writes the same
// K/V to the same slots).
TEST_F(PagedTest, ShardArgmaxPicksTheSamplersGreedyToken) {
  const std::vector<int32_t> base = story(120);
  const int64_t V = files_->config.vocab_size;
  for (const int64_t limit : {int64_t{0}, V / 2 + 3}) {
    PagePool pool(paged_->num_pages(), paged_->page_size());
    PagedScheduler sched(pool, /*max_batch=*/3, kMaxSeqLen, /*token_budget=*/40);
    for (int i = 0; i < 5; ++i) {
      ASSERT_FALSE(sched.add(i, std::vector<int32_t>(base.begin() + 7 * i, base.begin() + 50 + 9 * i), 6));
    }
    std::vector<int> made(5, 0);
    int rows = 0;
    while (auto step = sched.next_step()) {
      const std::vector<float> logits = paged_->step_paged(step->batch);
      const std::vector<Engine::TopCandidates> picks = paged_->step_paged_top(step->batch, limit, 1);
      sched.done_step(*step);
      ASSERT_EQ(picks.size(), step->ids.size());
      for (size_t k = 0; k < step->ids.size(); ++k) {
        const int64_t n = limit > 0 ? limit : V;
        const std::span<const float> row = std::span<const float>(logits).subspan(k * V, n);
        const int32_t want = Sampler::argmax(row);
        ASSERT_EQ(picks[k].ids.size(), 1u);
        EXPECT_EQ(picks[k].ids[0], want) << "limit " << limit << " at tp " << world_->size();
        EXPECT_EQ(picks[k].logits[0], row[static_cast<size_t>(want)]);
        EXPECT_EQ(picks[k].bad_id, -1);
        ++rows;
        const int64_t id = step->ids[k];
        if (++made[id] == 6) {
          sched.finish(id);
        } else {
          sched.append(id, want);
        }
      }
    }
    EXPECT_EQ(rows, 5 * 6);
  }
}

// Issue 26, item 1: top-k sampling from the shards' merged candidates
// (Engine::step_paged_top + Sampler::sample_top) draws the token Sampler::sample draws
// from the gathered row, with the same seed, step after step (the same random stream):
// temperatures high enough that the cuts matter (a top-k of 64 candidates handed to a
// request of top_k 5 would draw other tokens), top-k up to 64, top-p and min-p, greedy
// rows among them, at every tp size
// and with a vocab limit inside a shard. Each pass runs twice on the same batch.
TEST_F(PagedTest, ShardTopKDrawsTheSamplersToken) {
  const std::vector<int32_t> base = story(120);
  const int64_t V = files_->config.vocab_size;
  std::vector<SamplingParams> settings(4);
  settings[0].temperature = 3.0, settings[0].top_k = 5, settings[0].seed = 11;
  settings[1].temperature = 2.0, settings[1].top_k = 40, settings[1].top_p = 0.95, settings[1].seed = 12;
  settings[2].temperature = 1.5, settings[2].top_k = 64, settings[2].min_p = 0.02, settings[2].seed = 13;
  settings[3].temperature = 0.0;  // greedy among them
  for (const int64_t limit : {int64_t{0}, V / 2 + 3}) {
    PagePool pool(paged_->num_pages(), paged_->page_size());
    PagedScheduler sched(pool, /*max_batch=*/4, kMaxSeqLen, /*token_budget=*/40);
    std::vector<std::unique_ptr<Sampler>> full, top;
    for (int i = 0; i < 4; ++i) {
      SamplingParams p = settings[static_cast<size_t>(i)];
      p.vocab_limit = limit;
      full.push_back(std::make_unique<Sampler>(p));
      top.push_back(std::make_unique<Sampler>(p));
      ASSERT_FALSE(sched.add(i, std::vector<int32_t>(base.begin() + 5 * i, base.begin() + 40 + 7 * i), 8));
    }
    std::vector<int> made(4, 0);
    int drawn = 0;
    while (auto step = sched.next_step()) {
      const std::vector<float> logits = paged_->step_paged(step->batch);
      const std::vector<Engine::TopCandidates> cands = paged_->step_paged_top(step->batch, limit, 64);
      sched.done_step(*step);
      ASSERT_EQ(cands.size(), step->ids.size());
      for (size_t k = 0; k < step->ids.size(); ++k) {
        const int64_t id = step->ids[k];
        const std::span<const float> row = std::span<const float>(logits).subspan(k * V, V);
        ASSERT_EQ(cands[k].bad_id, -1);
        ASSERT_EQ(cands[k].ids.size(), static_cast<size_t>(std::min<int64_t>(64, limit > 0 ? limit : V)));
        const int32_t want = full[id]->sample(row);
        int32_t token = top[id]->sample_top(cands[k].ids, cands[k].logits);
        EXPECT_EQ(token, want) << "request " << id << " token " << made[id] << " limit " << limit << " at tp "
                               << world_->size();
        world_->broadcast(&token, sizeof token, 0);
        ++drawn;
        if (++made[id] == 8) {
          sched.finish(id);
        } else {
          sched.append(id, token);
        }
      }
    }
    EXPECT_EQ(drawn, 4 * 8);
  }
}

// The same with the sampler's penalties applied where the logits are (add_sampler_penalties
// -> Engine::step_paged_top -> Backend::apply_penalties): repetition above and below 1,
// presence and frequency, on sampled and greedy rows; the draw equals Sampler::sample over
// the full row with the context and the generated tokens, token for token.
TEST_F(PagedTest, ShardTopKWithPenaltiesDrawsTheSamplersToken) {
  const std::vector<int32_t> base = story(120);
  const int64_t V = files_->config.vocab_size;
  std::vector<SamplingParams> settings(4);
  settings[0].temperature = 1.5, settings[0].top_k = 20, settings[0].repetition_penalty = 1.3, settings[0].seed = 21;
  settings[1].temperature = 2.0, settings[1].top_k = 64, settings[1].presence_penalty = 0.8,
  settings[1].frequency_penalty = 0.6, settings[1].top_p = 0.95, settings[1].seed = 22;
  settings[2].temperature = 0.0, settings[2].repetition_penalty = 1.8;  // penalized greedy
  settings[3].temperature = 1.0, settings[3].top_k = 10, settings[3].repetition_penalty = 0.7,
  settings[3].frequency_penalty = -0.5, settings[3].seed = 24;
  PagePool pool(paged_->num_pages(), paged_->page_size());
  PagedScheduler sched(pool, /*max_batch=*/4, kMaxSeqLen, /*token_budget=*/40);
  std::vector<std::unique_ptr<Sampler>> full, top;
  std::vector<std::vector<int32_t>> prompts, made(4);
  for (int i = 0; i < 4; ++i) {
    full.push_back(std::make_unique<Sampler>(settings[static_cast<size_t>(i)]));
    top.push_back(std::make_unique<Sampler>(settings[static_cast<size_t>(i)]));
    prompts.emplace_back(base.begin() + 3 * i, base.begin() + 30 + 5 * i);
    ASSERT_FALSE(sched.add(i, prompts.back(), 10));
  }
  int drawn = 0;
  while (auto step = sched.next_step()) {
    std::vector<Backend::Penalty> pen;
    for (size_t k = 0; k < step->ids.size(); ++k) {
      const int64_t id = step->ids[k];
      add_sampler_penalties(settings[static_cast<size_t>(id)], prompts[id], made[id], static_cast<int32_t>(k), pen);
    }
    const std::vector<float> logits = paged_->step_paged(step->batch);
    const std::vector<Engine::TopCandidates> cands = paged_->step_paged_top(step->batch, 0, 64, pen);
    sched.done_step(*step);
    for (size_t k = 0; k < step->ids.size(); ++k) {
      const int64_t id = step->ids[k];
      const std::span<const float> row = std::span<const float>(logits).subspan(k * V, V);
      std::vector<int32_t> context = prompts[id];
      context.insert(context.end(), made[id].begin(), made[id].end());
      const int32_t want = full[id]->sample(row, context, made[id]);
      int32_t token = top[id]->sample_top(cands[k].ids, cands[k].logits);
      EXPECT_EQ(token, want) << "request " << id << " token " << made[id].size() << " at tp " << world_->size();
      world_->broadcast(&token, sizeof token, 0);
      made[id].push_back(token);
      ++drawn;
      if (made[id].size() == 10) {
        sched.finish(id);
      } else {
        sched.append(id, token);
      }
    }
  }
  EXPECT_EQ(drawn, 4 * 10);
}

// Issue 26, item 1: what has no top-k cut and what asks for logprobs through the
// shards too. A top-p / min-p over the whole vocabulary draws from the merged 64 best and
// the whole row's normalizer (Engine::RowSum, divisor = temperature) when the cut ends
// inside them, and gets its whole row (want_full) when it does not; a temperature with
// no cut always gets its whole row; logprobs come from the candidates and the divisor-1
// normalizer. Tokens equal Sampler::sample over step_paged's row, the same random
// stream; logprobs equal Sampler::logprobs bit for bit; at every tp size and with a
// vocab limit inside a shard. Both branches of the nucleus are taken.
TEST_F(PagedTest, ShardNucleusAndLogprobsMatchTheFullPath) {
  const std::vector<int32_t> base = story(120);
  const int64_t V = files_->config.vocab_size;
  std::vector<SamplingParams> settings(4);
  settings[0].temperature = 1.5, settings[0].top_p = 0.9, settings[0].seed = 31;
  settings[1].temperature = 2.5, settings[1].min_p = 0.05, settings[1].top_p = 0.97, settings[1].seed = 32;
  settings[1].repetition_penalty = 1.3, settings[1].presence_penalty = 0.5;  // penalized nucleus
  settings[2].temperature = 1.0, settings[2].seed = 33;  // no cut: its whole row, penalized
  settings[2].frequency_penalty = 0.4;
  settings[3].temperature = 0.0;                         // greedy
  const std::vector<int64_t> top_logprobs = {3, -1, -1, 5};  // logprobs rows have no penalty
  int within = 0, past = 0;
  for (const int64_t limit : {int64_t{0}, V / 2 + 3}) {
    PagePool pool(paged_->num_pages(), paged_->page_size());
    PagedScheduler sched(pool, /*max_batch=*/4, kMaxSeqLen, /*token_budget=*/40);
    std::vector<std::unique_ptr<Sampler>> full, top;
    std::vector<SamplingParams> params;
    std::vector<std::vector<int32_t>> prompts, made(4);
    for (int i = 0; i < 4; ++i) {
      params.push_back(settings[static_cast<size_t>(i)]);
      params.back().vocab_limit = limit;
      full.push_back(std::make_unique<Sampler>(params.back()));
      top.push_back(std::make_unique<Sampler>(params.back()));
      prompts.emplace_back(base.begin() + 5 * i, base.begin() + 40 + 7 * i);
      ASSERT_FALSE(sched.add(i, prompts.back(), 10));
    }
    while (auto step = sched.next_step()) {
      std::vector<Engine::RowSum> sums;
      std::vector<int> nucleus(step->ids.size(), -1), lp(step->ids.size(), -1);
      for (size_t k = 0; k < step->ids.size(); ++k) {
        const int64_t id = step->ids[k];
        int n = 0;
        if (id < 2) {
          nucleus[k] = n++;
          sums.push_back({static_cast<int32_t>(k), params[id].temperature});
        }
        if (top_logprobs[id] >= 0) {
          lp[k] = n++;
          sums.push_back({static_cast<int32_t>(k), 1.0});
        }
      }
      const auto want_full = [&](int64_t row, const Engine::TopCandidates& c) {
        const int64_t id = step->ids[static_cast<size_t>(row)];
        if (id == 2) return true;
        return id < 2 && !Sampler::nucleus_within(params[id], c.logits, c.sums.at(nucleus[row]));
      };
      std::vector<Backend::Penalty> pen;
      for (size_t k = 0; k < step->ids.size(); ++k) {
        const int64_t id = step->ids[k];
        add_sampler_penalties(params[id], prompts[id], made[id], static_cast<int32_t>(k), pen);
      }
      const std::vector<float> logits = paged_->step_paged(step->batch);
      const std::vector<Engine::TopCandidates> cands = paged_->step_paged_top(step->batch, limit, 64, pen, sums, want_full);
      sched.done_step(*step);
      ASSERT_EQ(cands.size(), step->ids.size());
      for (size_t k = 0; k < step->ids.size(); ++k) {
        const int64_t id = step->ids[k];
        const std::span<const float> row = std::span<const float>(logits).subspan(k * V, V);
        const Engine::TopCandidates& c = cands[k];
        ASSERT_EQ(c.bad_id, -1);
        std::vector<int32_t> context = prompts[id];
        context.insert(context.end(), made[id].begin(), made[id].end());
        const int32_t want = full[id]->sample(row, context, made[id]);
        int32_t token = -1;
        if (!c.full.empty()) {
          EXPECT_TRUE(id == 2 || id < 2) << "only rows that asked get their whole row";
          ASSERT_EQ(c.full.size(), static_cast<size_t>(V));
          if (id != 1 && id != 2) {
            EXPECT_TRUE(std::equal(c.full.begin(), c.full.end(), row.begin()));
          }
          token = top[id]->sample_penalized(c.full);
          past += id < 2;
        } else {
          EXPECT_NE(id, 2);
          token = top[id]->sample_top(c.ids, c.logits, nucleus[k] >= 0 ? c.sums.at(nucleus[k]) : -1.0);
          within += id < 2;
        }
        EXPECT_EQ(token, want) << "request " << id << " token " << made[id].size() << " limit " << limit << " at tp "
                               << world_->size();
        if (top_logprobs[id] >= 0) {
          const TokenLogprobs a = Sampler::logprobs(row, want, top_logprobs[id], limit);
          const TokenLogprobs b = c.full.empty()
                                      ? Sampler::logprobs_top(c.ids, c.logits, token, top_logprobs[id], c.sums.at(lp[k]))
                                      : Sampler::logprobs(c.full, token, top_logprobs[id], limit);
          EXPECT_EQ(a.logprob, b.logprob) << "request " << id << " token " << made[id].size();
          EXPECT_EQ(a.top, b.top) << "request " << id << " token " << made[id].size();
        }
        world_->broadcast(&token, sizeof token, 0);
        made[id].push_back(token);
        if (made[id].size() == 10) {
          sched.finish(id);
        } else {
          sched.append(id, token);
        }
      }
    }
    for (const auto& m : made) EXPECT_EQ(m.size(), 10u);
  }
  EXPECT_GT(within, 0) << "at tp " << world_->size();
  EXPECT_GT(past, 0) << "at tp " << world_->size();
}

// A request whose tokens come partly from the shard path (Sampler::sample_top) and partly
// from the full logits (a step with a logprobs request falls back) keeps its repetition
// penalty throughout: its tokens equal those it draws alone (all steps on the shard path),
// batch invariance making the logits equal. Two rows a step: the penalized request runs
// with a short greedy one first, then with one that asks for logprobs.
TEST_F(PagedTest, PenalizedRequestKeepsItsPenaltyAcrossPaths) {
  const ShardPlan plan = ShardPlan::make(files_->config, world_->rank(), world_->size());
  auto two = make_engine(*files_, plan, *backend_, *world_, kMaxSeqLen, /*max_batch=*/2, kKvPageSize, 24);
  const std::vector<int32_t> base = story(120);
  BatchRequest a, c, b;
  a.prompt.assign(base.begin(), base.begin() + 40);
  a.sampling.temperature = 1.2, a.sampling.top_k = 20, a.sampling.repetition_penalty = 3.0, a.sampling.seed = 5;
  a.max_new_tokens = 16;
  c.prompt.assign(base.begin() + 50, base.begin() + 70);
  c.max_new_tokens = 2;
  b.prompt.assign(base.begin() + 60, base.begin() + 90);
  b.max_new_tokens = 12;
  b.top_logprobs = 2;  // with a penalty: its steps gather the full logits
  b.sampling.presence_penalty = 0.5;
  const std::vector<int32_t> alone = generate_batch(*two, {a})[0].ids;
  const std::vector<GenerationResult> mixed = generate_batch(*two, {a, c, b});
  ASSERT_EQ(alone.size(), 16u);
  EXPECT_EQ(mixed[0].ids, alone) << "at tp " << world_->size();
  EXPECT_EQ(mixed[1].ids.size(), 2u);
  EXPECT_EQ(mixed[2].ids.size(), 12u);
}

// Settings the Sampler refuses (here a negative temperature with a nucleus and no top-k,
// which the shard path would otherwise turn into a normalizer's divisor) fail their own
// request, never the step: the others run on, at every tp size.
TEST_F(PagedTest, InvalidSamplingFailsOnlyItsRequest) {
  const ShardPlan plan = ShardPlan::make(files_->config, world_->rank(), world_->size());
  auto two = make_engine(*files_, plan, *backend_, *world_, kMaxSeqLen, /*max_batch=*/2, kKvPageSize, 24);
  const std::vector<int32_t> base = story(60);
  BatchRequest good, bad;
  good.prompt.assign(base.begin(), base.begin() + 30);
  good.max_new_tokens = 5;
  bad = good;
  bad.sampling.temperature = -1.0, bad.sampling.top_p = 0.9;
  const std::vector<GenerationResult> out = generate_batch(*two, {good, bad});
  EXPECT_EQ(out[0].finish_reason, "length");
  EXPECT_EQ(out[0].ids.size(), 5u);
  EXPECT_EQ(out[1].finish_reason, "error");
  if (world_->rank() == 0) {
    EXPECT_NE(out[1].error.find("temperature"), std::string::npos) << out[1].error;
  }
}

// The architectures' fixtures (llama3 rope, Qwen3 QK-norm, Phi-3 and Mistral sliding
// window 16) through generate_batch's paged path: prompts of ~150 tokens (three pages)
// sharing a 130-token prefix, a 40-token step budget (chunked prefill), at most 3
// running and a 12-page pool. Each request's greedy tokens and first logits equal the
// contiguous engine's (itself checked against transformers in test_fixtures).
class PagedFixtureTest : public testing::TestWithParam<std::string> {};

TEST_P(PagedFixtureTest, SharedPrefixesAndChunksMatchTheContiguousEngine) {
  const auto dir = test::test_data_dir() / "fixtures" / GetParam() / "f32";
  const ModelFiles files = open_model(dir);
  MpiCommunicator world(MPI_COMM_WORLD);
  if (files.config.num_attention_heads % world.size() != 0) GTEST_SKIP() << "heads do not split over this tp";
  auto backend = make_cpu_backend(1);
  const ShardPlan plan = ShardPlan::make(files.config, world.rank(), world.size());
  const int64_t L = 192;
  auto paged = make_engine(files, plan, *backend, world, L, /*max_batch=*/3, kKvPageSize, /*num_pages=*/12);
  auto single = make_engine(files, plan, *backend, world, L);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(files.config.vocab_size - 1));
  std::vector<int32_t> prefix(130);
  for (auto& t : prefix) t = id(rng);
  std::vector<BatchRequest> reqs(6);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt = prefix;
    for (size_t k = 0; k < 10 + 3 * i; ++k) reqs[i].prompt.push_back(id(rng));
    reqs[i].max_new_tokens = 8;
    reqs[i].top_logprobs = 0;  // keeps each token's logprob: compared below
  }
  PagePoolStats stats;
  BatchOptions options;
  options.step_token_budget = 40;
  options.kv_stats = &stats;
  const auto results = generate_batch(*paged, reqs, options);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerationResult alone = generate_until(*single, reqs[i].prompt, SamplingParams{}, 8, {});
    EXPECT_EQ(results[i].ids, alone.ids) << GetParam() << " request " << i << " at tp " << world.size();
    // First token's log-probability from the paged run vs the contiguous logits (a
    // collective: every rank computes them; the logprobs live on tp rank 0).
    const std::vector<float> logits = single->next_token(reqs[i].prompt);
    if (world.rank() != 0) continue;
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
    const double want = logits[alone.ids[0]] - mx - std::log(sum);
    ASSERT_FALSE(results[i].logprobs.empty());
    EXPECT_NEAR(results[i].logprobs[0].logprob, want, 1e-4) << GetParam() << " request " << i;
  }
  EXPECT_GE(stats.prefix_hit_tokens, 3 * 128) << "the last three requests share two prefix pages";
}

INSTANTIATE_TEST_SUITE_P(Architectures, PagedFixtureTest, testing::Values("llama31", "qwen3", "phi3", "mistral"));

}  // namespace
}  // namespace linnet
