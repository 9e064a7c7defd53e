#include "launch/model_setup.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "launch/generate_requests.h"
#include "launch/model_path.h"
#include "launch/progress.h"
#include "runtime/backend_factory.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"
#include "runtime/weights.h"

namespace linnet {

GenerationModel open_generation_model(const GenerateOptions& o, const WorldConfig& w) {
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
  m.defaults = resolve_defaults(o, m.files->generation);
  // Phi-3 pads its embedding to 32064 rows while the tokenizer knows 32011 ids: never
  // draw an id the tokenizer cannot decode.
  m.defaults.sampling.vocab_limit = std::min<int64_t>(m.files->config.vocab_size, m.tokenizer->vocab_size());
  Sampler check(m.defaults.sampling);  // validates generation_config.json's values before any rank starts
  m.eos = resolve_eos(*m.files, *m.tokenizer);
  return m;
}

void build_generation_engine(const GenerateOptions& o, const ModelFiles& files, const ShardPlan& plan,
                             int64_t max_seq_len, MpiGroups& groups, int64_t batch_rows,
                             std::unique_ptr<Backend>& backend, std::unique_ptr<Engine>& engine) {
  const WorldConfig& w = groups.world_config;
  const ScalarType held =
      held_weight_dtype(o.weight_dtype, o.backend, from_dtype(files.checkpoint.dominant_dtype()));
  const ScalarType kv_dtype = held_kv_cache_dtype(o.kv_cache_dtype, o.backend);
  const int64_t kv_tokens =
      resolve_kv_cache_tokens(files.config, plan, max_seq_len, batch_rows, o.kv_cache_tokens,
                              o.kv_cache_memory_fraction, available_host_memory(), w.local_size, held, kv_dtype);
  const RankMemory need = rank_memory(files.config, plan, kv_tokens, 1, held, kv_dtype);
  check_memory(need, available_host_memory(), w.local_size);
  const int threads = kernel_threads_per_rank(o.threads, w.local_size);
  backend = make_backend(o.backend, threads, w.local_rank, w.local_size, held, kv_dtype);
  engine = make_engine(files, plan, *backend, tp_communicator(*backend, *groups.tp, w.local_size), max_seq_len,
                       batch_rows, kKvPageSize,
                       kv_tokens / kKvPageSize, o.cuda_graphs);
  if (w.world_rank == 0 && o.cuda_graphs && !engine->cuda_graphs()) {
    warn_once("--cuda-graphs has no effect here: graphs need --backend cuda and NCCL (or a single rank)");
  }
  if (w.world_rank == 0) {  // the memory a rank holds, as the model cards state it
    std::fprintf(stderr, "[linnet-tp] per rank: weights %s (%s), KV cache %s (%lld pages of %lld positions, %s; "
                 "--max-seq-len %lld), backend %s\n",
                 format_bytes(need.weight_bytes).c_str(), scalar_type_name(held),
                 format_bytes(engine->kv_cache_bytes()).c_str(),
                 static_cast<long long>(engine->num_pages()), static_cast<long long>(engine->page_size()),
                 scalar_type_name(backend->kv_cache_dtype()),
                 static_cast<long long>(max_seq_len), backend->name().c_str());
  }
  info("dp group " + std::to_string(w.dp_rank) + "/" + std::to_string(w.dp_size) + ", tp rank " +
       std::to_string(w.tp_rank) + "/" + std::to_string(w.tp_size) + ": " +
       std::to_string(plan.num_heads_local) + " heads, " + std::to_string(plan.num_kv_heads_local) +
       " KV heads, " + std::to_string(plan.intermediate_local) + " MLP units, vocab rows [" +
       std::to_string(plan.vocab_begin) + ", " + std::to_string(plan.vocab_begin + plan.vocab_local) +
       "), backend " + backend->name() + " (" + std::to_string(threads) + " kernel threads on cpu), KV cache " + std::to_string(engine->num_pages()) +
       " pages x " + std::to_string(engine->page_size()) + " positions = " + format_bytes(engine->kv_cache_bytes()) +
       " (up to " + std::to_string(batch_rows) + " requests at once), weights " +
       format_bytes(need.weight_bytes) + " (" + scalar_type_name(held) + "); read " + format_bytes(static_cast<int64_t>(files.checkpoint.bytes_read())) +
       " of the checkpoint's " + format_bytes(static_cast<int64_t>(files.checkpoint.total_bytes())));
}

}  // namespace linnet
