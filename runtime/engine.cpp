#include "runtime/engine.h"

#include <numeric>
#include <string>

#include "common/error.h"
#include "kernels/cpu/ops.h"

namespace linnet {

Engine::Engine(const ModelConfig& config, const ShardPlan& plan, ModelWeights weights, Backend& backend,
               Communicator& tp_comm, int64_t max_seq_len, int64_t max_batch)
    : config_(config),
      plan_(plan),
      weights_(std::move(weights)),
      backend_(backend),
      comm_(tp_comm),
      cache_(KvCache::make(backend, config.num_hidden_layers, max_seq_len, plan.num_kv_heads_local,
                           config.head_dim, max_batch)) {
  LINNET_CHECK(max_seq_len >= 1 && max_batch >= 1, "max_seq_len and max_batch must be positive");
  inv_freq_ = Tensor::zeros({config.head_dim / 2});
  cpu::rope_inv_freq(config.rope_theta, config.head_dim, inv_freq_.data());
  if (const auto& rs = config.rope_scaling) {
    cpu::rope_scale_llama3(inv_freq_.data(), config.head_dim / 2, rs->factor, rs->low_freq_factor,
                           rs->high_freq_factor, static_cast<double>(rs->original_max_position_embeddings));
  }
}

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

// Rows of a sequence at positions pos..pos+S-1, cached at the same rows: each attends
// causally to the cache, or to its last sliding_window positions.
Engine::Rows Engine::sequence_rows(int64_t S, int64_t pos) const {
  Rows r;
  const int64_t window = config_.sliding_window.value_or(0);
  r.positions.resize(static_cast<size_t>(S));
  std::iota(r.positions.begin(), r.positions.end(), static_cast<int32_t>(pos));
  r.cache_rows = r.positions;
  r.key_begin.resize(static_cast<size_t>(S));
  r.key_end.resize(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = pos + i;
    r.key_end[i] = static_cast<int32_t>(p + 1);
    r.key_begin[i] = first_key(0, p, window);
  }
  return r;
}

Tensor Engine::run(std::span<const int32_t> tokens, const Rows& rows_in, KvCache& cache,
                   std::span<const int32_t> out) {
  const int64_t S = static_cast<int64_t>(tokens.size());
  const int64_t H = config_.hidden_size;
  const int64_t hd = config_.head_dim;
  const int64_t nh = plan_.num_heads_local;
  const int64_t nkv = plan_.num_kv_heads_local;
  const int64_t qkv_cols = (nh + 2 * nkv) * hd;
  const int64_t inter = plan_.intermediate_local;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const int32_t* positions = rows_in.positions.data();
  const int32_t* cache_rows = rows_in.cache_rows.data();

  Tensor h = backend_.zeros({S, H});         // residual stream
  Tensor xn = backend_.zeros({S, H});        // normed input of a block
  Tensor qkv = backend_.zeros({S, qkv_cols});
  Tensor attn = backend_.zeros({S, nh * hd});
  Tensor partial = backend_.zeros({S, H});   // row-parallel output before all_reduce
  Tensor gate_up = backend_.zeros({S, 2 * inter});
  Tensor act = backend_.zeros({S, inter});

  // Vocab-parallel embedding: rows this rank does not own are zero, the sum fills them.
  backend_.embedding_lookup(weights_.embed_tokens.data(), plan_.vocab_begin, plan_.vocab_local, H,
                            tokens.data(), S, h.data());
  comm_.all_reduce_sum(h.data(), static_cast<size_t>(S * H));

  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const LayerWeights& L = weights_.layers[l];
    // Attention block: column-parallel q/k/v (this rank's heads), row-parallel o_proj.
    backend_.rmsnorm(h.data(), L.input_norm.data(), xn.data(), S, H, eps);
    backend_.matmul_nt(xn.data(), L.wqkv.data(), qkv.data(), S, H, qkv_cols);
    if (config_.qk_norm) {  // Qwen3: per-head RMSNorm of q and k, before RoPE
      backend_.rmsnorm_heads(qkv.data(), S, qkv_cols, nh, hd, L.q_norm.data(), eps);
      backend_.rmsnorm_heads(qkv.data() + nh * hd, S, qkv_cols, nkv, hd, L.k_norm.data(), eps);
    }
    backend_.rope(qkv.data(), S, qkv_cols, nh, hd, positions, inv_freq_.data());
    backend_.rope(qkv.data() + nh * hd, S, qkv_cols, nkv, hd, positions, inv_freq_.data());
    backend_.store_rows(qkv.data() + nh * hd, qkv_cols, cache.k[l].data(), nkv * hd, cache_rows, S);
    backend_.store_rows(qkv.data() + (nh + nkv) * hd, qkv_cols, cache.v[l].data(), nkv * hd, cache_rows, S);
    backend_.attention(qkv.data(), qkv_cols, cache.k[l].data(), cache.v[l].data(), attn.data(), S, nh, nkv, hd,
                       rows_in.key_begin.data(), rows_in.key_end.data());
    backend_.matmul_nt(attn.data(), L.wo.data(), partial.data(), S, nh * hd, H);
    comm_.all_reduce_sum(partial.data(), static_cast<size_t>(S * H));  // row-parallel o_proj
    backend_.add_inplace(h.data(), partial.data(), S * H);

    // MLP block: column-parallel gate/up, row-parallel down_proj.
    backend_.rmsnorm(h.data(), L.post_attn_norm.data(), xn.data(), S, H, eps);
    backend_.matmul_nt(xn.data(), L.w_gate_up.data(), gate_up.data(), S, H, 2 * inter);
    backend_.swiglu(gate_up.data(), act.data(), S, inter);
    backend_.matmul_nt(act.data(), L.w_down.data(), partial.data(), S, inter, H);
    comm_.all_reduce_sum(partial.data(), static_cast<size_t>(S * H));  // row-parallel down_proj
    backend_.add_inplace(h.data(), partial.data(), S * H);
  }

  // Final norm and the vocab-parallel lm_head, on the requested rows only.
  const int64_t rows = out.empty() ? S : static_cast<int64_t>(out.size());
  Tensor selected;
  const float* last = h.data();
  if (!out.empty()) {
    selected = backend_.zeros({rows, H});
    for (int64_t i = 0; i < rows; ++i) {
      std::copy(h.data() + out[i] * H, h.data() + (out[i] + 1) * H, selected.data() + i * H);
    }
    last = selected.data();
  }
  Tensor normed = backend_.zeros({rows, H});
  backend_.rmsnorm(last, weights_.final_norm.data(), normed.data(), rows, H, eps);
  Tensor logits = backend_.zeros({rows, plan_.vocab_local});
  backend_.matmul_nt(normed.data(), weights_.lm_head.data(), logits.data(), rows, H, plan_.vocab_local);
  return logits;
}

std::vector<float> Engine::gather_logits(const Tensor& local, int64_t rows) {
  const int64_t vl = plan_.vocab_local;
  const int64_t V = config_.vocab_size;
  const int tp = comm_.size();
  std::vector<float> recv(static_cast<size_t>(tp * rows * vl));
  comm_.all_gather(local.data(), static_cast<size_t>(rows * vl), recv.data());
  // Rank r's slice is vocab rows [r * vl, (r + 1) * vl); rows past vocab_size are
  // padding and are dropped here, so they can never be sampled.
  std::vector<float> out(static_cast<size_t>(rows * V));
  for (int r = 0; r < tp; ++r) {
    const int64_t begin = r * vl;
    const int64_t n = std::min(vl, V - begin);
    if (n <= 0) continue;
    for (int64_t i = 0; i < rows; ++i) {
      const float* src = recv.data() + (r * rows + i) * vl;
      std::copy(src, src + n, out.begin() + i * V + begin);
    }
  }
  return out;
}

std::vector<float> Engine::forward(std::span<const int32_t> tokens) {
  const int64_t S = static_cast<int64_t>(tokens.size());
  check_tokens(tokens, 0, cache_.max_seq_len);
  KvCache scratch = KvCache::make(backend_, config_.num_hidden_layers, S, plan_.num_kv_heads_local,
                                  config_.head_dim);
  Tensor local = run(tokens, sequence_rows(S, 0), scratch, {});
  return gather_logits(local, S);
}

std::vector<float> Engine::next_token(std::span<const int32_t> tokens) {
  const int64_t S = static_cast<int64_t>(tokens.size());
  check_tokens(tokens, 0, cache_.max_seq_len);
  KvCache scratch = KvCache::make(backend_, config_.num_hidden_layers, S, plan_.num_kv_heads_local,
                                  config_.head_dim);
  const int32_t last[1] = {static_cast<int32_t>(S - 1)};
  return gather_logits(run(tokens, sequence_rows(S, 0), scratch, last), 1);
}

std::vector<float> Engine::prefill(std::span<const int32_t> tokens, int64_t pos) {
  check_tokens(tokens, pos, cache_.max_seq_len);
  const int32_t last[1] = {static_cast<int32_t>(tokens.size() - 1)};
  return gather_logits(run(tokens, sequence_rows(static_cast<int64_t>(tokens.size()), pos), cache_, last), 1);
}

std::vector<float> Engine::decode(int32_t token, int64_t pos) {
  const int32_t t[1] = {token};
  return prefill(std::span<const int32_t>(t, 1), pos);
}

Tensor Engine::packed_logits_local(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                                   std::span<const int32_t> segments) {
  const int64_t P = static_cast<int64_t>(tokens.size());
  if (positions.size() != tokens.size() || segments.size() != tokens.size()) {
    throw Error("tokens, positions and segments differ in length", "packed batch",
                std::to_string(P) + " each",
                std::to_string(positions.size()) + " positions, " + std::to_string(segments.size()) + " segments");
  }
  check_tokens(tokens, 0, P);
  const int64_t window = config_.sliding_window.value_or(0);
  Rows r;
  r.positions.assign(positions.begin(), positions.end());
  r.cache_rows.resize(static_cast<size_t>(P));
  std::iota(r.cache_rows.begin(), r.cache_rows.end(), 0);
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
  KvCache scratch = KvCache::make(backend_, config_.num_hidden_layers, P, plan_.num_kv_heads_local,
                                  config_.head_dim);
  return run(tokens, r, scratch, {});
}

std::vector<float> Engine::prefill_packed(std::span<const int32_t> tokens, std::span<const int32_t> rows,
                                          std::span<const int32_t> positions, std::span<const int32_t> last) {
  const int64_t P = static_cast<int64_t>(tokens.size());
  if (rows.size() != tokens.size() || positions.size() != tokens.size()) {
    throw Error("tokens, rows and positions differ in length", "prefill_packed", std::to_string(P) + " each",
                std::to_string(rows.size()) + " rows, " + std::to_string(positions.size()) + " positions");
  }
  if (P == 0) throw Error("no tokens to run", "prefill_packed");
  for (int32_t i : last) {
    if (i < 0 || i >= P) throw Error("index of a wanted token out of range", "prefill_packed", "[0, " + std::to_string(P) + ")", std::to_string(i));
  }
  check_tokens(tokens, 0, P);
  const int64_t L = cache_.max_seq_len;
  const int64_t window = config_.sliding_window.value_or(0);
  Rows r;
  r.positions.assign(positions.begin(), positions.end());
  r.cache_rows.resize(static_cast<size_t>(P));
  r.key_begin.resize(static_cast<size_t>(P));
  r.key_end.resize(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) {
    const int64_t row = rows[i], p = positions[i];
    if (row < 0 || row >= cache_.rows) {
      throw Error("KV cache row out of range", "prefill_packed", "[0, " + std::to_string(cache_.rows) + ")",
                  std::to_string(row));
    }
    if (p < 0 || p >= L) {
      throw Error("position does not fit in the KV cache", "--max-seq-len", "< " + std::to_string(L), std::to_string(p));
    }
    const int64_t base = row * L;
    r.cache_rows[i] = static_cast<int32_t>(base + p);
    r.key_end[i] = static_cast<int32_t>(base + p + 1);
    r.key_begin[i] = first_key(base, base + p, window);
  }
  return gather_logits(run(tokens, r, cache_, last), static_cast<int64_t>(last.size()));
}

std::vector<float> Engine::decode_rows(std::span<const int32_t> tokens, std::span<const int32_t> rows,
                                       std::span<const int32_t> positions) {
  std::vector<int32_t> all(tokens.size());
  std::iota(all.begin(), all.end(), 0);
  return prefill_packed(tokens, rows, positions, all);
}

}  // namespace linnet
