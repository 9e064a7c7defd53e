#include "launch/engine_options.h"

#include <algorithm>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

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
      ("no-prefix-caching", "Compute every prompt in full instead of sharing the KV pages of a cached prefix")
      ("speculative-config", "Speculative decoding, a JSON object as vLLM's: {\"method\": \"ngram\", "
       "\"num_speculative_tokens\": K, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2, "
       "\"disable_by_batch_size\": N}, or {\"method\": \"draft_model\", \"model\": DIR, "
       "\"num_speculative_tokens\": K}: each request runs up to K guesses a step, from prompt lookup or a "
       "smaller model with the same tokenizer (same output)",
       cxxopts::value<std::string>());
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
    if (r.count("speculative-config")) o.speculative = parse_speculative_config(r["speculative-config"].as<std::string>());
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

SpeculativeConfig parse_speculative_config(const std::string& text) {
  const char* flag = "--speculative-config";
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) invalid_value(flag, "a JSON object", "'" + text + "'");
  const auto integer = [&](const char* key, int64_t lo, int64_t hi) -> std::optional<int64_t> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    const nlohmann::json& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
      throw Error("invalid value", std::string(flag) + " key \"" + key + "\"",
                  "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", v.dump());
    }
    return v.get<int64_t>();
  };
  for (const auto& [key, value] : j.items()) {
    static const char* const known[] = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                                        "model", "quantization", "disable_by_batch_size"};
    if (std::find(std::begin(known), std::end(known), key) == std::end(known)) {
      throw Error("unknown key", flag, "method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, model, "
                  "quantization, disable_by_batch_size", "\"" + key + "\"");
    }
    (void)value;
  }
  SpeculativeConfig c;
  if (!j.contains("method") || !j["method"].is_string()) {
    throw Error("is required", std::string(flag) + " key \"method\"", "\"ngram\"",
                j.contains("method") ? j["method"].dump() : "absent");
  }
  c.method = j["method"].get<std::string>();
  if (c.method != "ngram" && c.method != "draft_model") {
    throw Error("invalid value", std::string(flag) + " key \"method\"", "\"ngram\" or \"draft_model\"", j["method"].dump());
  }
  if (c.method == "draft_model") {
    if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty()) {
      throw Error("is required with method \"draft_model\"", std::string(flag) + " key \"model\"",
                  "the draft checkpoint's folder", j.contains("model") ? j["model"].dump() : "absent");
    }
    c.model = j["model"].get<std::string>();
    if (j.contains("quantization")) {
      const nlohmann::json& q = j["quantization"];
      static const char* const dtypes[] = {"f32", "bf16", "f16", "int8", "int4"};
      if (!q.is_string() || std::find(std::begin(dtypes), std::end(dtypes), q.get<std::string>()) == std::end(dtypes)) {
        throw Error("invalid value", std::string(flag) + " key \"quantization\"",
                    "the draft's weight dtype: f32, bf16, f16, int8 or int4", q.dump());
      }
      c.quantization = q.get<std::string>();
    }
    for (const char* key : {"prompt_lookup_min", "prompt_lookup_max"}) {
      if (j.contains(key)) {
        throw Error("invalid key", std::string(flag) + " key \"" + key + "\"", "only with method \"ngram\"", j[key].dump());
      }
    }
  } else {
    for (const char* key : {"model", "quantization"}) {
      if (j.contains(key)) {
        throw Error("invalid key", std::string(flag) + " key \"" + key + "\"", "only with method \"draft_model\"", j[key].dump());
      }
    }
  }
  const auto k = integer("num_speculative_tokens", 1, kMaxSpeculativeTokens);
  if (!k) throw Error("is required", std::string(flag) + " key \"num_speculative_tokens\"");
  c.num_speculative_tokens = *k;
  const auto lo = integer("prompt_lookup_min", 1, kMaxPromptLookup);
  const auto hi = integer("prompt_lookup_max", 1, kMaxPromptLookup);
  c.prompt_lookup_max = hi ? *hi : std::max<int64_t>(c.prompt_lookup_max, lo.value_or(0));
  c.prompt_lookup_min = lo ? *lo : std::min(c.prompt_lookup_min, c.prompt_lookup_max);
  if (c.prompt_lookup_min > c.prompt_lookup_max) {
    throw Error("invalid value", std::string(flag) + " key \"prompt_lookup_min\"",
                "<= prompt_lookup_max (" + std::to_string(c.prompt_lookup_max) + ")", std::to_string(c.prompt_lookup_min));
  }
  c.disable_by_batch_size = integer("disable_by_batch_size", 1, int64_t{1} << 30).value_or(0);
  return c;
}

}  // namespace linnet
