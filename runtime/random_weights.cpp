#include "runtime/random_weights.h"

#include <algorithm>

#include "common/random_normal.h"

namespace linnet {

Tensor Backend::random_matrix(std::vector<int64_t> shape, float stddev, uint64_t seed, bool vocab) {
  Tensor host = Tensor::zeros(std::move(shape));
  float* d = host.data();
  const int64_t n = host.numel();
  // Each element depends only on (seed, i): the threads change no value.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] = stddev * random_normal(seed, static_cast<uint64_t>(i));
  return vocab ? upload_vocab_matrix(host) : upload_matrix(host);
}

namespace {
Tensor ones(int64_t n) {
  Tensor t = Tensor::zeros({n});
  std::fill(t.data(), t.data() + n, 1.0f);
  return t;
}
}  // namespace

ModelWeights random_weights(Backend& backend, const ModelConfig& c, const ShardPlan& p, uint64_t seed, float stddev) {
  const int64_t h = c.hidden_size, hd = c.head_dim;
  uint64_t stream = splitmix64(seed) ^ (static_cast<uint64_t>(p.tp_rank) << 48);
  auto matrix = [&](std::vector<int64_t> shape) { return backend.random_matrix(std::move(shape), stddev, stream++); };
  ModelWeights w;
  w.on_backend = true;
  w.embed_tokens = backend.random_matrix({p.vocab_local, h}, stddev, stream++, true);
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : backend.random_matrix({p.vocab_local, h}, stddev, stream++, true);
  w.final_norm = ones(h);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights L;
    L.input_norm = ones(h);
    L.wqkv = matrix({(p.num_heads_local + 2 * p.num_kv_heads_local) * hd, h});
    if (c.qk_norm) {
      L.q_norm = ones(hd);
      L.k_norm = ones(hd);
    }
    L.wo = matrix({h, p.num_heads_local * hd});
    L.post_attn_norm = ones(h);
    L.w_gate_up = matrix({2 * p.intermediate_local, h});
    L.w_down = matrix({h, p.intermediate_local});
    w.layers.push_back(std::move(L));
  }
  return w;
}

}  // namespace linnet
