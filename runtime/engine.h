// Engine: the decoder forward pass of the Llama family under Megatron-style tensor
// parallelism, and the batch-1 entries built on it (forward, next_token, prefill,
// decode). One implementation for the family; source of the math: transformers'
// modeling_llama.py (LlamaDecoderLayer, LlamaAttention, LlamaMLP).
//
// Per layer, the two all_reduce calls are visible in Engine::run: after the
// row-parallel o_proj and after the row-parallel down_proj.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "loader/model_config.h"
#include "parallel/communicator.h"
#include "parallel/shard_plan.h"
#include "runtime/backend.h"
#include "runtime/kv_cache.h"
#include "runtime/weights.h"

namespace linnet {

/// One rank's share of a model, with its KV cache. Every rank of the tp group must make
/// the same calls with the same arguments (the collectives inside pair them up).
class Engine {
 public:
  /// @param weights      this rank's slices in host f32 (load_weights); moved to the
  ///                     backend's memory and weight dtype here.
  /// @param max_seq_len  positions one sequence may reach (>= 1).
  /// @param max_batch    KV cache rows, i.e. sequences decoded together (>= 1); the
  ///                     batch-1 entries (prefill, decode) use row 0.
  /// @param page_size    positions per KV page; 0: max_seq_len (one contiguous page per row).
  /// @param num_pages    pages in the KV pool; 0: enough for max_batch full rows. Row r of
  ///                     the row-addressed entries (prefill, decode, prefill_packed,
  ///                     decode_rows) owns pages [r * P, (r + 1) * P) with P =
  ///                     ceil(max_seq_len / page_size); the paged entries take page
  ///                     tables instead (runtime/page_pool.h hands pages out).
  /// @param cuda_graphs  record decode passes as CUDA graphs and replay them (also on
  ///                     with the environment variable LINNET_CUDA_GRAPHS=1); see
  ///                     cuda_graphs(). Off: the eager path, unchanged.
  /// @throws Error on non-positive sizes.
  Engine(const ModelConfig& config, const ShardPlan& plan, ModelWeights weights, Backend& backend,
         Communicator& tp_comm, int64_t max_seq_len, int64_t max_batch = 1, int64_t page_size = 0,
         int64_t num_pages = 0, bool cuda_graphs = false);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Logits for every position of `tokens` (positions 0..S-1, a fresh sequence), f32
  /// [S, vocab_size] row-major, the vocab slices gathered from all ranks. Does not touch
  /// the engine's KV cache.
  /// @throws Error when tokens is empty, longer than max_seq_len, or holds an id outside
  ///   [0, vocab_size).
  std::vector<float> forward(std::span<const int32_t> tokens);

  /// Logits [vocab_size] of the last position of `tokens` (a fresh sequence).
  std::vector<float> next_token(std::span<const int32_t> tokens);

  /// Runs a chunk of prompt through the KV cache in one pass: tokens at positions
  /// pos..pos+S-1 (the cache must hold positions < pos). Returns the logits
  /// [vocab_size] after the last token; decoding continues at pos + S.
  /// @throws Error when pos + S > max_seq_len or an id is outside [0, vocab_size).
  std::vector<float> prefill(std::span<const int32_t> tokens, int64_t pos);

  /// One token at position `pos` through the KV cache: logits [vocab_size].
  std::vector<float> decode(int32_t token, int64_t pos);

  /// prefill_packed: prompts (or chunks of them) packed end to end into one pass, no
  /// padding. Token i goes to KV cache row rows[i] at positions[i] and attends to that
  /// row's positions <= positions[i] (so a chunk continues what an earlier pass left in
  /// the row: chunked prefill), within the sliding window. A row's tokens in one pack
  /// must be consecutive positions. Returns logits f32 [last.size(), vocab_size] of the
  /// tokens whose indices are in `last` (usually each prompt's final token).
  /// @throws Error on mismatched lengths, a row outside [0, max_batch), a position
  ///   outside [0, max_seq_len), or a bad token id.
  std::vector<float> prefill_packed(std::span<const int32_t> tokens, std::span<const int32_t> rows,
                                    std::span<const int32_t> positions, std::span<const int32_t> last);

  /// prefill_slots<M, S>: M prompts, each padded to S tokens (tokens [M * S], row-major;
  /// the first lengths[m] of row m are real), into KV cache rows slots[m] from position
  /// 0, as requests join a batch being served. The padding is never computed: the real
  /// tokens go through one prefill_packed pass. Returns logits f32 [M, vocab_size] after
  /// each prompt's last real token.
  /// @throws Error when tokens.size() != M * S, a length is outside [1, S], or as
  ///   prefill_packed.
  std::vector<float> prefill_slots(std::span<const int32_t> tokens, std::span<const int32_t> slots,
                                   std::span<const int32_t> lengths);

  /// decode_rows: one token per active row, each at its own position (continuous
  /// batching). Returns logits f32 [tokens.size(), vocab_size].
  std::vector<float> decode_rows(std::span<const int32_t> tokens, std::span<const int32_t> rows,
                                 std::span<const int32_t> positions);

  /// One pass of the paged entries: tokens of several sequences packed end to end, each
  /// sequence with its own page table. A sequence's tokens in a pass are consecutive
  /// positions; each attends to its sequence's positions <= its own (earlier ones were
  /// written by earlier passes or by another sequence sharing those pages), within the
  /// sliding window.
  struct PagedBatch {
    std::vector<int32_t> tokens;                   // [P] token ids
    std::vector<int32_t> seq;                      // [P] index into page_tables
    std::vector<int32_t> positions;                // [P] position in its sequence
    std::vector<std::vector<int32_t>> page_tables; // per sequence: its pages, in order
    std::vector<int32_t> last;                     // indices into tokens whose logits are returned
  };

  /// step_paged: one mixed pass (chunks of prompts and single decode tokens together,
  /// chunked prefill as in Sarathi / vLLM). Returns logits f32 [last.size(), vocab_size]
  /// (nothing, and no lm_head, when last is empty).
  /// @throws Error on mismatched lengths, a page outside [0, num_pages), a position past
  ///   its page table or max_seq_len, non-consecutive positions of a sequence, bad ids.
  std::vector<float> step_paged(const PagedBatch& batch);
  /// A logits row's best candidates, the same on every rank of the tp group.
  struct TopCandidates {
    std::vector<int32_t> ids;    ///< by logit descending, ties to the lower id; min(k, limit) of them
    std::vector<float> logits;   ///< their logits
    int32_t bad_id = -1;         ///< the lowest id < the limit whose logit is NaN or +-inf; -1 if none
    std::vector<double> sums;    ///< the row's RowSum results, in the order they were asked for
    std::vector<float> full;     ///< the whole row, f32 [vocab_size] (penalties applied), when
                                 ///< want_full asked for it; empty otherwise
  };
  /// A softmax normalizer step_paged_top computes over a row's whole vocabulary (ids <
  /// the limit): the ExpSum (runtime/exp_sum.h) of exp((l - best) / divisor), best the
  /// row's best logit (logits[0] of its candidates), l after the penalties. The
  /// sampler's normalizer of a nucleus drawn from the whole row (divisor = temperature:
  /// Sampler::sample_top's row_sum) or of log-probabilities (divisor 1:
  /// Sampler::logprobs_top's).
  struct RowSum {
    int32_t row = 0;       ///< index into batch.last
    double divisor = 1.0;  ///< > 0
  };
  /// step_paged for a step whose rows draw from their top-k candidates (Sampler::
  /// sample_top; greedy rows take the first): the same pass, each rank takes its shard's
  /// k best columns of each row where its logits are (Backend::top_k_rows; for k = 1
  /// without penalties the argmax of Backend::argmax_rows, which also finds the first
  /// non-finite column; on CUDA no logits row leaves the device), the ranks all_gather
  /// 2k + 1 numbers a row, and every rank merges them alike into the row's k best of ids
  /// < `vocab_limit` (> 0; else vocab_size): exactly the k best of step_paged's row, ties
  /// to the lower id. `penalties` (rows indexing batch.last) are applied first where the
  /// logits are (Backend::apply_penalties: the sampler's repetition / presence /
  /// frequency penalties in its f32 operations); the non-finite check reads the raw
  /// logits, as the sampler's. Then, when asked: `sums` (a second all_gather of 16
  /// bytes a request and rank: each shard's Backend::exp_sums, added exactly), and the
  /// whole (penalized) row, on every rank, of each row for which `want_full(row,
  /// candidates)` says so on any rank (the ranks take the union, an all_reduce of n
  /// flags, then a third gather, of those rows only; rows with a non-finite logit are
  /// never asked). 1 <= k <= 1024. A step recorded as a CUDA graph runs the same ops on
  /// the gathered rows on the host.
  /// @throws Error as step_paged, or k out of range, or a RowSum's row or divisor.
  std::vector<TopCandidates> step_paged_top(
      const PagedBatch& batch, int64_t vocab_limit, int64_t k, std::span<const Backend::Penalty> penalties = {},
      std::span<const RowSum> sums = {},
      const std::function<bool(int64_t row, const TopCandidates&)>& want_full = {});
  /// prefill_paged: step_paged over prompt chunks, logits of each sequence's last token
  /// in this pass, f32 [page_tables.size(), vocab_size].
  std::vector<float> prefill_paged(PagedBatch batch);
  /// decode_paged: one token per sequence (tokens[i] at positions[i] of sequence i),
  /// logits f32 [tokens.size(), vocab_size].
  std::vector<float> decode_paged(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                  const std::vector<std::vector<int32_t>>& page_tables);

  /// KV cache rows of the row-addressed entries (sequences decoded together).
  int64_t max_batch() const { return max_batch_; }
  /// Positions per KV page and pages in the pool.
  int64_t page_size() const { return cache_.page_size; }
  int64_t num_pages() const { return cache_.num_pages; }

  /// The packed forward pass behind loss_packed / log_probs_packed: several documents
  /// end to end in one pass, token i at positions[i] (0 at each document's start,
  /// counting up by one), attending only inside its document (segments[i], contiguous
  /// and non-decreasing) and its sliding window. Returns the final-normed hidden states
  /// (after the model's last RMSNorm, the lm_head's input) of the tokens listed in
  /// `rows` (indices into tokens, in that order), f32 [rows.size(), hidden_size] in
  /// backend memory: the logits are made a block of rows at a time by lm_head_local, so
  /// a long pack never holds a [P, vocab] tensor. Empty `rows`: no pass at all (an
  /// empty tensor; the ranks of a group must agree, as on every entry). Does not touch
  /// the KV cache.
  /// @throws Error on mismatched lengths, bad positions/segments, token ids or rows.
  Tensor packed_hidden(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                       std::span<const int32_t> segments, std::span<const int32_t> rows);
  /// This rank's vocab-parallel logits slice of rows [r0, r0 + n) of `hidden` (from
  /// packed_hidden): f32 [n, vocab_local] written to host memory `out` (columns past
  /// vocab_size are padding). The CPU backend multiplies straight into `out`.
  void lm_head_local(const Tensor& hidden, int64_t r0, int64_t n, float* out);
  /// The same slice left in backend memory: f32 [n, vocab_local] (for the device-side
  /// cross-entropy of loss.cpp: Backend::cross_entropy_rows; no logits row reaches the
  /// host). n >= 1.
  Tensor lm_head_block(const Tensor& hidden, int64_t r0, int64_t n);

  const ModelConfig& config() const { return config_; }
  const ShardPlan& plan() const { return plan_; }
  Communicator& tp_comm() { return comm_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  Backend& backend() { return backend_; }
  /// Bytes of this rank's KV cache.
  int64_t kv_cache_bytes() const { return cache_.bytes(); }

  /// CUDA graphs of decode passes: true when asked for (constructor, LINNET_CUDA_GRAPHS=1)
  /// and possible (a backend that records graphs, a communicator whose collectives can
  /// be recorded: NCCL; never the CPU backend or host-staged MPI). Then every pass whose
  /// logits are wanted for each of its P tokens (decode, decode_rows, decode_paged, a
  /// step_paged of decode tokens only) with P <= the largest bucket runs as a replay of
  /// the graph of its bucket, the smallest power of two >= P (up to max_batch rounded
  /// up): P real rows plus padding rows (token 0 at position 0, keys [0, 1), their K/V
  /// in one cache row reserved for them past the pages, so never in a real page). Each
  /// bucket's graph is recorded after one eager run of the same pass on the same stable
  /// buffers (GEMM plans, NCCL set-up and the count checks happen there); its page tables
  /// are ceil(max_seq_len / page_size) wide.
  bool cuda_graphs() const { return graphs_on_; }
  /// Graphs recorded so far, and passes run by replaying one.
  int64_t cuda_graphs_recorded() const;
  int64_t cuda_graph_replays() const { return graph_replays_; }

 private:
  // Where each row of a pass goes: RoPE position, KV cache row (slot), its sequence's
  // page table ([rows, max_pages] flattened) and the logical key positions
  // [key_begin, key_end) its query attends to.
  struct Rows {
    std::vector<int32_t> positions, slots, key_begin, key_end, page_table;
    int64_t max_pages = 1;
  };
  // A fresh sequence at positions pos..pos+S-1 in a cache whose pages are `table`.
  Rows sequence_rows(int64_t S, int64_t pos, std::span<const int32_t> table, int64_t page_size) const;
  // Row r's fixed pages in the pool.
  std::vector<int32_t> row_pages(int64_t row, const char* entry) const;
  Rows paged_rows(const PagedBatch& b, const char* entry) const;
  // A pass's i32 inputs in backend memory (what Rows holds, uploaded).
  struct PassInputs {
    const int32_t *ids, *positions, *slots, *page_table, *key_begin, *key_end;
    int64_t rows, max_pages;
  };
  // What a pass returns: nothing (it only fills the cache), the final-normed hidden
  // states [n, hidden_size], or this rank's logits slice [n, vocab_local].
  enum class PassOutput { kNone, kHidden, kLogits };
  // The decoder over `tokens` placed per `rows` in `cache`, returning `what` of the
  // tokens listed in `out` (all tokens when empty).
  Tensor run(std::span<const int32_t> tokens, const Rows& rows, KvCache& cache, std::span<const int32_t> out,
             PassOutput what = PassOutput::kLogits);
  // run() on inputs already in backend memory.
  Tensor run_pass(const PassInputs& in, KvCache& cache, std::span<const int32_t> out, PassOutput what);
  // A pass through the engine's KV cache: the gathered logits f32 [last.size(),
  // vocab_size] of the tokens listed in `last`, replayed as a CUDA graph when the pass
  // is a pure decode step and graphs are on, else run eagerly.
  std::vector<float> cache_logits(std::span<const int32_t> tokens, const Rows& r, std::span<const int32_t> last);
  // all_gather of local logits [rows, vocab_local] into [rows, vocab_size].
  std::vector<float> gather_logits(const Tensor& local, int64_t rows);
  void row_sums(const Tensor& logits, int64_t ld, int64_t valid, int64_t parts, std::span<const RowSum> sums,
                std::vector<TopCandidates>& out);
  // The host copy of all_gather's output [tp, rows, vocab_local] -> [keep, vocab_size]
  // (the first `keep` rows).
  std::vector<float> unpack_logits(const std::vector<float>& recv, int64_t rows, int64_t keep) const;
  struct DecodeGraph;  // one bucket's graph and stable buffers (engine.cpp)
  // The bucket whose graph runs a pass of `tokens` tokens that wants the logits of
  // `last`: nullptr (run it eagerly) unless cuda_graphs(), last is every token in order,
  // and a bucket holds them.
  DecodeGraph* graph_for(int64_t tokens, std::span<const int32_t> last);
  // The pass (over the engine's cache) as a replay of `g`: logits [tokens, vocab_size].
  std::vector<float> replay_decode(std::span<const int32_t> tokens, const Rows& rows, DecodeGraph& g);
  // A bucket's pass on its stable buffers: recorded by a graph, or run eagerly first.
  void decode_graph_pass(DecodeGraph& g);
  void check_tokens(std::span<const int32_t> tokens, int64_t pos, int64_t capacity) const;

  ModelConfig config_;
  ShardPlan plan_;
  ModelWeights weights_;  // in backend memory
  Backend& backend_;
  Communicator& comm_;
  int64_t max_seq_len_;
  int64_t max_batch_;
  KvCache cache_;
  Tensor inv_freq_;  // [head_dim / 2] f32, backend memory
  // CUDA graphs (cuda_graphs()); declared last so they go before the buffers they use.
  bool graphs_on_ = false;
  int64_t graph_max_pages_ = 0;  // page-table width of every graph
  int64_t graph_replays_ = 0;
  std::vector<std::unique_ptr<DecodeGraph>> graphs_;  // [log2 bucket]
};

}  // namespace linnet
