#include "driver/batch_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "driver/job.h"
#include "driver/progress.h"
#include "driver/run_relay.h"
#include "runtime/batch_generate.h"
#include "runtime/model_loader.h"

namespace linnet {
namespace {

using nlohmann::ordered_json;

// World rank 0 after the run: stdout and --output in input order (kept lines as they
// were), the stats line, and the exit code. An interrupted run writes the finished lines
// to --output and keeps the journal for --resume.
int write_batch_results(Engine& engine, const BatchRun& b, const std::map<size_t, ordered_json>& fresh,
                        const PagePoolStats& kv, const SpeculativeStats& spec,
                        std::chrono::steady_clock::time_point t0, std::unique_ptr<JsonlOutput>& output) {
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
  if (b.speculative.enabled()) {
    std::fprintf(stderr, "[linnet-tp] %s\n",
                 speculation_summary(b.speculative, spec, w.dp_size > 1 ? " (dp group 0)" : "").c_str());
  }
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

}  // namespace

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
  options.speculative = b.speculative;
  options.draft = b.draft;
  SpeculativeStats spec;
  options.speculative_stats = &spec;
  const auto t0 = std::chrono::steady_clock::now();
  generate_batch(engine, reqs, options);
  progress.finish();
  // Wait for the other groups and their records, still passing on a signal.
  relay.finish();

  int code = kOkExit;
  if (world_root) code = write_batch_results(engine, b, fresh, kv, spec, t0, output);
  b.groups.world->broadcast(&code, sizeof code, 0);  // every rank exits with rank 0's code
  return code;
}


}  // namespace linnet
