#include "launch/bench_command.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <cxxopts.hpp>

#include "common/error.h"
#include "common/float16.h"
#include "launch/cli_parse.h"
#include "launch/engine_setup.h"
#include "driver/job.h"
#include "parallel/comm_watch.h"
#include "loader/model_path.h"
#include "loader/model_config.h"
#include "parallel/mpi_communicator.h"
#include "parallel/shard_plan.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/roofline.h"
#include "kernels/cpu/threads.h"
#include "runtime/backend_factory.h"
#include "runtime/batch_generate.h"
#include "runtime/kv_cache.h"
#include "runtime/loss.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "runtime/random_weights.h"
#include "runtime/weights.h"

namespace linnet {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What the bench runs on, for its report.
struct BenchShape {
  const ModelConfig& config;
  const ShardPlan& plan;
  DType weight_dtype;
  int64_t weight_group_size;  // int8 / int4: inputs per scale
  int64_t max_seq_len;
  double load_s;  // making or loading the weights and the engine
};

// "bf16", or "int8, groups of 64" (held_weights_text).
std::string weight_format(const BenchShape& s) {
  return held_weights_text(s.config, s.weight_dtype, s.weight_group_size, "");
}

// Rank 0: the setup lines (backend, weights, kernels, KV cache, CUDA graphs).
void print_setup(const BenchOptions& o, const BenchShape& s, const Engine& engine, const Backend& backend,
                 const WorldConfig& w) {
  std::printf("bench: %s, tp %d, batch %lld, prompt %lld tokens, %lld new tokens\n", backend.name().c_str(),
              w.tp_size, static_cast<long long>(o.batch), static_cast<long long>(o.prompt_len),
              static_cast<long long>(o.new_tokens));
  std::printf("weights: %s (%s, %s per rank, %s in %.1f s)\n", o.random_weights ? "random" : "checkpoint",
              weight_format(s).c_str(),
              format_bytes(weight_bytes_local(s.config, s.plan, s.weight_dtype, s.weight_group_size)).c_str(),
              o.random_weights ? "made" : "loaded", s.load_s);
  std::printf("cpu kernels: %s, %d threads per rank%s%s\n", cpu::isa_name(cpu::active_isa()), cpu::num_threads(),
              cpu::int4_activation_dtype() == DType::kI8 ? "; int4 x int8 activations: " : "",
              cpu::int4_activation_dtype() == DType::kI8 ? cpu::int8_activation_kernel(cpu::active_isa()) : "");
  std::printf("kv cache: %s per rank (%lld rows x %lld positions, %s)\n", format_bytes(engine.kv_cache_bytes()).c_str(),
              static_cast<long long>(o.batch), static_cast<long long>(s.max_seq_len),
              dtype_name(backend.kv_cache_dtype()));
  std::printf("cuda graphs: %s\n", engine.cuda_graphs()    ? "on"
                                   : o.engine.cuda_graphs ? "off (they need --backend cuda and NCCL or one rank)"
                                                          : "off");
  std::fflush(stdout);
}

// --limits: this rank's DRAM read bandwidth and fma peak, 1 thread and all (rank 0 prints).
void measure_limits(bool print) {
  const int T = cpu::num_threads();
  const double bw1 = cpu::dram_read_gbps(1), bwT = cpu::dram_read_gbps(T);
  const double fma1 = cpu::fma_peak_gflops(1), fmaT = cpu::fma_peak_gflops(T);
  if (!print) return;
  std::printf("dram read GB/s: %.1f (1 thread), %.1f (%d threads)\n", bw1, bwT, T);
  std::printf("fma peak GFLOP/s: %.1f (1 thread), %.1f (%d threads)\n", fma1, fmaT, T);
  std::fflush(stdout);
}

// B prompts of P random tokens packed end to end: row b holds positions 0..P-1.
struct BenchPrompts {
  std::vector<int32_t> tokens, rows, positions, last;
  std::mt19937_64 rng;  // after the prompts: the decode steps' tokens
};

BenchPrompts random_prompts(const BenchOptions& o, int64_t vocab_size) {
  BenchPrompts p;
  p.rng.seed(o.seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab_size - 1));
  for (int64_t b = 0; b < o.batch; ++b) {
    for (int64_t i = 0; i < o.prompt_len; ++i) {
      p.tokens.push_back(token(p.rng));
      p.rows.push_back(static_cast<int32_t>(b));
      p.positions.push_back(static_cast<int32_t>(i));
    }
    p.last.push_back(static_cast<int32_t>((b + 1) * o.prompt_len - 1));
  }
  return p;
}

struct PassTimes {
  double prefill_s = 0, decode_s = 0;
  int64_t decode_waits = 0;     // Backend::host_waits over the decode steps
  double decode_wait_s = 0;     // of decode_s, waiting on the device
};

// One packed prefill pass, then N decode steps of one random token per row, timed after
// a warm-up (one prefill and two decode steps: GEMM plans, pools, caches) and a sync.
PassTimes time_passes(const BenchOptions& o, Engine& engine, Backend& backend, BenchPrompts& p, Communicator& tp) {
  const int64_t B = o.batch, P = o.prompt_len;
  std::mt19937_64& rng = p.rng;
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(engine.config().vocab_size - 1));
  std::vector<int32_t> step_rows(static_cast<size_t>(B));
  std::iota(step_rows.begin(), step_rows.end(), 0);
  auto decode_step = [&](int64_t pos) {
    std::vector<int32_t> step_tokens(static_cast<size_t>(B)), step_pos(static_cast<size_t>(B), static_cast<int32_t>(pos));
    for (auto& t : step_tokens) t = token(rng);
    engine.decode_rows(step_tokens, step_rows, step_pos);
  };
  engine.prefill_packed(p.tokens, p.rows, p.positions, p.last);
  for (int64_t i = 0; i < std::min<int64_t>(2, o.new_tokens); ++i) decode_step(P + i);
  backend.synchronize();
  tp.barrier();
  PassTimes t;
  auto t0 = std::chrono::steady_clock::now();
  engine.prefill_packed(p.tokens, p.rows, p.positions, p.last);
  backend.synchronize();
  t.prefill_s = seconds_since(t0);
  const int64_t waits0 = backend.host_waits();
  const double wait0 = backend.wait_seconds();
  t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.new_tokens; ++i) decode_step(P + i);
  backend.synchronize();
  t.decode_s = seconds_since(t0);
  t.decode_waits = backend.host_waits() - waits0 - 1;  // not the closing synchronize
  t.decode_wait_s = backend.wait_seconds() - wait0;
  return t;
}

// Rank 0: prefill and decode throughput, the weight bytes a decode step reads and the
// bandwidth that implies.
void print_pass_times(const BenchOptions& o, const BenchShape& s, const Engine& engine, const PassTimes& t) {
  const int64_t B = o.batch, P = o.prompt_len;
  const int64_t step_bytes = decode_weight_bytes(s.config, s.plan, s.weight_dtype, s.weight_group_size);
  const double step_ms = o.new_tokens > 0 ? 1e3 * t.decode_s / static_cast<double>(o.new_tokens) : 0.0;
  std::printf("prefill tokens/s: %.1f (%lld tokens in %.2f ms)\n", static_cast<double>(B * P) / t.prefill_s,
              static_cast<long long>(B * P), 1e3 * t.prefill_s);
  // 2 flops per weight per token in the projections and lm_head (attention not counted).
  const double matmul_flops = 2.0 * static_cast<double>(decode_weight_elements(s.config, s.plan)) * static_cast<double>(B * P);
  std::printf("prefill matmul GFLOP/s: %.1f per rank\n", matmul_flops / t.prefill_s / 1e9);
  std::printf("decode tokens/s: %.1f\n", t.decode_s > 0 ? static_cast<double>(B * o.new_tokens) / t.decode_s : 0.0);
  std::printf("decode ms/step: %.3f\n", step_ms);
  if (t.decode_waits > 0 && o.new_tokens > 0) {
    const double n = static_cast<double>(o.new_tokens);
    std::printf("decode step split: %.3f ms waiting on the device, %.3f ms on the host; %.2f waits/step\n",
                1e3 * t.decode_wait_s / n, 1e3 * (t.decode_s - t.decode_wait_s) / n,
                static_cast<double>(t.decode_waits) / n);
  }
  std::printf("weight bytes per decode step: %lld per rank (%s)\n", static_cast<long long>(step_bytes),
              format_bytes(step_bytes).c_str());
  std::printf("achieved GB/s: %.3f per rank\n", step_ms > 0 ? static_cast<double>(step_bytes) / step_ms / 1e6 : 0.0);
  std::printf("peak RSS: %s (rank 0)\n", format_bytes(peak_resident_bytes()).c_str());
  if (engine.cuda_graphs()) {
    std::printf("cuda graphs recorded: %lld, replays: %lld\n", static_cast<long long>(engine.cuda_graphs_recorded()),
                static_cast<long long>(engine.cuda_graph_replays()));
  }
  std::fflush(stdout);
}

// The B prompts as B documents of one loss_packed pass (each token's label the next,
// the last unlabelled): its tokens/s, and the forward pass (packed_hidden) alone, so the
// table shows what the lm_head and the cross-entropy add. After a warm-up pass.
void time_loss(const BenchOptions& o, Engine& engine, Backend& backend, const BenchPrompts& p, bool print) {
  const int64_t B = o.batch, P = o.prompt_len;
  PackedBatch batch;
  batch.tokens = p.tokens;
  batch.positions = p.positions;
  std::vector<int32_t> rows;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < P; ++i) {
      batch.segments.push_back(static_cast<int32_t>(b));
      const bool last = i + 1 == P;
      batch.labels.push_back(last ? kIgnoreIndex : p.tokens[static_cast<size_t>(b * P + i + 1)]);
      if (!last) rows.push_back(static_cast<int32_t>(b * P + i));
    }
  }
  (void)loss_packed(engine, batch);  // warm-up
  backend.synchronize();
  auto t0 = std::chrono::steady_clock::now();
  (void)engine.packed_hidden(batch.tokens, batch.positions, batch.segments, rows);
  backend.synchronize();
  const double pass_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const PackedLoss loss = loss_packed(engine, batch);
  backend.synchronize();
  const double loss_s = seconds_since(t0);
  if (!print) return;
  const auto scored = static_cast<int64_t>(rows.size());
  std::printf("loss tokens/s: %.1f (%lld documents of %lld tokens, %lld scored, in %.2f ms)\n",
              loss_s > 0 ? static_cast<double>(B * P) / loss_s : 0.0, static_cast<long long>(B),
              static_cast<long long>(P), static_cast<long long>(scored), 1e3 * loss_s);
  std::printf("loss split: %.2f ms forward pass, %.2f ms lm_head + cross-entropy\n", 1e3 * pass_s,
              1e3 * std::max(0.0, loss_s - pass_s));
  (void)loss;
}

// The prompts as requests through generate_batch (greedy, no EOS, N new tokens each).
void time_generate_batch(const BenchOptions& o, Engine& engine, Backend& backend, const BenchPrompts& p, bool print) {
  const int64_t B = o.batch, P = o.prompt_len;
  std::vector<BatchRequest> reqs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    reqs[b].prompt.assign(p.tokens.begin() + b * P, p.tokens.begin() + (b + 1) * P);
    reqs[b].max_new_tokens = o.new_tokens;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<GenerationResult> results = generate_batch(engine, reqs);
  backend.synchronize();
  const double gen_s = seconds_since(t0);
  int64_t made = 0;
  for (const auto& r : results) made += static_cast<int64_t>(r.ids.size());
  if (!print) return;
  std::printf("generate_batch tokens/s: %.1f (%lld requests, %lld new tokens in %.2f s, prefill included)\n",
              gen_s > 0 ? static_cast<double>(made) / gen_s : 0.0, static_cast<long long>(B),
              static_cast<long long>(made), gen_s);
}

// "MxKxN,MxKxN,...": each a positive triple (at most 2^20 each, 2^34 elements a matrix).
std::vector<std::array<int64_t, 3>> parse_gemm_shapes(const std::string& text) {
  std::vector<std::array<int64_t, 3>> shapes;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    std::array<int64_t, 3> s{};
    int used = 0;
    char extra = 0;
    long long a = 0, b = 0, c = 0;
    if (std::sscanf(item.c_str(), "%lldx%lldx%lld%n%c", &a, &b, &c, &used, &extra) != 3 ||
        used != static_cast<int>(item.size()) || a < 1 || b < 1 || c < 1 || a > (1 << 20) || b > (1 << 20) ||
        c > (1 << 20) || a * b > (int64_t{1} << 34) || b * c > (int64_t{1} << 34) || a * c > (int64_t{1} << 34)) {
      throw Error("a GEMM shape is MxKxN, each in [1, 2^20], at most 2^34 elements a matrix", "--gemm", "e.g. 512x576x1536",
                  item);
    }
    s = {a, b, c};
    shapes.push_back(s);
    at = end + 1;
  }
  return shapes;
}

// --gemm: matmul_nt_packed over random x and w (N(0, 1), N(0, 0.02)), one warm-up call,
// then calls until 0.5 s have passed (at least 3); the best call's GFLOP/s (2 M K N flops)
// beside the fma peak of the same threads (roofline.h).
void run_gemm_bench(const BenchOptions& o, const WorldConfig& w) {
  const int threads = kernel_threads_per_rank(o.engine.threads, w.local_size);
  cpu::set_num_threads(threads);
  cpu::pin_threads(w.local_rank, w.local_size);
  const DType wt = held_weight_dtype(o.engine.weight_dtype, "cpu", DType::kF32);
  const int64_t group = o.engine.weight_group_size > 0 ? o.engine.weight_group_size : (wt == DType::kI4 ? 32 : 64);
  const double peak = cpu::fma_peak_gflops(threads);
  const bool print = w.world_rank == 0;
  if (print) {
    std::printf("gemm: %s kernels, %d threads, %s weights; fma peak %.1f GFLOP/s\n", cpu::isa_name(cpu::active_isa()),
                threads, dtype_name(wt), peak);
  }
  std::mt19937 rng(o.seed);
  for (const auto& [M, K, N] : o.gemm) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(M * K)), wf(static_cast<size_t>(N * K)), out(static_cast<size_t>(M * N));
    for (auto& v : x) v = nd(rng);
    for (auto& v : wf) v = 0.02f * nd(rng);
    std::vector<char> packed;
    if (is_quantized(wt)) {
      packed.resize(static_cast<size_t>(cpu::quantized_matrix_bytes(N, K, group, wt)));
      cpu::quantize_pack_weight(wf.data(), N, K, group, packed.data(), wt);
    } else {
      std::vector<uint16_t> half;
      const void* src = wf.data();
      if (wt != DType::kF32) {
        half.resize(wf.size());
        for (size_t i = 0; i < wf.size(); ++i) half[i] = wt == DType::kBF16 ? float_to_bf16(wf[i]) : float_to_half(wf[i]);
        src = half.data();
      }
      packed.resize(static_cast<size_t>(cpu::packed_elements(N, K) * static_cast<int64_t>(dtype_size(wt))));
      cpu::pack_weight(src, wt, N, K, packed.data());
    }
    cpu::matmul_nt_packed(x.data(), packed.data(), wt, out.data(), M, K, N);
    double best = 1e30, total = 0;
    int calls = 0;
    while (calls < 3 || total < 0.5) {
      const auto t0 = std::chrono::steady_clock::now();
      cpu::matmul_nt_packed(x.data(), packed.data(), wt, out.data(), M, K, N);
      const double t = seconds_since(t0);
      best = std::min(best, t);
      total += t;
      ++calls;
    }
    const double gflops = 2.0 * static_cast<double>(M) * static_cast<double>(K) * static_cast<double>(N) / best / 1e9;
    if (print) {
      std::printf("gemm %lldx%lldx%lld: %.1f GFLOP/s (%.0f%% of the fma peak), %.3f ms, best of %d\n",
                  static_cast<long long>(M), static_cast<long long>(K), static_cast<long long>(N), gflops,
                  100.0 * gflops / peak, 1e3 * best, calls);
    }
  }
  if (print) std::fflush(stdout);
}

}  // namespace

std::optional<BenchOptions> parse_bench_options(int argc, char** argv, std::string& help_text) {
  cxxopts::Options opts("linnet-tp bench",
                        "Prefill and decode throughput of the decoder: B prompts of P random tokens in one\n"
                        "packed prefill pass, then N decode steps of one token per sequence.\n\n"
                        "  linnet-tp bench --config config.json --random-weights --batch 16\n"
                        "  mpirun -np 2 linnet-tp bench --model DIR --backend cpu\n");
  opts.custom_help("[OPTIONS]");
  // clang-format off
  opts.add_options()
    ("config", "A config.json to build a random-weight model of (with --random-weights)",
     cxxopts::value<std::string>())
    ("random-weights", "N(0, 0.02) weight matrices and unit norm weights, made directly in the "
     "backend's memory (no checkpoint needed)")
    ("batch", "Sequences decoded together", cxxopts::value<int64_t>())
    ("prompt-len", "Tokens per prompt (default 128)", cxxopts::value<int64_t>())
    ("new-tokens", "Decode steps (default 32)", cxxopts::value<int64_t>())
    ("seed", "Seed of the random weights and prompt tokens (default 1)", cxxopts::value<uint64_t>())
    ("loss", "Also time loss_packed over the prompts as documents (labels: the next token): loss tokens/s, "
     "and the forward pass alone")
    ("limits", "Also measure this rank's two CPU limits first: DRAM read GB/s and f32 fma GFLOP/s, with 1 "
     "thread and with --threads (kernels/cpu/roofline.h)")
    ("gemm", "Instead of the decoder: the CPU GEMM microbenchmark, out[M,N] = x[M,K] w[N,K]^T for each "
     "comma-separated MxKxN (e.g. 512x576x1536,512x576x49152), the weights packed in --weight-dtype (auto: f32), "
     "with --threads threads; prints GFLOP/s and the share of the fma peak (each rank runs it, rank 0 prints)",
     cxxopts::value<std::string>())
    ("h,help", "Print this help and exit");
  // clang-format on
  EngineFlags engine_flags;
  engine_flags.model_required = false;
  engine_flags.verbose = false;
  engine_flags.model_help = "Model directory or name (its weights; its shapes only with --random-weights)";
  engine_flags.max_seq_len_help = "KV cache length per sequence (default: prompt-len + new-tokens)";
  engine_flags.cuda_graphs_help = "Record decode steps as CUDA graphs (one per batch-size bucket) and replay them "
                                  "(also LINNET_CUDA_GRAPHS=1; CUDA backend with NCCL or one rank)";
  BenchOptions o;
  const auto parsed = parse_engine_command(opts, engine_flags, argc, argv, "bench", help_text, o.engine);
  if (!parsed) return std::nullopt;
  const cxxopts::ParseResult& r = *parsed;
  if (r.count("config")) o.config = r["config"].as<std::string>();
  o.random_weights = r.count("random-weights") > 0;
  if (r.count("gemm")) o.gemm = parse_gemm_shapes(r["gemm"].as<std::string>());
  if (o.gemm.empty() && o.engine.model.empty() == o.config.empty()) {
    throw Error("give exactly one of --model and --config", "--model");
  }
  if (!o.config.empty() && !o.random_weights) throw Error("needs --random-weights (a config has no weights)", "--config");
  read_at_least<int64_t>(r, "batch", 1, o.batch);
  read_at_least<int64_t>(r, "prompt-len", 1, o.prompt_len);
  read_at_least<int64_t>(r, "new-tokens", 0, o.new_tokens);
  if (r.count("seed")) o.seed = r["seed"].as<uint64_t>();
  o.limits = r.count("limits") > 0;
  o.loss = r.count("loss") > 0;
  return o;
}

int run_bench(const BenchOptions& o, Job& job) {
  std::optional<MpiGroups> made = start_engine_run(o.engine, job);
  if (!made) return kUsageExit;
  MpiGroups& groups = *made;
  const WorldConfig& w = groups.world_config;
  if (!o.gemm.empty()) {
    try {
      run_gemm_bench(o, w);
    } catch (const std::exception& e) {
      job.abort(e.what());
    }
    return 0;
  }

  std::unique_ptr<ModelFiles> files;
  ModelConfig config;
  ShardPlan plan;
  int64_t max_seq_len = 0;
  OpenedEngine opened;
  double load_s = 0;
  if (!job.load_phase([&] {
        if (!o.engine.model.empty()) {
          files = std::make_unique<ModelFiles>(open_model(resolve_model_dir(o.engine.model)));
          config = files->config;
        } else {
          config = ModelConfig::load(o.config);
        }
        // Random weights are made dense, in --weight-dtype (which may quantize them), even
        // from a pre-quantized checkpoint's config.
        if (o.random_weights) config.quantization.reset();
        plan = ShardPlan::make(config, w.tp_rank, w.tp_size);
        if (o.engine.max_seq_len <= 0 && o.prompt_len + o.new_tokens > config.max_position_embeddings) {
          throw Error("--prompt-len + --new-tokens is longer than the model's context", "--prompt-len",
                      "<= max_position_embeddings = " + std::to_string(config.max_position_embeddings) + " in all",
                      std::to_string(o.prompt_len) + " + " + std::to_string(o.new_tokens));
        }
        max_seq_len =
            resolve_max_seq_len(config, o.engine.max_seq_len > 0 ? o.engine.max_seq_len : o.prompt_len + o.new_tokens);
        if (o.prompt_len + o.new_tokens > max_seq_len) {
          throw Error("prompt and new tokens do not fit in the KV cache", "--max-seq-len",
                      ">= " + std::to_string(o.prompt_len + o.new_tokens), std::to_string(max_seq_len));
        }
        const auto t_load = std::chrono::steady_clock::now();
        opened = open_engine(o.engine, config, files.get(), plan, groups, {EngineSizing::Kv::kRows, max_seq_len, o.batch},
                             o.random_weights ? std::optional<uint64_t>(o.seed) : std::nullopt);
        opened.backend->synchronize();
        load_s = seconds_since(t_load);
      })) {
    return kLoadErrorExit;
  }

  try {
    Engine& engine = *opened.engine;
    Backend& backend = *opened.backend;
    const BenchShape shape{config, plan, opened.plan.weight_dtype, opened.plan.weight_group_size, max_seq_len, load_s};
    if (w.world_rank == 0) print_setup(o, shape, engine, backend, w);
    if (o.limits && backend.device() == Device::kCpu) measure_limits(w.world_rank == 0);
    BenchPrompts prompts = random_prompts(o, config.vocab_size);
    const PassTimes t = time_passes(o, engine, backend, prompts, tp_communicator(backend, *groups.tp));
    if (w.world_rank == 0) print_pass_times(o, shape, engine, t);
    // The same B prompts as requests through generate_batch, the continuous-batching
    // scheduler `generate --input` uses (greedy, no EOS, N new tokens each).
    if (o.new_tokens > 0) time_generate_batch(o, engine, backend, prompts, w.world_rank == 0);
    if (o.loss) time_loss(o, engine, backend, prompts, w.world_rank == 0);
    if (w.world_rank == 0 && std::fflush(stdout) != 0) throw Error("cannot write the results", "stdout");
  } catch (const std::exception& e) {
    job.abort(e.what());
  }
  return 0;
}

}  // namespace linnet
