#include "driver/loss_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "driver/job.h"

namespace linnet {
namespace {

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

}  // namespace

// Chunks of at most `n` tokens, packed in input order into sequences of at most `n`.
std::vector<std::vector<PackChunk>> pack_documents(const std::vector<LossDocument>& docs, int64_t n) {
  std::vector<std::vector<PackChunk>> packs;
  int64_t used = n;  // forces a new pack first
  for (size_t d = 0; d < docs.size(); ++d) {
    const int64_t len = static_cast<int64_t>(docs[d].ids.size());
    for (int64_t b = 0; b < len; b += n) {
      const PackChunk c{static_cast<int64_t>(d), b, std::min(len, b + n)};
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

PackedBatch make_pack_batch(const std::vector<LossDocument>& docs, const std::vector<PackChunk>& chunks) {
  PackedBatch b;
  for (size_t s = 0; s < chunks.size(); ++s) {
    const PackChunk& c = chunks[s];
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

// The journal line of scored pack `k` (tp rank 0): {"pack", "tokens" (its length), "docs":
// [[document, nll sum, scored tokens], ...]} with the sums over the pack's positions in
// order. A document has at most one chunk per pack (a chunk that is not its last fills
// a pack), so these are the per-pack parts of its sums.
std::string pack_record(size_t k, const std::vector<PackChunk>& chunks, const PackedBatch& batch, const PackedLoss& loss) {
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
void check_loss_resume(const std::string& output, const std::string& journal_file, const JournalContents& journal,
                  const std::map<int64_t, std::string>& kept,
                  const std::map<int64_t, nlohmann::ordered_json>& records, const std::vector<LossDocument>& docs,
                  const std::vector<std::vector<PackChunk>>& packs, int64_t pack_len) {
  const int64_t D = static_cast<int64_t>(docs.size());
  for (const auto& [index, text] : kept) {
    const std::string where = output + ": line with index " + std::to_string(index);
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
int write_loss_results(const std::string& input, const std::vector<std::pair<int, std::string>>& lines,
                       const std::vector<LossDocument>& docs, const std::vector<std::vector<PackChunk>>& packs,
                       const std::map<int64_t, std::string>& kept,
                       const std::map<int64_t, nlohmann::ordered_json>& records, double tokens_per_s,
                       Journal* journal, JsonlOutput* output) {
  const size_t D = docs.size();
  std::vector<double> nll(D, 0.0), scored(D, 0.0);
  std::vector<size_t> packs_seen(D, 0), packs_needed(D, 0);
  for (const auto& chunks : packs) {
    int64_t prev = -1;
    for (const PackChunk& c : chunks) {
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
    const std::string where = input + ":" + std::to_string(lines[d].first);
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
                "--input " + input);
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

// This dp group's share of `todo` (round-robin), one loss_packed pass a pack; tp rank 0
// sends each pack's sums to world rank 0 (RunRelay) as soon as it is scored. Once a pack
// the tp group agrees whether any of its ranks heard of a stop signal, and stops.
void score_packs(Engine& engine, MpiGroups& groups, RunRelay& relay, const std::vector<LossDocument>& docs,
                 const std::vector<std::vector<PackChunk>>& packs, const std::vector<size_t>& todo,
                 std::chrono::steady_clock::time_point t0) {
  using Clock = std::chrono::steady_clock;
  const WorldConfig& w = groups.world_config;
  const bool world_root = w.world_rank == 0;
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
    const PackedBatch batch = make_pack_batch(docs, packs[k]);
    const PackedLoss loss = loss_packed(engine, batch);
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
}

}  // namespace linnet
