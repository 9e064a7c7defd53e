#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>

#include "common/error.h"
#include "kernels/cpu/ops.h"
#include "runtime/decode_graph.h"

namespace linnet {

namespace {

// Host weights -> the backend's memory, weight dtype and layout (the CPU backend packs
// each matrix into panels, kernels/cpu/gemm.h). Matrices random_weights made on the
// backend (on_backend) are kept as they are: packing them again would scramble them.
// Each host tensor is released as soon as its copy exists, unless shared (a tied head).
ModelWeights to_backend(ModelWeights w, Backend& b) {
  const bool tied = w.lm_head.raw() == w.embed_tokens.raw();
  auto matrix = [&](Tensor& t, bool vocab = false) {
    Tensor out = w.on_backend ? t : vocab ? b.upload_vocab_matrix(t) : b.upload_matrix(t);
    t = Tensor();
    return out;
  };
  ModelWeights out;
  out.on_backend = true;
  out.embed_tokens = matrix(w.embed_tokens, true);
  out.lm_head = tied ? out.embed_tokens : matrix(w.lm_head, true);
  w.lm_head = Tensor();
  out.final_norm = b.upload_vector(w.final_norm);
  for (LayerWeights& L : w.layers) {
    LayerWeights d;
    d.input_norm = b.upload_vector(L.input_norm);
    d.wqkv = matrix(L.wqkv);
    if (!L.q_norm.empty()) d.q_norm = b.upload_vector(L.q_norm);
    if (!L.k_norm.empty()) d.k_norm = b.upload_vector(L.k_norm);
    d.wo = matrix(L.wo);
    d.post_attn_norm = b.upload_vector(L.post_attn_norm);
    d.w_gate_up = matrix(L.w_gate_up);
    d.w_down = matrix(L.w_down);
    L = LayerWeights();
    out.layers.push_back(std::move(d));
  }
  return out;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Engine::Engine(const ModelConfig& config, const ShardPlan& plan, ModelWeights weights, Backend& backend,
               Communicator& tp_comm, int64_t max_seq_len, int64_t max_batch, int64_t page_size,
               int64_t num_pages, bool cuda_graphs)
    : config_(config),
      plan_(plan),
      backend_(backend),
      comm_(tp_comm),
      max_seq_len_(max_seq_len),
      max_batch_(max_batch) {
  LINNET_CHECK(max_seq_len >= 1 && max_batch >= 1 && page_size >= 0 && num_pages >= 0,
               "max_seq_len and max_batch must be positive");
  if (page_size == 0) page_size = max_seq_len;
  if (num_pages == 0) num_pages = max_batch * ceil_div(max_seq_len, page_size);
  const char* env = std::getenv("LINNET_CUDA_GRAPHS");
  const bool graphs_wanted = cuda_graphs || (env != nullptr && std::string(env) == "1");
  graphs_on_ = graphs_wanted && backend.supports_graphs() && tp_comm.capturable();
  if (graphs_wanted && tp_comm.size() > 1) {  // every rank pads alike, or none does
    float off = graphs_on_ ? 0.0f : 1.0f;
    tp_comm.all_reduce_max(&off, 1);
    graphs_on_ = off == 0.0f;
  }
  weights_ = to_backend(std::move(weights), backend);
  // With graphs, one row past the pages: the padding rows' (Engine::cuda_graphs).
  cache_ = KvCache::make(backend, config.num_hidden_layers, page_size, num_pages, plan.num_kv_heads_local,
                         config.head_dim, graphs_on_ ? 1 : 0);
  if (graphs_on_) {
    graph_max_pages_ = ceil_div(max_seq_len, page_size);
    size_t buckets = 1;
    while ((int64_t{1} << (buckets - 1)) < max_batch) ++buckets;
    graphs_.resize(buckets);
  }
  Tensor inv_freq = Tensor::zeros({config.head_dim / 2});
  cpu::rope_inv_freq(config.rope_theta, config.head_dim, inv_freq.data());
  if (const auto& rs = config.rope_scaling) {
    cpu::rope_scale_llama3(inv_freq.data(), config.head_dim / 2, rs->factor, rs->low_freq_factor,
                           rs->high_freq_factor, static_cast<double>(rs->original_max_position_embeddings));
  }
  inv_freq_ = backend.upload_vector(inv_freq);
}

Engine::~Engine() = default;

void Engine::check_tokens(std::span<const int32_t> tokens, int64_t pos, int64_t capacity) const {
  if (tokens.empty()) throw Error("no tokens to run", "prompt");
  if (pos < 0 || pos + static_cast<int64_t>(tokens.size()) > capacity) {
    throw Error("sequence does not fit in the KV cache", "--max-seq-len",
                "positions < " + std::to_string(capacity),
                std::to_string(tokens.size()) + " tokens at position " + std::to_string(pos));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      throw Error("token id out of range", "token " + std::to_string(i),
                  "[0, " + std::to_string(config_.vocab_size) + ")", std::to_string(tokens[i]));
    }
  }
}

// First cache index a query at index `i` (position counted from `start`) attends to:
// its document's start, or the last `window` keys (itself included) when that is later.
static int32_t first_key(int64_t start, int64_t i, int64_t window) {
  return static_cast<int32_t>(window > 0 ? std::max<int64_t>(start, i + 1 - window) : start);
}

// Rows of a sequence at positions pos..pos+S-1 whose pages are `table`: each attends
// causally to the cache, or to its last sliding_window positions.
Engine::Rows Engine::sequence_rows(int64_t S, int64_t pos, std::span<const int32_t> table,
                                   int64_t page_size) const {
  Rows r;
  const int64_t window = config_.sliding_window.value_or(0);
  r.max_pages = static_cast<int64_t>(table.size());
  r.positions.resize(static_cast<size_t>(S));
  r.slots.resize(static_cast<size_t>(S));
  r.key_begin.resize(static_cast<size_t>(S));
  r.key_end.resize(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = pos + i;
    r.positions[i] = static_cast<int32_t>(p);
    r.slots[i] = static_cast<int32_t>(table[p / page_size] * page_size + p % page_size);
    r.key_end[i] = static_cast<int32_t>(p + 1);
    r.key_begin[i] = first_key(0, p, window);
    r.page_table.insert(r.page_table.end(), table.begin(), table.end());
  }
  return r;
}

std::vector<int32_t> Engine::row_pages(int64_t row, const char* entry) const {
  const int64_t per_row = ceil_div(max_seq_len_, cache_.page_size);
  if (row < 0 || row >= max_batch_) {
    throw Error("KV cache row out of range", entry, "[0, " + std::to_string(max_batch_) + ")", std::to_string(row));
  }
  if ((row + 1) * per_row > cache_.num_pages) {
    throw Error("KV cache row " + std::to_string(row) + " does not fit in the page pool", entry,
                std::to_string((row + 1) * per_row) + " pages", std::to_string(cache_.num_pages) + " pages");
  }
  std::vector<int32_t> t(static_cast<size_t>(per_row));
  std::iota(t.begin(), t.end(), static_cast<int32_t>(row * per_row));
  return t;
}

Tensor Engine::run(std::span<const int32_t> tokens, const Rows& rows_in, KvCache& cache,
                   std::span<const int32_t> out, PassOutput what) {
  // The pass's small inputs, in backend memory once.
  const Tensor ids = backend_.upload_i32(tokens);
  const Tensor positions_t = backend_.upload_i32(rows_in.positions);
  const Tensor slots_t = backend_.upload_i32(rows_in.slots);
  const Tensor table_t = backend_.upload_i32(rows_in.page_table);
  const Tensor key_begin_t = backend_.upload_i32(rows_in.key_begin);
  const Tensor key_end_t = backend_.upload_i32(rows_in.key_end);
  const PassInputs in{.ids = ids.i32(),
                      .positions = positions_t.i32(),
                      .slots = slots_t.i32(),
                      .page_table = table_t.i32(),
                      .key_begin = key_begin_t.i32(),
                      .key_end = key_end_t.i32(),
                      .rows = static_cast<int64_t>(tokens.size()),
                      .max_pages = rows_in.max_pages};
  return run_pass(in, cache, out, what);
}

Tensor Engine::run_pass(const PassInputs& in, KvCache& cache, std::span<const int32_t> out, PassOutput what) {
  const int64_t S = in.rows;
  const int64_t H = config_.hidden_size;
  const int64_t hd = config_.head_dim;
  const int64_t nh = plan_.num_heads_local;
  const int64_t nkv = plan_.num_kv_heads_local;
  const int64_t qkv_cols = (nh + 2 * nkv) * hd;
  const int64_t inter = plan_.intermediate_local;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const int32_t* positions = in.positions;
  const int32_t* slots = in.slots;

  // Every buffer is written in full before it is read (Backend::empty: no memset on CUDA;
  // NaN-filled on the CPU, so a read before a write would show in every test).
  Tensor h = backend_.empty({S, H});         // residual stream
  Tensor xn = backend_.empty({S, H});        // normed input of a block
  Tensor qkv = backend_.empty({S, qkv_cols});
  Tensor attn = backend_.empty({S, nh * hd});
  Tensor partial = backend_.empty({S, H});   // row-parallel output before all_reduce
  Tensor gate_up = backend_.empty({S, 2 * inter});
  Tensor act = backend_.empty({S, inter});

  // Vocab-parallel embedding: rows this rank does not own are zero, the sum fills them.
  backend_.embedding_lookup(weights_.embed_tokens, plan_.vocab_begin, plan_.vocab_local, H, in.ids, S,
                            h.data());
  comm_.all_reduce_sum(h.data(), static_cast<size_t>(S * H));

  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const LayerWeights& L = weights_.layers[l];
    // Attention block: column-parallel q/k/v (this rank's heads), row-parallel o_proj.
    backend_.rmsnorm(h.data(), L.input_norm.data(), xn.data(), S, H, eps);
    backend_.matmul_nt(xn.data(), L.wqkv, qkv.data(), S, H, qkv_cols);
    if (config_.qk_norm) {  // Qwen3: per-head RMSNorm of q and k, before RoPE
      backend_.rmsnorm_heads(qkv.data(), S, qkv_cols, nh, hd, L.q_norm.data(), eps);
      backend_.rmsnorm_heads(qkv.data() + nh * hd, S, qkv_cols, nkv, hd, L.k_norm.data(), eps);
    }
    backend_.rope(qkv.data(), S, qkv_cols, nh, hd, positions, inv_freq_.data());
    backend_.rope(qkv.data() + nh * hd, S, qkv_cols, nkv, hd, positions, inv_freq_.data());
    backend_.store_rows(qkv.data() + nh * hd, qkv_cols, cache.k[l], nkv * hd, slots, S);
    backend_.store_rows(qkv.data() + (nh + nkv) * hd, qkv_cols, cache.v[l], nkv * hd, slots, S);
    backend_.attention(qkv.data(), qkv_cols, cache.k[l], cache.v[l], attn.data(), S, nh, nkv, hd,
                       in.page_table, in.max_pages, cache.page_size, in.key_begin, in.key_end);
    backend_.matmul_nt(attn.data(), L.wo, partial.data(), S, nh * hd, H);
    comm_.all_reduce_sum(partial.data(), static_cast<size_t>(S * H));  // row-parallel o_proj
    backend_.add_inplace(h.data(), partial.data(), S * H);

    // MLP block: column-parallel gate/up, row-parallel down_proj.
    backend_.rmsnorm(h.data(), L.post_attn_norm.data(), xn.data(), S, H, eps);
    backend_.matmul_nt(xn.data(), L.w_gate_up, gate_up.data(), S, H, 2 * inter);
    backend_.swiglu(gate_up.data(), act.data(), S, inter);
    backend_.matmul_nt(act.data(), L.w_down, partial.data(), S, inter, H);
    comm_.all_reduce_sum(partial.data(), static_cast<size_t>(S * H));  // row-parallel down_proj
    backend_.add_inplace(h.data(), partial.data(), S * H);
  }

  if (what == PassOutput::kNone) return Tensor();
  // Final norm and the vocab-parallel lm_head, on the requested rows only.
  const int64_t rows = out.empty() ? S : static_cast<int64_t>(out.size());
  Tensor selected;
  const float* last = h.data();
  if (!out.empty()) {
    selected = backend_.empty({rows, H});
    const Tensor index = backend_.upload_i32(out);
    backend_.gather_rows(h.data(), H, index.i32(), rows, selected.data());
    last = selected.data();
  }
  Tensor normed = backend_.empty({rows, H});
  backend_.rmsnorm(last, weights_.final_norm.data(), normed.data(), rows, H, eps);
  if (what == PassOutput::kHidden) return normed;
  Tensor logits = backend_.empty({rows, plan_.vocab_local});
  backend_.matmul_nt(normed.data(), weights_.lm_head, logits.data(), rows, H, plan_.vocab_local);
  return logits;
}

std::vector<float> Engine::gather_logits(const Tensor& local, int64_t rows) {
  const int64_t vl = plan_.vocab_local;
  const int tp = comm_.size();
  Tensor gathered = backend_.empty({tp * rows * vl});
  comm_.all_gather(local.data(), static_cast<size_t>(rows * vl), gathered.data());
  std::vector<float> recv(static_cast<size_t>(tp * rows * vl));
  backend_.to_host(gathered, recv.data());
  return unpack_logits(recv, rows, rows);
}

std::vector<float> Engine::unpack_logits(const std::vector<float>& recv, int64_t rows, int64_t keep) const {
  const int64_t vl = plan_.vocab_local;
  const int64_t V = config_.vocab_size;
  const int tp = comm_.size();
  // Rank r's slice is vocab rows [r * vl, (r + 1) * vl); rows past vocab_size are
  // padding and are dropped here, so they can never be sampled.
  std::vector<float> out(static_cast<size_t>(keep * V));
  for (int r = 0; r < tp; ++r) {
    const int64_t begin = r * vl;
    const int64_t n = std::min(vl, V - begin);
    if (n <= 0) continue;
    for (int64_t i = 0; i < keep; ++i) {
      const float* src = recv.data() + (r * rows + i) * vl;
      std::copy(src, src + n, out.begin() + i * V + begin);
    }
  }
  return out;
}

std::vector<float> Engine::cache_logits(std::span<const int32_t> tokens, const Rows& r,
                                        std::span<const int32_t> last) {
  if (DecodeGraph* g = graph_for(static_cast<int64_t>(tokens.size()), last)) return replay_decode(tokens, r, *g);
  return gather_logits(run(tokens, r, cache_, last), static_cast<int64_t>(last.size()));
}

std::vector<float> Engine::forward(std::span<const int32_t> tokens) {
  const int64_t S = static_cast<int64_t>(tokens.size());
  check_tokens(tokens, 0, max_seq_len_);
  KvCache scratch = KvCache::make(backend_, config_.num_hidden_layers, S, 1, plan_.num_kv_heads_local,
                                  config_.head_dim);
  const int32_t page[1] = {0};
  Tensor local = run(tokens, sequence_rows(S, 0, page, S), scratch, {});
  return gather_logits(local, S);
}

std::vector<float> Engine::next_token(std::span<const int32_t> tokens) {
  const int64_t S = static_cast<int64_t>(tokens.size());
  check_tokens(tokens, 0, max_seq_len_);
  KvCache scratch = KvCache::make(backend_, config_.num_hidden_layers, S, 1, plan_.num_kv_heads_local,
                                  config_.head_dim);
  const int32_t page[1] = {0};
  const int32_t last[1] = {static_cast<int32_t>(S - 1)};
  return gather_logits(run(tokens, sequence_rows(S, 0, page, S), scratch, last), 1);
}

std::vector<float> Engine::prefill(std::span<const int32_t> tokens, int64_t pos) {
  check_tokens(tokens, pos, max_seq_len_);
  const int32_t last[1] = {static_cast<int32_t>(tokens.size() - 1)};
  const std::vector<int32_t> table = row_pages(0, "prefill");
  const Rows r = sequence_rows(static_cast<int64_t>(tokens.size()), pos, table, cache_.page_size);
  return cache_logits(tokens, r, last);
}

std::vector<float> Engine::decode(int32_t token, int64_t pos) {
  const int32_t t[1] = {token};
  return prefill(std::span<const int32_t>(t, 1), pos);
}

Tensor Engine::packed_hidden(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                             std::span<const int32_t> segments, std::span<const int32_t> rows) {
  const int64_t P = static_cast<int64_t>(tokens.size());
  if (positions.size() != tokens.size() || segments.size() != tokens.size()) {
    throw Error("tokens, positions and segments differ in length", "packed batch",
                std::to_string(P) + " each",
                std::to_string(positions.size()) + " positions, " + std::to_string(segments.size()) + " segments");
  }
  check_tokens(tokens, 0, P);
  const int64_t window = config_.sliding_window.value_or(0);
  // One scratch page of P rows; token i is row i, and its keys are the rows of its
  // document (as logical positions of that single page).
  Rows r;
  r.positions.assign(positions.begin(), positions.end());
  r.slots.resize(static_cast<size_t>(P));
  std::iota(r.slots.begin(), r.slots.end(), 0);
  r.page_table.assign(static_cast<size_t>(P), 0);
  r.key_begin.resize(static_cast<size_t>(P));
  r.key_end.resize(static_cast<size_t>(P));
  int64_t seg_start = 0;
  for (int64_t i = 0; i < P; ++i) {
    const bool new_segment = i == 0 || segments[i] != segments[i - 1];
    if (new_segment) {
      if (i > 0 && segments[i] < segments[i - 1]) {
        throw Error("segments must not decrease", "packed batch", "non-decreasing segment ids",
                    "segment " + std::to_string(segments[i]) + " after " + std::to_string(segments[i - 1]));
      }
      if (positions[i] != 0) {
        throw Error("a document must start at position 0", "packed batch", "0", std::to_string(positions[i]));
      }
      seg_start = i;
    } else if (positions[i] != positions[i - 1] + 1) {
      throw Error("positions inside a document must count up by one", "packed batch",
                  std::to_string(positions[i - 1] + 1), std::to_string(positions[i]));
    }
    if (positions[i] >= config_.max_position_embeddings) {
      throw Error("position past the model's context", "packed batch",
                  "< max_position_embeddings = " + std::to_string(config_.max_position_embeddings),
                  std::to_string(positions[i]));
    }
    // Only keys of the same document, and inside the sliding window.
    r.key_end[i] = static_cast<int32_t>(i + 1);
    r.key_begin[i] = first_key(seg_start, i, window);
  }
  for (const int32_t i : rows) {
    if (i < 0 || i >= P) throw Error("row out of range", "packed_hidden", "[0, " + std::to_string(P) + ")", std::to_string(i));
  }
  if (rows.empty()) return Tensor();
  KvCache scratch = KvCache::make(backend_, config_.num_hidden_layers, P, 1, plan_.num_kv_heads_local,
                                  config_.head_dim);
  return run(tokens, r, scratch, rows, PassOutput::kHidden);
}

void Engine::lm_head_local(const Tensor& hidden, int64_t r0, int64_t n, float* out) {
  const int64_t H = config_.hidden_size, vl = plan_.vocab_local;
  LINNET_CHECK(r0 >= 0 && n >= 0 && (n == 0 || hidden.numel() >= (r0 + n) * H), "lm_head_local rows out of range");
  if (n == 0) return;
  const float* x = hidden.data() + r0 * H;
  if (backend_.device() == Device::kCpu) {
    backend_.matmul_nt(x, weights_.lm_head, out, n, H, vl);
    return;
  }
  backend_.to_host(lm_head_block(hidden, r0, n), out);
}

Tensor Engine::lm_head_block(const Tensor& hidden, int64_t r0, int64_t n) {
  const int64_t H = config_.hidden_size, vl = plan_.vocab_local;
  LINNET_CHECK(r0 >= 0 && n >= 1 && hidden.numel() >= (r0 + n) * H, "lm_head_block rows out of range");
  Tensor logits = backend_.empty({n, vl});
  backend_.matmul_nt(hidden.data() + r0 * H, weights_.lm_head, logits.data(), n, H, vl);
  return logits;
}

std::vector<float> Engine::prefill_packed(std::span<const int32_t> tokens, std::span<const int32_t> rows,
                                          std::span<const int32_t> positions, std::span<const int32_t> last) {
  const int64_t P = static_cast<int64_t>(tokens.size());
  if (rows.size() != tokens.size() || positions.size() != tokens.size()) {
    throw Error("tokens, rows and positions differ in length", "prefill_packed", std::to_string(P) + " each",
                std::to_string(rows.size()) + " rows, " + std::to_string(positions.size()) + " positions");
  }
  // Each row is a sequence whose page table is the row's fixed pages.
  PagedBatch b;
  b.tokens.assign(tokens.begin(), tokens.end());
  b.positions.assign(positions.begin(), positions.end());
  b.last.assign(last.begin(), last.end());
  std::vector<int32_t> seq_of_row(static_cast<size_t>(max_batch_), -1);
  for (int64_t i = 0; i < P; ++i) {
    const int64_t row = rows[i];
    if (row < 0 || row >= max_batch_) {
      throw Error("KV cache row out of range", "prefill_packed", "[0, " + std::to_string(max_batch_) + ")",
                  std::to_string(row));
    }
    if (seq_of_row[row] < 0) {
      seq_of_row[row] = static_cast<int32_t>(b.page_tables.size());
      b.page_tables.push_back(row_pages(row, "prefill_packed"));
    }
    b.seq.push_back(seq_of_row[row]);
  }
  return step_paged(b);
}

std::vector<float> Engine::prefill_slots(std::span<const int32_t> tokens, std::span<const int32_t> slots,
                                         std::span<const int32_t> lengths) {
  const int64_t M = static_cast<int64_t>(slots.size());
  if (M == 0 || lengths.size() != slots.size() || tokens.size() % slots.size() != 0) {
    throw Error("tokens must be M prompts of S tokens, with one slot and one length per prompt", "prefill_slots",
                "M * S tokens, M slots, M lengths",
                std::to_string(tokens.size()) + " tokens, " + std::to_string(M) + " slots, " +
                    std::to_string(lengths.size()) + " lengths");
  }
  const int64_t S = static_cast<int64_t>(tokens.size()) / M;
  std::vector<int32_t> packed, rows, positions, last;
  for (int64_t m = 0; m < M; ++m) {
    if (lengths[m] < 1 || lengths[m] > S) {
      throw Error("prompt length out of range", "prefill_slots: prompt " + std::to_string(m),
                  "[1, " + std::to_string(S) + "]", std::to_string(lengths[m]));
    }
    for (int32_t i = 0; i < lengths[m]; ++i) {
      packed.push_back(tokens[m * S + i]);
      rows.push_back(slots[m]);
      positions.push_back(i);
    }
    last.push_back(static_cast<int32_t>(packed.size() - 1));
  }
  return prefill_packed(packed, rows, positions, last);
}

std::vector<float> Engine::decode_rows(std::span<const int32_t> tokens, std::span<const int32_t> rows,
                                       std::span<const int32_t> positions) {
  std::vector<int32_t> all(tokens.size());
  std::iota(all.begin(), all.end(), 0);
  return prefill_packed(tokens, rows, positions, all);
}

Engine::Rows Engine::paged_rows(const PagedBatch& b, const char* entry) const {
  const int64_t P = static_cast<int64_t>(b.tokens.size());
  if (b.seq.size() != b.tokens.size() || b.positions.size() != b.tokens.size()) {
    throw Error("tokens, sequence indices and positions differ in length", entry, std::to_string(P) + " each",
                std::to_string(b.seq.size()) + " sequence indices, " + std::to_string(b.positions.size()) +
                    " positions");
  }
  if (P == 0) throw Error("no tokens to run", entry);
  for (int32_t i : b.last) {
    if (i < 0 || i >= P) {
      throw Error("index of a wanted token out of range", entry, "[0, " + std::to_string(P) + ")", std::to_string(i));
    }
  }
  check_tokens(b.tokens, 0, P);
  int64_t max_pages = 1;
  for (size_t s = 0; s < b.page_tables.size(); ++s) {
    max_pages = std::max<int64_t>(max_pages, static_cast<int64_t>(b.page_tables[s].size()));
    for (int32_t page : b.page_tables[s]) {
      if (page < 0 || page >= cache_.num_pages) {
        throw Error("KV page out of range", std::string(entry) + ": page table of sequence " + std::to_string(s),
                    "[0, " + std::to_string(cache_.num_pages) + ")", std::to_string(page));
      }
    }
  }
  const int64_t window = config_.sliding_window.value_or(0);
  const int64_t ps = cache_.page_size;
  Rows r;
  r.max_pages = max_pages;
  r.positions = b.positions;
  r.slots.resize(static_cast<size_t>(P));
  r.key_begin.resize(static_cast<size_t>(P));
  r.key_end.resize(static_cast<size_t>(P));
  r.page_table.assign(static_cast<size_t>(P * max_pages), 0);
  std::vector<int32_t> last_pos(b.page_tables.size(), -1);  // last position of each sequence in this pass
  for (int64_t i = 0; i < P; ++i) {
    const int64_t s = b.seq[i], p = b.positions[i];
    if (s < 0 || s >= static_cast<int64_t>(b.page_tables.size())) {
      throw Error("sequence index out of range", entry, "[0, " + std::to_string(b.page_tables.size()) + ")",
                  std::to_string(s));
    }
    const auto& table = b.page_tables[s];
    const int64_t capacity = std::min<int64_t>(max_seq_len_, static_cast<int64_t>(table.size()) * ps);
    if (p < 0 || p >= capacity) {
      throw Error("position does not fit in the sequence's KV pages", entry,
                  "< " + std::to_string(capacity) + " (its pages, and --max-seq-len = " +
                      std::to_string(max_seq_len_) + ")",
                  std::to_string(p));
    }
    if (last_pos[s] >= 0 && p != last_pos[s] + 1) {
      throw Error("a sequence's tokens in one pass must be consecutive positions", entry,
                  std::to_string(last_pos[s] + 1), std::to_string(p));
    }
    last_pos[s] = static_cast<int32_t>(p);
    r.slots[i] = static_cast<int32_t>(table[p / ps] * ps + p % ps);
    r.key_end[i] = static_cast<int32_t>(p + 1);
    r.key_begin[i] = first_key(0, p, window);
    std::copy(table.begin(), table.end(), r.page_table.begin() + i * max_pages);
  }
  return r;
}

std::vector<float> Engine::step_paged(const PagedBatch& batch) {
  const Rows r = paged_rows(batch, "step_paged");
  if (batch.last.empty()) {  // prompt chunks only: fill the cache, no logits wanted
    run(batch.tokens, r, cache_, {}, PassOutput::kNone);
    return {};
  }
  return cache_logits(batch.tokens, r, batch.last);
}

std::vector<Engine::TopCandidates> Engine::step_paged_top(
    const PagedBatch& batch, int64_t vocab_limit, int64_t k, std::span<const Backend::Penalty> penalties,
    std::span<const RowSum> sums, const std::function<bool(int64_t row, const TopCandidates&)>& want_full) {
  if (k < 1 || k > 1024) throw Error("invalid value", "step_paged_top k", "in [1, 1024]", std::to_string(k));
  const Rows r = paged_rows(batch, "step_paged_top");
  const int64_t n = static_cast<int64_t>(batch.last.size());
  for (const RowSum& q : sums) {
    if (q.row < 0 || q.row >= n || !(q.divisor > 0.0) || std::isinf(q.divisor)) {
      throw Error("invalid row sum", "step_paged_top", "a row in [0, " + std::to_string(n) + ") and a divisor > 0",
                  "row " + std::to_string(q.row) + ", divisor " + std::to_string(q.divisor));
    }
  }
  if (n == 0) {
    run(batch.tokens, r, cache_, {}, PassOutput::kNone);
    return {};
  }
  const int64_t V = config_.vocab_size;
  LINNET_CHECK(V < (int64_t{1} << 24), "vocabulary too large for float ids");  // ids travel as floats
  const int64_t limit = vocab_limit > 0 ? std::min(vocab_limit, V) : V;
  // The rows this rank reads: its logits slice where they are computed, or, for a step
  // recorded as a CUDA graph, the gathered rows on the host (one "shard" of the whole
  // vocabulary, nothing left to gather). The backend's ops take either memory.
  std::vector<float> gathered;
  Tensor logits;
  int64_t ld = plan_.vocab_local, begin = plan_.vocab_begin, parts = comm_.size();
  if (DecodeGraph* g = graph_for(static_cast<int64_t>(batch.tokens.size()), batch.last)) {
    gathered = replay_decode(batch.tokens, r, *g);
    logits = Tensor::wrap({n, V}, DType::kF32, Device::kCpu, nullptr, gathered.data());
    ld = V, begin = 0, parts = 1;
  } else {
    logits = run(batch.tokens, r, cache_, batch.last);
  }
  const int64_t valid = std::clamp<int64_t>(limit - begin, 0, ld);
  const int64_t kk = std::min(k, valid);  // this shard's candidates
  std::vector<float> value(static_cast<size_t>(n));
  std::vector<int32_t> index(static_cast<size_t>(n)), bad(static_cast<size_t>(n));
  backend_.argmax_rows(logits, n, ld, valid, value.data(), index.data(), bad.data());  // raw: the check
  std::vector<float> vals = value;
  std::vector<int32_t> cols = index;
  if (kk > 1 || (kk == 1 && !penalties.empty())) {  // else the argmax is the shard's top 1
    backend_.apply_penalties(logits, ld, begin, valid, penalties);
    vals.resize(static_cast<size_t>(n * kk));
    cols.resize(vals.size());
    backend_.top_k_rows(logits, ld, valid, kk, vals.data(), cols.data());
  }
  // 2k + 1 floats a row: k (logit, global id) pairs, padded with (-inf, -1), then the
  // first non-finite id or -1.
  const int64_t width = 2 * k + 1;
  std::vector<float> send(static_cast<size_t>(n * width)), recv;
  for (int64_t row = 0; row < n; ++row) {
    float* f = send.data() + row * width;
    for (int64_t c = 0; c < k; ++c) {
      // A column outside [0, valid) is padding (CUDA's top-k where fewer than kk values
      // are above -inf; they have probability 0, so leaving them out draws the same).
      const int32_t col = c < kk ? cols[row * kk + c] : -1;
      const bool real = bad[row] < 0 && col >= 0 && col < valid;
      f[2 * c] = real ? vals[row * kk + c] : -std::numeric_limits<float>::infinity();
      f[2 * c + 1] = real ? static_cast<float>(begin + col) : -1.0f;
    }
    f[2 * k] = bad[row] >= 0 ? static_cast<float>(begin + bad[row]) : -1.0f;
  }
  if (parts == 1) {
    recv = std::move(send);
  } else {
    recv.resize(send.size() * static_cast<size_t>(parts));
    comm_.all_gather(send.data(), send.size(), recv.data());
  }
  const auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::vector<TopCandidates> out(static_cast<size_t>(n));
  std::vector<std::pair<float, int32_t>> cand;
  for (int64_t row = 0; row < n; ++row) {
    TopCandidates& c = out[static_cast<size_t>(row)];
    cand.clear();
    for (int64_t part = 0; part < parts; ++part) {  // ranks hold ascending id ranges
      const float* f = recv.data() + (part * n + row) * width;
      if (c.bad_id < 0 && f[2 * k] >= 0) c.bad_id = static_cast<int32_t>(f[2 * k]);
      for (int64_t i = 0; i < k; ++i) {
        if (f[2 * i + 1] >= 0) cand.emplace_back(f[2 * i], static_cast<int32_t>(f[2 * i + 1]));
      }
    }
    if (c.bad_id >= 0) continue;
    const size_t m = std::min(cand.size(), static_cast<size_t>(k));
    std::partial_sort(cand.begin(), cand.begin() + static_cast<long>(m), cand.end(), by_logit);
    for (size_t i = 0; i < m; ++i) {
      c.ids.push_back(cand[i].second);
      c.logits.push_back(cand[i].first);
    }
  }
  if (!sums.empty()) row_sums(logits, ld, valid, parts, sums, out);
  if (want_full) {
    std::vector<float> wanted(static_cast<size_t>(n), 0.0f);
    for (int64_t row = 0; row < n; ++row) {
      const TopCandidates& c = out[static_cast<size_t>(row)];
      if (c.bad_id < 0 && !c.ids.empty() && want_full(row, c)) wanted[static_cast<size_t>(row)] = 1.0f;
    }
    // The callback may compute in floating point (Sampler::nucleus_within's exp): ranks
    // on hosts with another libm could answer differently on a boundary row, so the
    // ranks take the union before the gather, which they must all make alike.
    if (parts > 1) comm_.all_reduce_max(wanted.data(), wanted.size());
    std::vector<int32_t> rows;
    for (int64_t row = 0; row < n; ++row) {
      if (wanted[static_cast<size_t>(row)] > 0.0f) rows.push_back(static_cast<int32_t>(row));
    }
    if (!rows.empty()) {
      const int64_t m = static_cast<int64_t>(rows.size());
      std::vector<float> full;
      if (parts == 1 && logits.device() == Device::kCpu) {  // one rank's host rows, or a graph step's
        full.resize(static_cast<size_t>(m * V));
        for (int64_t i = 0; i < m; ++i) {
          std::copy_n(logits.data() + rows[static_cast<size_t>(i)] * ld, V, full.begin() + i * V);
        }
      } else {
        Tensor picked = backend_.empty({m, ld});
        const Tensor index = backend_.upload_i32(rows);
        backend_.gather_rows(logits.data(), ld, index.i32(), m, picked.data());
        full = gather_logits(picked, m);
      }
      for (int64_t i = 0; i < m; ++i) {
        auto& dst = out[static_cast<size_t>(rows[static_cast<size_t>(i)])].full;
        dst.assign(full.begin() + i * V, full.begin() + (i + 1) * V);
      }
    }
  }
  return out;
}

// The second gather of step_paged_top: each request's ExpSum over this shard (relative
// to the row's merged best logit), all_gathered as 4 floats' bits per request and rank,
// added exactly on every rank. Rows with a non-finite logit or no candidates get 0.
void Engine::row_sums(const Tensor& logits, int64_t ld, int64_t valid, int64_t parts, std::span<const RowSum> sums,
                      std::vector<TopCandidates>& out) {
  std::vector<Backend::ExpSumRequest> reqs;
  std::vector<size_t> which;  // index into sums of each request
  for (size_t j = 0; j < sums.size(); ++j) {
    const TopCandidates& c = out[static_cast<size_t>(sums[j].row)];
    if (c.bad_id >= 0 || c.ids.empty()) continue;
    reqs.push_back({sums[j].row, static_cast<double>(c.logits[0]), sums[j].divisor});
    which.push_back(j);
  }
  std::vector<ExpSum> mine(reqs.size());
  backend_.exp_sums(logits, ld, valid, reqs, mine.data());
  static_assert(sizeof(ExpSum) == 4 * sizeof(float), "an ExpSum travels as 4 floats' bits");
  std::vector<ExpSum> all(mine.size() * static_cast<size_t>(parts));
  if (parts == 1) {
    all = mine;
  } else if (!mine.empty()) {
    // The bits travel as floats: an all_gather only copies them.
    comm_.all_gather(reinterpret_cast<const float*>(mine.data()), 4 * mine.size(), reinterpret_cast<float*>(all.data()));
  }
  std::vector<double> total(sums.size(), 0.0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ExpSum s;
    for (int64_t part = 0; part < parts; ++part) s.add(all[static_cast<size_t>(part) * reqs.size() + i]);
    total[which[i]] = s.value();
  }
  for (size_t j = 0; j < sums.size(); ++j) out[static_cast<size_t>(sums[j].row)].sums.push_back(total[j]);
}

std::vector<float> Engine::prefill_paged(PagedBatch batch) {
  // The last token of each sequence in this pass.
  batch.last.assign(batch.page_tables.size(), -1);
  for (size_t i = 0; i < batch.tokens.size() && i < batch.seq.size(); ++i) {
    if (batch.seq[i] >= 0 && static_cast<size_t>(batch.seq[i]) < batch.last.size()) {
      batch.last[batch.seq[i]] = static_cast<int32_t>(i);
    }
  }
  for (size_t s = 0; s < batch.last.size(); ++s) {
    if (batch.last[s] < 0) throw Error("a sequence has no tokens in this pass", "prefill_paged", "", "sequence " + std::to_string(s));
  }
  return cache_logits(batch.tokens, paged_rows(batch, "prefill_paged"), batch.last);
}

std::vector<float> Engine::decode_paged(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                        const std::vector<std::vector<int32_t>>& page_tables) {
  if (tokens.size() != page_tables.size()) {
    throw Error("one token per sequence", "decode_paged", std::to_string(page_tables.size()) + " tokens",
                std::to_string(tokens.size()));
  }
  PagedBatch b;
  b.tokens.assign(tokens.begin(), tokens.end());
  b.positions.assign(positions.begin(), positions.end());
  b.page_tables = page_tables;
  b.seq.resize(tokens.size());
  std::iota(b.seq.begin(), b.seq.end(), 0);
  b.last = b.seq;
  return cache_logits(b.tokens, paged_rows(b, "decode_paged"), b.last);
}

}  // namespace linnet
