#include "launch/cli_options.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <cxxopts.hpp>

#include "common/error.h"
#include "launch/cli_parse.h"

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
                        "Subcommands: generate (the default), loss, info, tokenize, template (see SUBCOMMAND --help).\n");
  opts.custom_help("[generate] [OPTIONS]");
  // clang-format off
  opts.add_options()
    ("model", "Model directory (Hugging Face layout: config.json, *.safetensors, tokenizer.json)",
     cxxopts::value<std::string>())
    ("prompt", "Prompt text (raw, unless --chat)", cxxopts::value<std::string>())
    ("input", "JSONL file, one {\"prompt\": ...} per line, done one after another "
     "(instead of --prompt); a {\"messages\": [...], ...} line is rendered with the chat template",
     cxxopts::value<std::string>())
    ("chat", "Treat --prompt (and each {\"prompt\"} line) as one user message and render it with the "
     "model's chat template (add_generation_prompt true)")
    ("output", "JSONL results, one {prompt, completion, prompt_ids, completion_ids, "
     "finish_reason} per prompt in input order; written when the run succeeds",
     cxxopts::value<std::string>())
    ("max-new-tokens", "Most tokens to generate per prompt; prompt + new tokens never exceed "
     "--max-seq-len", cxxopts::value<int64_t>()->default_value("256"))
    ("temperature", "Sampling temperature; 0 = greedy. Default: generation_config.json "
     "(do_sample true: its temperature or 1; else 0)", cxxopts::value<double>())
    ("top-k", "With sampling, keep the k most probable tokens; 0 = off. Default: "
     "generation_config.json, else 50", cxxopts::value<int64_t>())
    ("top-p", "With sampling, keep the smallest set of most probable tokens with mass >= p. "
     "Default: generation_config.json, else 1", cxxopts::value<double>())
    ("seed", "Sampling seed (default: random, printed with --verbose)", cxxopts::value<uint64_t>())
    ("max-seq-len", "KV cache length in tokens (default: min(max_position_embeddings, 8192))",
     cxxopts::value<int64_t>())
    ("max-batch", "With --input, prompts decoded together (continuous batching; KV cache rows)",
     cxxopts::value<int64_t>()->default_value("16"))
    ("threads", "BLAS threads per rank (default: cores / ranks on the node)",
     cxxopts::value<int>())
    ("verbose", "Print the shard plan, KV cache size, sampling settings and seed to stderr")
    ("version", "Print the version and exit")
    ("h,help", "Print this help and exit");
  // clang-format on

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
  if (!r.count("model")) throw Error("is required", "--model");
  g.model = r["model"].as<std::string>();
  if (r.count("prompt") > 1 || r.count("input") > 1) throw Error("given more than once", "--prompt/--input");
  if (r.count("prompt")) g.prompt = r["prompt"].as<std::string>();
  if (r.count("input")) g.input = r["input"].as<std::string>();
  if (r.count("output")) {
    g.output = r["output"].as<std::string>();
    if (g.output.empty()) throw Error("is empty", "--output");
  }
  if (!g.prompt && g.input.empty()) throw Error("give --prompt TEXT or --input FILE.jsonl", "--prompt");
  if (g.prompt && !g.input.empty()) throw Error("give only one of --prompt and --input", "--input");
  g.max_new_tokens = r["max-new-tokens"].as<int64_t>();
  if (g.max_new_tokens < 0) invalid("--max-new-tokens", ">= 0", std::to_string(g.max_new_tokens));
  if (r.count("temperature")) {
    g.temperature = r["temperature"].as<double>();
    if (!(*g.temperature >= 0.0) || std::isinf(*g.temperature)) {
      invalid("--temperature", "a finite number >= 0", num(*g.temperature));
    }
  }
  if (r.count("top-k")) {
    g.top_k = r["top-k"].as<int64_t>();
    if (*g.top_k < 0) invalid("--top-k", ">= 0", std::to_string(*g.top_k));
  }
  if (r.count("top-p")) {
    g.top_p = r["top-p"].as<double>();
    if (!(*g.top_p > 0.0 && *g.top_p <= 1.0)) invalid("--top-p", "in (0, 1]", num(*g.top_p));
  }
  if (r.count("seed")) g.seed = r["seed"].as<uint64_t>();
  if (r.count("max-seq-len")) {
    g.max_seq_len = r["max-seq-len"].as<int64_t>();
    if (g.max_seq_len < 1) invalid("--max-seq-len", ">= 1", std::to_string(g.max_seq_len));
  }
  g.max_batch = r["max-batch"].as<int64_t>();
  if (g.max_batch < 1) invalid("--max-batch", ">= 1", std::to_string(g.max_batch));
  if (r.count("threads")) {
    g.threads = r["threads"].as<int>();
    if (g.threads < 1) invalid("--threads", ">= 1", std::to_string(g.threads));
  }
  g.verbose = r.count("verbose") > 0;
  g.chat = r.count("chat") > 0;
  return cl;
}

}  // namespace linnet
