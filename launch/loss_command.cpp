#include "launch/loss_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "launch/cli_parse.h"
#include "launch/job.h"
#include "launch/journal.h"
#include "launch/jsonl_input.h"
#include "launch/jsonl_output.h"
#include "launch/loss_document.h"
#include "launch/model_path.h"
#include "launch/run_relay.h"
#include "loader/tokenizer/tokenizer.h"
#include "parallel/comm_watch.h"
#include "parallel/mpi_communicator.h"
#include "runtime/backend_factory.h"
#include "runtime/weights.h"
#include "runtime/loss.h"
#include "runtime/model_loader.h"

namespace linnet {
namespace {

// A piece of a document scored on its own: ids[begin, end) of document `doc`.
struct Chunk {
  int64_t doc = 0;
  int64_t begin = 0, end = 0;
};

// Chunks of at most `n` tokens, packed in input order into sequences of at most `n`.
std::vector<std::vector<Chunk>> pack(const std::vector<LossDocument>& docs, int64_t n) {
  std::vector<std::vector<Chunk>> packs;
  int64_t used = n;  // forces a new pack first
  for (size_t d = 0; d < docs.size(); ++d) {
    const int64_t len = static_cast<int64_t>(docs[d].ids.size());
    for (int64_t b = 0; b < len; b += n) {
      const Chunk c{static_cast<int64_t>(d), b, std::min(len, b + n)};
      if (used + (c.end - c.begin) > n) {
        packs.emplace_back();
        used = 0;
      }
      packs.back().push_back(c);
      used += c.end - c.begin;
    }
  }
  return packs;
}

PackedBatch make_batch(const std::vector<LossDocument>& docs, const std::vector<Chunk>& chunks) {
  PackedBatch b;
  for (size_t s = 0; s < chunks.size(); ++s) {
    const Chunk& c = chunks[s];
    const LossDocument& d = docs[static_cast<size_t>(c.doc)];
    for (int64_t i = c.begin; i < c.end; ++i) {
      b.tokens.push_back(d.ids[i]);
      b.positions.push_back(static_cast<int32_t>(i - c.begin));
      b.segments.push_back(static_cast<int32_t>(s));
      // Position i predicts the next label of the same chunk; a chunk's last token none.
      b.labels.push_back(i + 1 < c.end ? d.labels[i + 1] : kIgnoreIndex);
    }
  }
  return b;
}

// Tokens of `d` that are scored when it is cut into chunks of `n`: position i of a chunk
// predicts label i + 1 of the same chunk, unless that label is -100 (as make_batch does).
int64_t scored_tokens(const LossDocument& d, int64_t n) {
  const int64_t len = static_cast<int64_t>(d.ids.size());
  int64_t count = 0;
  for (int64_t b = 0; b < len; b += n) {
    const int64_t e = std::min(len, b + n);
    for (int64_t i = b + 1; i < e; ++i) count += d.labels[static_cast<size_t>(i)] != kIgnoreIndex ? 1 : 0;
  }
  return count;
}

// A double for a journal line: a number, or "nan" / "inf" / "-inf" (JSON has none of those).
nlohmann::ordered_json json_double(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

double double_of(const nlohmann::ordered_json& v) {
  if (v.is_number()) return v.get<double>();
  const std::string s = v.is_string() ? v.get<std::string>() : std::string();
  if (s == "inf") return INFINITY;
  if (s == "-inf") return -INFINITY;
  return NAN;
}

// The journal line of scored pack `k` (tp rank 0): {"pack", "tokens" (its length), "docs":
// [[document, nll sum, scored tokens], ...]} with the sums over the pack's positions in
// order. A document has at most one chunk per pack (a chunk that is not its last fills
// a pack), so these are the per-pack parts of its sums.
std::string pack_record(size_t k, const std::vector<Chunk>& chunks, const PackedBatch& batch, const PackedLoss& loss) {
  std::vector<double> nll(chunks.size(), 0.0);
  std::vector<int64_t> scored(chunks.size(), 0);
  for (size_t i = 0; i < batch.tokens.size(); ++i) {
    const size_t s = static_cast<size_t>(batch.segments[i]);
    nll[s] += loss.nll[i];
    scored[s] += loss.scored[i];
  }
  nlohmann::ordered_json rec;
  rec["pack"] = k;
  rec["tokens"] = batch.tokens.size();
  rec["docs"] = nlohmann::ordered_json::array();
  for (size_t s = 0; s < chunks.size(); ++s) {
    rec["docs"].push_back({chunks[s].doc, json_double(nll[s]), scored[s]});
  }
  return rec.dump();
}

// Rank 0, --resume: every kept --output line and every journal pack must belong to this
// input and these flags (a resumed run must add up exactly as an uninterrupted one).
void check_resume(const LossOptions& o, const std::string& journal_file, const JournalContents& journal,
                  const std::map<int64_t, std::string>& kept,
                  const std::map<int64_t, nlohmann::ordered_json>& records, const std::vector<LossDocument>& docs,
                  const std::vector<std::vector<Chunk>>& packs, int64_t pack_len) {
  const int64_t D = static_cast<int64_t>(docs.size());
  for (const auto& [index, text] : kept) {
    const std::string where = o.output + ": line with index " + std::to_string(index);
    if (index >= D) throw Error("no document of --input has this index; is it the output of another input?", where);
    const nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
    const int64_t expected = scored_tokens(docs[static_cast<size_t>(index)], pack_len);
    if (!j.contains("tokens") || !j["tokens"].is_number_integer() || j["tokens"].get<int64_t>() != expected) {
      throw Error("its \"tokens\" differ from the tokens this run scores in that document; is it the output of "
                  "another input or --max-seq-len?",
                  where, std::to_string(expected), j.contains("tokens") ? j["tokens"].dump() : "none");
    }
    const bool scored = j.contains("nll_sum") && j["nll_sum"].is_number();
    const bool failed = j.contains("error") && j["error"].is_string();
    if (scored == failed) {
      throw Error("a kept line needs a number \"nll_sum\" or a string \"error\" (as linnet-tp writes them)", where);
    }
    // Only what linnet-tp writes, and a mean that is its sum's (an edited line would reach
    // --output and the summary).
    for (const auto& [key, value] : j.items()) {
      static const std::set<std::string> written = {"index", "tokens", "nll_sum", "mean_nll", "error"};
      if (!written.count(key)) {
        throw Error("a kept line has a key linnet-tp does not write: \"" + key + "\"; is it linnet-tp's output?", where);
      }
    }
    if (scored) {
      const double sum = j["nll_sum"].get<double>();
      const bool mean_ok = expected > 0 ? j.contains("mean_nll") && j["mean_nll"].is_number() &&
                                              std::fabs(j["mean_nll"].get<double>() - sum / static_cast<double>(expected)) <=
                                                  1e-9 * std::max(1.0, std::fabs(sum))
                                        : j.contains("mean_nll") && j["mean_nll"].is_null();
      if (!std::isfinite(sum) || sum < -1e-9 || !mean_ok) {
        throw Error("its \"nll_sum\" / \"mean_nll\" are not those linnet-tp writes (a finite sum >= 0, its mean over "
                    "\"tokens\"); was the line edited?",
                    where);
      }
    }
  }
  if (journal.header.is_object()) {
    const std::pair<const char*, int64_t> expect[] = {
        {"documents", D}, {"packs", static_cast<int64_t>(packs.size())}, {"max_seq_len", pack_len}};
    for (const auto& [key, value] : expect) {
      if (!journal.header.contains(key) || journal.header[key] != value) {
        throw Error(std::string("the journal is of a run with other ") + key +
                        "; resume with the same --input, --max-seq-len and model",
                    journal_file + ":1", std::to_string(value),
                    journal.header.contains(key) ? journal.header[key].dump() : "none");
      }
    }
  }
  for (const auto& [k, rec] : records) {
    const std::string where = journal_file + ": pack " + std::to_string(k);
    if (k >= static_cast<int64_t>(packs.size())) throw Error("this run has no such pack", where);
    const auto& entries = rec["docs"];
    bool same = entries.size() == packs[static_cast<size_t>(k)].size();
    for (size_t s = 0; same && s < entries.size(); ++s) {
      const auto& e = entries[s];
      same = e.is_array() && e.size() == 3 && e[0].is_number_integer() &&
             e[0].get<int64_t>() == packs[static_cast<size_t>(k)][s].doc && (e[1].is_number() || e[1].is_string()) &&
             e[2].is_number_integer();
    }
    if (!same || !rec.contains("tokens") || !rec["tokens"].is_number_unsigned()) {
      throw Error("its documents differ from this run's pack (or the line is not as linnet-tp writes it)", where);
    }
  }
}

// World rank 0 after the run: each document's sums from its scored packs, added in pack
// order (so a resumed run adds exactly what an uninterrupted one does), or its kept
// --output line as it was; --output in input order (committed here) and the summary on
// stdout. An interrupted run writes the documents done and keeps the journal. Returns
// the exit code.
int write_loss_results(const LossOptions& o, const std::vector<std::pair<int, std::string>>& lines,
                       const std::vector<LossDocument>& docs, const std::vector<std::vector<Chunk>>& packs,
                       const std::map<int64_t, std::string>& kept,
                       const std::map<int64_t, nlohmann::ordered_json>& records, double tokens_per_s,
                       Journal* journal, JsonlOutput* output) {
  const size_t D = docs.size();
  std::vector<double> nll(D, 0.0), scored(D, 0.0);
  std::vector<size_t> packs_seen(D, 0), packs_needed(D, 0);
  for (const auto& chunks : packs) {
    int64_t prev = -1;
    for (const Chunk& c : chunks) {
      if (c.doc != prev) ++packs_needed[static_cast<size_t>(c.doc)];
      prev = c.doc;
    }
  }
  for (const auto& [k, rec] : records) {
    for (const auto& e : rec["docs"]) {
      const size_t d = e[0].get<size_t>();
      nll[d] += double_of(e[1]);
      scored[d] += e[2].get<double>();
      ++packs_seen[d];
    }
  }
  double total_nll = 0, total_scored = 0;
  size_t failed = 0, finished = 0;
  for (size_t d = 0; d < D; ++d) {
    const std::string where = o.input + ":" + std::to_string(lines[d].first);
    std::string text;
    if (const auto k = kept.find(static_cast<int64_t>(d)); k != kept.end()) {
      text = k->second;
      const nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
      if (j.contains("error")) {
        ++failed;
        print_error(-1, j["error"].get<std::string>());
      } else {
        total_nll += j["nll_sum"].get<double>();
        total_scored += j["tokens"].get<double>();
      }
    } else if (packs_seen[d] == packs_needed[d]) {
      // A document whose loss is NaN or inf (e.g. NaN weights) fails alone: its line
      // says why instead of holding a null, and it stays out of the mean.
      nlohmann::ordered_json j;
      j["index"] = d;
      j["tokens"] = static_cast<int64_t>(scored[d]);
      if (!std::isfinite(nll[d])) {
        const std::string error = where + ": the loss is not finite (" + std::to_string(nll[d]) +
                                  "); the logits hold NaN or inf (check the weights)";
        ++failed;
        print_error(-1, error);
        j["error"] = error;
      } else {
        j["nll_sum"] = nll[d];
        j["mean_nll"] = scored[d] > 0 ? nlohmann::ordered_json(nll[d] / scored[d]) : nlohmann::ordered_json();
        total_nll += nll[d];
        total_scored += scored[d];
      }
      text = j.dump();
    } else {
      continue;  // not scored yet (interrupted)
    }
    ++finished;
    if (output) output->add_line(std::move(text));
  }
  if (finished < D) {
    if (journal) journal->sync();
    if (output) output->commit();
    std::string kept_in = output ? " (kept in --output" : "";
    if (journal && journal->ok()) kept_in += " and in the journal " + journal->path();
    if (output) kept_in += "); rerun with --resume";
    print_error(-1, "interrupted: " + std::to_string(finished) + " of " + std::to_string(D) + " documents done" +
                        (output ? kept_in
                                : "; give --output to keep finished documents, and --resume to score the rest"));
    return kInterruptedExit;
  }
  if (total_scored <= 0 && failed == 0) {
    if (journal) journal->remove();  // nothing scored is worth resuming
    throw Error("no token was scored: every document has fewer than 2 tokens or only -100 labels",
                "--input " + o.input);
  }
  if (total_scored > 0) {
    const double mean = total_nll / total_scored;
    std::printf("scored tokens: %.0f\nmean NLL per token: %.6f\nperplexity: %.4f\ntokens/s: %.1f\n", total_scored,
                mean, std::exp(mean), tokens_per_s);
  }
  if (failed > 0) {
    std::fprintf(stderr, "[linnet-tp] %zu of %zu documents failed (not finite loss)%s\n", failed, D,
                 total_scored > 0 ? "; the mean leaves them out" : "");
  }
  if (std::fflush(stdout) != 0) throw Error("cannot write the results", "stdout");
  if (output) output->commit();
  return failed > 0 ? kSomeFailedExit : kOkExit;
}

}  // namespace

std::optional<LossOptions> parse_loss_options(int argc, char** argv, std::string& help_text) {
  cxxopts::Options opts("linnet-tp loss",
                        "Mean NLL and perplexity of a model on a JSONL data set, with vocab-parallel\n"
                        "cross-entropy; world = dp x tp ranks, tp groups are contiguous ranks.\n\n"
                        "  mpirun -np 8 linnet-tp loss --model DIR --input data.jsonl --tp 4\n");
  opts.custom_help("[OPTIONS]");
  // clang-format off
  opts.add_options()
    ("model", "Model directory or name", cxxopts::value<std::string>())
    ("input", "JSONL: {\"text\": ...} (tokenized with BOS as the tokenizer adds it) or "
     "{\"ids\": [...], \"labels\": [...] (optional, -100 = ignored)} per line", cxxopts::value<std::string>())
    ("output", "Per-document JSONL {index, tokens, nll_sum, mean_nll}, input order, written atomically "
     "at the end; each scored pack goes to OUTPUT.journal at once (kept after a crash, removed at the end)",
     cxxopts::value<std::string>())
    ("resume", "With --output: keep the documents already in --output and the packs in its journal, "
     "score only the rest")
    ("max-seq-len", "Tokens per packed sequence; longer documents are scored in chunks "
     "(default: min(max_position_embeddings, 8192))", cxxopts::value<int64_t>())
    ("tp", "Ranks per tensor-parallel group (default: all ranks)", cxxopts::value<int>())
    ("comm-timeout", kCommTimeoutHelp, cxxopts::value<int64_t>())
    ("threads", "CPU backend: kernel (OpenMP) threads per rank (default: cores / ranks on the node)", cxxopts::value<int64_t>())
    ("backend", "cpu or cuda (default: cuda when a CUDA device is visible, else cpu)",
     cxxopts::value<std::string>())
    ("weight-dtype", kWeightDtypeHelp, cxxopts::value<std::string>())
    ("kv-cache-dtype", kKvCacheDtypeHelp, cxxopts::value<std::string>())
    ("verbose", "Print the plan and per-rank details to stderr")
    ("h,help", "Print this help and exit");
  // clang-format on
  const auto parsed = parse_options(opts, argc, argv, "loss", help_text);
  if (!parsed) return std::nullopt;
  const cxxopts::ParseResult& r = *parsed;
  LossOptions o;
  if (!r.count("model")) throw Error("is required", "--model");
  if (!r.count("input")) throw Error("is required", "--input");
  o.model = r["model"].as<std::string>();
  o.input = r["input"].as<std::string>();
  if (r.count("output")) {
    o.output = r["output"].as<std::string>();
    if (o.output.empty()) throw Error("is empty", "--output");
  }
  read_at_least<int64_t>(r, "max-seq-len", 2, o.max_seq_len);
  read_at_least(r, "tp", 1, o.tp);
  read_comm_timeout(r, o.comm_timeout);
  o.resume = r.count("resume") > 0;
  if (o.resume && o.output.empty()) throw Error("needs --output (the documents to keep are there)", "--resume");
  read_in_range(r, "threads", 1, kMaxThreads, o.threads);
  read_backend(r, o.backend);
  read_weight_dtype(r, o.weight_dtype);
  read_kv_cache_dtype(r, o.kv_cache_dtype);
  o.verbose = r.count("verbose") > 0;
  return o;
}

int run_loss(const LossOptions& o, Job& job) {
  set_verbose(o.verbose);
  set_comm_timeout(o.comm_timeout);
  std::optional<MpiGroups> made = make_run_groups(job, o.tp);
  if (!made) return kUsageExit;
  MpiGroups& groups = *made;
  const WorldConfig& w = groups.world_config;
  // From here a signal only sets a flag; the pack loop stops at its next pack.
  install_stop_handlers();

  // Rank 0 reads the input, and with --resume the documents of --output and the packs of
  // the journal; every rank learns which of them are done.
  std::vector<std::pair<int, std::string>> lines;
  std::string journal_file;                   // rank 0 with --output
  std::map<int64_t, std::string> kept;        // rank 0: --output lines by document index
  JournalContents journal_found;              // rank 0 (or the run record's header)
  std::string settings_file;                  // rank 0: where journal_found's header came from
  std::map<int64_t, nlohmann::ordered_json> pack_records;  // rank 0: scored packs by index
  std::vector<std::string> kept_indices, journal_packs;    // every rank
  if (!job.load_phase([&] {
        if (w.world_rank != 0) return;
        lines = read_jsonl_lines(o.input, nullptr, [] { return caught_stop_signal() != 0; });
        if (!o.output.empty()) {
          check_output_path(o.output, o.input);
          journal_file = journal_path(o.output);
        }
        if (o.resume) {
          wait_for_journal_writer(journal_file);  // a killed mpirun's ranks may still be at work
          kept = read_output_lines(resolve_output_path(o.output));
          journal_found = read_journal(journal_file, "loss");
          settings_file = journal_file;
          if (!journal_found.exists && !kept.empty()) {  // a finished run's --output: its record
            journal_found.header = read_run_record(o.output, "loss");
            settings_file = run_record_path(o.output);
          }
          if (!journal_found.dropped.empty()) {
            warn_once("ignoring " + journal_found.dropped + "; that pack is scored again");
          }
          for (const auto& [n, text] : journal_found.lines) {
            const std::string where = journal_file + ":" + std::to_string(n);
            nlohmann::ordered_json rec = parse_jsonl_line(text, where);
            const auto k = rec.find("pack");
            if (k == rec.end() || !k->is_number_unsigned() || !rec.contains("docs") || !rec["docs"].is_array()) {
              throw Error("a journal line of loss needs \"pack\" (an integer >= 0) and \"docs\" (as linnet-tp "
                          "writes them)",
                          where);
            }
            const int64_t pack = k->get<int64_t>();
            if (const auto [it, added] = pack_records.emplace(pack, rec); !added && it->second != rec) {
              throw Error("pack " + std::to_string(pack) + " appears twice with different sums", where);
            }
          }
        } else if (!journal_file.empty() && std::filesystem::exists(journal_file)) {
          if (journal_in_use(journal_file)) {
            throw Error("another linnet-tp run is writing this --output now (it holds its journal); wait for it to "
                        "end, or stop it",
                        journal_file);
          }
          throw Error("an unfinished run left its journal here: give --resume to keep its scored documents and "
                      "score only the rest, or remove the journal to start over",
                      journal_file);
        }
        for (const auto& [index, line] : kept) kept_indices.push_back(std::to_string(index));
        for (const auto& [pack, rec] : pack_records) journal_packs.push_back(std::to_string(pack));
      })) {
    return job.load_failure_exit();  // 130 when a signal stopped the reading
  }
  broadcast_lines(*groups.world, lines);
  broadcast_strings(*groups.world, kept_indices);
  broadcast_strings(*groups.world, journal_packs);

  std::unique_ptr<ModelFiles> files;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
  std::vector<LossDocument> docs;
  std::vector<std::vector<Chunk>> packs;
  std::vector<size_t> todo;  // packs to score in this run, all groups
  int64_t pack_len = 0;
  nlohmann::ordered_json settings;  // what the journal's header keeps for --resume to check
  if (!job.load_phase([&] {
        const std::filesystem::path dir = resolve_model_dir(o.model);
        {
          std::error_code ec;
          const std::filesystem::path real = std::filesystem::weakly_canonical(dir, ec);
          settings["model"] = (ec ? dir : real).string();
          settings["weight_dtype"] = o.weight_dtype;
          settings["kv_cache_dtype"] = o.kv_cache_dtype;
          if (w.world_rank == 0 && o.resume) check_journal_settings(journal_found, settings, settings_file);
        }
        files = std::make_unique<ModelFiles>(open_model(dir));
        const ShardPlan plan = ShardPlan::make(files->config, w.tp_rank, w.tp_size);
        pack_len = resolve_max_seq_len(files->config, o.max_seq_len);
        // No KV cache is kept between passes; the packed pass needs one of pack_len rows.
        const ScalarType held =
            held_weight_dtype(o.weight_dtype, o.backend, from_dtype(files->checkpoint.dominant_dtype()));
        const ScalarType kv_dtype = held_kv_cache_dtype(o.kv_cache_dtype, o.backend);
        const RankMemory need = rank_memory(files->config, plan, pack_len, 1, held, kv_dtype);
        check_memory(need, available_host_memory(), w.local_size);
        std::unique_ptr<Tokenizer> tok;
        if (std::filesystem::exists(dir / "tokenizer.json")) {
          tok = std::make_unique<Tokenizer>(Tokenizer::from_dir(dir));
        }
        for (const JsonlLine& l : parse_jsonl(o.input, lines)) {
          docs.push_back(parse_loss_document(l.value, o.input + ":" + std::to_string(l.line), tok.get(), files->config.vocab_size));
        }
        packs = pack(docs, pack_len);
        if (w.world_rank == 0) check_resume(o, journal_file, journal_found, kept, pack_records, docs, packs, pack_len);
        std::set<int64_t> kept_docs, done_packs;
        for (const auto& s : kept_indices) kept_docs.insert(std::stoll(s));
        for (const auto& s : journal_packs) done_packs.insert(std::stoll(s));
        for (size_t k = 0; k < packs.size(); ++k) {
          if (done_packs.count(static_cast<int64_t>(k))) continue;
          const bool needed = std::any_of(packs[k].begin(), packs[k].end(),
                                          [&](const Chunk& c) { return kept_docs.count(c.doc) == 0; });
          if (needed) todo.push_back(k);
        }
        backend = make_backend(o.backend, o.threads, w.local_rank, w.local_size, held, kv_dtype);
        engine = make_engine(*files, plan, *backend, tp_communicator(*backend, *groups.tp, w.local_size),
                             /*max_seq_len=*/1);
        info("dp group " + std::to_string(w.dp_rank) + "/" + std::to_string(w.dp_size) + ", tp rank " +
             std::to_string(w.tp_rank) + "/" + std::to_string(w.tp_size) + ": " + std::to_string(docs.size()) +
             " documents in " + std::to_string(packs.size()) + " packs of <= " + std::to_string(pack_len) +
             " tokens, " + std::to_string(todo.size()) + " to score");
      })) {
    return kLoadErrorExit;
  }

  std::unique_ptr<JsonlOutput> output;
  std::unique_ptr<Journal> journal;  // rank 0 with --output
  nlohmann::ordered_json journal_header;  // rank 0: its first line, and the run record at the end
  int code = 0;
  try {
    const bool world_root = w.world_rank == 0;
    if (world_root && !o.output.empty()) {
      journal_header["linnet-tp journal"] = "loss";
      journal_header["documents"] = docs.size();
      journal_header["packs"] = packs.size();
      journal_header["max_seq_len"] = pack_len;
      journal_header["settings"] = settings;
      journal = std::make_unique<Journal>(journal_file, journal_header, o.resume ? &journal_found : nullptr);
      std::remove(run_record_path(o.output).c_str());  // written again once --output is
      std::fprintf(stderr, "[linnet-tp] journal: %s (each scored pack of documents is kept there until --output is "
                   "written; after a crash, rerun with --resume)\n", journal->path().c_str());
      set_stop_note("[linnet-tp] stopping after the packs in flight; scored documents are kept in the journal " +
                    journal->path() + "\n");
    }
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    double fresh_tokens = 0;  // rank 0: tokens of the packs scored in this run
    RunRelay relay(
        MPI_COMM_WORLD,
        [&](std::string text) {
          nlohmann::ordered_json rec = nlohmann::ordered_json::parse(text);
          if (journal) journal->append(text);
          fresh_tokens += rec["tokens"].get<double>();
          const int64_t k = rec["pack"].get<int64_t>();
          pack_records[k] = std::move(rec);
        },
        [&] {
          if (journal) journal->tick();
        });
    auto last_report = t0;
    std::vector<size_t> mine;  // this group's share of todo, round-robin
    for (size_t j = static_cast<size_t>(w.dp_rank); j < todo.size(); j += static_cast<size_t>(w.dp_size)) {
      mine.push_back(todo[j]);
    }
    size_t done = 0;
    double local_tokens = 0;
    for (const size_t k : mine) {
      // Once a pack the tp group agrees whether any of its ranks heard of a signal.
      float stop = relay.poll() ? 1.0f : 0.0f;
      groups.tp->all_reduce_max(&stop, 1);
      if (stop > 0.0f) break;
      const PackedBatch batch = make_batch(docs, packs[k]);
      const PackedLoss loss = loss_packed(*engine, batch);
      if (w.tp_rank == 0) relay.send(pack_record(k, packs[k], batch, loss));
      local_tokens += static_cast<double>(batch.tokens.size());
      ++done;
      const auto now = Clock::now();
      if (world_root && now - last_report > std::chrono::seconds(2)) {
        const double s = std::chrono::duration<double>(now - t0).count();
        std::fprintf(stderr, "[linnet-tp] loss: %zu/%zu packs of this group, %.0f tokens/s\n", done, mine.size(),
                     local_tokens / s);
        last_report = now;
      }
    }
    // Wait for the other groups and their packs, still passing on a signal.
    relay.finish();
    if (world_root) {
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!o.output.empty()) output = std::make_unique<JsonlOutput>(o.output);
      code = write_loss_results(o, lines, docs, packs, kept, pack_records, fresh_tokens / std::max(seconds, 1e-9),
                                journal.get(), output.get());
      output.reset();
    }
    groups.world->broadcast(&code, sizeof code, 0);  // every rank exits with rank 0's code
    // Every scored document is in --output now (an interrupted run keeps the journal); the
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
