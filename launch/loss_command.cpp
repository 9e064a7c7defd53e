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
#include "launch/engine_setup.h"
#include "driver/job.h"
#include "driver/journal.h"
#include "requests/jsonl_input.h"
#include "parallel/text_broadcast.h"
#include "driver/jsonl_output.h"
#include "driver/loss_run.h"
#include "driver/resume.h"
#include "requests/loss_document.h"
#include "loader/model_path.h"
#include "driver/run_relay.h"
#include "loader/tokenizer/tokenizer.h"
#include "parallel/comm_watch.h"
#include "parallel/mpi_communicator.h"
#include "runtime/backend_factory.h"
#include "runtime/weights.h"
#include "runtime/loss.h"
#include "runtime/model_loader.h"

namespace linnet {
namespace {

// What world rank 0 reads before the model: the documents' lines, and with --resume the
// documents of --output and the packs of the journal.
struct LossInput {
  std::vector<std::pair<int, std::string>> lines;
  ResumeState resume;                                      // --output (by document index), its journal
  std::map<int64_t, nlohmann::ordered_json> pack_records;  // scored packs by index
  std::vector<std::string> kept_indices, journal_packs;    // broadcast to every rank
};

// World rank 0 only; no collective call.
// @throws Error naming the file and line (input, --output, journal).
void read_loss_input(const LossOptions& o, LossInput& in) {
  in.lines = read_jsonl_lines(o.input, nullptr, [] { return caught_stop_signal() != 0; });
  in.resume = read_resume_state(o.output, o.input, o.resume, true,
                                     {"loss", "its scored documents and score only the rest",
                                      "that pack is scored again"});
  for (const auto& [n, text] : in.resume.journal.lines) {
    const std::string where = in.resume.journal_file + ":" + std::to_string(n);
    nlohmann::ordered_json rec = parse_jsonl_line(text, where);
    const auto k = rec.find("pack");
    if (k == rec.end() || !k->is_number_unsigned() || !rec.contains("docs") || !rec["docs"].is_array()) {
      throw Error("a journal line of loss needs \"pack\" (an integer >= 0) and \"docs\" (as linnet-tp "
                  "writes them)",
                  where);
    }
    const int64_t pack = k->get<int64_t>();
    if (const auto [it, added] = in.pack_records.emplace(pack, rec); !added && it->second != rec) {
      throw Error("pack " + std::to_string(pack) + " appears twice with different sums", where);
    }
  }
  for (const auto& [index, line] : in.resume.kept) in.kept_indices.push_back(std::to_string(index));
  for (const auto& [pack, rec] : in.pack_records) in.journal_packs.push_back(std::to_string(pack));
}

// What every rank holds for the scoring: the model, its engine, the documents, their packs
// and the packs this run scores.
struct LossRun {
  std::unique_ptr<ModelFiles> files;
  OpenedEngine opened;
  std::vector<LossDocument> docs;
  std::vector<std::vector<PackChunk>> packs;
  std::vector<size_t> todo;         // packs to score in this run, all groups
  int64_t pack_len = 0;
  nlohmann::ordered_json settings;  // what the journal's header keeps for --resume to check
};

// Every rank: the model, the documents tokenized and packed, what --resume leaves to
// score, and the engine. No collective call (inside Job::load_phase).
// @throws Error naming the file, line or flag.
void load_loss_run(const LossOptions& o, const LossInput& in, MpiGroups& groups, LossRun& run) {
  const WorldConfig& w = groups.world_config;
  const std::filesystem::path dir = resolve_model_dir(o.engine.model);
  {
    std::error_code ec;
    const std::filesystem::path real = std::filesystem::weakly_canonical(dir, ec);
    run.settings["model"] = (ec ? dir : real).string();
    run.settings["weight_dtype"] = o.engine.weight_dtype;
    if (const int64_t g = quantized_group_size(o.engine); g > 0) run.settings["weight_group_size"] = g;
    run.settings["kv_cache_dtype"] = o.engine.kv_cache_dtype;
    if (o.engine.activation_dtype != "f32") run.settings["activation_dtype"] = o.engine.activation_dtype;  // other outputs
    if (w.world_rank == 0 && o.resume) check_journal_settings(in.resume.journal, run.settings, in.resume.settings_file);
  }
  run.files = std::make_unique<ModelFiles>(open_model(dir));
  const ShardPlan plan = ShardPlan::make(run.files->config, w.tp_rank, w.tp_size);
  run.pack_len = resolve_max_seq_len(run.files->config, o.engine.max_seq_len);
  std::unique_ptr<Tokenizer> tok;
  if (std::filesystem::exists(dir / "tokenizer.json")) {
    tok = std::make_unique<Tokenizer>(Tokenizer::from_dir(dir));
  }
  for (const JsonlLine& l : parse_jsonl(o.input, in.lines)) {
    run.docs.push_back(parse_loss_document(l.value, o.input + ":" + std::to_string(l.line), tok.get(), run.files->config.vocab_size));
  }
  run.packs = pack_documents(run.docs, run.pack_len);
  if (w.world_rank == 0) check_loss_resume(o.output, in.resume.journal_file, in.resume.journal, in.resume.kept, in.pack_records, run.docs, run.packs, run.pack_len);
  std::set<int64_t> kept_docs, done_packs;
  for (const auto& s : in.kept_indices) kept_docs.insert(std::stoll(s));
  for (const auto& s : in.journal_packs) done_packs.insert(std::stoll(s));
  for (size_t k = 0; k < run.packs.size(); ++k) {
    if (done_packs.count(static_cast<int64_t>(k))) continue;
    const bool needed = std::any_of(run.packs[k].begin(), run.packs[k].end(),
                                    [&](const PackChunk& c) { return kept_docs.count(c.doc) == 0; });
    if (needed) run.todo.push_back(k);
  }
  // No KV cache is kept between passes; the packed pass needs one of pack_len rows.
  run.opened = open_engine(o.engine, run.files->config, run.files.get(), plan, groups,
                           {EngineSizing::Kv::kPacked, run.pack_len, 1});
  info("dp group " + std::to_string(w.dp_rank) + "/" + std::to_string(w.dp_size) + ", tp rank " +
       std::to_string(w.tp_rank) + "/" + std::to_string(w.tp_size) + ": " + std::to_string(run.docs.size()) +
       " documents in " + std::to_string(run.packs.size()) + " packs of <= " + std::to_string(run.pack_len) +
       " tokens, " + std::to_string(run.todo.size()) + " to score");
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
    ("input", "JSONL: {\"text\": ...} (tokenized with BOS as the tokenizer adds it) or "
     "{\"ids\": [...], \"labels\": [...] (optional, -100 = ignored)} per line", cxxopts::value<std::string>())
    ("output", "Per-document JSONL {index, tokens, nll_sum, mean_nll}, input order, written atomically "
     "at the end; each scored pack goes to OUTPUT.journal at once (kept after a crash, removed at the end)",
     cxxopts::value<std::string>())
    ("resume", "With --output: keep the documents already in --output and the packs in its journal, "
     "score only the rest")
    ("h,help", "Print this help and exit");
  // clang-format on
  EngineFlags engine_flags;
  engine_flags.cuda_graphs = false;
  engine_flags.min_max_seq_len = 2;
  engine_flags.max_seq_len_help = "Tokens per packed sequence; longer documents are scored in chunks "
                                  "(default: min(max_position_embeddings, 8192))";
  engine_flags.verbose_help = "Print the plan and per-rank details to stderr";
  LossOptions o;
  const auto parsed = parse_engine_command(opts, engine_flags, argc, argv, "loss", help_text, o.engine);
  if (!parsed) return std::nullopt;
  const cxxopts::ParseResult& r = *parsed;
  if (!r.count("input")) throw Error("is required", "--input");
  o.input = r["input"].as<std::string>();
  if (r.count("output")) {
    o.output = r["output"].as<std::string>();
    if (o.output.empty()) throw Error("is empty", "--output");
  }
  o.resume = r.count("resume") > 0;
  if (o.resume && o.output.empty()) throw Error("needs --output (the documents to keep are there)", "--resume");
  return o;
}

int run_loss(const LossOptions& o, Job& job) {
  std::optional<MpiGroups> made = start_engine_run(o.engine, job);
  if (!made) return kUsageExit;
  MpiGroups& groups = *made;
  const WorldConfig& w = groups.world_config;
  // From here a signal only sets a flag; the pack loop stops at its next pack.
  install_stop_handlers();

  // Rank 0 reads the input, and with --resume the documents of --output and the packs of
  // the journal; every rank learns which of them are done.
  LossInput in;
  if (!job.load_phase([&] {
        if (w.world_rank == 0) read_loss_input(o, in);
      })) {
    return job.load_failure_exit();  // 130 when a signal stopped the reading
  }
  broadcast_lines(*groups.world, in.lines);
  broadcast_strings(*groups.world, in.kept_indices);
  broadcast_strings(*groups.world, in.journal_packs);

  LossRun run;
  if (!job.load_phase([&] { load_loss_run(o, in, groups, run); })) return kLoadErrorExit;

  std::unique_ptr<JsonlOutput> output;
  std::unique_ptr<Journal> journal;  // rank 0 with --output
  nlohmann::ordered_json journal_header;  // rank 0: its first line, and the run record at the end
  int code = 0;
  try {
    const bool world_root = w.world_rank == 0;
    if (world_root && !o.output.empty()) {
      journal_header["linnet-tp journal"] = "loss";
      journal_header["documents"] = run.docs.size();
      journal_header["packs"] = run.packs.size();
      journal_header["max_seq_len"] = run.pack_len;
      journal_header["settings"] = run.settings;
      journal = std::make_unique<Journal>(in.resume.journal_file, journal_header, o.resume ? &in.resume.journal : nullptr);
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
          in.pack_records[k] = std::move(rec);
        },
        [&] {
          if (journal) journal->tick();
        });
    score_packs(*run.opened.engine, groups, relay, run.docs, run.packs, run.todo, t0);
    // Wait for the other groups and their packs, still passing on a signal.
    relay.finish();
    if (world_root) {
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!o.output.empty()) output = std::make_unique<JsonlOutput>(o.output);
      code = write_loss_results(o.input, in.lines, run.docs, run.packs, in.resume.kept, in.pack_records, fresh_tokens / std::max(seconds, 1e-9),
                                journal.get(), output.get());
      output.reset();
    }
    groups.world->broadcast(&code, sizeof code, 0);  // every rank exits with rank 0's code
    // Every scored document is in --output now (an interrupted run keeps the journal); the
    // run record keeps its settings for a later --resume over it.
    retire_journal(journal.get(), o.output, journal_header, code);
  } catch (const std::exception& e) {
    const std::string note = journal_note(journal.get());
    job.abort(e.what() + note, [&] { output.reset(); });
  }
  return code;
}

}  // namespace linnet
