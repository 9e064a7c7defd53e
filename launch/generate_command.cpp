#include "launch/generate_command.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "launch/jsonl_input.h"
#include "launch/jsonl_output.h"
#include "launch/model_path.h"
#include "loader/chat_template.h"
#include "loader/tokenizer.h"
#include "parallel/mpi_communicator.h"
#include "parallel/shard_plan.h"
#include "runtime/backend.h"
#include "runtime/batch_generate.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"

namespace linnet {
namespace {

struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
};

// A chat prompt travels as its request JSON (key order kept) with kind "chat"; raw text
// has kind "text".
constexpr const char* kChat = "chat";

std::string user_message_request(const std::string& prompt) {
  nlohmann::ordered_json r;
  r["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", prompt}}});
  r["add_generation_prompt"] = true;
  return r.dump();
}

std::vector<std::string> read_prompts(const GenerateOptions& o, std::vector<std::string>& kinds) {
  if (o.prompt) {
    kinds = {o.chat ? kChat : "text"};
    return {o.chat ? user_message_request(*o.prompt) : *o.prompt};
  }
  std::vector<std::string> prompts;
  for (const auto& [n, text] : read_jsonl_lines(o.input)) {
    const std::string where = o.input + ":" + std::to_string(n);
    nlohmann::ordered_json line = parse_jsonl_line(text, where);
    if (line.contains("messages")) {
      if (line.contains("prompt")) throw Error("give \"prompt\" or \"messages\", not both", where);
      if (!line.contains("add_generation_prompt")) line["add_generation_prompt"] = true;
      kinds.push_back(kChat);
      prompts.push_back(line.dump());
      continue;
    }
    const auto it = line.find("prompt");
    if (it == line.end() || !it->is_string()) {
      throw Error("each line must be an object with a string \"prompt\" or a \"messages\" list", where);
    }
    kinds.push_back(o.chat ? kChat : "text");
    prompts.push_back(o.chat ? user_message_request(it->get<std::string>()) : it->get<std::string>());
  }
  return prompts;
}

// generation_config.json gives the defaults (do_sample false or absent: greedy; with
// sampling, transformers' defaults temperature 1, top_k 50, top_p 1), flags override.
SamplingParams resolve_sampling(const GenerateOptions& o, const GenerationConfig& g) {
  SamplingParams p;
  const bool do_sample = g.do_sample.value_or(false);
  p.temperature = do_sample ? g.temperature.value_or(1.0) : 0.0;
  p.top_k = g.top_k.value_or(50);
  p.top_p = g.top_p.value_or(1.0);
  if (o.temperature) p.temperature = *o.temperature;
  if (o.top_k) p.top_k = *o.top_k;
  if (o.top_p) p.top_p = *o.top_p;
  return p;
}

std::vector<int64_t> resolve_eos(const ModelFiles& files, const Tokenizer& tok) {
  if (!files.generation.eos_token_ids.empty()) return files.generation.eos_token_ids;
  if (!files.config.eos_token_ids.empty()) return files.config.eos_token_ids;
  if (auto id = tok.eos_token_id()) return {*id};
  return {};
}

// --input: every prompt through continuous batching; prompt i samples with seed + i.
// Rank 0 prints each completion on its own line and fills --output, in input order.
void run_batch(Engine& engine, const Tokenizer& tok, const std::vector<Prompt>& prompts, const SamplingParams& sampling,
               int64_t max_new_tokens, const std::vector<int64_t>& eos, bool is_root, JsonlOutput* output) {
  std::vector<BatchRequest> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].prompt = prompts[i].ids;
    reqs[i].sampling = sampling;
    reqs[i].sampling.seed = sampling.seed + i;
    reqs[i].max_new_tokens = max_new_tokens;
    reqs[i].eos_ids = eos;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<GenerationResult> results = generate_batch(engine, reqs);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!is_root) return;
  size_t new_tokens = 0, errors = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GenerationResult& r = results[i];
    StreamingDetokenizer stream(tok, prompts[i].ids);
    std::string completion;
    for (int32_t id : r.ids) completion += stream.push(id);
    completion += stream.flush();
    std::fwrite(completion.data(), 1, completion.size(), stdout);
    std::fputc('\n', stdout);
    if (r.finish_reason == "error") {
      ++errors;
      warn("prompt #" + std::to_string(i + 1) + ": " + r.error);
    }
    new_tokens += r.ids.size();
    if (output) output->add(prompts[i].text, completion, prompts[i].ids, r.ids, r.finish_reason, r.error);
  }
  std::fprintf(stderr, "[linnet-tp] requests: %zu (%zu failed), batch rows: %lld, new tokens: %zu, %.2f s, %.1f tokens/s\n",
               prompts.size(), errors, static_cast<long long>(engine.max_batch()), new_tokens, seconds,
               seconds > 0 ? static_cast<double>(new_tokens) / seconds : 0.0);
}

}  // namespace

int run_generate(const GenerateOptions& o, Job& job) {
  set_verbose(o.verbose);
  MpiGroups groups;
  std::unique_ptr<ModelFiles> files;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
  std::vector<Prompt> prompts;
  SamplingParams sampling;
  std::vector<int64_t> eos;
  ShardPlan plan;

  groups = make_mpi_groups(/*tp_size=*/0);  // one tp group of all ranks
  const WorldConfig& w = groups.world_config;
  set_log_rank(w.world_size > 1 ? w.world_rank : -1);

  // Rank 0 reads the prompts (stdin and local files exist only there under mpirun) and
  // checks --output; then every rank gets the same texts.
  std::vector<std::string> texts;
  std::vector<std::string> kinds;  // "text" or "chat" per prompt
  if (!job.load_phase([&] {
        if (w.world_rank != 0) return;
        texts = read_prompts(o, kinds);
        if (!o.output.empty()) check_output_path(o.output);
      })) {
    return 1;
  }
  broadcast_strings(*groups.world, texts);
  broadcast_strings(*groups.world, kinds);

  const bool loaded = job.load_phase([&] {
    const std::filesystem::path model_dir = resolve_model_dir(o.model);
    files = std::make_unique<ModelFiles>(open_model(model_dir));
    plan = ShardPlan::make(files->config, w.tp_rank, w.tp_size);
    const int64_t max_seq_len = resolve_max_seq_len(files->config, o.max_seq_len);
    const int64_t batch_rows = std::min<int64_t>(o.max_batch, static_cast<int64_t>(texts.size()));
    const RankMemory need = rank_memory(files->config, plan, max_seq_len, batch_rows);
    check_memory(need, available_host_memory(), w.local_size);
    tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(model_dir));
    if (tokenizer->vocab_size() > files->config.vocab_size) {
      throw Error("the tokenizer knows more ids than the model has embedding rows", (model_dir / "tokenizer.json").string(),
                  "ids < config.json vocab_size = " + std::to_string(files->config.vocab_size),
                  "ids up to " + std::to_string(tokenizer->vocab_size() - 1));
    }
    std::unique_ptr<ModelChatTemplate> chat;
    for (std::size_t k = 0; k < texts.size(); ++k) {
      std::string& text = texts[k];
      const std::string where =
          o.input.empty() ? std::string("--prompt") : o.input + ": prompt #" + std::to_string(prompts.size() + 1);
      const bool is_chat = kinds[k] == kChat;
      if (is_chat) {
        // The rendered text already holds the template's BOS, so no second one is added.
        if (!chat) chat = std::make_unique<ModelChatTemplate>(load_chat_template(*tokenizer, model_dir));
        try {
          text = chat->chat_template.render(
              chat_variables(nlohmann::ordered_json::parse(text), chat->special_tokens, where));
        } catch (const Error& e) {
          throw e.at(where);
        }
      }
      std::vector<int32_t> ids;
      try {
        ids = tokenizer->encode(text, /*add_special_tokens=*/!is_chat);
      } catch (const Error& e) {
        throw e.at(where);
      }
      if (ids.empty()) throw Error("the prompt has no tokens (and the tokenizer adds no BOS)", where);
      if (static_cast<int64_t>(ids.size()) > max_seq_len) {
        throw Error("the prompt is longer than the context", where,
                    "<= --max-seq-len = " + std::to_string(max_seq_len) + " tokens",
                    std::to_string(ids.size()) + " tokens");
      }
      if (static_cast<int64_t>(ids.size()) == max_seq_len && o.max_new_tokens > 0 && w.world_rank == 0) {
        warn(where + ": the prompt fills --max-seq-len = " + std::to_string(max_seq_len) +
             " tokens; no room is left for new tokens");
      }
      prompts.push_back({std::move(text), std::move(ids)});
    }
    sampling = resolve_sampling(o, files->generation);
    Sampler check(sampling);  // validates the values before any rank starts
    eos = resolve_eos(*files, *tokenizer);
    // Phi-3 pads its embedding to 32064 rows while the tokenizer knows 32011 ids: never
    // draw an id the tokenizer cannot decode.
    sampling.vocab_limit = std::min<int64_t>(files->config.vocab_size, tokenizer->vocab_size());
    const int threads = blas_threads_per_rank(o.threads, w.local_size);
    backend = make_cpu_backend(threads);
    engine = make_engine(*files, plan, *backend, *groups.tp, max_seq_len, batch_rows);
    info("tp rank " + std::to_string(w.tp_rank) + "/" + std::to_string(w.tp_size) + ": " +
         std::to_string(plan.num_heads_local) + " heads, " + std::to_string(plan.num_kv_heads_local) +
         " KV heads, " + std::to_string(plan.intermediate_local) + " MLP units, vocab rows [" +
         std::to_string(plan.vocab_begin) + ", " + std::to_string(plan.vocab_begin + plan.vocab_local) +
         "), " + std::to_string(threads) + " BLAS threads, KV cache " + std::to_string(max_seq_len) +
         " positions = " + format_bytes(engine->kv_cache_bytes()) + ", weights " +
         format_bytes(need.weight_bytes) + " (f32); read " + format_bytes(static_cast<int64_t>(files->checkpoint.bytes_read())) +
         " of the checkpoint's " + format_bytes(static_cast<int64_t>(files->checkpoint.total_bytes())));
  });
  if (!loaded) return 1;

  std::unique_ptr<JsonlOutput> output;
  try {
    if (w.world_rank == 0 && !files->unused_tensors.empty()) {
      std::string names;
      for (const auto& n : files->unused_tensors) names += (names.empty() ? "" : ", ") + n;
      warn("checkpoint tensors the model does not use: " + names);
    }
    uint64_t seed = 0;
    if (o.seed) {
      seed = *o.seed;
    } else if (w.world_rank == 0) {
      seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    }
    groups.world->broadcast(&seed, sizeof seed, 0);
    sampling.seed = seed;
    if (w.world_rank == 0) {
      char line[160];
      std::snprintf(line, sizeof line, "sampling: temperature %g, top_k %lld, top_p %g, seed %llu",
                    sampling.temperature, static_cast<long long>(sampling.top_k), sampling.top_p,
                    static_cast<unsigned long long>(seed));
      info(line);
      if (sampling.temperature == 0.0 && (o.top_k || o.top_p || o.seed)) {
        warn("decoding is greedy (temperature 0), so --top-k, --top-p and --seed have no effect; "
             "give --temperature > 0 to sample");
      }
      if (!o.output.empty()) output = std::make_unique<JsonlOutput>(o.output);
    }

    if (prompts.size() > 1) {
      run_batch(*engine, *tokenizer, prompts, sampling, o.max_new_tokens, eos, w.world_rank == 0, output.get());
      prompts.clear();
    }
    for (const Prompt& p : prompts) {
      std::unique_ptr<StreamingDetokenizer> stream;
      std::string completion;
      if (w.world_rank == 0) stream = std::make_unique<StreamingDetokenizer>(*tokenizer, p.ids);
      auto on_token = [&](int32_t id) {
        if (!stream) return;
        const std::string piece = stream->push(id);
        completion += piece;
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      };
      GenerationResult r = generate_until(*engine, p.ids, sampling, o.max_new_tokens, eos, on_token);
      if (w.world_rank != 0) continue;
      const std::string tail = stream->flush();
      completion += tail;
      std::fwrite(tail.data(), 1, tail.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
      const double decode_tps =
          r.decode_ms > 0 ? 1000.0 * static_cast<double>(r.ids.size() > 1 ? r.ids.size() - 1 : 0) / r.decode_ms : 0.0;
      char stats[256];
      std::snprintf(stats, sizeof stats,
                    "[linnet-tp] prompt tokens: %zu, new tokens: %zu, prefill: %.1f ms, decode: %.1f tokens/s, "
                    "finish: %s\n",
                    p.ids.size(), r.ids.size(), r.prefill_ms, decode_tps, r.finish_reason.c_str());
      std::fputs(stats, stderr);
      if (output) output->add(p.text, completion, p.ids, r.ids, r.finish_reason);
    }
    if (w.world_rank == 0 && (std::fflush(stdout) != 0 || std::ferror(stdout))) {
      throw Error(std::string("cannot write the completion: ") + std::strerror(errno), "stdout");
    }
    if (output) output->commit();
  } catch (const std::exception& e) {
    job.abort(e.what(), [&] { output.reset(); });
  }
  return 0;
}

}  // namespace linnet
