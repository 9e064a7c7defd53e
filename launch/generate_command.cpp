// `linnet-tp generate` (the request side is launch/generate_requests.h): --prompt
// streams one completion; --input runs every line through continuous batching. With
// world = D x T ranks (--tp T), the D data-parallel groups take the lines round-robin
// and each runs generate_batch; tp rank 0 of each group turns each request into its
// output line the moment it finishes and sends it to world rank 0 (launch/run_relay.h),
// which appends it to the journal beside --output (launch/journal.h) and at the end
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

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "launch/generate_requests.h"
#include "launch/journal.h"
#include "launch/jsonl_input.h"
#include "launch/jsonl_output.h"
#include "launch/model_setup.h"
#include "launch/model_path.h"
#include "launch/progress.h"
#include "launch/run_relay.h"
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

// Everything the batch path needs besides the engine.
struct BatchRun {
  MpiGroups& groups;
  const Tokenizer& tok;
  const std::vector<Request>& requests;        // every input line, input order
  const std::map<int64_t, std::string>& kept;  // rank 0: --resume lines by index (--output and journal)
  const std::vector<size_t>& todo;             // positions in `requests` to run, all groups
  bool prefix_caching = true;                  // share KV pages of common prompt prefixes
  bool progress = false;                       // draw the progress bar even when stderr is no terminal
  size_t kept_from_journal = 0;                // rank 0: how many of `kept` came from the journal only
  Journal* journal = nullptr;                  // rank 0 with --output: where finished lines go at once
};

// World rank 0 after the run: stdout and --output in input order (kept lines as they
// were), the stats line, and the exit code. An interrupted run writes the finished lines
// to --output and keeps the journal for --resume.
int write_batch_results(Engine& engine, const BatchRun& b, const std::map<size_t, ordered_json>& fresh,
                        const PagePoolStats& kv, std::chrono::steady_clock::time_point t0,
                        std::unique_ptr<JsonlOutput>& output) {
  const WorldConfig& w = b.groups.world_config;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool interrupted =
      std::any_of(b.todo.begin(), b.todo.end(), [&](size_t pos) { return fresh.find(pos) == fresh.end(); });
  size_t failed = 0, new_tokens = 0, kept_failed = 0;
  std::vector<double> ttft, itl;
  for (const auto& [pos, rec] : fresh) {
    failed += rec["failed"].get<bool>() ? 1 : 0;
    const std::vector<double> t = rec["token_ms"].get<std::vector<double>>();
    new_tokens += t.size();
    if (!t.empty()) ttft.push_back(t[0]);
    for (size_t i = 1; i < t.size(); ++i) itl.push_back(t[i] - t[i - 1]);
  }
  for (size_t pos = 0; pos < b.requests.size(); ++pos) {
    const Request& r = b.requests[pos];
    std::string line, completion;
    if (const auto k = b.kept.find(r.index); k != b.kept.end()) {
      line = k->second;
      const ordered_json j = ordered_json::parse(line);
      if (j.contains("completion") && j["completion"].is_string()) completion = j["completion"].get<std::string>();
      if (j.value("finish_reason", "") == "error") ++kept_failed;
    } else if (const auto f = fresh.find(pos); f != fresh.end()) {
      line = f->second["line"].get<std::string>();
      completion = f->second["completion"].get<std::string>();
      if (f->second["failed"].get<bool>()) {
        // The error names its line already when it came from reading it (file:line: ...).
        const std::string error = ordered_json::parse(line)["error"].get<std::string>();
        warn_once(error.rfind(r.where + ":", 0) == 0 ? error : r.where + ": " + error);
      }
    } else {
      continue;  // not done (interrupted)
    }
    if (!interrupted) {
      std::fwrite(completion.data(), 1, completion.size(), stdout);
      std::fputc('\n', stdout);
    }
    if (output) output->add_line(std::move(line));
  }
  std::string kept_note;
  if (!b.kept.empty()) {
    kept_note = ", " + std::to_string(b.kept.size()) + " kept from --output" +
                (b.kept_from_journal > 0 ? " and the journal (" + std::to_string(b.kept_from_journal) +
                                               " from the journal)"
                                         : std::string());
  }
  std::fprintf(stderr,
               "[linnet-tp] requests: %zu (%zu failed)%s, dp groups: %d x tp %d, batch rows: %lld, new tokens: %zu, "
               "%.2f s, %.1f tokens/s, time to first token p50/p90/p99: %s ms, inter-token latency "
               "p50/p90/p99: %s ms, KV pages%s: peak %lld of %lld (%lld positions each), prefix cache hits: "
               "%lld tokens, peak RSS %s (rank 0)\n",
               fresh.size(), failed, kept_note.c_str(), w.dp_size, w.tp_size,
               static_cast<long long>(engine.max_batch()), new_tokens, seconds,
               seconds > 0 ? static_cast<double>(new_tokens) / seconds : 0.0, percentiles_ms(ttft).c_str(),
               percentiles_ms(itl).c_str(), w.dp_size > 1 ? " (dp group 0)" : "",
               static_cast<long long>(kv.peak_used_pages), static_cast<long long>(engine.num_pages()),
               static_cast<long long>(engine.page_size()), static_cast<long long>(kv.prefix_hit_tokens),
               format_bytes(peak_resident_bytes()).c_str());
  if (interrupted) {
    const size_t done = fresh.size() + b.kept.size();
    if (b.journal) b.journal->sync();
    if (output) output->commit();
    std::string kept_in = output ? " (kept in --output" : "";
    if (b.journal && b.journal->ok()) kept_in += " and in the journal " + b.journal->path();
    if (output) kept_in += "); rerun with --resume";
    print_error(-1, "interrupted: " + std::to_string(done) + " of " + std::to_string(b.requests.size()) +
                        " requests done" +
                        (output ? kept_in
                                : "; give --output to keep finished requests, and --resume to rerun the rest"));
    output.reset();
    return kInterruptedExit;
  }
  return failed + kept_failed > 0 ? kSomeFailedExit : kOkExit;
}

// --input: runs this dp group's share of `todo`; tp rank 0 of each group sends each
// finished request's line to world rank 0 as it finishes (RunRelay), which journals it
// and at the end writes stdout and --output. Returns the exit code (every rank alike).
int run_batch(Engine& engine, const BatchRun& b, const std::vector<int64_t>& eos, uint64_t seed,
              std::unique_ptr<JsonlOutput>& output) {
  const WorldConfig& w = b.groups.world_config;
  const bool world_root = w.world_rank == 0;
  const bool tp_root = w.tp_rank == 0;
  std::vector<size_t> mine;  // positions in b.requests, round-robin over the dp groups
  for (size_t k = static_cast<size_t>(w.dp_rank); k < b.todo.size(); k += static_cast<size_t>(w.dp_size)) {
    mine.push_back(b.todo[k]);
  }
  std::vector<BatchRequest> reqs(mine.size());
  for (size_t k = 0; k < mine.size(); ++k) {
    const Request& r = b.requests[mine[k]];
    reqs[k] = batch_request(r, eos, r.settings.seed ? *r.settings.seed : seed + static_cast<uint64_t>(r.index));
  }

  // World rank 0: every finished request's record, from every group, as it arrives.
  std::map<size_t, ordered_json> fresh;
  RunRelay relay(
      MPI_COMM_WORLD,
      [&](std::string text) {
        ordered_json rec = ordered_json::parse(text);
        if (b.journal) b.journal->append(rec["line"].get<std::string>());
        const size_t pos = rec["pos"].get<size_t>();
        fresh[pos] = std::move(rec);
      },
      [&] {
        if (b.journal) b.journal->tick();
      });
  ProgressBar progress(mine.size(), w.dp_size > 1 ? "requests of dp group 0" : "requests", world_root,
                       b.progress);
  std::vector<StopScan> scans(tp_root ? mine.size() : 0);
  BatchOptions options;
  options.on_done = [&](size_t k, const GenerationResult& g) {
    progress.add(g.ids.size());
    if (!tp_root) return;
    std::string completion;
    const ordered_json line = output_line(b.tok, b.requests[mine[k]], g, completion);
    ordered_json rec;
    rec["pos"] = mine[k];
    rec["line"] = dump_line(line);
    rec["completion"] = completion;
    rec["failed"] = g.finish_reason == "error";
    rec["token_ms"] = g.token_ms;
    relay.send(dump_line(rec));
  };
  options.stop_check = [&](size_t k, int32_t token) { return scans[k].push(b.tok, b.requests[mine[k]], token); };
  // Once a step the tp group agrees whether any of its ranks heard of a signal.
  options.stop_requested = [&] {
    float stop = relay.poll() ? 1.0f : 0.0f;
    b.groups.tp->all_reduce_max(&stop, 1);
    return stop > 0.0f;
  };
  PagePoolStats kv;
  options.kv_stats = &kv;
  options.prefix_caching = b.prefix_caching;
  const auto t0 = std::chrono::steady_clock::now();
  generate_batch(engine, reqs, options);
  progress.finish();
  // Wait for the other groups and their records, still passing on a signal.
  relay.finish();

  int code = kOkExit;
  if (world_root) code = write_batch_results(engine, b, fresh, kv, t0, output);
  b.groups.world->broadcast(&code, sizeof code, 0);  // every rank exits with rank 0's code
  return code;
}

// --prompt: one completion, streamed on rank 0 as it is generated (dp group 0 only).
// Returns whether it failed (finish_reason "error").
bool run_single(Engine& engine, const Tokenizer& tok, const Request& r, const std::vector<int64_t>& eos,
                uint64_t seed, bool is_root, JsonlOutput* output) {
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
  GenerationResult g = generate_until(
      engine, r.ids, sampling, r.settings.max_new_tokens, stop_ids,
      [&](int32_t id) {
        if (stream) show(stream->push(id));
      },
      [&](int32_t id) { return scan.push(tok, r, id); });
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
  s["weight_dtype"] = o.weight_dtype;
  s["kv_cache_dtype"] = o.kv_cache_dtype;
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
  return s;
}

}  // namespace

int run_generate(const GenerateOptions& o, Job& job) {
  set_verbose(o.verbose);
  set_comm_timeout(o.comm_timeout);
  std::optional<MpiGroups> made = make_run_groups(job, o.tp);
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
  std::vector<std::pair<int, std::string>> lines;
  std::vector<std::pair<int, std::string>> oversized;  // line number, its byte count: each fails alone
  std::map<int64_t, std::string> kept;  // rank 0
  std::vector<std::string> kept_indices;
  std::string journal_file;             // rank 0, --input with --output: <output>.journal
  JournalContents journal_found;        // rank 0, --resume: what the journal holds (or the run record)
  std::string settings_file;            // rank 0, --resume: where journal_found's header came from
  std::set<int64_t> from_journal;       // rank 0: indices kept from the journal only
  std::map<int64_t, std::string> kept_where;  // rank 0: "file:line" of each kept line
  if (!job.load_phase([&] {
        if (w.world_rank != 0) return;
        if (o.prompt) {
          lines = {{1, *o.prompt}};  // the text itself: JSON would mask invalid UTF-8
        } else {
          std::vector<std::pair<int, uint64_t>> too_long;
          lines = read_jsonl_lines(o.input, &too_long, [] { return caught_stop_signal() != 0; });
          for (const auto& [n, bytes] : too_long) oversized.emplace_back(n, std::to_string(bytes));
        }
        if (!o.output.empty()) {
          check_output_path(o.output, o.input);
          if (batch) journal_file = journal_path(o.output);
        }
        if (o.resume) {
          wait_for_journal_writer(journal_file);  // a killed mpirun's ranks may still be at work
          std::map<int64_t, int> numbers;
          kept = read_output_lines(resolve_output_path(o.output), &numbers);
          for (const auto& [index, n] : numbers) kept_where[index] = o.output + ":" + std::to_string(n);
          journal_found = read_journal(journal_file, "generate");
          settings_file = journal_file;
          if (!journal_found.exists && !kept.empty()) {  // a finished run's --output: its record
            journal_found.header = read_run_record(o.output, "generate");
            settings_file = run_record_path(o.output);
          }
          if (!journal_found.dropped.empty()) {
            warn_once("ignoring " + journal_found.dropped + "; that request runs again");
          }
          for (const auto& [n, text] : journal_found.lines) {
            const std::string where = journal_file + ":" + std::to_string(n);
            const int64_t index = output_line_index(parse_jsonl_line(text, where), where);
            const auto [it, added] = kept.emplace(index, text);
            if (added) {
              from_journal.insert(index);
              kept_where[index] = where;
            } else if (it->second != text) {
              throw Error("index " + std::to_string(index) + " is also in " +
                              (from_journal.count(index) ? std::string("the journal") : "--output " + o.output) +
                              " with a different line; are they of different runs?",
                          where);
            }
          }
        } else if (!journal_file.empty() && std::filesystem::exists(journal_file)) {
          if (journal_in_use(journal_file)) {
            throw Error("another linnet-tp run is writing this --output now (it holds its journal); wait for it to "
                        "end, or stop it",
                        journal_file);
          }
          throw Error("an unfinished run left its journal here: give --resume to keep its finished requests and run "
                      "only the rest, or remove the journal to start over",
                      journal_file);
        }
        for (const auto& [index, line] : kept) kept_indices.push_back(std::to_string(index));
      })) {
    return job.load_failure_exit();  // 130 when a signal stopped the reading
  }
  broadcast_lines(*groups.world, lines);
  broadcast_lines(*groups.world, oversized);
  broadcast_strings(*groups.world, kept_indices);
  // An oversized line takes its place in input order with no text (a real line is never
  // blank); its request fails alone below.
  std::map<int, uint64_t> oversized_bytes;
  for (const auto& [n, bytes] : oversized) {
    oversized_bytes[n] = std::stoull(bytes);
    lines.emplace_back(n, std::string());
  }
  std::stable_sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) { return a.first < b.first; });

  std::unique_ptr<ModelFiles> files;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
  std::vector<Request> requests;
  std::vector<size_t> todo;  // positions in `requests` still to generate
  std::vector<int64_t> eos;
  RequestSettings defaults;
  ordered_json settings;  // what the journal's header keeps for --resume to check
  const bool loaded = job.load_phase([&] {
    GenerationModel m = open_generation_model(o, w);
    const std::filesystem::path& model_dir = m.model_dir;
    const int64_t max_seq_len = m.max_seq_len;
    files = std::move(m.files);
    tokenizer = std::move(m.tokenizer);
    defaults = m.defaults;
    eos = m.eos;
    settings = generate_settings(o, defaults, model_dir, max_seq_len);
    if (w.world_rank == 0 && o.resume) check_journal_settings(journal_found, settings, settings_file);

    std::vector<int64_t> skip;
    for (const auto& s : kept_indices) skip.push_back(std::stoll(s));
    std::sort(skip.begin(), skip.end());
    // No prompt longer than this many bytes can have <= max_seq_len tokens: it is refused
    // before the tokenizer sees it (the tokenizer's time and memory grow with the text).
    const int64_t prompt_byte_limit = max_seq_len * prompt_bytes_per_token(*tokenizer);
    std::unique_ptr<ModelChatTemplate> chat;
    // The flags' own values fail the run, before any line (a line's keys fail that line).
    for (const int64_t id : defaults.stop_token_ids) {
      if (id >= files->config.vocab_size) {
        throw Error("invalid value", "--stop-token-ids", "ids < vocab_size = " + std::to_string(files->config.vocab_size),
                    std::to_string(id));
      }
    }
    for (const auto& [n, text] : lines) {
      Request r;
      r.index = n - 1;
      r.where = o.prompt ? std::string("--prompt") : o.input + ":" + std::to_string(n);
      if (const auto big = oversized_bytes.find(n); big != oversized_bytes.end()) {
        r.settings = defaults;
        r.error = r.where + ": the line has " + std::to_string(big->second) +
                  " bytes; an --input line may have at most " + std::to_string(kMaxJsonlLineBytes) + " (64 MiB)";
        if (!std::binary_search(skip.begin(), skip.end(), r.index)) todo.push_back(requests.size());
        requests.push_back(std::move(r));
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
        read_request_line(line, defaults, files->config.vocab_size, o.chat, *tokenizer, model_dir, chat, r, is_chat);
      } catch (const Error& e) {
        if (o.prompt) throw;
        // In a batch a bad line (JSON, a key, its chat template) fails alone: its output
        // line says why (finish_reason "error"), the others run, the exit code is 3.
        r.settings = defaults;
        r.text.clear();
        r.error = e.what();
        if (!done) todo.push_back(requests.size());
        requests.push_back(std::move(r));
        continue;
      }
      if (!done && static_cast<int64_t>(r.text.size()) > prompt_byte_limit) {
        const std::string why = "the prompt has " + std::to_string(r.text.size()) +
                                " bytes, more than --max-seq-len = " + std::to_string(max_seq_len) +
                                " tokens can hold (" + std::to_string(prompt_byte_limit / max_seq_len) +
                                " bytes per token at most); it was not tokenized";
        if (o.prompt) throw Error(why, r.where);
        r.error = why;  // in a batch it fails alone
        todo.push_back(requests.size());
        requests.push_back(std::move(r));
        continue;
      }
      if (!done) {
        try {
          // A rendered chat text already holds the template's BOS, so no second one is added.
          r.ids = tokenizer->encode(r.text, /*add_special_tokens=*/!is_chat);
        } catch (const Error& e) {
          if (o.prompt) throw e.at(r.where);
          r.error = e.at(r.where).what();  // fails alone, as a bad line
          r.ids.clear();
        }
        if (o.prompt && r.ids.empty()) throw Error("the prompt has no tokens (and the tokenizer adds no BOS)", r.where);
        // One prompt is refused now; in a batch it fails alone (its line says why).
        if (o.prompt && static_cast<int64_t>(r.ids.size()) > max_seq_len) {
          throw Error("the prompt is longer than the context", r.where,
                      "<= --max-seq-len = " + std::to_string(max_seq_len) + " tokens",
                      std::to_string(r.ids.size()) + " tokens");
        }
        if (static_cast<int64_t>(r.ids.size()) == max_seq_len && r.settings.max_new_tokens > 0 && w.world_rank == 0) {
          warn_once(r.where + ": the prompt fills --max-seq-len = " + std::to_string(max_seq_len) +
               " tokens; no room is left for new tokens");
        }
        todo.push_back(requests.size());
      }
      requests.push_back(std::move(r));
    }
    // Rank 0: a kept line must belong to this input (its index and its prompt).
    for (const auto& [index, line] : kept) {
      const auto it = std::find_if(requests.begin(), requests.end(), [&](const Request& r) { return r.index == index; });
      const std::string where = kept_where[index] + " (index " + std::to_string(index) + ")";
      if (it == requests.end()) throw Error("no input line has this index; is it the output of another input?", where);
      const ordered_json j = ordered_json::parse(line);
      // Only the keys linnet-tp writes: a line edited by hand would end up in --output.
      for (const auto& [key, value] : j.items()) {
        static const std::set<std::string> written = {"index", "prompt", "completion", "prompt_ids", "completion_ids",
                                                      "finish_reason", "error", "prompt_tokens", "completion_tokens",
                                                      "logprobs"};
        if (!written.count(key)) {
          throw Error("a kept line has a key linnet-tp does not write: \"" + key + "\"; is it linnet-tp's output?",
                      where);
        }
      }
      if (!j.contains("prompt") || j["prompt"] != it->text) {
        throw Error("its prompt differs from " + it->where + "; is it the output of another input?", where);
      }
      for (const char* key : {"completion", "finish_reason"}) {
        if (!j.contains(key) || !j[key].is_string()) {
          throw Error(std::string("a kept line needs a string \"") + key + "\" (as linnet-tp writes it)", where);
        }
      }
      // Its values too, as an input line's are: ids of this model, a finish reason
      // linnet-tp writes, counts and a completion text that are those of its ids (an
      // edited id or text would reach --output).
      const int64_t vocab = files->config.vocab_size;
      auto ids_of = [&](const char* key) {
        if (!j.contains(key) || !j[key].is_array()) {
          throw Error(std::string("a kept line needs a \"") + key + "\" list (as linnet-tp writes it)", where);
        }
        std::vector<int32_t> ids;
        for (const auto& v : j[key]) {
          if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
            throw Error(std::string("its \"") + key + "\" holds " + v.dump() + ", not a token id of this model (0 to " +
                            std::to_string(vocab - 1) + "); was the line edited?",
                        where);
          }
          ids.push_back(v.get<int32_t>());
        }
        return ids;
      };
      Request probe;
      probe.ids = ids_of("prompt_ids");
      probe.settings = it->settings;
      const std::vector<int32_t> completion_ids = ids_of("completion_ids");
      const std::string finish = j["finish_reason"].get<std::string>();
      if (finish != "stop" && finish != "length" && finish != "error") {
        throw Error("its \"finish_reason\" is \"" + finish + "\" (linnet-tp writes stop, length or error)", where);
      }
      if ((finish == "error") != (j.contains("error") && j["error"].is_string())) {
        throw Error("a kept line has a string \"error\" exactly when its finish_reason is \"error\"", where);
      }
      for (const auto& [key, n] : {std::pair<const char*, size_t>{"prompt_tokens", probe.ids.size()},
                                   {"completion_tokens", completion_ids.size()}}) {
        if (j.contains(key) && !(j[key].is_number_unsigned() && j[key].get<uint64_t>() == n)) {
          throw Error(std::string("its \"") + key + "\" is " + j[key].dump() + ", not the " + std::to_string(n) +
                          " ids it lists; was the line edited?",
                      where);
        }
      }
      std::string text;
      bool stopped = false;
      try {
        text = completion_text(*tokenizer, probe, completion_ids, stopped);
      } catch (const Error&) {
        text.clear();
      }
      if (text != j["completion"].get<std::string>()) {
        throw Error("its \"completion\" is not the text of its \"completion_ids\"; was the line edited?", where);
      }
      // A finish reason its ids bear out: "length" at the request's limit (its
      // max_new_tokens, or the context), "stop" at an EOS / stop token id or a stop string.
      if (finish != "error") {
        const int64_t n = static_cast<int64_t>(completion_ids.size());
        const int64_t limit =
            std::min<int64_t>(it->settings.max_new_tokens, max_seq_len - static_cast<int64_t>(probe.ids.size()));
        const int64_t last = completion_ids.empty() ? -1 : completion_ids.back();
        const bool stop_id = last >= 0 && (std::find(eos.begin(), eos.end(), last) != eos.end() ||
                                           std::find(it->settings.stop_token_ids.begin(),
                                                     it->settings.stop_token_ids.end(), last) !=
                                               it->settings.stop_token_ids.end());
        const bool ok = n <= limit && (finish == "length" ? n == limit : stop_id || stopped);
        if (!ok) {
          throw Error("its finish_reason \"" + finish + "\" does not fit its " + std::to_string(n) +
                          " completion ids (the limit is " + std::to_string(limit) + "); was the line edited?",
                      where);
        }
      }
    }

    const int64_t share = static_cast<int64_t>((todo.size() + static_cast<size_t>(w.dp_size) - 1 -
                                                static_cast<size_t>(w.dp_rank)) / static_cast<size_t>(w.dp_size));
    const int64_t batch_rows = std::max<int64_t>(1, std::min<int64_t>(o.max_batch, share));
    build_generation_engine(o, *files, m.plan, max_seq_len, groups, batch_rows, backend, engine);
  });
  if (!loaded) return kLoadErrorExit;

  std::unique_ptr<JsonlOutput> output;
  std::unique_ptr<Journal> journal;  // rank 0
  ordered_json journal_header;       // rank 0: its first line, and the run record at the end
  int code = 0;
  try {
    if (w.world_rank == 0 && !files->unused_tensors.empty()) {
      std::string names;
      for (const auto& n : files->unused_tensors) names += (names.empty() ? "" : ", ") + n;
      warn_once("checkpoint tensors the model does not use: " + names);
    }
    // The journal's seed, so that a resumed run without --seed samples the requests
    // still to run as the interrupted run would have.
    std::optional<uint64_t> journal_seed;
    if (journal_found.header.is_object() && journal_found.header.contains("seed") &&
        journal_found.header["seed"].is_number_unsigned()) {
      journal_seed = journal_found.header["seed"].get<uint64_t>();
    }
    uint64_t seed = 0;
    if (o.seed) {
      seed = *o.seed;
    } else if (w.world_rank == 0) {
      seed = journal_seed ? *journal_seed
                          : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    }
    groups.world->broadcast(&seed, sizeof seed, 0);
    if (w.world_rank == 0) {
      const SamplingParams& p = defaults.sampling;
      char line[256];
      std::snprintf(line, sizeof line,
                    "sampling: temperature %g, top_k %lld, top_p %g, min_p %g, repetition_penalty %g, seed %llu",
                    p.temperature, static_cast<long long>(p.top_k), p.top_p, p.min_p, p.repetition_penalty,
                    static_cast<unsigned long long>(seed));
      info(line);
      // Only when no request samples (an --input line may set its own temperature).
      const bool any_sampling = std::any_of(requests.begin(), requests.end(),
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
        journal = std::make_unique<Journal>(journal_file, journal_header, o.resume ? &journal_found : nullptr);
        std::remove(run_record_path(o.output).c_str());  // written again once --output is
        std::fprintf(stderr, "[linnet-tp] journal: %s (each finished request is kept there until --output is "
                     "written; after a crash, rerun with --resume)\n", journal->path().c_str());
        set_stop_note("[linnet-tp] stopping at the next step; finished requests are kept in the journal " +
                      journal->path() + "\n");
      }
    }

    if (batch) {
      BatchRun run{groups, *tokenizer, requests, kept, todo, o.prefix_caching, o.progress};
      run.kept_from_journal = from_journal.size();
      run.journal = journal.get();
      code = run_batch(*engine, run, eos, seed, output);
    } else {
      float failed = 0.0f;
      if (w.dp_rank == 0 && run_single(*engine, *tokenizer, requests.at(0), eos, seed, w.world_rank == 0,
                                       output.get())) {
        failed = 1.0f;
      }
      // The other dp groups wait here for group 0's whole completion: no stall, so no
      // timeout for them (group 0's own collectives are watched).
      const double timeout = comm_timeout();
      if (w.dp_rank != 0) set_comm_timeout(0);
      groups.world->all_reduce_max(&failed, 1);  // every rank exits with the same code
      set_comm_timeout(timeout);
      if (failed > 0.0f) code = kSomeFailedExit;
    }
    if (w.world_rank == 0 && (std::fflush(stdout) != 0 || std::ferror(stdout))) {
      throw Error(std::string("cannot write the completion: ") + std::strerror(errno), "stdout");
    }
    if (output) output->commit();
    // Every finished line is in --output now (an interrupted run keeps the journal); the
    // run record keeps its settings for a later --resume over it.
    if (journal && code != kInterruptedExit) {
      write_run_record(o.output, journal_header);
      journal->remove();
    }
  } catch (const std::exception& e) {
    const std::string note = journal_note(journal.get());
    job.abort(e.what() + note, [&] { output.reset(); });
  }
  return code;
}

}  // namespace linnet
