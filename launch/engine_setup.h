// Opening an engine, the one set-up chain of every engine command (generate, serve,
// loss, bench; info runs its first half): the model's files -> this rank's ShardPlan ->
// the dtypes held -> the KV sizing -> the memory preflight -> the backend -> the tp
// communicator -> the Engine. open_generation_model adds what generate and serve read
// before their requests (tokenizer, context length, sampling defaults, EOS ids).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "driver/job.h"
#include "launch/engine_options.h"
#include "loader/tokenizer/tokenizer.h"
#include "parallel/mpi_communicator.h"
#include "parallel/shard_plan.h"
#include "requests/request_settings.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"

namespace linnet {

/// The start of every engine command: --verbose and --comm-timeout take effect, then the
/// dp x tp groups of --tp (make_run_groups; collective), then every rank's device report
/// (MpiGroups::devices: GPU UUID, free memory, NCCL build, LINNET_COMM; one all_gather
/// over the world, so open_engine needs no collective). Returns nullopt, the error
/// printed, when --tp cannot split this world or a rank cannot make its report (an
/// unknown LINNET_COMM) (the command exits 2).
std::optional<MpiGroups> start_engine_run(const EngineOptions& o, Job& job);

/// What sizes the engine's KV cache, and what the memory preflight counts.
struct EngineSizing {
  enum class Kv {
    kPaged,   // generate, serve: one pool of pages shared by up to `rows` requests, sized by
              // --kv-cache-tokens / --kv-cache-memory-fraction (default rows x max_seq_len)
    kRows,    // bench: `rows` sequences of max_seq_len positions, each its own pages
    kPacked,  // loss: no cache kept between passes; one packed pass of max_seq_len positions
              // (info: the KV cache of one sequence)
  };
  Kv kv = Kv::kPaged;
  int64_t max_seq_len = 0;  // positions one sequence may reach (kPacked: tokens per pack)
  int64_t rows = 1;         // sequences at once
};

/// What a rank will hold, decided before anything is allocated (also what `info` prints).
struct EnginePlan {
  DType weight_dtype = DType::kF32;    // the matrices held (held_weight_dtype)
  DType kv_cache_dtype = DType::kF32;  // held_kv_cache_dtype
  int64_t weight_group_size = 64;      // int8 / int4: inputs per scale (check_weight_groups passed)
  int64_t kv_tokens = 0;                         // kPaged: positions of the pool (a multiple of kKvPageSize)
  RankMemory need;                               // weights and KV cache, as check_memory counts them
};

/// The dtypes, KV size and memory of `plan`'s slice under `o`. `auto_dtype`: the
/// checkpoint's dominant dtype (config.json's torch_dtype for random weights).
/// `node_available_bytes`: for --kv-cache-memory-fraction (available_host_memory()).
/// @throws Error naming the flag (--weight-dtype, --weight-group-size, --kv-cache-dtype,
/// --kv-cache-tokens, ...).
EnginePlan plan_engine(const EngineOptions& o, const ModelConfig& config, const ShardPlan& plan,
                       DType auto_dtype, const EngineSizing& sizing, int64_t node_available_bytes,
                       int ranks_on_node);

/// A backend and the engine on it.
struct OpenedEngine {
  EnginePlan plan;
  int threads = 0;  // kernel threads per rank (CPU backend)
  int64_t available_bytes = -1;  // the memory the preflight divided (-1: unknown) ...
  int sharing = 1;               // ... over this many ranks (the node's, or the GPU's)
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
};

/// Plans (plan_engine), checks the memory (check_memory; on the CPU backend only for
/// kRows), makes the backend and loads `files`' slices into the Engine. With
/// `random_seed` (kRows only: bench) the weights are random of `config`'s shape
/// (runtime/random_weights.h) and `files`, when given, only names the dtype.
/// Makes no collective call (run it inside Job::load_phase).
/// @throws Error when the pool or the weights cannot fit in memory, or as make_backend
///   and make_engine.
OpenedEngine open_engine(const EngineOptions& o, const ModelConfig& config, const ModelFiles* files,
                         const ShardPlan& plan, MpiGroups& groups, const EngineSizing& sizing,
                         std::optional<uint64_t> random_seed = std::nullopt);

/// A model opened for generation on one rank, before its engine exists.
struct GenerationModel {
  std::filesystem::path model_dir;
  std::unique_ptr<ModelFiles> files;
  std::unique_ptr<Tokenizer> tokenizer;
  ShardPlan plan;                // this rank's slices
  int64_t max_seq_len = 0;       // positions one request may reach (--max-seq-len)
  RequestSettings defaults;      // generation_config.json overridden by the flags
  std::vector<int64_t> eos;      // the model's EOS ids
};

/// Opens `o.model` (resolve_model_dir) for tp rank `w.tp_rank` of `w.tp_size`; the
/// request defaults are generation_config.json's (generation_defaults) overridden by
/// `flags` (the command's sampling flags, whichever were given).
/// Makes no collective call (run it inside Job::load_phase).
/// @throws Error naming the file when the checkpoint, config or tokenizer is bad, when
///   the tokenizer knows more ids than the model has rows, or when
///   generation_config.json's sampling values are out of range.
GenerationModel open_generation_model(const EngineOptions& o, const WorldConfig& w,
                                      const std::function<void(RequestSettings&)>& flags);

/// The draft model of --speculative-config's "draft_model", on one rank.
struct DraftModel {
  std::filesystem::path model_dir;
  std::unique_ptr<ModelFiles> files;
  ShardPlan plan;                    // this rank's slices, at the target's tp
  std::unique_ptr<Backend> backend;  // its own (CPU) backend when held otherwise than the target
  std::unique_ptr<Engine> engine;    // on the target's tp communicator and backend (or `backend`)
};

/// Opens `o.speculative.model` as the draft of `target` (open_generation_model) and
/// `target_engine` (open_engine), on the same ranks and tp: each rank holds its slice of
/// both models on the same backend, so a draft guess needs no message beyond the draft's
/// own gathers. Its weights are held as the target's (the dtype, any at-load
/// quantization) unless o.speculative.quantization names another dtype or the draft is a
/// pre-quantized checkpoint: then, on the CPU, on a backend of its own (same threads);
/// its KV pool has the target's positions (--kv-cache-tokens) in its own pages; `rows`
/// as open_engine's. Rank 0 prints what it holds.
/// Makes no collective call (run it inside Job::load_phase).
/// @throws Error naming --speculative-config's "model" and the draft's files when the
///   folder cannot be opened, its tokenizer maps any id differently from the target's
///   (or knows another number of ids), its heads do not split over --tp, its dtype is
///   refused (plan_engine) or differs from the target's on CUDA, or it does not fit in
///   the memory left.
DraftModel open_draft_model(const EngineOptions& o, const GenerationModel& target, const OpenedEngine& target_engine,
                            MpiGroups& groups, int64_t rows);

/// How the weights of `config`'s model are held, for the start-up line and bench: "bf16";
/// quantized at load "int4, groups of 32<after_groups>, embedding and lm_head int8"; a
/// pre-quantized checkpoint "compressed-tensors pack-quantized int4, groups of 32,
/// symmetric; embedding and lm_head bf16", or for FP8 "...widened at load; held in bf16,
/// as the embedding and lm_head". `held` is the plan's weight dtype, `group_size` its
/// at-load group size.
std::string held_weights_text(const ModelConfig& config, DType held, int64_t group_size, const char* after_groups);

/// Rank 0 prints the per-rank memory line ("[linnet-tp] per rank: weights ...") and, when
/// `o` asked for --cuda-graphs that the engine cannot use, a warning; every rank an info
/// line with its slice, backend and KV cache (generate, serve).
void report_engine(const EngineOptions& o, const OpenedEngine& e, const ModelFiles& files, const ShardPlan& plan, int64_t max_seq_len,
                   int64_t rows, const WorldConfig& w);

}  // namespace linnet
