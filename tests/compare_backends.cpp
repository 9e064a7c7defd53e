// compare_backends: the GPU check's real-shape comparison (scripts/gpu_check.sh). Not a
// test of the suite: a developer tool the check runs on the device machine, and on the
// CPU alone in CI (tests/test_gpu_check.sh) to prove its logic.
//
// Random mode (--config): one model of a config's full shape with random weights made from
// one seed on both backends (runtime/random_weights.h: the same N(0, stddev^2) values,
// rounded to bf16 on each side), so both hold the same bf16 weights. A random prompt of
// --prompt-len tokens goes through one packed prefill pass (the logits of every position)
// and then --decode-steps decode steps, each fed the reference's greedy token (teacher
// forcing: both engines always see the same tokens, so one near tie cannot make every
// later step differ). The reference (--reference, default cpu with bf16 weights and f32
// activations) runs first and is freed, then the backend under test (--backend, default
// cuda), so the two never hold memory at once.
//
// The bound. The CUDA path rounds every GEMM input (the activations entering the qkv, o,
// gate/up, down and lm_head products) to bf16; the CPU path keeps them f32. Nothing else
// differs but the f32 summation order. Rounding to bf16 (8 significant bits) is a
// relative error of rms u = 2^-8 sqrt(1 / (8 ln 2)) ~ 1.66e-3 (mantissas spread
// log-uniformly); L layers round 4 inputs each and the lm_head one more, independent
// errors adding in quadrature, so a logit carries an error of rms about
// e = sqrt(4L + 1) u rms(logits). Measured by scripts/estimate_bf16_rounding.py (torch on
// the CPU: the same random bf16 weights with and without the GEMM inputs rounded, 64
// positions x the whole vocabulary, two seeds, depths 2 to full): the rms error is 0.75
// to 1.6 e (the qkv and gate/up inputs count more than one rounding: the softmax and the
// SiLU x up product amplify them) and the max 4.6 to 9.5 e (Llama-3.1-8B shape: e =
// 0.024, max 0.219 / 0.228; Qwen3-4B: e = 0.020, max 0.092 / 0.097). The bound is
// kBoundMultiple = 16 e on the max over all positions and the whole vocabulary
// (Llama-3.1-8B: 0.39, against logits of rms 1.28), so a wrong rope band, cache slot or
// GEMM (errors of the order of the logits themselves at some position) fails it.
// Greedy: the argmax of each position on both sides. With random weights and 128k-token
// vocabularies the top two logits are often closer than the rounding noise (the same
// measurement: 5 to 7 of 64 positions of the 8B shape flip), and a flip is only possible
// where the reference's gap is at most the two logits' differences, so within the bound a
// flip is a near tie: each is listed with its gap; one whose gap exceeds 2 x bound (which
// the max check would catch too) is called WRONG and fails.
//
// Logits mode (--model): a checkpoint's logits of every position of the ids in --ids
// (whitespace-separated integers) through one forward pass on --backend, written to
// --logits-out as little-endian f32 [n, vocab_size]; scripts/gpu_transformers_check.py
// compares them with transformers.
//
// Exit: 0 within the bound (or logits written), 1 outside it or on an error, 2 on usage.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "common/error.h"
#include "kernels/cpu/threads.h"
#include "loader/model_config.h"
#include "parallel/mpi_communicator.h"
#include "parallel/shard_plan.h"
#include "runtime/backend_factory.h"
#include "runtime/cuda_backend.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/model_loader.h"
#include "runtime/random_weights.h"

namespace linnet {
namespace {

constexpr double kBoundMultiple = 16.0;  // see the file comment

struct Run {
  std::vector<float> prefill;  // [P, V]
  std::vector<float> decode;   // [N, V]
};

struct Options {
  std::string config, model, ids, logits_out;
  std::string backend = "cuda", reference = "cpu";
  uint64_t seed = 1;
  int64_t reference_seed = -1;  // the reference's weights; -1: seed (another: a test that must fail)
  int64_t prompt_len = 64, decode_steps = 8;
  int threads = 0;
  float stddev = 0.02f;
};

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

// The random model on `kind`, its name in `name`: prefill of `prompt` (every position's
// logits), then one decode step per token of `feed` (feed[i] at position P + i). With
// `own_feed`, `feed` is filled with this model's own greedy tokens as it goes (N of them).
Run run_random(const std::string& kind, const Options& o, uint64_t seed, const ModelConfig& config,
               const std::vector<int32_t>& prompt, std::vector<int32_t>& feed, bool own_feed, std::string& name) {
  MpiCommunicator self(MPI_COMM_SELF);
  const ShardPlan plan = ShardPlan::make(config, 0, 1);
  auto backend = make_backend(kind, kernel_threads_per_rank(o.threads, 1), 0, 1, DType::kBF16);
  name = backend->name() + " (" + dtype_name(backend->host_weight_dtype(DType::kBF16)) + " weights)";
  Communicator& comm = tp_communicator(*backend, self);
  const int64_t P = static_cast<int64_t>(prompt.size()), N = o.decode_steps, V = config.vocab_size;
  auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&t0] {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - t0).count();
    t0 = now;
    return s;
  };
  Engine engine(config, plan, random_weights(*backend, config, plan, seed, o.stddev), *backend, comm, P + N + 1, 1,
                kKvPageSize);
  backend->synchronize();
  const double made_s = seconds();
  std::vector<int32_t> rows(static_cast<size_t>(P), 0), positions(static_cast<size_t>(P)), last(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) positions[p] = last[p] = static_cast<int32_t>(p);
  Run r;
  r.prefill = engine.prefill_packed(prompt, rows, positions, last);
  const double prefill_s = seconds();
  int32_t next = argmax(r.prefill.data() + (P - 1) * V, V);
  for (int64_t i = 0; i < N; ++i) {
    if (own_feed) feed.push_back(next);
    const int32_t tok[1] = {feed[i]}, row[1] = {0}, pos[1] = {static_cast<int32_t>(P + i)};
    const std::vector<float> step = engine.decode_rows(tok, row, pos);
    r.decode.insert(r.decode.end(), step.begin(), step.end());
    next = argmax(step.data(), V);
  }
  backend->synchronize();
  char times[160];
  std::snprintf(times, sizeof times, ": weights made in %.1f s, prefill %.2f s, %lld decode steps %.2f s", made_s,
                prefill_s, static_cast<long long>(N), seconds());
  name += times;
  return r;
}

// The random-weights comparison (see the file comment). Returns the exit code.
int compare_random(const Options& o) {
  const ModelConfig config = ModelConfig::load(o.config);
  const int64_t V = config.vocab_size, P = o.prompt_len, N = o.decode_steps, L = config.num_hidden_layers;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(P));
  for (auto& t : prompt) t = token(rng);
  std::printf("shape: %s (%s: %lld layers, hidden %lld, vocab %lld), seed %llu, stddev %g, prompt %lld, %lld decode "
              "steps\n",
              o.config.c_str(), config.model_type.c_str(), static_cast<long long>(L),
              static_cast<long long>(config.hidden_size), static_cast<long long>(V),
              static_cast<unsigned long long>(o.seed), o.stddev, static_cast<long long>(P),
              static_cast<long long>(N));
  std::fflush(stdout);
  // The reference first: its greedy tokens are the decode steps' feed for both.
  std::vector<int32_t> feed;
  std::string ref_name, got_name;
  const uint64_t ref_seed = o.reference_seed >= 0 ? static_cast<uint64_t>(o.reference_seed) : o.seed;
  const Run ref = run_random(o.reference, o, ref_seed, config, prompt, feed, true, ref_name);
  std::printf("reference: %s\n", ref_name.c_str());
  std::fflush(stdout);
  const Run got = run_random(o.backend, o, o.seed, config, prompt, feed, false, got_name);
  std::printf("tested: %s\n", got_name.c_str());

  double sq = 0;
  for (float x : ref.prefill) sq += static_cast<double>(x) * x;
  const double rms_logits = std::sqrt(sq / static_cast<double>(ref.prefill.size()));
  const double u = std::ldexp(1.0, -8) * std::sqrt(1.0 / (8.0 * std::log(2.0)));  // see the file comment
  const double e = std::sqrt(4.0 * static_cast<double>(L) + 1.0) * u * rms_logits;
  const double bound = kBoundMultiple * e;

  int64_t equal = 0, ties = 0, wrong = 0;
  auto part = [&](const std::vector<float>& a, const std::vector<float>& b, int64_t rows_n, const char* what) {
    double max_d = 0, sum_d2 = 0;
    int64_t worst_row = 0;
    for (int64_t r = 0; r < rows_n; ++r) {
      const float* x = a.data() + r * V;
      const float* y = b.data() + r * V;
      for (int64_t v = 0; v < V; ++v) {
        if (!std::isfinite(y[v])) {
          max_d = INFINITY;
          worst_row = r;
          continue;
        }
        const double d = std::fabs(static_cast<double>(x[v]) - y[v]);
        sum_d2 += d * d;
        if (d > max_d) {
          max_d = d;
          worst_row = r;
        }
      }
      const int32_t tr = argmax(x, V), tg = argmax(y, V);
      if (tr == tg) {
        ++equal;
      } else if (x[tr] - x[tg] <= 2 * bound) {
        ++ties;
        std::printf("  %s row %lld: near tie, reference %d, got %d (reference logits %.4f vs %.4f)\n", what,
                    static_cast<long long>(r), tr, tg, x[tr], x[tg]);
      } else {
        ++wrong;
        std::printf("  %s row %lld: WRONG greedy token, reference %d, got %d (reference logits %.4f vs %.4f)\n", what,
                    static_cast<long long>(r), tr, tg, x[tr], x[tg]);
      }
    }
    const double rms_d = rows_n > 0 ? std::sqrt(sum_d2 / static_cast<double>(rows_n * V)) : 0.0;
    std::printf("%s max |logit diff|: %.5f (row %lld), rms %.5f\n", what, max_d, static_cast<long long>(worst_row),
                rms_d);
    return max_d;
  };
  const double max_prefill = part(ref.prefill, got.prefill, P, "prefill");
  const double max_decode = part(ref.decode, got.decode, N, "decode");
  const double max_all = std::max(max_prefill, max_decode);
  std::printf("rms logits: %.4f; rounding estimate e = sqrt(4L+1) u rms = %.5f; bound %.0f e = %.5f\n",
              rms_logits, e, kBoundMultiple, bound);
  std::printf("greedy: %lld/%lld equal, %lld near ties, %lld wrong\n", static_cast<long long>(equal),
              static_cast<long long>(P + N), static_cast<long long>(ties), static_cast<long long>(wrong));
  const bool ok = max_all <= bound && wrong == 0;
  std::printf("result: %s (max |diff| %.5f %s bound %.5f)\n", ok ? "PASS" : "FAIL", max_all,
              max_all <= bound ? "<=" : ">", bound);
  return ok ? 0 : 1;
}

// Logits mode: a checkpoint's logits over --ids to --logits-out.
int dump_logits(const Options& o) {
  std::vector<int32_t> ids;
  {
    std::ifstream in(o.ids);
    if (!in) throw Error("cannot open", o.ids);
    for (long long v; in >> v;) ids.push_back(static_cast<int32_t>(v));
    if (!in.eof()) throw Error("not whitespace-separated integers", o.ids);
    if (ids.empty()) throw Error("holds no token id", o.ids);
  }
  MpiCommunicator self(MPI_COMM_SELF);
  const ModelFiles files = open_model(o.model);
  const ShardPlan plan = ShardPlan::make(files.config, 0, 1);
  auto backend = make_backend(o.backend, kernel_threads_per_rank(o.threads, 1), 0, 1, DType::kBF16);
  Communicator& comm = tp_communicator(*backend, self);
  auto engine = make_engine(files, plan, *backend, comm, static_cast<int64_t>(ids.size()));
  const std::vector<float> logits = engine->forward(ids);
  std::ofstream out(o.logits_out, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  out.close();
  if (!out) throw Error("cannot write", o.logits_out);
  std::printf("logits: %zu positions x %lld to %s (%s, %s weights)\n", ids.size(),
              static_cast<long long>(files.config.vocab_size), o.logits_out.c_str(), backend->name().c_str(),
              dtype_name(backend->host_weight_dtype(DType::kBF16)));
  return 0;
}

}  // namespace
}  // namespace linnet

int main(int argc, char** argv) {
  using linnet::Options;
  cxxopts::Options opts("compare_backends",
                        "A random model of a config's shape on two backends (--config), or a checkpoint's logits "
                        "(--model)\n");
  // clang-format off
  opts.add_options()
    ("config", "config.json of the random model", cxxopts::value<std::string>())
    ("model", "Checkpoint folder (logits mode)", cxxopts::value<std::string>())
    ("ids", "Logits mode: token ids, whitespace-separated", cxxopts::value<std::string>())
    ("logits-out", "Logits mode: output file, f32 [n, vocab]", cxxopts::value<std::string>())
    ("backend", "Backend under test (default cuda)", cxxopts::value<std::string>())
    ("reference", "Reference backend (default cpu)", cxxopts::value<std::string>())
    ("seed", "Seed of the weights and the prompt (default 1)", cxxopts::value<uint64_t>())
    ("reference-seed", "The reference's weight seed (default: --seed; another seed is a different model, which "
     "must fail: the tool's own test)", cxxopts::value<int64_t>())
    ("stddev", "Standard deviation of the random matrices (default 0.02)", cxxopts::value<float>())
    ("prompt-len", "Prompt tokens (default 64)", cxxopts::value<int64_t>())
    ("decode-steps", "Decode steps after the prompt (default 8)", cxxopts::value<int64_t>())
    ("threads", "CPU backend threads (default: all cores)", cxxopts::value<int>())
    ("h,help", "Print this help");
  // clang-format on
  Options o;
  try {
    const auto r = opts.parse(argc, argv);
    if (r.count("help")) {
      std::fputs(opts.help().c_str(), stdout);
      return 0;
    }
    if (r.count("config")) o.config = r["config"].as<std::string>();
    if (r.count("model")) o.model = r["model"].as<std::string>();
    if (r.count("ids")) o.ids = r["ids"].as<std::string>();
    if (r.count("logits-out")) o.logits_out = r["logits-out"].as<std::string>();
    if (r.count("backend")) o.backend = r["backend"].as<std::string>();
    if (r.count("reference")) o.reference = r["reference"].as<std::string>();
    if (r.count("seed")) o.seed = r["seed"].as<uint64_t>();
    if (r.count("reference-seed")) o.reference_seed = r["reference-seed"].as<int64_t>();
    if (r.count("stddev")) o.stddev = r["stddev"].as<float>();
    if (r.count("prompt-len")) o.prompt_len = r["prompt-len"].as<int64_t>();
    if (r.count("decode-steps")) o.decode_steps = r["decode-steps"].as<int64_t>();
    if (r.count("threads")) o.threads = r["threads"].as<int>();
    if (o.config.empty() == o.model.empty()) throw linnet::Error("give exactly one of --config and --model");
    if (!o.model.empty() && (o.ids.empty() || o.logits_out.empty())) {
      throw linnet::Error("--model needs --ids and --logits-out");
    }
    if (o.prompt_len < 1 || o.decode_steps < 0 || o.threads < 0 || !(o.stddev > 0)) {
      throw linnet::Error("--prompt-len >= 1, --decode-steps >= 0, --threads >= 0 and --stddev > 0");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_backends: %s\n", e.what());
    return 2;
  }
  MPI_Init(&argc, &argv);
  int code = 1;
  try {
    code = o.model.empty() ? linnet::compare_random(o) : linnet::dump_logits(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_backends: %s\n", e.what());
    code = 1;
  }
  std::fflush(stdout);
  MPI_Finalize();
  return code;
}
