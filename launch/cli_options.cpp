#include "launch/cli_options.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <cxxopts.hpp>

#include "common/error.h"
#include "launch/cli_parse.h"
#include "launch/request_settings.h"
#include "launch/serve_command.h"
#include "runtime/model_loader.h"

namespace linnet {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void invalid(const char* option, const std::string& expected, const std::string& actual) {
  throw Error("invalid value", option, expected, actual);
}

}  // namespace

void add_engine_options(cxxopts::Options& opts, const std::string& dp_note, const std::string& max_batch_help) {
  // clang-format off
  opts.add_options()
    ("model", "Model directory (Hugging Face layout: config.json, *.safetensors, tokenizer.json)",
     cxxopts::value<std::string>())
    ("tp", "Ranks per tensor-parallel group (default: all ranks); world = dp x tp, and the " + dp_note,
     cxxopts::value<int>())
    ("max-seq-len", "KV cache length in tokens (default: min(max_position_embeddings, 8192))",
     cxxopts::value<int64_t>())
    ("max-batch", max_batch_help, cxxopts::value<int64_t>()->default_value("16"))
    ("kv-cache-tokens", "Positions of the paged KV pool, in pages of 64 (default: --max-batch requests of "
     "--max-seq-len); prompts sharing a prefix share its pages", cxxopts::value<int64_t>())
    ("kv-cache-memory-fraction", "Size the KV pool as this fraction (0, 1] of the memory left after the "
     "weights, instead of --kv-cache-tokens", cxxopts::value<double>())
    ("no-prefix-caching", "Compute every prompt in full instead of sharing the KV pages of a cached prefix")
    ("cuda-graphs", "With --backend cuda, replay decode steps as CUDA graphs (also LINNET_CUDA_GRAPHS=1; "
     "experimental)")
    ("threads", "CPU backend: kernel (OpenMP) threads per rank (default: cores / ranks on the node)",
     cxxopts::value<int64_t>())
    ("backend", "cpu or cuda (default: cuda when a CUDA device is visible, else cpu)",
     cxxopts::value<std::string>())
    ("weight-dtype", kWeightDtypeHelp, cxxopts::value<std::string>())
    ("kv-cache-dtype", kKvCacheDtypeHelp, cxxopts::value<std::string>())
    ("comm-timeout", kCommTimeoutHelp, cxxopts::value<int64_t>())
    ("verbose", "Print the shard plan, KV cache size, sampling settings and seed to stderr");
  // clang-format on
}

void read_engine_options(const cxxopts::ParseResult& r, GenerateOptions& g) {
  if (!r.count("model")) throw Error("is required", "--model");
  g.model = r["model"].as<std::string>();
  read_at_least(r, "tp", 1, g.tp);
  read_comm_timeout(r, g.comm_timeout);
  read_in_range(r, "max-seq-len", 1, kMaxSeqLenLimit, g.max_seq_len);
  g.max_batch = r["max-batch"].as<int64_t>();
  if (g.max_batch < 1 || g.max_batch > kMaxBatchLimit) {
    invalid("--max-batch", "an integer in [1, " + std::to_string(kMaxBatchLimit) + "]", std::to_string(g.max_batch));
  }
  g.prefix_caching = !r.count("no-prefix-caching");
  g.cuda_graphs = r.count("cuda-graphs") > 0;
  if (r.count("kv-cache-tokens") && r.count("kv-cache-memory-fraction")) {
    invalid("--kv-cache-tokens", "not together with --kv-cache-memory-fraction", "both");
  }
  if (r.count("kv-cache-tokens")) {
    g.kv_cache_tokens = r["kv-cache-tokens"].as<int64_t>();
    if (*g.kv_cache_tokens < 1 || *g.kv_cache_tokens > kMaxKvCacheTokens) {
      invalid("--kv-cache-tokens", "an integer in [1, " + std::to_string(kMaxKvCacheTokens) + "]",
              std::to_string(*g.kv_cache_tokens));
    }
  }
  if (r.count("kv-cache-memory-fraction")) {
    g.kv_cache_memory_fraction = r["kv-cache-memory-fraction"].as<double>();
    const double f = *g.kv_cache_memory_fraction;
    if (!(f > 0.0 && f <= 1.0)) invalid("--kv-cache-memory-fraction", "in (0, 1]", num(f));
  }
  read_in_range(r, "threads", 1, kMaxThreads, g.threads);
  read_backend(r, g.backend);
  read_weight_dtype(r, g.weight_dtype);
  read_kv_cache_dtype(r, g.kv_cache_dtype);
  g.verbose = r.count("verbose") > 0;
}

CommandLine parse_command_line(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "info") == 0) {
    CommandLine cl;
    const auto options = parse_info_options(argc, argv, cl.help_text);
    cl.kind = options ? CommandLine::Kind::kInfo : CommandLine::Kind::kHelp;
    if (options) cl.info = *options;
    return cl;
  }
  if (argc > 1 && std::strcmp(argv[1], "loss") == 0) {
    CommandLine cl;
    const auto options = parse_loss_options(argc, argv, cl.help_text);
    cl.kind = options ? CommandLine::Kind::kLoss : CommandLine::Kind::kHelp;
    if (options) cl.loss = *options;
    return cl;
  }
  if (argc > 1 && std::strcmp(argv[1], "tokenize") == 0) {
    CommandLine cl;
    const auto options = parse_tokenize_options(argc, argv, cl.help_text);
    cl.kind = options ? CommandLine::Kind::kTokenize : CommandLine::Kind::kHelp;
    if (options) cl.tokenize = *options;
    return cl;
  }
  if (argc > 1 && std::strcmp(argv[1], "bench") == 0) {
    CommandLine cl;
    const auto options = parse_bench_options(argc, argv, cl.help_text);
    cl.kind = options ? CommandLine::Kind::kBench : CommandLine::Kind::kHelp;
    if (options) cl.bench = *options;
    return cl;
  }
  if (argc > 1 && std::strcmp(argv[1], "serve") == 0) {
    CommandLine cl;
    const auto options = parse_serve_options(argc, argv, cl.help_text);
    cl.kind = options ? CommandLine::Kind::kServe : CommandLine::Kind::kHelp;
    if (options) cl.serve = *options;
    return cl;
  }
  if (argc > 1 && std::strcmp(argv[1], "template") == 0) {
    CommandLine cl;
    const auto options = parse_template_options(argc, argv, cl.help_text);
    cl.kind = options ? CommandLine::Kind::kTemplate : CommandLine::Kind::kHelp;
    if (options) cl.chat_template = *options;
    return cl;
  }

  cxxopts::Options opts("linnet-tp",
                        "Tensor-parallel inference for Llama-family models. Run it under mpirun:\n"
                        "every rank loads its slice of the checkpoint and computes its share of\n"
                        "each layer.\n\n"
                        "  mpirun -np 4 linnet-tp --model DIR --prompt TEXT\n\n"
                        "Subcommands: generate (the default), serve, loss, bench, info, tokenize, template (see SUBCOMMAND --help).\n");
  opts.custom_help("[generate] [OPTIONS]");
  // clang-format off
  opts.add_options()
    ("prompt", "Prompt text (raw, unless --chat)", cxxopts::value<std::string>())
    ("input", "JSONL file, one {\"prompt\": ...} per line, generated with continuous batching "
     "(instead of --prompt); a {\"messages\": [...], ...} line is rendered with the chat template. "
     "A line may set temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, "
     "frequency_penalty, seed, max_new_tokens, "
     "stop, stop_token_ids, logprobs, top_logprobs (default: the flags)",
     cxxopts::value<std::string>())
    ("chat", "Treat --prompt (and each {\"prompt\"} line) as one user message and render it with the "
     "model's chat template (add_generation_prompt true)")
    ("output", "JSONL results, one {index, prompt, completion, prompt_ids, completion_ids, "
     "finish_reason, prompt_tokens, completion_tokens} per prompt in input order; written "
     "atomically when the run ends (an interrupted run keeps the finished ones). With --input, "
     "each finished request goes to OUTPUT.journal at once (kept after a crash, removed at the end)",
     cxxopts::value<std::string>())
    ("resume", "With --input and --output: keep the lines already in --output and in its journal "
     "(matched by their \"index\", the 0-based input line) and generate only the missing ones")
    ("max-new-tokens", "Most tokens to generate per prompt; prompt + new tokens never exceed "
     "--max-seq-len. Default: generation_config.json, else 256", cxxopts::value<int64_t>())
    ("temperature", "Sampling temperature; 0 = greedy. Default: generation_config.json "
     "(do_sample true: its temperature or 1; else 0)", cxxopts::value<double>())
    ("top-k", "With sampling, keep the k most probable tokens; 0 = off. Default: "
     "generation_config.json, else 50", cxxopts::value<int64_t>())
    ("top-p", "With sampling, keep the smallest set of most probable tokens with mass >= p. "
     "Default: generation_config.json, else 1", cxxopts::value<double>())
    ("min-p", "With sampling, drop tokens whose probability is below min-p times the most "
     "probable one's; 0 = off. Default: generation_config.json, else 0", cxxopts::value<double>())
    ("repetition-penalty", "Divide positive (multiply negative) logits of tokens already in the "
     "prompt or completion by this; 1 = off. Default: generation_config.json, else 1",
     cxxopts::value<double>())
    ("stop", "Stop string (repeatable): generation ends when the completion contains it, and the "
     "completion is cut before it", cxxopts::value<std::string>())
    ("stop-token-ids", "Comma-separated token ids that end generation, besides the model's EOS ids",
     cxxopts::value<std::vector<int64_t>>())
    ("logprobs", "Record each new token's log-probability (log_softmax of the raw logits) in --output")
    ("top-logprobs", "With --logprobs, also the N most probable alternatives per token (N <= 20; "
     "implies --logprobs)", cxxopts::value<int64_t>())
    ("seed", "Sampling seed (default: random, printed with --verbose; --resume takes the journal's)",
     cxxopts::value<uint64_t>())
    ("progress", "Draw the --input progress bar on stderr even when it is not a terminal (under mpirun a "
     "rank's stderr is a pipe, so the bar is off unless asked for)")
    ("version", "Print the version and exit")
    ("h,help", "Print this help and exit");
  // clang-format on
  add_engine_options(opts, "dp groups split the --input prompts", "With --input, prompts decoded together "
                     "(continuous batching)");

  CommandLine cl;
  const auto parsed = parse_options(opts, argc, argv, "generate", cl.help_text);
  if (!parsed) {
    cl.kind = CommandLine::Kind::kHelp;
    return cl;
  }
  const cxxopts::ParseResult& r = *parsed;
  if (r.count("version")) {
    cl.kind = CommandLine::Kind::kVersion;
    return cl;
  }
  GenerateOptions& g = cl.generate;
  read_engine_options(r, g);
  if (r.count("prompt") > 1 || r.count("input") > 1) throw Error("given more than once", "--prompt/--input");
  if (r.count("prompt")) g.prompt = r["prompt"].as<std::string>();
  if (r.count("input")) g.input = r["input"].as<std::string>();
  if (r.count("output")) {
    g.output = r["output"].as<std::string>();
    if (g.output.empty()) throw Error("is empty", "--output");
  }
  if (!g.prompt && g.input.empty()) throw Error("give --prompt TEXT or --input FILE.jsonl", "--prompt");
  if (g.prompt && !g.input.empty()) throw Error("give only one of --prompt and --input", "--input");
  if (r.count("max-new-tokens")) {
    g.max_new_tokens = r["max-new-tokens"].as<int64_t>();
    if (*g.max_new_tokens < 0) invalid("--max-new-tokens", ">= 0", std::to_string(*g.max_new_tokens));
  }
  if (r.count("temperature")) {
    g.temperature = r["temperature"].as<double>();
    if (!temperature_ok(*g.temperature)) invalid("--temperature", "a finite number >= 0", num(*g.temperature));
  }
  if (r.count("min-p")) {
    g.min_p = r["min-p"].as<double>();
    if (!min_p_ok(*g.min_p)) invalid("--min-p", "in [0, 1]", num(*g.min_p));
  }
  if (r.count("repetition-penalty")) {
    g.repetition_penalty = r["repetition-penalty"].as<double>();
    if (!penalty_ok(*g.repetition_penalty)) {
      invalid("--repetition-penalty", "a finite number > 0", num(*g.repetition_penalty));
    }
  }
  // Every --stop in order (cxxopts' vector values would split a stop string at commas).
  for (const auto& kv : r.arguments()) {
    if (kv.key() != "stop") continue;
    if (kv.value().empty()) invalid("--stop", "a non-empty string", "\"\"");
    g.stop.push_back(kv.value());
  }
  if (r.count("stop-token-ids")) {
    g.stop_token_ids = r["stop-token-ids"].as<std::vector<int64_t>>();
    for (int64_t id : g.stop_token_ids) {
      if (id < 0) invalid("--stop-token-ids", "token ids >= 0", std::to_string(id));
    }
  }
  g.logprobs = r.count("logprobs") > 0;
  if (r.count("top-logprobs")) {
    g.top_logprobs = r["top-logprobs"].as<int64_t>();
    if (g.top_logprobs < 0 || g.top_logprobs > kMaxTopLogprobs) {
      invalid("--top-logprobs", "in [0, " + std::to_string(kMaxTopLogprobs) + "]", std::to_string(g.top_logprobs));
    }
    g.logprobs = true;
  }
  g.resume = r.count("resume") > 0;
  if (g.resume && (g.input.empty() || g.output.empty())) throw Error("needs --input and --output", "--resume");
  if (r.count("top-k")) {
    g.top_k = r["top-k"].as<int64_t>();
    if (*g.top_k < 0) invalid("--top-k", ">= 0", std::to_string(*g.top_k));
  }
  if (r.count("top-p")) {
    g.top_p = r["top-p"].as<double>();
    if (!top_p_ok(*g.top_p)) invalid("--top-p", "in (0, 1]", num(*g.top_p));
  }
  if (r.count("seed")) g.seed = r["seed"].as<uint64_t>();
  g.progress = r.count("progress") > 0;
  g.chat = r.count("chat") > 0;
  return cl;
}

}  // namespace linnet
