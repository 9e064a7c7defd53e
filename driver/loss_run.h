// The scoring side of `linnet-tp loss`: documents cut into chunks of at most
// --max-seq-len tokens and packed in input order (pack_documents), each pack one
// loss_packed pass (make_pack_batch) whose per-document sums tp rank 0 sends world rank 0
// as a journal line (pack_record, score_packs); at the end world rank 0 adds the sums up
// per document in pack order, so a resumed run equals an uninterrupted one bit for bit
// (write_loss_results), after checking what --resume keeps (check_loss_resume).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "driver/journal.h"
#include "driver/jsonl_output.h"
#include "driver/run_relay.h"
#include "parallel/mpi_communicator.h"
#include "requests/loss_document.h"
#include "runtime/engine.h"
#include "runtime/loss.h"

namespace linnet {

/// A piece of a document scored on its own: ids[begin, end) of document `doc`.
struct PackChunk {
  int64_t doc = 0;
  int64_t begin = 0, end = 0;
};

/// Chunks of at most `n` tokens of every document, packed in input order into sequences
/// of at most `n` tokens (a chunk that is not its document's last fills a pack).
std::vector<std::vector<PackChunk>> pack_documents(const std::vector<LossDocument>& docs, int64_t n);

/// The packed batch of `chunks`: each chunk its own segment from position 0; position i
/// predicts label i + 1 of the same chunk, a chunk's last position nothing (-100).
PackedBatch make_pack_batch(const std::vector<LossDocument>& docs, const std::vector<PackChunk>& chunks);

/// The journal line of scored pack `k`: {"pack", "tokens", "docs": [[document, nll sum,
/// scored tokens], ...]}, the sums over the pack's positions in order (nan / inf as strings).
std::string pack_record(size_t k, const std::vector<PackChunk>& chunks, const PackedBatch& batch,
                        const PackedLoss& loss);

/// World rank 0, --resume: every kept --output line (`kept`, by document index) and every
/// journal pack (`records`) must belong to this input and these packs.
/// @throws Error naming --output's line or the journal's pack that does not fit.
void check_loss_resume(const std::string& output, const std::string& journal_file, const JournalContents& journal,
                       const std::map<int64_t, std::string>& kept,
                       const std::map<int64_t, nlohmann::ordered_json>& records, const std::vector<LossDocument>& docs,
                       const std::vector<std::vector<PackChunk>>& packs, int64_t pack_len);

/// This dp group's share of `todo` (round-robin over the groups), one loss_packed pass a
/// pack; tp rank 0 sends each pack's record to world rank 0 through `relay` as soon as it
/// is scored. Once a pack the tp group agrees whether any rank heard of a stop signal.
/// World rank 0 prints progress every 2 s. Collective over the tp group.
void score_packs(Engine& engine, MpiGroups& groups, RunRelay& relay, const std::vector<LossDocument>& docs,
                 const std::vector<std::vector<PackChunk>>& packs, const std::vector<size_t>& todo,
                 std::chrono::steady_clock::time_point t0);

/// World rank 0 at the end: per-document sums in pack order (kept lines as they were),
/// --output in input order, and the totals on stdout (tokens, mean NLL, perplexity,
/// `tokens_per_s`). Returns the exit code: 0, 3 when a document failed, 130 when packs
/// are missing (interrupted; finished documents kept).
/// @throws Error when stdout or --output cannot be written.
int write_loss_results(const std::string& input, const std::vector<std::pair<int, std::string>>& lines, const std::vector<LossDocument>& docs,
                       const std::vector<std::vector<PackChunk>>& packs, const std::map<int64_t, std::string>& kept,
                       const std::map<int64_t, nlohmann::ordered_json>& records, double tokens_per_s,
                       Journal* journal, JsonlOutput* output);

}  // namespace linnet
