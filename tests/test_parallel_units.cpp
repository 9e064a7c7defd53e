// ShardPlan splits, WorldConfig groups, the Sampler and the one-rank communicator,
// without MPI.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "parallel/self_communicator.h"
#include "parallel/shard_plan.h"
#include "parallel/tp_comm_choice.h"
#include "parallel/world_config.h"
#include "runtime/backend_factory.h"
#include "runtime/cuda_backend.h"
#include "runtime/kv_cache.h"
#include "runtime/model_loader.h"
#include "runtime/sampler.h"
#include "runtime/weights.h"
#include "tests/test_data.h"

namespace linnet {
namespace {

ModelConfig stories_like() {
  ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 64;
  c.intermediate_size = 172;
  c.num_hidden_layers = 5;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 8;
  c.vocab_size = 512;
  return c;
}

TEST(ShardPlan, EvenSplitsCoverEveryDimension) {
  const ModelConfig c = stories_like();
  for (int tp : {1, 2, 4}) {
    int64_t heads = 0, kv = 0, inter = 0, vocab = 0;
    for (int r = 0; r < tp; ++r) {
      const ShardPlan p = ShardPlan::make(c, r, tp);
      EXPECT_EQ(p.head_begin, heads);
      EXPECT_EQ(p.kv_head_begin, kv);
      EXPECT_EQ(p.intermediate_begin, inter);
      EXPECT_EQ(p.vocab_begin, vocab);
      heads += p.num_heads_local;
      kv += p.num_kv_heads_local;
      inter += p.intermediate_local;
      vocab += p.vocab_local;
    }
    EXPECT_EQ(heads, 8);
    EXPECT_EQ(kv, 4);
    EXPECT_EQ(inter, 172);
    EXPECT_EQ(vocab, 512);
  }
}

TEST(ShardPlan, RefusesSplitsNamingTheDimensionAndWorkingSizes) {
  const ModelConfig c = stories_like();
  try {
    ShardPlan::make(c, 0, 3);
    FAIL() << "tp 3 must be refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("num_attention_heads = 8"), std::string::npos) << m;
    EXPECT_NE(m.find("tp sizes that work for this model: 1, 2, 4"), std::string::npos) << m;
  }
  try {
    ShardPlan::make(c, 0, 8);
    FAIL() << "tp 8 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("intermediate_size = 172"), std::string::npos) << e.what();
  }
  ModelConfig gqa = stories_like();
  gqa.num_key_value_heads = 8;
  gqa.num_attention_heads = 24;
  gqa.intermediate_size = 192;
  try {
    ShardPlan::make(gqa, 0, 6);  // 8 KV heads over 6 ranks: neither divides the other
    FAIL() << "tp 6 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads = 8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tp sizes that work for this model: 1, 2, 4, 8, 24"), std::string::npos)
        << e.what();
  }
}

TEST(ShardPlan, KvHeadsAreReplicatedWhenTpExceedsThem) {
  ModelConfig c = stories_like();
  c.num_key_value_heads = 2;
  c.intermediate_size = 128;
  for (int r = 0; r < 8; ++r) {
    const ShardPlan p = ShardPlan::make(c, r, 8);
    EXPECT_EQ(p.num_heads_local, 1);
    EXPECT_EQ(p.head_begin, r);
    EXPECT_EQ(p.num_kv_heads_local, 1);
    EXPECT_EQ(p.kv_replication, 4);
    // q head r belongs to KV head r / (8 / 2), as in repeat_kv.
    EXPECT_EQ(p.kv_head_begin, r / 4);
  }
}

TEST(ShardPlan, VocabIsPaddedToAMultipleOfTp) {
  ModelConfig c = stories_like();
  c.vocab_size = 301;
  const ShardPlan p = ShardPlan::make(c, 3, 4);
  EXPECT_EQ(p.vocab_padded, 304);
  EXPECT_EQ(p.vocab_local, 76);
  EXPECT_EQ(p.vocab_begin, 228);
  EXPECT_EQ(ShardPlan::make(c, 0, 1).vocab_padded, 301);
}

// --activation-dtype int8 (runtime/weights.h: check_int8_activations): int4 layers only,
// with groups of a multiple of 32 at the tp size run; each refusal names the flag and why.
TEST(Int8Activations, FitOnlyInt4GroupsOfAMultipleOf32) {
  ModelConfig c = stories_like();
  c.intermediate_size = 128;
  auto refusal = [&](DType held, int64_t group, int tp) -> std::string {
    try {
      check_int8_activations(c, ShardPlan::make(c, 0, tp), held, group);
      return "";
    } catch (const Error& e) {
      return e.what();
    }
  };
  EXPECT_EQ(refusal(DType::kI4, 32, 1), "");
  EXPECT_EQ(refusal(DType::kI4, 64, 2), "");
  EXPECT_NE(refusal(DType::kI4, 16, 1).find("--activation-dtype: int8 activations are scaled per 32 inputs"),
            std::string::npos) << refusal(DType::kI4, 16, 1);
  for (DType held : {DType::kF32, DType::kBF16, DType::kI8}) {
    EXPECT_NE(refusal(held, 64, 1).find(std::string("the layers here are ") + dtype_name(held)), std::string::npos)
        << refusal(held, 64, 1);
  }
  WeightQuantization q;  // a compressed-tensors int4 checkpoint, per channel
  q.num_bits = 4;
  q.group_size = 0;
  c.quantization = q;
  EXPECT_EQ(refusal(DType::kF32, 0, 2), "") << "per channel: rows of 64 and 32";
  c.intermediate_size = 172;  // down_proj rows of 172: not whole blocks of 32
  EXPECT_NE(refusal(DType::kF32, 0, 1).find("down_proj (this rank's intermediate slice) has groups of 172 at tp 1"),
            std::string::npos) << refusal(DType::kF32, 0, 1);
  c.intermediate_size = 128;
  c.quantization->num_bits = 8;
  EXPECT_NE(refusal(DType::kF32, 0, 1).find("the layers here are compressed-tensors"), std::string::npos)
      << refusal(DType::kF32, 0, 1);
  c.quantization->num_bits = 4;
  c.quantization->fp8 = true;
  EXPECT_NE(refusal(DType::kF32, 0, 1).find("FP8"), std::string::npos) << refusal(DType::kF32, 0, 1);
}

TEST(WorldConfig, TpGroupsAreContiguousRanks) {
  const WorldConfig w = WorldConfig::make(5, 8, 4, 1, 4);
  EXPECT_EQ(w.tp_rank, 1);
  EXPECT_EQ(w.dp_rank, 1);
  EXPECT_EQ(w.dp_size, 2);
  EXPECT_EQ(WorldConfig::make(3, 4, 0, 3, 4).tp_size, 4);
  EXPECT_THROW(WorldConfig::make(0, 6, 4, 0, 6), Error);
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(Sampler::argmax(logits), 1);
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(Sampler, TopKAndTopPRestrictCandidates) {
  // Probabilities ~ softmax([4, 3, 2, 1, 0]): 0.64, 0.24, 0.09, 0.03, 0.01.
  const std::vector<float> logits = {1.0f, 4.0f, 0.0f, 3.0f, 2.0f};
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 2;
  p.seed = 7;
  Sampler top2(p);
  std::map<int, int> seen;
  for (int i = 0; i < 2000; ++i) seen[top2.sample(logits)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], seen[3]);
  p.top_k = 0;
  p.top_p = 0.8;  // 0.64 < 0.8 <= 0.88: ids 1 and 3
  Sampler nucleus(p);
  seen.clear();
  for (int i = 0; i < 2000; ++i) seen[nucleus.sample(logits)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(1) && seen.count(3));
  // Frequencies follow the renormalized probabilities 0.73 / 0.27 (loose bound).
  EXPECT_NEAR(seen[1] / 2000.0, 0.731, 0.05);
}

TEST(Sampler, SameSeedSameDraws) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = static_cast<float>(i % 7) * 0.3f;
  SamplingParams p;
  p.temperature = 0.8;
  p.seed = 42;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
}

// logits = log(p): softmax gives back p.
std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

TEST(Sampler, TopPKeepsExactlyTheNucleus) {
  // [0.3, 0.1, 0.1, 0.5] with top_p 0.8: {0.5, 0.3} has mass 0.8 and is kept, nothing else.
  const auto logits = log_probs({0.3, 0.1, 0.1, 0.5});
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.8;
  p.seed = 5;
  Sampler s(p);
  std::map<int, int> seen;
  for (int i = 0; i < 4000; ++i) seen[s.sample(logits)]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(0) && seen.count(3));
  EXPECT_NEAR(seen[3] / 4000.0, 0.5 / 0.8, 0.03);
}

TEST(Sampler, TopPNextToOneNeverIndexesPastTheVocabulary) {
  const auto logits = log_probs({0.25, 0.25, 0.25, 0.25});
  for (double top_p : {1.0 - 1e-7, 1.0 - 1e-12, 1.0}) {
    SamplingParams p;
    p.temperature = 1.0;
    p.top_p = top_p;
    p.seed = 9;
    Sampler s(p);
    for (int i = 0; i < 2000; ++i) {
      const int32_t t = s.sample(logits);
      ASSERT_GE(t, 0);
      ASSERT_LT(t, 4);
    }
  }
}

TEST(Sampler, TopK1AndTemperature0AreGreedy) {
  const auto logits = log_probs({0.2, 0.05, 0.4, 0.35});
  for (double top_p : {0.1, 0.5, 1.0}) {
    SamplingParams p;
    p.temperature = 1.5;
    p.top_k = 1;
    p.top_p = top_p;
    p.seed = 3;
    Sampler s(p);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(logits), 2);
  }
  SamplingParams g;
  g.top_k = 3;
  g.top_p = 0.3;
  Sampler s(g);
  EXPECT_EQ(s.sample(logits), 2);
}

TEST(Sampler, TinyTemperatureIsGreedyInTheLimit) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.9f};
  for (double t : {1e-308, 1e-30, 1e-6}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 11;
    Sampler s(p);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits), 1) << "temperature " << t;
  }
}

TEST(Sampler, NeverDrawsIdsPastTheVocabLimit) {
  std::vector<float> logits(10, 0.0f);
  logits[8] = 50.0f;  // a row the tokenizer does not know, with the top logit
  logits[3] = 1.0f;
  SamplingParams p;
  p.vocab_limit = 8;
  EXPECT_EQ(Sampler(p).sample(logits), 3);
  p.temperature = 1.0;
  p.seed = 3;
  Sampler s(p);
  for (int i = 0; i < 500; ++i) EXPECT_LT(s.sample(logits), 8);
}

TEST(MemoryPreflight, RefusesWithTheNumbersAndWhatToChange) {
  const RankMemory need{3LL << 30, 1LL << 30};
  EXPECT_NO_THROW(check_memory(need, 5LL << 30, 1));
  EXPECT_NO_THROW(check_memory(need, -1, 1));  // unknown: no refusal
  try {
    check_memory(need, 8LL << 30, 4);  // 2 GiB for each of 4 ranks
    FAIL() << "4 GiB must not fit in 2 GiB";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* part : {"4.00 GiB", "weights 3.00 GiB", "KV cache 1.00 GiB", "has 2.00 GiB", "4 ranks",
                             "more ranks", "--max-seq-len"}) {
      EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
    }
  }
}

TEST(MemoryPreflight, CountsThisRanksSlices) {
  ModelConfig c = stories_like();
  c.tie_word_embeddings = true;
  const RankMemory one = rank_memory(c, ShardPlan::make(c, 0, 1), 512);
  const RankMemory two = rank_memory(c, ShardPlan::make(c, 0, 2), 512);
  // stories260k: 1,040,128 bytes of f32 weights in its checkpoint.
  EXPECT_EQ(one.weight_bytes, 1040128);
  EXPECT_EQ(one.kv_cache_bytes, 2 * 5 * 512 * 4 * 8 * 4);
  EXPECT_EQ(two.kv_cache_bytes * 2, one.kv_cache_bytes);
  EXPECT_LT(two.weight_bytes, one.weight_bytes / 2 + 4096);
  const RankMemory bf16 = rank_memory(c, ShardPlan::make(c, 0, 1), 512, 1, DType::kF32, DType::kBF16);
  EXPECT_EQ(bf16.kv_cache_bytes * 2, one.kv_cache_bytes);
  EXPECT_EQ(bf16.weight_bytes, one.weight_bytes);
  // --kv-cache-memory-fraction fits twice the positions in a bf16 cache.
  const ShardPlan p = ShardPlan::make(c, 0, 1);
  const int64_t avail = one.weight_bytes + 64 * one.kv_cache_bytes;
  EXPECT_EQ(resolve_kv_cache_tokens(c, p, 512, 1, std::nullopt, 1.0, avail, 1, DType::kF32, DType::kBF16),
            2 * resolve_kv_cache_tokens(c, p, 512, 1, std::nullopt, 1.0, avail, 1));
}

// Issue 26, item 3: on CUDA the default pool (--max-batch full-length requests) is capped
// at kDefaultDeviceKvFraction of what the weights leave of the GPU's free memory. The
// 8B shape's default 16 x 8192 f32 positions (32 GiB) on a 40 GB GPU was a raw OOM.
TEST(MemoryPreflight, DefaultKvPoolOnAGpuFitsWhatTheWeightsLeave) {
  const ModelConfig c = ModelConfig::load(test::test_data_dir() / ".." / ".." / "scripts" / "configs" / "llama-3.1-8b.json");
  const ShardPlan p = ShardPlan::make(c, 0, 1);
  const int64_t gpu = 40LL * 1000 * 1000 * 1000;  // an A100 40 GB, all free
  const int64_t per_f32 = KvCache::bytes_for(c.num_hidden_layers, 1, p.num_kv_heads_local, c.head_dim, DType::kF32);
  const int64_t weights = weight_bytes_local(c, p, DType::kBF16, 64);
  // Uncapped (the CPU rule): 16 x 8192 positions, 32 GiB in f32.
  EXPECT_EQ(resolve_kv_cache_tokens(c, p, 8192, 16, std::nullopt, std::nullopt, gpu, 1, DType::kBF16, DType::kF32),
            16 * 8192);
  EXPECT_EQ(per_f32 * 16 * 8192, 32LL << 30);
  const int64_t capped = resolve_kv_cache_tokens(c, p, 8192, 16, std::nullopt, std::nullopt, gpu, 1, DType::kBF16,
                                                 DType::kF32, 64, kDefaultDeviceKvFraction);
  EXPECT_LT(capped, 16 * 8192);
  EXPECT_GE(capped, 8192);
  EXPECT_EQ(capped % kKvPageSize, 0);
  EXPECT_LE(weights + capped * per_f32, gpu);
  EXPECT_GT(weights + (capped + kKvPageSize) * per_f32, static_cast<int64_t>(weights + 0.9 * (gpu - weights)));
  // A bf16 cache (CUDA's default) of the same 16 x 8192 fits: 16 GiB in 0.9 x ~24 GB.
  EXPECT_EQ(resolve_kv_cache_tokens(c, p, 8192, 16, std::nullopt, std::nullopt, gpu, 1, DType::kBF16, DType::kBF16,
                                    64, kDefaultDeviceKvFraction),
            16 * 8192);
  // Two ranks sharing the GPU halve it; a GPU too small for one request names --max-seq-len.
  EXPECT_LT(resolve_kv_cache_tokens(c, p, 8192, 16, std::nullopt, std::nullopt, gpu, 2, DType::kBF16, DType::kBF16,
                                    64, kDefaultDeviceKvFraction),
            16 * 8192);
  try {
    resolve_kv_cache_tokens(c, p, 8192, 16, std::nullopt, std::nullopt, weights + (256LL << 20), 1, DType::kBF16,
                            DType::kF32, 64, kDefaultDeviceKvFraction);
    ADD_FAILURE() << "256 MiB beside the weights held a request of 8192 f32 positions";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-seq-len"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fewer than one request"), std::string::npos) << e.what();
  }
  // The flags still win: --kv-cache-tokens is taken as asked.
  EXPECT_EQ(resolve_kv_cache_tokens(c, p, 8192, 16, int64_t{16 * 8192}, std::nullopt, gpu, 1, DType::kBF16,
                                    DType::kF32, 64, kDefaultDeviceKvFraction),
            16 * 8192);
}

// Issue 26, item 3: bf16 is the CUDA backend's default KV cache ("auto"), f32 on request.
TEST(KvCacheDtype, AutoFollowsTheBackendAndErrorsNameTheFlag) {
  EXPECT_EQ(held_kv_cache_dtype("", "cpu"), DType::kF32);
  EXPECT_EQ(held_kv_cache_dtype("auto", "cpu"), DType::kF32);
  EXPECT_EQ(held_kv_cache_dtype("", "cuda"), DType::kBF16);
  EXPECT_EQ(held_kv_cache_dtype("auto", "cuda"), DType::kBF16);
  EXPECT_EQ(held_kv_cache_dtype("f32", "cuda"), DType::kF32);
  EXPECT_EQ(held_kv_cache_dtype("bf16", "cuda"), DType::kBF16);
  EXPECT_EQ(held_kv_cache_dtype("bf16", "cpu"), DType::kBF16);
  for (const auto& [flag, kind] : {std::pair{"fp8", "cuda"}, {"fp8", "cpu"}}) {
    try {
      held_kv_cache_dtype(flag, kind);
      ADD_FAILURE() << flag << " on " << kind << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(make_cpu_backend(1, DType::kF32, DType::kF16), Error);
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_p = 0;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_k = -2;
  EXPECT_THROW(Sampler{p}, Error);
}

// A group of one rank: sums and maxes are the identity, all_gather copies through the
// owner's copy function (the CUDA backend's device copy), broadcast from a rank that is
// not in the group is refused.
TEST(SelfCommunicator, CollectivesOfOneRank) {
  int copies = 0;
  SelfCommunicator comm([&](void* d, const void* s, std::size_t n) {
    ++copies;
    std::memcpy(d, s, n);
  });
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_FALSE(comm.capturable());
  std::vector<float> f = {1.5f, -2.0f, 3.25f};
  std::vector<double> d = {0.5, 7.0};
  comm.all_reduce_sum(f.data(), f.size());
  comm.all_reduce_max(f.data(), f.size());
  comm.all_reduce_sum(d.data(), d.size());
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(d, (std::vector<double>{0.5, 7.0}));
  std::vector<float> out(3, 0.0f);
  comm.all_gather(f.data(), 3, out.data());
  EXPECT_EQ(out, f);
  EXPECT_EQ(copies, 1);
  comm.all_gather(out.data(), 3, out.data());  // in place: no copy
  EXPECT_EQ(copies, 1);
  comm.broadcast(f.data(), 12, 0);
  EXPECT_THROW(comm.broadcast(f.data(), 12, 1), Error);
  comm.barrier();
  EXPECT_TRUE(SelfCommunicator({}, true).capturable());
}

// A tp = 1 engine needs no MPI (nor NCCL on a GPU): the llama31 fixture through a
// SelfCommunicator, in a process that never called MPI_Init, equals transformers.
TEST(SelfCommunicator, TpOneEngineNeedsNoMpi) {
  const auto dir = test::test_data_dir() / "fixtures" / "llama31";
  const auto golden = test::read_json(dir / "golden.json");
  const ModelFiles files = open_model(dir / "f32");
  auto backend = make_cpu_backend(1);
  SelfCommunicator self;
  auto engine = make_engine(files, ShardPlan::make(files.config, 0, 1), *backend, self, 64);
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  const auto logits = engine->forward(prompt);
  const int64_t vocab = files.config.vocab_size;
  ASSERT_EQ(logits.size(), prompt.size() * static_cast<size_t>(vocab));
  float worst = 0.0f;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const auto want = golden["logits_f32"][i].get<std::vector<float>>();
    for (int64_t v = 0; v < vocab; ++v) worst = std::max(worst, std::fabs(logits[i * vocab + v] - want[v]));
  }
  EXPECT_LT(worst, 1e-4f);
}

// Without a usable device, asking for the CUDA backend says why (the device query's
// CUDA error, or a build without CUDA), not only "no CUDA device".
TEST(CudaDeviceQuery, NoDeviceErrorSaysWhy) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
  const std::string why = cuda_device_error();
  EXPECT_TRUE(why.rfind("cudaGetDeviceCount: ", 0) == 0 || why == "linnet-tp was built without CUDA") << why;
  try {
    make_backend("cuda", 1, 0, 1);
    ADD_FAILURE() << "make_backend(cuda) did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}


// Issue 26, item 5: the tp group's device communicator is chosen from every rank's
// report (choose_tp_comm), so ranks never mix NCCL with MPI.
TpCommReport report(uint8_t gpu, bool nccl = true, uint8_t wish = 0) {
  TpCommReport r;
  r.gpu_uuid.fill(0xab);
  r.gpu_uuid[15] = gpu;
  r.nccl_built = nccl ? 1 : 0;
  r.wish = wish;
  return r;
}

std::string choice_error(const std::vector<TpCommReport>& ranks) {
  try {
    choose_tp_comm(ranks);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TpCommChoice, OneRankNeedsNoCommunicatorUnlessNcclIsAskedFor) {
  EXPECT_EQ(choose_tp_comm(std::vector{report(0)}).kind, TpCommKind::kSelf);
  EXPECT_EQ(choose_tp_comm(std::vector{report(0, false)}).kind, TpCommKind::kSelf);
  EXPECT_EQ(choose_tp_comm(std::vector{report(0, true, 1)}).kind, TpCommKind::kNccl);
  EXPECT_EQ(choose_tp_comm(std::vector{report(0, true, 2)}).kind, TpCommKind::kHostStaged);
  EXPECT_NE(choice_error({report(0, false, 1)}).find("rank 0's build has no NCCL"), std::string::npos);
  EXPECT_NE(choice_error({report(0, false, 1)}).find("LINNET_COMM=nccl"), std::string::npos);
}

// Slurm's --gpus-per-task=1: every rank sees one device (its "device 0"), but the UUIDs
// differ, so the group uses NCCL; the old per-node count said MPI.
TEST(TpCommChoice, OneGpuPerRankUsesNcclWhateverEachRankCallsItsDevice) {
  const TpCommChoice c = choose_tp_comm(std::vector{report(1), report(2), report(3), report(4)});
  EXPECT_EQ(c.kind, TpCommKind::kNccl);
  EXPECT_EQ(c.reason, "one GPU per rank");
}

TEST(TpCommChoice, SharedGpuOrMissingNcclFallsBackToHostStagedNamingTheRanks) {
  TpCommChoice c = choose_tp_comm(std::vector{report(1), report(2), report(3), report(2)});
  EXPECT_EQ(c.kind, TpCommKind::kHostStaged);
  EXPECT_NE(c.reason.find("ranks 1 and 3 of the tp group share one GPU"), std::string::npos) << c.reason;
  c = choose_tp_comm(std::vector{report(1), report(2), report(3), report(4, false)});
  EXPECT_EQ(c.kind, TpCommKind::kHostStaged);
  EXPECT_NE(c.reason.find("rank 3's build has no NCCL"), std::string::npos) << c.reason;
}

// Uneven ranks per node: node A holds ranks 0-2 on two GPUs, node B rank 3 on its own
// GPU. A per-rank rule (ranks on my node <= GPUs on my node) gave MPI on A and NCCL on
// B, a hang; the reports give every rank the same answer.
TEST(TpCommChoice, UnevenNodesGetOneAnswerForTheWholeGroup) {
  const std::vector<TpCommReport> group{report(1), report(2), report(1), report(9)};
  const TpCommChoice first = choose_tp_comm(group);
  EXPECT_EQ(first.kind, TpCommKind::kHostStaged);
  for (int rank = 1; rank < 4; ++rank) {
    const TpCommChoice again = choose_tp_comm(group);  // what rank `rank` computes
    EXPECT_EQ(again.kind, first.kind);
    EXPECT_EQ(again.reason, first.reason);
  }
}

TEST(TpCommChoice, LinnetCommMustAgreeAndBeServable) {
  EXPECT_EQ(choose_tp_comm(std::vector{report(1, true, 2), report(2, true, 2)}).kind, TpCommKind::kHostStaged);
  EXPECT_EQ(choose_tp_comm(std::vector{report(1, true, 1), report(2, true, 1)}).kind, TpCommKind::kNccl);
  std::string e = choice_error({report(1, true, 1), report(2, true, 2)});
  EXPECT_NE(e.find("disagree on LINNET_COMM"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 0: nccl, rank 1: mpi"), std::string::npos) << e;
  e = choice_error({report(1, true, 0), report(2, true, 0), report(3, true, 1)});
  EXPECT_NE(e.find("rank 0: unset, rank 2: nccl"), std::string::npos) << e;
  e = choice_error({report(1, true, 1), report(1, true, 1)});
  EXPECT_NE(e.find("ranks 0 and 1 of the tp group share one GPU; NCCL needs one GPU per rank"), std::string::npos) << e;
  e = choice_error({report(1, true, 1), report(2, false, 1)});
  EXPECT_NE(e.find("rank 1's build has no NCCL"), std::string::npos) << e;
  EXPECT_EQ(parse_comm_wish(nullptr), 0);
  EXPECT_EQ(parse_comm_wish(""), 0);
  EXPECT_EQ(parse_comm_wish("nccl"), 1);
  EXPECT_EQ(parse_comm_wish("mpi"), 2);
  try {
    parse_comm_wish("gloo");
    ADD_FAILURE() << "LINNET_COMM=gloo accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("LINNET_COMM"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("gloo"), std::string::npos) << err.what();
  }
  EXPECT_NE(choice_error({}).find("at least one rank"), std::string::npos);
}


// Issue 26, item 7: a CUDA runtime that cannot start on a machine with an NVIDIA driver
// is a warning naming CUDA's error; a machine without a driver says nothing.
TEST(CudaDeviceQuery, FallbackToTheCpuWarnsOnlyWhereADriverIsPresent) {
  const std::string err = "cudaGetDeviceCount: cudaErrorInsufficientDriver: CUDA driver version is insufficient";
  const std::string w = cuda_fallback_warning(err, true, nullptr);
  EXPECT_NE(w.find(err), std::string::npos) << w;
  EXPECT_NE(w.find("running on the CPU backend"), std::string::npos) << w;
  EXPECT_EQ(cuda_fallback_warning(err, false, nullptr), "");
  EXPECT_EQ(cuda_fallback_warning("", true, nullptr), "");
  EXPECT_EQ(cuda_fallback_warning(err, true, ""), "");
  EXPECT_EQ(cuda_fallback_warning(err, true, "-1"), "");
  EXPECT_EQ(cuda_fallback_warning(err, true, "0,1"), w);
  // This machine: with no device and no driver, the default backend is the CPU, silently.
  if (cuda_device_count() == 0 && !nvidia_driver_present()) {
    EXPECT_EQ(cuda_fallback_warning(cuda_device_error(), nvidia_driver_present(), nullptr), "");
  }
}

}  // namespace
}  // namespace linnet
