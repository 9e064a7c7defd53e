#include "launch/info_command.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include <cxxopts.hpp>

#include "common/error.h"
#include "launch/cli_parse.h"
#include "driver/job.h"
#include "loader/model_path.h"
#include "loader/checkpoint.h"
#include "loader/model_config.h"
#include "loader/weight_table.h"
#include "parallel/shard_plan.h"
#include "launch/engine_setup.h"
#include "runtime/backend_factory.h"
#include "runtime/model_loader.h"
#include "runtime/weights.h"

namespace linnet {
namespace {

std::string range(int64_t begin, int64_t n) {
  return "[" + std::to_string(begin) + ", " + std::to_string(begin + n) + ")";
}

bool has_checkpoint(const std::filesystem::path& dir) {
  return std::filesystem::exists(dir / "model.safetensors") ||
         std::filesystem::exists(dir / "model.safetensors.index.json");
}

}  // namespace

std::optional<InfoOptions> parse_info_options(int argc, char** argv, std::string& help_text) {
  cxxopts::Options opts("linnet-tp info",
                        "A model's configuration and what each tensor-parallel rank would hold,\n"
                        "from config.json and the safetensors headers only (no weights read).\n");
  // clang-format off
  opts.add_options()
    ("model", "Model directory or name", cxxopts::value<std::string>())
    ("tp", "Tensor-parallel size to plan for", cxxopts::value<int>()->default_value("1"))
    ("max-seq-len", "KV cache length in tokens (default: min(max_position_embeddings, 8192))",
     cxxopts::value<int64_t>())
    ("weight-dtype", "The dtype the weights column counts: auto (the checkpoint's, else config.json's "
     "torch_dtype), f32, bf16, f16, int8 or int4", cxxopts::value<std::string>())
    ("weight-group-size", kWeightGroupSizeHelp, cxxopts::value<int64_t>())
    ("h,help", "Print this help and exit");
  // clang-format on
  const auto parsed = parse_options(opts, argc, argv, "info", help_text);
  if (!parsed) return std::nullopt;
  const cxxopts::ParseResult& r = *parsed;
  InfoOptions o;
  if (!r.count("model")) throw Error("is required", "--model");
  o.model = r["model"].as<std::string>();
  o.tp = r["tp"].as<int>();
  if (o.tp < 1) throw Error("invalid value", "--tp", ">= 1", std::to_string(o.tp));
  read_weight_dtype(r, o.weight_dtype);
  read_weight_group_size(r, o.weight_dtype, o.weight_group_size);
  if (r.count("max-seq-len")) {
    o.max_seq_len = r["max-seq-len"].as<int64_t>();
    if (o.max_seq_len < 1) throw Error("invalid value", "--max-seq-len", ">= 1", std::to_string(o.max_seq_len));
  }
  return o;
}

int run_info(const InfoOptions& o, Job& job) {
  if (job.rank() != 0) return 0;
  try {
    const std::filesystem::path dir = resolve_model_dir(o.model);
    const ModelConfig c = ModelConfig::load(dir / "config.json");
    std::printf("model: %s\n", dir.string().c_str());
    std::printf("  model_type %s, %lld layers, hidden_size %lld, intermediate_size %lld\n", c.model_type.c_str(),
                static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.intermediate_size));
    std::printf("  num_attention_heads %lld, num_key_value_heads %lld, head_dim %lld, vocab_size %lld%s\n",
                static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.num_key_value_heads),
                static_cast<long long>(c.head_dim), static_cast<long long>(c.vocab_size),
                c.tie_word_embeddings ? " (tied lm_head)" : "");
    std::printf("  rope_theta %g", c.rope_theta);
    if (const auto& rs = c.rope_scaling) {
      std::printf(", rope_scaling %s (factor %g, low_freq_factor %g, high_freq_factor %g, "
                  "original_max_position_embeddings %lld)",
                  rs->rope_type.c_str(), rs->factor, rs->low_freq_factor, rs->high_freq_factor,
                  static_cast<long long>(rs->original_max_position_embeddings));
    }
    std::printf(", max_position_embeddings %lld, rms_norm_eps %g", static_cast<long long>(c.max_position_embeddings),
                c.rms_norm_eps);
    if (c.sliding_window) std::printf(", sliding_window %lld", static_cast<long long>(*c.sliding_window));
    if (c.qk_norm) std::printf(", QK-norm");
    if (c.fused_projections) std::printf(", fused qkv_proj / gate_up_proj");
    if (c.quantization) std::printf(", layers quantized: %s", c.quantization->describe().c_str());
    std::printf("\n");

    DType held = config_weight_dtype(c);
    if (has_checkpoint(dir)) {
      const Checkpoint ckpt = Checkpoint::open(dir);  // headers only
      held = ckpt.dominant_dtype();
      const std::vector<WeightEntry> table = weight_table(c);
      const std::vector<std::string> unused = ckpt.validate(tensor_specs(table, c));
      check_unused_quantized_parts(unused, table, c, dir.string());
      std::map<std::string, int> dtypes;
      for (const WeightEntry& e : table) {
        if (stored_quantized(e, c)) {  // counted as what the packed words hold
          dtypes[c.quantization->fp8 ? std::string("F8_E4M3")
                                     : std::string(c.quantization->num_bits == 4 ? "int4" : "int8") + " (packed I32)"]++;
        } else {
          dtypes[safetensors_dtype_name(ckpt.find(e.name).first->dtype)]++;
        }
      }
      std::string d;
      for (const auto& [name, n] : dtypes) d += (d.empty() ? "" : ", ") + std::to_string(n) + " " + name;
      std::printf("checkpoint: %s of tensor data; the model's tensors: %s; all names and shapes match%s\n",
                  format_bytes(static_cast<int64_t>(ckpt.total_bytes())).c_str(), d.c_str(),
                  unused.empty() ? "" : (" (" + std::to_string(unused.size()) + " unused)").c_str());
    } else {
      std::printf("checkpoint: none in this directory; sizes below come from config.json\n");
    }

    EngineOptions eo;  // what info plans for: the CPU backend, an f32 KV cache
    eo.backend = "cpu";
    eo.weight_dtype = o.weight_dtype;
    eo.weight_group_size = o.weight_group_size;
    const DType auto_dtype = held;
    held = held_weight_dtype(o.weight_dtype, "cpu", auto_dtype);
    const int64_t max_seq_len = resolve_max_seq_len(c, o.max_seq_len);
    const ShardPlan first = ShardPlan::make(c, 0, o.tp);  // throws with the tp sizes that work
    // Every rank's plan before any of the table is printed (a group size that does not
    // fit is refused here, naming the flag).
    std::vector<RankMemory> need;
    for (int r = 0; r < o.tp; ++r) {
      need.push_back(plan_engine(eo, c, ShardPlan::make(c, r, o.tp), auto_dtype,
                                 {EngineSizing::Kv::kPacked, max_seq_len, 1}, -1, 1)
                         .need);
    }
    std::printf("tp %d (tp sizes that work: %s), KV cache of one sequence of %lld positions (generate --input "
                "holds --max-batch of them unless --kv-cache-tokens says otherwise)", o.tp,
                (c.quantization ? quantized_tp_sizes(c) : ShardPlan::working_tp_sizes(c)).c_str(),
                static_cast<long long>(max_seq_len));
    if (first.kv_replication > 1) {
      std::printf(", each KV head on %lld ranks", static_cast<long long>(first.kv_replication));
    }
    if (first.vocab_padded != c.vocab_size) {
      std::printf(", vocabulary padded to %lld", static_cast<long long>(first.vocab_padded));
    }
    std::printf("\n%-5s %-14s %-12s %-18s %-20s %-18s %-12s\n", "rank", "q heads", "KV heads", "MLP units",
                "vocab rows",
                (std::string("weights(") +
                 (c.quantization && !c.quantization->fp8
                      ? std::string(c.quantization->num_bits == 4 ? "int4" : "int8") + "+" + dtype_name(held)
                      : std::string(dtype_name(held))) +
                 ")")
                    .c_str(),
                "KV cache");
    for (int r = 0; r < o.tp; ++r) {
      const ShardPlan p = ShardPlan::make(c, r, o.tp);
      const RankMemory& m = need[static_cast<size_t>(r)];
      std::printf("%-5d %-14s %-12s %-18s %-20s %-18s %-12s\n", r, range(p.head_begin, p.num_heads_local).c_str(),
                  range(p.kv_head_begin, p.num_kv_heads_local).c_str(),
                  range(p.intermediate_begin, p.intermediate_local).c_str(),
                  range(p.vocab_begin, p.vocab_local).c_str(), format_bytes(m.weight_bytes).c_str(),
                  format_bytes(m.kv_cache_bytes).c_str());
    }
    std::fflush(stdout);
  } catch (const std::exception& e) {
    print_error(-1, e.what());
    return kLoadErrorExit;
  }
  return 0;
}

}  // namespace linnet
