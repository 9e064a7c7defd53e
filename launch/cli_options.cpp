#include "launch/cli_options.h"

#include <cstring>
#include <vector>

#include <cxxopts.hpp>

#include "common/error.h"

namespace linnet {

CommandLine parse_command_line(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  if (args.size() > 1 && std::strcmp(args[1], "generate") == 0) args.erase(args.begin() + 1);

  cxxopts::Options opts("linnet-tp",
                        "Tensor-parallel inference for Llama-family models.\n"
                        "Run it under mpirun: every rank loads its slice of the checkpoint.\n\n"
                        "  mpirun -np 4 linnet-tp [generate] --model DIR --prompt TEXT\n");
  opts.custom_help("[generate] [OPTIONS]");
  // clang-format off
  opts.add_options()
    ("model", "Model directory (Hugging Face layout: config.json, *.safetensors, tokenizer.json)",
     cxxopts::value<std::string>())
    ("prompt", "Prompt text", cxxopts::value<std::string>())
    ("input", "JSONL file, one {\"prompt\": ...} per line, done one after another",
     cxxopts::value<std::string>())
    ("output", "JSONL results, one {prompt, completion, prompt_ids, completion_ids, "
     "finish_reason} per prompt in input order", cxxopts::value<std::string>())
    ("max-new-tokens", "Most tokens to generate per prompt",
     cxxopts::value<int64_t>()->default_value("256"))
    ("temperature", "Sampling temperature; 0 = greedy (default: generation_config.json)",
     cxxopts::value<double>())
    ("top-k", "Keep the k most probable tokens; 0 = off", cxxopts::value<int64_t>())
    ("top-p", "Keep the smallest set of most probable tokens with mass >= p",
     cxxopts::value<double>())
    ("seed", "Sampling seed (default: random, printed with --verbose)", cxxopts::value<uint64_t>())
    ("max-seq-len", "KV cache length (default: min(max_position_embeddings, 8192))",
     cxxopts::value<int64_t>()->default_value("0"))
    ("threads", "BLAS threads per rank (default: cores / ranks on the node)",
     cxxopts::value<int>()->default_value("0"))
    ("verbose", "Print load details, KV cache size and the seed to stderr")
    ("version", "Print the version and exit")
    ("h,help", "Print this help and exit");
  // clang-format on

  CommandLine cl;
  cxxopts::ParseResult r;
  try {
    r = opts.parse(static_cast<int>(args.size()), args.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw Error(e.what(), "command line");
  }
  if (!r.unmatched().empty()) {
    throw Error("unexpected argument '" + r.unmatched().front() + "'", "command line");
  }
  if (r.count("help")) {
    cl.kind = CommandLine::Kind::kHelp;
    cl.help_text = opts.help();
    return cl;
  }
  if (r.count("version")) {
    cl.kind = CommandLine::Kind::kVersion;
    return cl;
  }
  GenerateOptions& g = cl.generate;
  if (!r.count("model")) throw Error("is required", "--model");
  g.model = r["model"].as<std::string>();
  if (r.count("prompt")) g.prompt = r["prompt"].as<std::string>();
  if (r.count("input")) g.input = r["input"].as<std::string>();
  if (r.count("output")) g.output = r["output"].as<std::string>();
  if (!g.prompt && g.input.empty()) throw Error("give --prompt TEXT or --input FILE.jsonl", "--prompt");
  if (g.prompt && !g.input.empty()) throw Error("give only one of --prompt and --input", "--input");
  g.max_new_tokens = r["max-new-tokens"].as<int64_t>();
  if (g.max_new_tokens < 0) {
    throw Error("must be >= 0", "--max-new-tokens", ">= 0", std::to_string(g.max_new_tokens));
  }
  if (r.count("temperature")) g.temperature = r["temperature"].as<double>();
  if (r.count("top-k")) g.top_k = r["top-k"].as<int64_t>();
  if (r.count("top-p")) g.top_p = r["top-p"].as<double>();
  if (r.count("seed")) g.seed = r["seed"].as<uint64_t>();
  g.max_seq_len = r["max-seq-len"].as<int64_t>();
  if (g.max_seq_len < 0) throw Error("must be >= 0", "--max-seq-len", ">= 0", std::to_string(g.max_seq_len));
  g.threads = r["threads"].as<int>();
  g.verbose = r.count("verbose") > 0;
  return cl;
}

}  // namespace linnet
