#include "launch/engine_options.h"

#include <cxxopts.hpp>

#include "common/error.h"
#include "launch/cli_parse.h"
#include "runtime/backend.h"
#include "runtime/model_loader.h"

namespace linnet {

EngineFlags paged_engine_flags(const std::string& dp_groups_take, const std::string& max_batch_help) {
  EngineFlags f;
  f.paged_pool = true;
  f.model_help = "Model directory (Hugging Face layout: config.json, *.safetensors, tokenizer.json)";
  f.tp_help = "Ranks per tensor-parallel group (default: all ranks); world = dp x tp, and the dp groups " + dp_groups_take;
  f.max_batch_help = max_batch_help;
  return f;
}

int64_t quantized_group_size(const EngineOptions& o) {
  if (o.weight_dtype != "int8" && o.weight_dtype != "int4") return 0;
  if (o.weight_group_size > 0) return o.weight_group_size;
  return default_weight_group_size(o.weight_dtype == "int4" ? DType::kI4 : DType::kI8);
}

void add_engine_options(cxxopts::Options& opts, const EngineFlags& which) {
  // clang-format off
  opts.add_options()
    ("model", which.model_help, cxxopts::value<std::string>())
    ("tp", which.tp_help, cxxopts::value<int>())
    ("max-seq-len", which.max_seq_len_help, cxxopts::value<int64_t>());
  if (which.paged_pool) {
    opts.add_options()
      ("max-batch", which.max_batch_help, cxxopts::value<int64_t>()->default_value("16"))
      ("kv-cache-tokens", "Positions of the paged KV pool, in pages of 64 (default: --max-batch requests of "
       "--max-seq-len); prompts sharing a prefix share its pages", cxxopts::value<int64_t>())
      ("kv-cache-memory-fraction", "Size the KV pool as this fraction (0, 1] of the memory left after the "
       "weights, instead of --kv-cache-tokens", cxxopts::value<double>())
      ("no-prefix-caching", "Compute every prompt in full instead of sharing the KV pages of a cached prefix");
  }
  if (which.cuda_graphs) opts.add_options()("cuda-graphs", which.cuda_graphs_help);
  opts.add_options()
    ("threads", "CPU backend: kernel (OpenMP) threads per rank (default: cores / ranks on the node)",
     cxxopts::value<int64_t>())
    ("backend", "cpu or cuda (default: cuda when a CUDA device is visible, else cpu)",
     cxxopts::value<std::string>())
    ("weight-dtype", kWeightDtypeHelp, cxxopts::value<std::string>())
    ("weight-group-size", kWeightGroupSizeHelp, cxxopts::value<int64_t>())
    ("kv-cache-dtype", kKvCacheDtypeHelp, cxxopts::value<std::string>())
    ("activation-dtype", kActivationDtypeHelp, cxxopts::value<std::string>())
    ("comm-timeout", kCommTimeoutHelp, cxxopts::value<int64_t>());
  if (which.verbose) opts.add_options()("verbose", which.verbose_help);
  // clang-format on
}

void read_engine_options(const cxxopts::ParseResult& r, const EngineFlags& which, EngineOptions& o) {
  if (r.count("model")) {
    o.model = r["model"].as<std::string>();
  } else if (which.model_required) {
    throw Error("is required", "--model");
  }
  read_at_least(r, "tp", 1, o.tp);
  read_comm_timeout(r, o.comm_timeout);
  read_in_range(r, "max-seq-len", which.min_max_seq_len, kMaxSeqLenLimit, o.max_seq_len);
  if (which.paged_pool) {
    o.max_batch = r["max-batch"].as<int64_t>();
    if (o.max_batch < 1 || o.max_batch > kMaxBatchLimit) {
      invalid_value("--max-batch", "an integer in [1, " + std::to_string(kMaxBatchLimit) + "]", std::to_string(o.max_batch));
    }
    o.prefix_caching = !r.count("no-prefix-caching");
    if (r.count("kv-cache-tokens") && r.count("kv-cache-memory-fraction")) {
      invalid_value("--kv-cache-tokens", "not together with --kv-cache-memory-fraction", "both");
    }
    if (r.count("kv-cache-tokens")) {
      o.kv_cache_tokens = r["kv-cache-tokens"].as<int64_t>();
      if (*o.kv_cache_tokens < 1 || *o.kv_cache_tokens > kMaxKvCacheTokens) {
        invalid_value("--kv-cache-tokens", "an integer in [1, " + std::to_string(kMaxKvCacheTokens) + "]",
                std::to_string(*o.kv_cache_tokens));
      }
    }
    if (r.count("kv-cache-memory-fraction")) {
      o.kv_cache_memory_fraction = r["kv-cache-memory-fraction"].as<double>();
      const double f = *o.kv_cache_memory_fraction;
      if (!(f > 0.0 && f <= 1.0)) invalid_value("--kv-cache-memory-fraction", "in (0, 1]", number_text(f));
    }
  }
  if (which.cuda_graphs) o.cuda_graphs = r.count("cuda-graphs") > 0;
  read_in_range(r, "threads", 1, kMaxThreads, o.threads);
  read_backend(r, o.backend);
  read_weight_dtype(r, o.weight_dtype);
  read_weight_group_size(r, o.weight_dtype, o.weight_group_size);
  read_kv_cache_dtype(r, o.kv_cache_dtype);
  read_activation_dtype(r, o.activation_dtype);
  if (which.verbose) o.verbose = r.count("verbose") > 0;
}

std::optional<cxxopts::ParseResult> parse_engine_command(cxxopts::Options& opts, const EngineFlags& which, int argc,
                                                         char** argv, const char* subcommand, std::string& help_text,
                                                         EngineOptions& o) {
  add_engine_options(opts, which);
  std::optional<cxxopts::ParseResult> parsed = parse_options(opts, argc, argv, subcommand, help_text);
  if (parsed) read_engine_options(*parsed, which, o);
  return parsed;
}

}  // namespace linnet
