// `linnet-tp generate` (the request side is requests/request.h): --prompt
// streams one completion; --input runs every line through continuous batching. With
// world = D x T ranks (--tp T), the D data-parallel groups take the lines round-robin
// and each runs generate_batch; tp rank 0 of each group turns each request into its
// output line the moment it finishes and sends it to world rank 0 (driver/run_relay.h),
// which appends it to the journal beside --output (driver/journal.h) and at the end
// writes stdout and --output in input order. Stop strings are checked on tp rank 0,
// where the logits rows are gathered anyway, and reach the other tp ranks with the token.
#include "launch/generate_command.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "launch/cli_parse.h"
#include "requests/request.h"
#include "driver/journal.h"
#include "requests/jsonl_input.h"
#include "parallel/text_broadcast.h"
#include "driver/jsonl_output.h"
#include "launch/engine_setup.h"
#include "driver/batch_run.h"
#include "driver/resume.h"
#include "loader/model_path.h"
#include "driver/progress.h"
#include "driver/run_relay.h"
#include "loader/chat/chat_template.h"
#include "loader/tokenizer/tokenizer.h"
#include "parallel/comm_watch.h"
#include "parallel/mpi_communicator.h"
#include "parallel/shard_plan.h"
#include "runtime/backend.h"
#include "runtime/backend_factory.h"
#include "runtime/weights.h"
#include "runtime/batch_generate.h"
#include "runtime/generate.h"
#include "runtime/kv_cache.h"
#include "runtime/model_loader.h"

namespace linnet {
namespace {

using nlohmann::ordered_json;

// --prompt: one completion, streamed on rank 0 as it is generated (dp group 0 only).
// Returns whether it failed (finish_reason "error").
bool run_single(Engine& engine, const Tokenizer& tok, const Request& r, const std::vector<int64_t>& eos,
                uint64_t seed, bool is_root, JsonlOutput* output, const SpeculativeConfig& speculative, Engine* draft) {
  SamplingParams sampling = r.settings.sampling;
  sampling.seed = seed;
  std::vector<int64_t> stop_ids = eos;
  stop_ids.insert(stop_ids.end(), r.settings.stop_token_ids.begin(), r.settings.stop_token_ids.end());
  std::unique_ptr<CompletionStream> stream;
  if (is_root) stream = std::make_unique<CompletionStream>(tok, r);
  auto show = [&](const std::string& text) {
    if (text.empty()) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  StopScan scan;
  GenerationResult g;
  SpeculativeStats spec;
  if (speculative.enabled()) {
    // Speculation verifies guesses in paged passes: the request runs as a batch of one
    // (BatchSession), its tokens streamed from the stop check (tp rank 0, each emitted
    // token once, in order).
    BatchOptions options;
    options.speculative = speculative;
    options.draft = draft;
    options.speculative_stats = &spec;
    options.stop_check = [&](size_t, int32_t id) {
      if (stream) show(stream->push(id));
      return scan.push(tok, r, id);
    };
    g = generate_batch(engine, {batch_request(r, eos, seed)}, options).at(0);
    if (!g.token_ms.empty()) {
      g.prefill_ms = g.token_ms.front();
      g.decode_ms = g.token_ms.back() - g.token_ms.front();
    }
  } else {
    g = generate_until(
        engine, r.ids, sampling, r.settings.max_new_tokens, stop_ids,
        [&](int32_t id) {
          if (stream) show(stream->push(id));
        },
        [&](int32_t id) { return scan.push(tok, r, id); }, r.settings.top_logprobs);
  }
  if (!is_root) return g.finish_reason == "error";
  show(stream->finish());
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (g.finish_reason == "error") warn_once("--prompt: " + g.error);
  const double decode_tps =
      g.decode_ms > 0 ? 1000.0 * static_cast<double>(g.ids.size() > 1 ? g.ids.size() - 1 : 0) / g.decode_ms : 0.0;
  std::string completion;
  const ordered_json line = output_line(tok, r, g, completion);
  char stats[256];
  std::snprintf(stats, sizeof stats,
                "[linnet-tp] prompt tokens: %zu, new tokens: %zu, prefill: %.1f ms, decode: %.1f tokens/s, "
                "finish: %s\n",
                r.ids.size(), g.ids.size(), g.prefill_ms, decode_tps, line["finish_reason"].get<std::string>().c_str());
  std::fputs(stats, stderr);
  if (speculative.enabled()) std::fprintf(stderr, "[linnet-tp] %s\n", speculation_summary(speculative, spec).c_str());
  if (output) output->add_line(dump_line(line));
  return g.finish_reason == "error";
}

// What decides a request's output line besides its input line and the seed: the
// model, the dtypes held, the context, and the defaults a line's own keys override.
ordered_json generate_settings(const GenerateOptions& o, const RequestSettings& d,
                               const std::filesystem::path& model_dir, int64_t max_seq_len) {
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::weakly_canonical(model_dir, ec);
  ordered_json s;
  s["model"] = (ec ? model_dir : real).string();
  s["weight_dtype"] = o.engine.weight_dtype;
  if (const int64_t g = quantized_group_size(o.engine); g > 0) s["weight_group_size"] = g;
  s["kv_cache_dtype"] = o.engine.kv_cache_dtype;
  if (o.engine.activation_dtype != "f32") s["activation_dtype"] = o.engine.activation_dtype;  // other outputs
  s["max_seq_len"] = max_seq_len;
  s["chat"] = o.chat;
  s["max_new_tokens"] = d.max_new_tokens;
  s["temperature"] = d.sampling.temperature;
  s["top_k"] = d.sampling.top_k;
  s["top_p"] = d.sampling.top_p;
  s["min_p"] = d.sampling.min_p;
  s["repetition_penalty"] = d.sampling.repetition_penalty;
  s["presence_penalty"] = d.sampling.presence_penalty;
  s["frequency_penalty"] = d.sampling.frequency_penalty;
  s["stop"] = d.stop;
  s["stop_token_ids"] = d.stop_token_ids;
  s["top_logprobs"] = d.top_logprobs;
  if (const SpeculativeConfig& c = o.engine.speculative; c.enabled()) {
    // On the CPU the output is the same with speculation; on CUDA a guess row may round
    // differently from a single decode row, so a --resume keeps the run's configuration.
    s["speculative_config"] = {{"method", c.method},
                               {"num_speculative_tokens", c.num_speculative_tokens},
                               {"prompt_lookup_min", c.prompt_lookup_min},
                               {"prompt_lookup_max", c.prompt_lookup_max},
                               {"disable_by_batch_size", c.disable_by_batch_size}};
    if (c.method == "draft_model") s["speculative_config"]["model"] = c.model;
  }
  return s;
}

// What world rank 0 reads before the model: the prompts (stdin and local files exist only
// there under mpirun), the lines --resume keeps (--output, the journal) and where each
// came from, and whether --output may be written.
struct GenerateInput {
  std::vector<std::pair<int, std::string>> lines;
  std::vector<std::pair<int, std::string>> oversized;  // line number, its byte count: each fails alone
  ResumeState resume;                                  // --output, its journal, the kept lines (by index)
  std::vector<std::string> kept_indices;               // their indices (broadcast to every rank)
  std::set<int64_t> from_journal;                      // indices kept from the journal only
  std::map<int64_t, std::string> kept_where;           // "file:line" of each kept line
};

// World rank 0 only; no collective call.
// @throws Error naming the file (input, --output, journal) and line.
void read_generate_input(const GenerateOptions& o, bool batch, GenerateInput& in) {
  if (o.prompt) {
    in.lines = {{1, *o.prompt}};  // the text itself: JSON would mask invalid UTF-8
  } else {
    std::vector<std::pair<int, uint64_t>> too_long;
    in.lines = read_jsonl_lines(o.input, &too_long, [] { return caught_stop_signal() != 0; });
    for (const auto& [n, bytes] : too_long) in.oversized.emplace_back(n, std::to_string(bytes));
  }
  in.resume = read_resume_state(o.output, o.input, o.resume, batch,
                                     {"generate", "its finished requests and run only the rest",
                                      "that request runs again"});
  for (const auto& [index, n] : in.resume.kept_line) in.kept_where[index] = o.output + ":" + std::to_string(n);
  for (const auto& [n, text] : in.resume.journal.lines) {
    const std::string where = in.resume.journal_file + ":" + std::to_string(n);
    const int64_t index = output_line_index(parse_jsonl_line(text, where), where);
    const auto [it, added] = in.resume.kept.emplace(index, text);
    if (added) {
      in.from_journal.insert(index);
      in.kept_where[index] = where;
    } else if (it->second != text) {
      throw Error("index " + std::to_string(index) + " is also in " +
                      (in.from_journal.count(index) ? std::string("the journal") : "--output " + o.output) +
                      " with a different line; are they of different runs?",
                  where);
    }
  }
  for (const auto& [index, line] : in.resume.kept) in.kept_indices.push_back(std::to_string(index));
}

// Every input line (or --prompt) as a Request, in input order, and the positions of those
// to run (not kept by --resume). In a batch a bad line fails alone (its Request holds the
// error); with --prompt it is the run's error. No collective call.
// @throws Error naming --prompt or the flag (--stop-token-ids) whose value is bad.
struct GenerateRequests {
  std::vector<Request> requests;  // every input line, input order
  std::vector<size_t> todo;       // positions in `requests` still to generate
};

GenerateRequests build_requests(const GenerateOptions& o, const GenerationModel& m, const GenerateInput& in,
                                const std::map<int, uint64_t>& oversized_bytes, const WorldConfig& w) {
  GenerateRequests out;
  std::vector<int64_t> skip;
  for (const auto& s : in.kept_indices) skip.push_back(std::stoll(s));
  std::sort(skip.begin(), skip.end());
  // No prompt longer than this many bytes can have <= m.max_seq_len tokens: it is refused
  // before the tokenizer sees it (the tokenizer's time and memory grow with the text).
  const int64_t prompt_byte_limit = m.max_seq_len * prompt_bytes_per_token(*m.tokenizer);
  std::unique_ptr<ModelChatTemplate> chat;
  // The flags' own values fail the run, before any line (a line's keys fail that line).
  for (const int64_t id : m.defaults.stop_token_ids) {
    if (id >= m.files->config.vocab_size) {
      throw Error("invalid value", "--stop-token-ids", "ids < vocab_size = " + std::to_string(m.files->config.vocab_size),
                  std::to_string(id));
    }
  }
  for (const auto& [n, text] : in.lines) {
    Request r;
    r.index = n - 1;
    r.where = o.prompt ? std::string("--prompt") : o.input + ":" + std::to_string(n);
    if (const auto big = oversized_bytes.find(n); big != oversized_bytes.end()) {
      r.settings = m.defaults;
      r.error = r.where + ": the line has " + std::to_string(big->second) +
                " bytes; an --input line may have at most " + std::to_string(kMaxJsonlLineBytes) + " (64 MiB)";
      if (!std::binary_search(skip.begin(), skip.end(), r.index)) out.todo.push_back(out.requests.size());
      out.requests.push_back(std::move(r));
      continue;
    }
    const bool done = std::binary_search(skip.begin(), skip.end(), r.index);
    bool is_chat = false;
    try {
      ordered_json line;
      if (o.prompt) {
        line["prompt"] = text;
      } else {
        line = parse_jsonl_line(text, r.where);
      }
      read_request_line(line, m.defaults, m.files->config.vocab_size, o.chat, *m.tokenizer, m.model_dir, chat, r, is_chat);
    } catch (const Error& e) {
      if (o.prompt) throw;
      // In a batch a bad line (JSON, a key, its chat template) fails alone: its output
      // line says why (finish_reason "error"), the others run, the exit code is 3.
      r.settings = m.defaults;
      r.text.clear();
      r.error = e.what();
      if (!done) out.todo.push_back(out.requests.size());
      out.requests.push_back(std::move(r));
      continue;
    }
    if (!done && static_cast<int64_t>(r.text.size()) > prompt_byte_limit) {
      const std::string why = "the prompt has " + std::to_string(r.text.size()) +
                              " bytes, more than --max-seq-len = " + std::to_string(m.max_seq_len) +
                              " tokens can hold (" + std::to_string(prompt_byte_limit / m.max_seq_len) +
                              " bytes per token at most); it was not tokenized";
      if (o.prompt) throw Error(why, r.where);
      r.error = why;  // in a batch it fails alone
      out.todo.push_back(out.requests.size());
      out.requests.push_back(std::move(r));
      continue;
    }
    if (!done) {
      try {
        // A rendered chat text already holds the template's BOS, so no second one is added.
        r.ids = m.tokenizer->encode(r.text, /*add_special_tokens=*/!is_chat);
      } catch (const Error& e) {
        if (o.prompt) throw e.at(r.where);
        r.error = e.at(r.where).what();  // fails alone, as a bad line
        r.ids.clear();
      }
      if (o.prompt && r.ids.empty()) throw Error("the prompt has no tokens (and the tokenizer adds no BOS)", r.where);
      // One prompt is refused now; in a batch it fails alone (its line says why).
      if (o.prompt && static_cast<int64_t>(r.ids.size()) > m.max_seq_len) {
        throw Error("the prompt is longer than the context", r.where,
                    "<= --max-seq-len = " + std::to_string(m.max_seq_len) + " tokens",
                    std::to_string(r.ids.size()) + " tokens");
      }
      if (static_cast<int64_t>(r.ids.size()) == m.max_seq_len && r.settings.max_new_tokens > 0 && w.world_rank == 0) {
        warn_once(r.where + ": the prompt fills --max-seq-len = " + std::to_string(m.max_seq_len) +
             " tokens; no room is left for new tokens");
      }
      out.todo.push_back(out.requests.size());
    }
    out.requests.push_back(std::move(r));
  }
  return out;
}

// The run's sampling seed, the same on every rank: --seed, else the journal's (so a
// resumed run samples the requests still to run as the interrupted run would have), else
// a random one drawn by world rank 0. Collective over the world.
uint64_t choose_seed(const GenerateOptions& o, const JournalContents& found, MpiGroups& groups,
                     std::optional<uint64_t>& journal_seed) {
  if (found.header.is_object() && found.header.contains("seed") && found.header["seed"].is_number_unsigned()) {
    journal_seed = found.header["seed"].get<uint64_t>();
  }
  uint64_t seed = 0;
  if (o.seed) {
    seed = *o.seed;
  } else if (groups.world_config.world_rank == 0) {
    seed = journal_seed ? *journal_seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  groups.world->broadcast(&seed, sizeof seed, 0);
  return seed;
}

// World rank 0: the sampling line (--verbose) and a warning for sampling flags that a
// greedy run ignores.
void report_sampling(const GenerateOptions& o, const RequestSettings& defaults, const std::vector<Request>& requests,
                     uint64_t seed, bool& any_sampling) {
  const SamplingParams& p = defaults.sampling;
  char line[256];
  std::snprintf(line, sizeof line,
                "sampling: temperature %g, top_k %lld, top_p %g, min_p %g, repetition_penalty %g, seed %llu",
                p.temperature, static_cast<long long>(p.top_k), p.top_p, p.min_p, p.repetition_penalty,
                static_cast<unsigned long long>(seed));
  info(line);
  // Only when no request samples (an --input line may set its own temperature).
  any_sampling = std::any_of(requests.begin(), requests.end(),
                             [](const Request& r) { return r.settings.sampling.temperature > 0.0; });
  std::string unused;
  for (const auto& [given, flag] : {std::pair{o.top_k.has_value(), "--top-k"}, {o.top_p.has_value(), "--top-p"},
                                    {o.min_p.has_value(), "--min-p"}, {o.seed.has_value(), "--seed"}}) {
    if (given) unused += std::string(unused.empty() ? "" : ", ") + flag;
  }
  if (!any_sampling && !unused.empty()) {
    warn_once("decoding is greedy (temperature 0), so " + unused +
              (unused.find(',') == std::string::npos ? " has" : " have") +
              " no effect; give --temperature > 0 to sample");
  }
}

// The flags that override generation_config.json's request defaults.
void apply_sampling_flags(const GenerateOptions& o, RequestSettings& d) {
  SamplingParams& p = d.sampling;
  if (o.temperature) p.temperature = *o.temperature;
  if (o.top_k) p.top_k = *o.top_k;
  if (o.top_p) p.top_p = *o.top_p;
  if (o.min_p) p.min_p = *o.min_p;
  if (o.repetition_penalty) p.repetition_penalty = *o.repetition_penalty;
  if (o.max_new_tokens) d.max_new_tokens = *o.max_new_tokens;
  d.stop = o.stop;
  d.stop_token_ids = o.stop_token_ids;
  d.top_logprobs = o.logprobs ? o.top_logprobs : -1;
}

// --prompt on every rank: dp group 0 generates (rank 0 streams it); the other groups wait
// for its whole completion. Returns the exit code, the same on every rank.
int run_prompt(Engine& engine, const Tokenizer& tok, const Request& r, const std::vector<int64_t>& eos, uint64_t seed,
               MpiGroups& groups, JsonlOutput* output, const SpeculativeConfig& speculative, Engine* draft) {
  const WorldConfig& w = groups.world_config;
  float failed = 0.0f;
  if (w.dp_rank == 0 && run_single(engine, tok, r, eos, seed, w.world_rank == 0, output, speculative, draft)) failed = 1.0f;
  // The other dp groups wait here for group 0's whole completion: no stall, so no
  // timeout for them (group 0's own collectives are watched).
  const double timeout = comm_timeout();
  if (w.dp_rank != 0) set_comm_timeout(0);
  groups.world->all_reduce_max(&failed, 1);  // every rank exits with the same code
  set_comm_timeout(timeout);
  return failed > 0.0f ? kSomeFailedExit : kOkExit;
}

EngineFlags generate_engine_flags() {
  return paged_engine_flags("split the --input prompts", "With --input, prompts decoded together (continuous batching)");
}

}  // namespace

// The options of `linnet-tp [generate]` besides the engine flags.
cxxopts::Options generate_command_options() {
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
  return opts;
}

// --max-new-tokens and the sampling flags, checked against the ranges a request line's
// keys have (requests/request_settings.h).
void read_sampling_flags(const cxxopts::ParseResult& r, GenerateOptions& g) {
  if (r.count("max-new-tokens")) {
    g.max_new_tokens = r["max-new-tokens"].as<int64_t>();
    if (*g.max_new_tokens < 0) invalid_value("--max-new-tokens", ">= 0", std::to_string(*g.max_new_tokens));
  }
  if (r.count("temperature")) {
    g.temperature = r["temperature"].as<double>();
    if (!temperature_ok(*g.temperature)) invalid_value("--temperature", "a finite number >= 0", number_text(*g.temperature));
  }
  if (r.count("min-p")) {
    g.min_p = r["min-p"].as<double>();
    if (!min_p_ok(*g.min_p)) invalid_value("--min-p", "in [0, 1]", number_text(*g.min_p));
  }
  if (r.count("repetition-penalty")) {
    g.repetition_penalty = r["repetition-penalty"].as<double>();
    if (!penalty_ok(*g.repetition_penalty)) {
      invalid_value("--repetition-penalty", "a finite number > 0", number_text(*g.repetition_penalty));
    }
  }
  // Every --stop in order (cxxopts' vector values would split a stop string at commas).
  for (const auto& kv : r.arguments()) {
    if (kv.key() != "stop") continue;
    if (kv.value().empty()) invalid_value("--stop", "a non-empty string", "\"\"");
    g.stop.push_back(kv.value());
  }
  if (r.count("stop-token-ids")) {
    g.stop_token_ids = r["stop-token-ids"].as<std::vector<int64_t>>();
    for (int64_t id : g.stop_token_ids) {
      if (id < 0) invalid_value("--stop-token-ids", "token ids >= 0", std::to_string(id));
    }
  }
  g.logprobs = r.count("logprobs") > 0;
  if (r.count("top-logprobs")) {
    g.top_logprobs = r["top-logprobs"].as<int64_t>();
    if (g.top_logprobs < 0 || g.top_logprobs > kMaxTopLogprobs) {
      invalid_value("--top-logprobs", "in [0, " + std::to_string(kMaxTopLogprobs) + "]", std::to_string(g.top_logprobs));
    }
    g.logprobs = true;
  }
  if (r.count("top-k")) {
    g.top_k = r["top-k"].as<int64_t>();
    if (*g.top_k < 0) invalid_value("--top-k", ">= 0", std::to_string(*g.top_k));
  }
  if (r.count("top-p")) {
    g.top_p = r["top-p"].as<double>();
    if (!top_p_ok(*g.top_p)) invalid_value("--top-p", "in (0, 1]", number_text(*g.top_p));
  }
}

std::optional<GenerateOptions> parse_generate_options(int argc, char** argv, std::string& help_text, bool& version) {
  cxxopts::Options opts = generate_command_options();
  add_engine_options(opts, generate_engine_flags());

  const auto parsed = parse_options(opts, argc, argv, "generate", help_text);
  if (!parsed) return std::nullopt;
  const cxxopts::ParseResult& r = *parsed;
  GenerateOptions g;
  if (r.count("version")) {
    version = true;
    return g;
  }
  read_engine_options(r, generate_engine_flags(), g.engine);
  if (r.count("prompt") > 1 || r.count("input") > 1) throw Error("given more than once", "--prompt/--input");
  if (r.count("prompt")) g.prompt = r["prompt"].as<std::string>();
  if (r.count("input")) g.input = r["input"].as<std::string>();
  if (r.count("output")) {
    g.output = r["output"].as<std::string>();
    if (g.output.empty()) throw Error("is empty", "--output");
  }
  if (!g.prompt && g.input.empty()) throw Error("give --prompt TEXT or --input FILE.jsonl", "--prompt");
  if (g.prompt && !g.input.empty()) throw Error("give only one of --prompt and --input", "--input");
  read_sampling_flags(r, g);
  g.resume = r.count("resume") > 0;
  if (g.resume && (g.input.empty() || g.output.empty())) throw Error("needs --input and --output", "--resume");
  if (r.count("seed")) g.seed = r["seed"].as<uint64_t>();
  g.progress = r.count("progress") > 0;
  g.chat = r.count("chat") > 0;
  return g;
}

int run_generate(const GenerateOptions& o, Job& job) {
  std::optional<MpiGroups> made = start_engine_run(o.engine, job);
  if (!made) return kUsageExit;
  MpiGroups& groups = *made;
  const WorldConfig& w = groups.world_config;
  const bool batch = !o.prompt;
  // From here a signal only sets a flag; the batch loop stops at its next step.
  if (batch) {
    install_stop_handlers();
  } else {
    release_stop_handlers();
  }

  // Rank 0 reads the prompts (stdin and local files exist only there under mpirun), the
  // lines to keep for --resume, and checks --output; then every rank gets the lines.
  GenerateInput in;
  if (!job.load_phase([&] {
        if (w.world_rank == 0) read_generate_input(o, batch, in);
      })) {
    return job.load_failure_exit();  // 130 when a signal stopped the reading
  }
  broadcast_lines(*groups.world, in.lines);
  broadcast_lines(*groups.world, in.oversized);
  broadcast_strings(*groups.world, in.kept_indices);
  // An oversized line takes its place in input order with no text (a real line is never
  // blank); its request fails alone below.
  std::map<int, uint64_t> oversized_bytes;
  for (const auto& [n, bytes] : in.oversized) {
    oversized_bytes[n] = std::stoull(bytes);
    in.lines.emplace_back(n, std::string());
  }
  std::stable_sort(in.lines.begin(), in.lines.end(), [](const auto& a, const auto& b) { return a.first < b.first; });

  GenerationModel m;
  GenerateRequests reqs;
  OpenedEngine e;
  DraftModel draft;  // --speculative-config's draft_model
  ordered_json settings;  // what the journal's header keeps for --resume to check
  const bool loaded = job.load_phase([&] {
    m = open_generation_model(o.engine, w, [&](RequestSettings& d) { apply_sampling_flags(o, d); });
    settings = generate_settings(o, m.defaults, m.model_dir, m.max_seq_len);
    if (w.world_rank == 0 && o.resume) check_journal_settings(in.resume.journal, settings, in.resume.settings_file);
    reqs = build_requests(o, m, in, oversized_bytes, w);
    // Rank 0: a kept line must belong to this input (its index and its prompt).
    for (const auto& [index, line] : in.resume.kept) {
      const auto it = std::find_if(reqs.requests.begin(), reqs.requests.end(),
                                   [&](const Request& r) { return r.index == index; });
      const std::string where = in.kept_where[index] + " (index " + std::to_string(index) + ")";
      if (it == reqs.requests.end()) {
        throw Error("no input line has this index; is it the output of another input?", where);
      }
      check_kept_output_line(line, where, *it, *m.tokenizer, m.files->config.vocab_size, m.max_seq_len, m.eos);
    }
    const int64_t share = static_cast<int64_t>((reqs.todo.size() + static_cast<size_t>(w.dp_size) - 1 -
                                                static_cast<size_t>(w.dp_rank)) / static_cast<size_t>(w.dp_size));
    const int64_t batch_rows = std::max<int64_t>(1, std::min<int64_t>(o.engine.max_batch, share));
    e = open_engine(o.engine, m.files->config, m.files.get(), m.plan, groups,
                    {EngineSizing::Kv::kPaged, m.max_seq_len, batch_rows});
    report_engine(o.engine, e, *m.files, m.plan, m.max_seq_len, batch_rows, w);
    if (o.engine.speculative.method == "draft_model") draft = open_draft_model(o.engine, m, e, groups, batch_rows);
  });
  if (!loaded) return kLoadErrorExit;

  std::unique_ptr<JsonlOutput> output;
  std::unique_ptr<Journal> journal;  // rank 0
  ordered_json journal_header;       // rank 0: its first line, and the run record at the end
  int code = 0;
  try {
    if (w.world_rank == 0 && !m.files->unused_tensors.empty()) {
      std::string names;
      for (const auto& n : m.files->unused_tensors) names += (names.empty() ? "" : ", ") + n;
      warn_once("checkpoint tensors the model does not use: " + names);
    }
    std::optional<uint64_t> journal_seed;
    const uint64_t seed = choose_seed(o, in.resume.journal, groups, journal_seed);
    if (w.world_rank == 0) {
      bool any_sampling = false;
      report_sampling(o, m.defaults, reqs.requests, seed, any_sampling);
      if (!o.output.empty()) output = std::make_unique<JsonlOutput>(o.output);
      if (batch && !o.output.empty()) {
        if (journal_seed && *journal_seed != seed && any_sampling) {
          warn_once("--seed " + std::to_string(seed) + " differs from the seed of the journal's run (" +
                    std::to_string(*journal_seed) + "): the requests still to run sample with --seed " +
                    std::to_string(seed));
        }
        journal_header["linnet-tp journal"] = "generate";
        journal_header["seed"] = seed;
        journal_header["settings"] = settings;
        journal = std::make_unique<Journal>(in.resume.journal_file, journal_header, o.resume ? &in.resume.journal : nullptr);
        std::remove(run_record_path(o.output).c_str());  // written again once --output is
        std::fprintf(stderr, "[linnet-tp] journal: %s (each finished request is kept there until --output is "
                     "written; after a crash, rerun with --resume)\n", journal->path().c_str());
        set_stop_note("[linnet-tp] stopping at the next step; finished requests are kept in the journal " +
                      journal->path() + "\n");
      }
    }

    if (batch) {
      BatchRun run{groups, *m.tokenizer, reqs.requests, in.resume.kept, reqs.todo, o.engine.prefix_caching, o.progress};
      run.kept_from_journal = in.from_journal.size();
      run.journal = journal.get();
      run.speculative = o.engine.speculative;
      run.draft = draft.engine.get();
      code = run_batch(*e.engine, run, m.eos, seed, output);
    } else {
      code = run_prompt(*e.engine, *m.tokenizer, reqs.requests.at(0), m.eos, seed, groups, output.get(),
                        o.engine.speculative, draft.engine.get());
    }
    if (w.world_rank == 0 && (std::fflush(stdout) != 0 || std::ferror(stdout))) {
      throw Error(std::string("cannot write the completion: ") + std::strerror(errno), "stdout");
    }
    if (output) output->commit();
    // Every finished line is in --output now (an interrupted run keeps the journal); the
    // run record keeps its settings for a later --resume over it.
    retire_journal(journal.get(), o.output, journal_header, code);
  } catch (const std::exception& ex) {
    const std::string note = journal_note(journal.get());
    job.abort(ex.what() + note, [&] { output.reset(); });
  }
  return code;
}

}  // namespace linnet
