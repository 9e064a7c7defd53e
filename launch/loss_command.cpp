#include "launch/loss_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "launch/cli_parse.h"
#include "launch/job.h"
#include "launch/jsonl_input.h"
#include "launch/jsonl_output.h"
#include "launch/model_path.h"
#include "loader/tokenizer/tokenizer.h"
#include "parallel/mpi_communicator.h"
#include "runtime/backend_factory.h"
#include "runtime/weights.h"
#include "runtime/loss.h"
#include "runtime/model_loader.h"

namespace linnet {
namespace {

struct Document {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // unshifted, as transformers takes them; -100 = ignored
};

// A piece of a document scored on its own: ids[begin, end) of document `doc`.
struct Chunk {
  int64_t doc = 0;
  int64_t begin = 0, end = 0;
};

std::vector<int32_t> int_list(const nlohmann::json& v, const char* field, const std::string& where) {
  if (!v.is_array()) throw Error(std::string("\"") + field + "\" must be a list of integers", where);
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (const auto& e : v) {
    if (!e.is_number_integer()) throw Error(std::string("\"") + field + "\" must be a list of integers", where);
    if ((e.is_number_unsigned() && e.get<uint64_t>() > INT32_MAX) ||
        (!e.is_number_unsigned() && (e.get<int64_t>() < INT32_MIN || e.get<int64_t>() > INT32_MAX))) {
      throw Error("integer out of range", where + ": " + field, "a token id or -100", e.dump());
    }
    out.push_back(e.get<int32_t>());
  }
  return out;
}

// {"text": ...} (tokenized with the special tokens the tokenizer adds, e.g. BOS) or
// {"ids": [...]} with optional "labels" of the same length.
Document parse_document(const JsonlLine& l, const std::string& where, const Tokenizer* tok, int64_t vocab_size) {
  check_known_keys(l.value, {"text", "ids", "labels"}, "a loss line", where);
  Document d;
  const auto text = l.value.find("text");
  const auto ids = l.value.find("ids");
  if ((text != l.value.end()) == (ids != l.value.end())) {
    throw Error("each line needs exactly one of \"text\" and \"ids\"", where);
  }
  if (text != l.value.end()) {
    if (!text->is_string()) throw Error("\"text\" must be a string", where);
    if (!tok) throw Error("\"text\" needs the model's tokenizer.json", where);
    try {
      d.ids = tok->encode(text->get<std::string>());
    } catch (const Error& e) {
      throw e.at(where);
    }
    if (l.value.contains("labels")) throw Error("\"labels\" go with \"ids\", not \"text\"", where);
  } else {
    d.ids = int_list(*ids, "ids", where);
  }
  for (size_t i = 0; i < d.ids.size(); ++i) {
    if (d.ids[i] < 0 || d.ids[i] >= vocab_size) {
      throw Error("token id out of range", where + ": ids[" + std::to_string(i) + "]",
                  "[0, " + std::to_string(vocab_size) + ")", std::to_string(d.ids[i]));
    }
  }
  if (const auto labels = l.value.find("labels"); labels != l.value.end()) {
    d.labels = int_list(*labels, "labels", where);
    if (d.labels.size() != d.ids.size()) {
      throw Error("\"labels\" and \"ids\" differ in length", where, std::to_string(d.ids.size()),
                  std::to_string(d.labels.size()));
    }
    for (size_t i = 0; i < d.labels.size(); ++i) {
      if (d.labels[i] != kIgnoreIndex && (d.labels[i] < 0 || d.labels[i] >= vocab_size)) {
        throw Error("label out of range", where + ": labels[" + std::to_string(i) + "]",
                    "[0, " + std::to_string(vocab_size) + ") or -100", std::to_string(d.labels[i]));
      }
    }
  } else {
    d.labels = d.ids;
  }
  return d;
}

// Chunks of at most `n` tokens, packed in input order into sequences of at most `n`.
std::vector<std::vector<Chunk>> pack(const std::vector<Document>& docs, int64_t n) {
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

PackedBatch make_batch(const std::vector<Document>& docs, const std::vector<Chunk>& chunks) {
  PackedBatch b;
  for (size_t s = 0; s < chunks.size(); ++s) {
    const Chunk& c = chunks[s];
    const Document& d = docs[static_cast<size_t>(c.doc)];
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
    ("output", "Per-document JSONL {index, tokens, nll_sum, mean_nll}, input order",
     cxxopts::value<std::string>())
    ("max-seq-len", "Tokens per packed sequence; longer documents are scored in chunks "
     "(default: min(max_position_embeddings, 8192))", cxxopts::value<int64_t>())
    ("tp", "Ranks per tensor-parallel group (default: all ranks)", cxxopts::value<int>())
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
  read_in_range(r, "threads", 1, kMaxThreads, o.threads);
  read_backend(r, o.backend);
  read_weight_dtype(r, o.weight_dtype);
  read_kv_cache_dtype(r, o.kv_cache_dtype);
  o.verbose = r.count("verbose") > 0;
  return o;
}

int run_loss(const LossOptions& o, Job& job) {
  set_verbose(o.verbose);
  std::optional<MpiGroups> made = make_run_groups(job, o.tp);
  if (!made) return kUsageExit;
  MpiGroups& groups = *made;
  const WorldConfig& w = groups.world_config;

  std::vector<std::pair<int, std::string>> lines;
  if (!job.load_phase([&] {
        if (w.world_rank != 0) return;
        lines = read_jsonl_lines(o.input);
        if (!o.output.empty()) check_output_path(o.output, o.input);
      })) {
    return kLoadErrorExit;
  }
  broadcast_lines(*groups.world, lines);

  std::unique_ptr<ModelFiles> files;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
  std::vector<Document> docs;
  std::vector<std::vector<Chunk>> packs;
  int64_t pack_len = 0;
  if (!job.load_phase([&] {
        const std::filesystem::path dir = resolve_model_dir(o.model);
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
          docs.push_back(parse_document(l, o.input + ":" + std::to_string(l.line), tok.get(), files->config.vocab_size));
        }
        packs = pack(docs, pack_len);
        backend = make_backend(o.backend, o.threads, w.local_rank, w.local_size, held, kv_dtype);
        engine = make_engine(*files, plan, *backend, tp_communicator(*backend, *groups.tp, w.local_size),
                             /*max_seq_len=*/1);
        info("dp group " + std::to_string(w.dp_rank) + "/" + std::to_string(w.dp_size) + ", tp rank " +
             std::to_string(w.tp_rank) + "/" + std::to_string(w.tp_size) + ": " + std::to_string(docs.size()) +
             " documents in " + std::to_string(packs.size()) + " packs of <= " + std::to_string(pack_len) + " tokens");
      })) {
    return kLoadErrorExit;
  }

  std::unique_ptr<JsonlOutput> output;
  int code = 0;
  try {
    // [0, D): nll sums, [D, 2D): scored token counts, per document.
    const size_t D = docs.size();
    std::vector<double> sums(2 * D, 0.0);
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    auto last_report = t0;
    double local_tokens = 0;
    size_t mine = 0, done = 0;
    for (size_t k = static_cast<size_t>(w.dp_rank); k < packs.size(); k += static_cast<size_t>(w.dp_size)) ++mine;
    for (size_t k = static_cast<size_t>(w.dp_rank); k < packs.size(); k += static_cast<size_t>(w.dp_size)) {
      const PackedBatch batch = make_batch(docs, packs[k]);
      const PackedLoss loss = loss_packed(*engine, batch);
      for (size_t i = 0; i < batch.tokens.size(); ++i) {
        const size_t d = static_cast<size_t>(packs[k][static_cast<size_t>(batch.segments[i])].doc);
        sums[d] += loss.nll[i];
        sums[D + d] += loss.scored[i];
      }
      local_tokens += static_cast<double>(batch.tokens.size());
      ++done;
      const auto now = Clock::now();
      if (w.world_rank == 0 && now - last_report > std::chrono::seconds(2)) {
        const double s = std::chrono::duration<double>(now - t0).count();
        std::fprintf(stderr, "[linnet-tp] loss: %zu/%zu packs of this group, %.0f tokens/s\n", done, mine,
                     local_tokens / s);
        last_report = now;
      }
    }
    // Every tp rank of a group holds the same sums: combine over the dp groups only.
    groups.dp->all_reduce_sum(sums.data(), sums.size());
    double all_tokens = local_tokens;
    groups.dp->all_reduce_sum(&all_tokens, 1);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

    // A document whose loss is NaN or inf (e.g. NaN weights) fails alone: its output line
    // says why instead of holding a null, it stays out of the mean, and the run exits 3.
    // Every rank holds the same sums, so every rank knows.
    std::vector<size_t> bad;
    for (size_t d = 0; d < D; ++d) {
      if (!std::isfinite(sums[d])) bad.push_back(d);
    }
    if (!bad.empty()) code = kSomeFailedExit;
    if (w.world_rank == 0) {
      double nll = 0, scored = 0;
      if (!o.output.empty()) output = std::make_unique<JsonlOutput>(o.output);
      size_t next_bad = 0;
      for (size_t d = 0; d < D; ++d) {
        const bool failed = next_bad < bad.size() && bad[next_bad] == d;
        const std::string where = o.input + ":" + std::to_string(lines[d].first);
        const std::string error = failed ? "the loss is not finite (" + std::to_string(sums[d]) +
                                               "); the logits hold NaN or inf (check the weights)"
                                         : std::string();
        if (failed) {
          ++next_bad;
          print_error(-1, where + ": " + error);
        } else {
          nll += sums[d];
          scored += sums[D + d];
        }
        if (output) {
          nlohmann::ordered_json j;
          j["index"] = d;
          j["tokens"] = static_cast<int64_t>(sums[D + d]);
          if (failed) {
            j["error"] = where + ": " + error;
          } else {
            j["nll_sum"] = sums[d];
            j["mean_nll"] = sums[D + d] > 0 ? nlohmann::ordered_json(sums[d] / sums[D + d]) : nlohmann::ordered_json();
          }
          output->add_line(j.dump());
        }
      }
      if (scored <= 0 && bad.empty()) {
        throw Error("no token was scored: every document has fewer than 2 tokens or only -100 labels",
                    "--input " + o.input);
      }
      if (scored > 0) {
        const double mean = nll / scored;
        std::printf("scored tokens: %.0f\nmean NLL per token: %.6f\nperplexity: %.4f\ntokens/s: %.1f\n", scored,
                    mean, std::exp(mean), seconds > 0 ? all_tokens / seconds : 0.0);
      }
      if (!bad.empty()) {
        std::fprintf(stderr, "[linnet-tp] %zu of %zu documents failed (not finite loss)%s\n", bad.size(), D,
                     scored > 0 ? "; the mean leaves them out" : "");
      }
      if (std::fflush(stdout) != 0) throw Error("cannot write the results", "stdout");
      if (output) output->commit();
    }
  } catch (const std::exception& e) {
    job.abort(e.what(), [&] { output.reset(); });
  }
  return code;
}

}  // namespace linnet
