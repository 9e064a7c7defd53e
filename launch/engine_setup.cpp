#include "launch/engine_setup.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/gemm.h"
#include "parallel/comm_watch.h"
#include "loader/model_path.h"
#include "requests/request.h"
#include "parallel/tp_comm_choice.h"
#include "runtime/backend_factory.h"
#include "runtime/cuda_backend.h"
#include "runtime/kv_cache.h"
#include "runtime/random_weights.h"
#include "runtime/sampler.h"
#include "runtime/weights.h"

namespace linnet {

std::optional<MpiGroups> start_engine_run(const EngineOptions& o, Job& job) {
  set_verbose(o.verbose);
  set_comm_timeout(o.comm_timeout);
  std::optional<MpiGroups> groups = make_run_groups(job, o.tp);
  if (!groups) return groups;
  // Every rank's device, gathered here where every rank arrives (the loading after it
  // makes no collective call): its GPU's UUID and free memory (ranks sharing a GPU divide
  // it), its NCCL build and LINNET_COMM (the tp group's communicator: choose_tp_comm).
  RankDevice mine;
  std::string why;
  try {
    const std::string kind = o.backend.empty() ? default_backend_kind() : o.backend;
    if (kind == "cuda" && cuda_device_count() > 0) {
      mine.comm.wish = parse_comm_wish(std::getenv("LINNET_COMM"));
      const int device = groups->world_config.local_rank % cuda_device_count();
      const CudaDeviceMemory m = cuda_device_memory(device);
      mine.cuda = 1;
      mine.free_bytes = m.free_bytes;
      mine.total_bytes = m.total_bytes;
      mine.comm.gpu_uuid = m.uuid;
      mine.comm.nccl_built = cuda_has_nccl() ? 1 : 0;
    }
  } catch (const Error& e) {
    mine.ok = 0;
    why = e.what();
  }
  groups->devices.resize(static_cast<size_t>(groups->world->size()));
  MpiCommunicator& world = *groups->world;
  world.collective("all_gather (device reports)", [&](MPI_Request* request) {
    return MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, groups->devices.data(), sizeof mine, MPI_BYTE, world.comm(),
                          request);
  });
  if (!job.load_phase([&] {
        if (!mine.ok) throw Error(why);
      })) {
    return std::nullopt;
  }
  return groups;
}

EnginePlan plan_engine(const EngineOptions& o, const ModelConfig& config, const ShardPlan& plan,
                       DType auto_dtype, const EngineSizing& sizing, int64_t node_available_bytes,
                       int ranks_on_node) {
  EnginePlan p;
  p.weight_dtype = held_weight_dtype(o.weight_dtype, o.backend, auto_dtype);
  p.kv_cache_dtype = held_kv_cache_dtype(o.kv_cache_dtype, o.backend);
  // The group size the journals record (quantized_group_size); unused by other dtypes.
  const int64_t asked = quantized_group_size(o);
  p.weight_group_size = asked > 0 ? asked : kDefaultWeightGroupSize;
  if (config.quantization) {  // a pre-quantized checkpoint: its layers come packed as they are
    if (is_quantized(p.weight_dtype)) {
      throw Error("the checkpoint is quantized already (" + config.quantization->describe() +
                      "); int8 / int4 quantize an unquantized checkpoint at load",
                  "--weight-dtype", "auto, f32, bf16 or f16 (the dtype of its unquantized embedding and lm_head)",
                  dtype_name(p.weight_dtype));
    }
    check_quantized_checkpoint(config, plan);
  } else if (is_quantized(p.weight_dtype)) {
    check_weight_groups(config, plan, p.weight_group_size, p.weight_dtype, o.weight_group_size == 0);
  }
  const bool cuda = (o.backend.empty() ? default_backend_kind() : o.backend) == "cuda";
  if (o.activation_dtype == "int8") {
    if (cuda) {
      throw Error("int8 activations are a mode of the CPU kernels", "--activation-dtype", "f32 with --backend cuda", "int8");
    }
    check_int8_activations(config, plan, p.weight_dtype, p.weight_group_size);
  }
  const int64_t g = p.weight_group_size;
  // The CUDA backend holds a pre-quantized checkpoint's matrices dequantized to bf16
  // (cuda_backend.cpp: upload_matrix), so they are sized as dense bf16 there.
  ModelConfig sized = config;
  if (cuda) sized.quantization.reset();
  switch (sizing.kv) {
    case EngineSizing::Kv::kPaged:
      p.kv_tokens = resolve_kv_cache_tokens(
          sized, plan, sizing.max_seq_len, sizing.rows, o.kv_cache_tokens, o.kv_cache_memory_fraction,
          node_available_bytes, ranks_on_node, p.weight_dtype, p.kv_cache_dtype, g,
          cuda ? std::optional<double>(kDefaultDeviceKvFraction) : std::nullopt);
      p.need = rank_memory(sized, plan, p.kv_tokens, 1, p.weight_dtype, p.kv_cache_dtype, g);
      break;
    case EngineSizing::Kv::kRows:
      p.need = rank_memory(sized, plan, sizing.max_seq_len, sizing.rows, p.weight_dtype, p.kv_cache_dtype, g);
      break;
    case EngineSizing::Kv::kPacked:
      p.need = rank_memory(sized, plan, sizing.max_seq_len, 1, p.weight_dtype, p.kv_cache_dtype, g);
      break;
  }
  return p;
}

OpenedEngine open_engine(const EngineOptions& o, const ModelConfig& config, const ModelFiles* files,
                         const ShardPlan& plan, MpiGroups& groups, const EngineSizing& sizing,
                         std::optional<uint64_t> random_seed) {
  const WorldConfig& w = groups.world_config;
  OpenedEngine e;
  const DType auto_dtype = files ? files->checkpoint.dominant_dtype() : config_weight_dtype(config);
  const bool cuda = (o.backend.empty() ? default_backend_kind() : o.backend) == "cuda";
  // The memory the KV pool and the preflight count: the host's MemAvailable over the
  // node's ranks on the CPU; on CUDA the free memory of this rank's GPU at start-up over
  // the ranks that share it (start_engine_run's device reports: no collective here).
  int64_t available = available_host_memory();
  int sharing = w.local_size;
  std::string source = "available memory";
  const auto me = static_cast<size_t>(w.world_rank);
  if (cuda && me < groups.devices.size() && groups.devices[me].cuda) {
    std::vector<std::array<uint8_t, 16>> uuids;
    int mine = 0;
    for (size_t r = 0; r < groups.devices.size(); ++r) {
      if (!groups.devices[r].cuda) continue;
      if (r == me) mine = static_cast<int>(uuids.size());
      uuids.push_back(groups.devices[r].comm.gpu_uuid);
    }
    const int device = w.local_rank % std::max(1, cuda_device_count());
    available = groups.devices[me].free_bytes;
    sharing = ranks_on_same_gpu(uuids, mine);
    source = "free memory of GPU " + std::to_string(device) + " at start-up, cudaMemGetInfo";
    info("GPU " + std::to_string(device) + ": " + format_bytes(groups.devices[me].free_bytes) + " free of " +
         format_bytes(groups.devices[me].total_bytes) + ", shared by " + std::to_string(sharing) + " rank(s)");
  }
  e.plan = plan_engine(o, config, plan, auto_dtype, sizing, available, sharing);
  e.available_bytes = available;
  e.sharing = sharing;
  if (cuda || sizing.kv != EngineSizing::Kv::kRows) check_memory(e.plan.need, available, sharing, source);
  e.threads = kernel_threads_per_rank(o.threads, w.local_size);
  cpu::set_int4_activation_dtype(o.activation_dtype == "int8" ? DType::kI8 : DType::kF32);
  e.backend = make_backend(o.backend, e.threads, w.local_rank, w.local_size, e.plan.weight_dtype,
                           e.plan.kv_cache_dtype, e.plan.weight_group_size);
  // bench (kRows) on the CPU: its weights are held where it computes, checked here.
  if (sizing.kv == EngineSizing::Kv::kRows && !cuda) check_memory(e.plan.need, available, sharing, source);
  // The tp group's reports: tp groups are contiguous world ranks.
  std::vector<TpCommReport> tp_reports;
  if (groups.devices.size() == static_cast<size_t>(w.world_size)) {
    const int first = w.world_rank - w.tp_rank;
    for (int r = 0; r < w.tp_size; ++r) tp_reports.push_back(groups.devices[static_cast<size_t>(first + r)].comm);
  }
  Communicator& comm = tp_communicator(*e.backend, *groups.tp, tp_reports);
  switch (sizing.kv) {
    case EngineSizing::Kv::kPaged:
      e.engine = make_engine(*files, plan, *e.backend, comm, sizing.max_seq_len, sizing.rows, kKvPageSize,
                             e.plan.kv_tokens / kKvPageSize, o.cuda_graphs);
      break;
    case EngineSizing::Kv::kRows: {
      // Raw entries use row b's fixed pages of 64; generate_batch hands pages out itself.
      ModelWeights weights = random_seed ? random_weights(*e.backend, config, plan, *random_seed)
                                         : load_weights(files->checkpoint, config, plan,
                                                        e.backend->host_weight_dtype(files->checkpoint.dominant_dtype()));
      e.engine = std::make_unique<Engine>(config, plan, std::move(weights), *e.backend, comm, sizing.max_seq_len,
                                          sizing.rows, kKvPageSize, 0, o.cuda_graphs);
      break;
    }
    case EngineSizing::Kv::kPacked:  // loss_packed sizes its own pass
      e.engine = make_engine(*files, plan, *e.backend, comm, /*max_seq_len=*/1);
      break;
  }
  return e;
}

GenerationModel open_generation_model(const EngineOptions& o, const WorldConfig& w,
                                      const std::function<void(RequestSettings&)>& flags) {
  GenerationModel m;
  m.model_dir = resolve_model_dir(o.model);
  const std::filesystem::path& model_dir = m.model_dir;
  m.files = std::make_unique<ModelFiles>(open_model(model_dir));
  m.plan = ShardPlan::make(m.files->config, w.tp_rank, w.tp_size);
  m.max_seq_len = resolve_max_seq_len(m.files->config, o.max_seq_len);
  m.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(model_dir));
  if (m.tokenizer->vocab_size() > m.files->config.vocab_size) {
    throw Error("the tokenizer knows more ids than the model has embedding rows", (model_dir / "tokenizer.json").string(),
                "ids < config.json vocab_size = " + std::to_string(m.files->config.vocab_size),
                "ids up to " + std::to_string(m.tokenizer->vocab_size() - 1));
  }
  m.defaults = generation_defaults(m.files->generation);
  if (flags) flags(m.defaults);
  // Phi-3 pads its embedding to 32064 rows while the tokenizer knows 32011 ids: never
  // draw an id the tokenizer cannot decode.
  m.defaults.sampling.vocab_limit = std::min<int64_t>(m.files->config.vocab_size, m.tokenizer->vocab_size());
  Sampler check(m.defaults.sampling);  // validates generation_config.json's values before any rank starts
  m.eos = resolve_eos(*m.files, *m.tokenizer);
  return m;
}

DraftModel open_draft_model(const EngineOptions& o, const GenerationModel& target, const OpenedEngine& target_engine,
                            MpiGroups& groups, int64_t rows) {
  const WorldConfig& w = groups.world_config;
  const std::string key = "--speculative-config key \"model\"";
  DraftModel d;
  std::optional<Tokenizer> draft_tok;
  try {
    d.model_dir = resolve_model_dir(o.speculative.model);
    d.files = std::make_unique<ModelFiles>(open_model(d.model_dir));
    draft_tok.emplace(Tokenizer::from_dir(d.model_dir));
  } catch (const Error& e) {
    throw Error(key + " (the draft model): " + e.what());
  }
  const ModelConfig& config = d.files->config;
  // The same tokenizer: every id the same token (a draft's embedding may be padded to
  // another vocab_size; a guess among the padded ids is never kept).
  const std::filesystem::path mine = d.model_dir / "tokenizer.json", theirs = target.model_dir / "tokenizer.json";
  const Tokenizer& tok = *draft_tok;
  const Tokenizer& t = *target.tokenizer;
  if (tok.vocab_size() != t.vocab_size()) {
    throw Error("the draft model's tokenizer differs from the target's", mine.string(),
                std::to_string(t.vocab_size()) + " ids, as " + theirs.string(), std::to_string(tok.vocab_size()) + " ids");
  }
  for (int32_t id = 0; id < static_cast<int32_t>(t.vocab_size()); ++id) {
    if (tok.id_to_token(id) != t.id_to_token(id)) {
      throw Error("the draft model's tokenizer differs from the target's", mine.string() + " id " + std::to_string(id),
                  "'" + t.id_to_token(id) + "', as " + theirs.string(), "'" + tok.id_to_token(id) + "'");
    }
  }
  if (tok.vocab_size() > config.vocab_size) {
    throw Error("the tokenizer knows more ids than the draft model has embedding rows", (d.model_dir / "config.json").string(),
                "vocab_size >= " + std::to_string(tok.vocab_size()), std::to_string(config.vocab_size));
  }
  try {
    d.plan = ShardPlan::make(config, w.tp_rank, w.tp_size);
  } catch (const Error& e) {
    throw Error(key + " (the draft model runs at the target's --tp " + std::to_string(w.tp_size) + "): " + e.what());
  }
  // Held as the target ("auto" resolves to the target's dtype), or as its "quantization"
  // says; the KV pool has the target's positions.
  EngineOptions od = o;
  od.kv_cache_tokens = target_engine.plan.kv_tokens;
  od.kv_cache_memory_fraction.reset();
  if (!o.speculative.quantization.empty()) od.weight_dtype = o.speculative.quantization;
  if (od.weight_dtype != "int8" && od.weight_dtype != "int4") od.weight_group_size = 0;
  const EngineSizing sizing{EngineSizing::Kv::kPaged, target.max_seq_len, rows};
  EnginePlan p;
  try {
    p = plan_engine(od, config, d.plan, target_engine.plan.weight_dtype, sizing, -1, w.local_size);
  } catch (const Error& e) {
    throw Error("--speculative-config (the draft model " + d.model_dir.string() + "): " + e.what());
  }
  // The target's backend when the draft is held alike (the same dtypes and groups);
  // else one of its own, on the CPU only: on CUDA the tp communicator runs on the
  // target backend's stream.
  const bool cuda = target_engine.backend->name().find("cuda") != std::string::npos;
  Backend* backend = target_engine.backend.get();
  const bool alike = p.weight_dtype == target_engine.plan.weight_dtype &&
                     p.kv_cache_dtype == target_engine.plan.kv_cache_dtype &&
                     (!is_quantized(p.weight_dtype) || p.weight_group_size == target_engine.plan.weight_group_size);
  if (!alike && cuda) {
    throw Error("on CUDA the draft model is held as the target", "--speculative-config key \"quantization\"",
                std::string("absent (the target's ") + dtype_name(target_engine.plan.weight_dtype) + ")",
                dtype_name(p.weight_dtype));
  }
  // The memory left once the target is loaded: the host's MemAvailable now; on a GPU its
  // free memory at start-up less what the ranks sharing it took for the target.
  const auto me = static_cast<size_t>(w.world_rank);
  if (cuda && me < groups.devices.size() && groups.devices[me].cuda) {
    const int64_t free = target_engine.available_bytes;
    const int64_t taken = target_engine.plan.need.total() > INT64_MAX / target_engine.sharing
                              ? INT64_MAX
                              : target_engine.plan.need.total() * target_engine.sharing;
    check_memory(p.need, free < 0 ? -1 : std::max<int64_t>(0, free - taken), target_engine.sharing,
                 "free memory of the GPU after the target model");
  } else {
    check_memory(p.need, available_host_memory(), w.local_size, "available memory after the target model");
  }
  if (!alike && !cuda) {
    d.backend = make_backend("cpu", target_engine.threads, w.local_rank, w.local_size, p.weight_dtype, p.kv_cache_dtype,
                             p.weight_group_size);
    backend = d.backend.get();
  }
  d.engine = make_engine(*d.files, d.plan, *backend, target_engine.engine->tp_comm(), target.max_seq_len, rows,
                         kKvPageSize, p.kv_tokens / kKvPageSize, o.cuda_graphs);
  if (w.world_rank == 0) {
    std::fprintf(stderr, "[linnet-tp] draft model %s: %lld layers, per rank weights %s (%s), KV cache %s (%lld pages)\n",
                 d.model_dir.string().c_str(), static_cast<long long>(config.num_hidden_layers),
                 format_bytes(p.need.weight_bytes).c_str(),
                 held_weights_text(config, p.weight_dtype, p.weight_group_size, " quantized at load").c_str(),
                 format_bytes(d.engine->kv_cache_bytes()).c_str(),
                 static_cast<long long>(d.engine->num_pages()));
  }
  return d;
}

std::string held_weights_text(const ModelConfig& config, DType held, int64_t group_size, const char* after_groups) {
  const std::string name = dtype_name(held);
  // The int8-activation mode (set by open_engine before anything reports) says so.
  const std::string acts = cpu::int4_activation_dtype() == DType::kI8 ? "; int8 activations" : "";
  if (const auto& q = config.quantization) {
    return q->describe() + (q->fp8 ? "; held in " + name + ", as the embedding and lm_head" : "; embedding and lm_head " + name) +
           acts;
  }
  if (!is_quantized(held)) return name;
  return name + ", groups of " + std::to_string(group_size) + after_groups +
         (held == DType::kI4 ? ", embedding and lm_head int8" : "") + acts;
}

void report_engine(const EngineOptions& o, const OpenedEngine& e, const ModelFiles& files, const ShardPlan& plan, int64_t max_seq_len,
                   int64_t rows, const WorldConfig& w) {
  const Engine& engine = *e.engine;
  const Backend& backend = *e.backend;
  const std::string held =
      held_weights_text(files.config, e.plan.weight_dtype, e.plan.weight_group_size, " quantized at load");
  const RankMemory& need = e.plan.need;
  if (w.world_rank == 0 && o.cuda_graphs && !engine.cuda_graphs()) {
    warn_once("--cuda-graphs has no effect here: graphs need --backend cuda and NCCL (or a single rank)");
  }
  if (w.world_rank == 0) {  // the memory a rank holds, as the model cards state it
    std::fprintf(stderr, "[linnet-tp] per rank: weights %s (%s), KV cache %s (%lld pages of %lld positions, %s; "
                 "--max-seq-len %lld), backend %s\n",
                 format_bytes(need.weight_bytes).c_str(), held.c_str(),
                 format_bytes(engine.kv_cache_bytes()).c_str(),
                 static_cast<long long>(engine.num_pages()), static_cast<long long>(engine.page_size()),
                 dtype_name(backend.kv_cache_dtype()),
                 static_cast<long long>(max_seq_len), backend.name().c_str());
  }
  info("dp group " + std::to_string(w.dp_rank) + "/" + std::to_string(w.dp_size) + ", tp rank " +
       std::to_string(w.tp_rank) + "/" + std::to_string(w.tp_size) + ": " +
       std::to_string(plan.num_heads_local) + " heads, " + std::to_string(plan.num_kv_heads_local) +
       " KV heads, " + std::to_string(plan.intermediate_local) + " MLP units, vocab rows [" +
       std::to_string(plan.vocab_begin) + ", " + std::to_string(plan.vocab_begin + plan.vocab_local) +
       "), backend " + backend.name() + " (" + std::to_string(e.threads) + " kernel threads on cpu), KV cache " +
       std::to_string(engine.num_pages()) + " pages x " + std::to_string(engine.page_size()) + " positions = " +
       format_bytes(engine.kv_cache_bytes()) + " (up to " + std::to_string(rows) + " requests at once), weights " +
       format_bytes(need.weight_bytes) + " (" + held + "); read " +
       format_bytes(static_cast<int64_t>(files.checkpoint.bytes_read())) + " of the checkpoint's " +
       format_bytes(static_cast<int64_t>(files.checkpoint.total_bytes())));
}

}  // namespace linnet
