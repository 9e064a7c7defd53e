// The Engine's CUDA-graph path (Engine::cuda_graphs): a decode pass of a power-of-two
// bucket of rows is run eagerly once, recorded, and replayed with new inputs copied into
// its fixed input tensor; padding rows write K/V into the spare row past the pages.
// Everything else of the Engine is runtime/engine.cpp.
#include <algorithm>
#include <span>
#include <vector>

#include "runtime/decode_graph.h"
#include "runtime/engine.h"

namespace linnet {

int64_t Engine::cuda_graphs_recorded() const {
  int64_t n = 0;
  for (const auto& g : graphs_) n += g && g->graph ? 1 : 0;
  return n;
}

Engine::DecodeGraph* Engine::graph_for(int64_t tokens, std::span<const int32_t> last) {
  if (!graphs_on_ || static_cast<int64_t>(last.size()) != tokens) return nullptr;
  for (int64_t i = 0; i < tokens; ++i) {
    if (last[i] != i) return nullptr;
  }
  size_t b = 0;
  while ((int64_t{1} << b) < tokens) ++b;
  if (b >= graphs_.size()) return nullptr;
  if (!graphs_[b]) {
    auto g = std::make_unique<DecodeGraph>();
    g->rows = int64_t{1} << b;
    g->inputs = backend_.zeros({g->rows * (5 + graph_max_pages_)}, DType::kI32);
    g->gathered = backend_.zeros({comm_.size() * g->rows * plan_.vocab_local});
    graphs_[b] = std::move(g);
  }
  return graphs_[b].get();
}

void Engine::decode_graph_pass(DecodeGraph& g) {
  const int64_t B = g.rows;
  const int32_t* p = g.inputs.i32();
  const PassInputs in{.ids = p,
                      .positions = p + B,
                      .slots = p + 2 * B,
                      .page_table = p + 5 * B,
                      .key_begin = p + 3 * B,
                      .key_end = p + 4 * B,
                      .rows = B,
                      .max_pages = graph_max_pages_};
  const Tensor local = run_pass(in, cache_, {}, PassOutput::kLogits);
  comm_.all_gather(local.data(), static_cast<size_t>(B * plan_.vocab_local), g.gathered.data());
}

std::vector<float> Engine::replay_decode(std::span<const int32_t> tokens, const Rows& r, DecodeGraph& g) {
  const int64_t P = static_cast<int64_t>(tokens.size()), B = g.rows, M = graph_max_pages_;
  const int64_t ps = cache_.page_size;
  const int64_t pad_page = cache_.num_pages;  // its position 0 is the row past the pages
  // The inputs as DecodeGraph::inputs lays them out. A table wider than M holds pages
  // no key reaches (positions < max_seq_len <= M * page_size).
  std::vector<int32_t> in(static_cast<size_t>(B * (5 + M)), 0);
  int32_t* ids = in.data();
  int32_t *positions = ids + B, *slots = ids + 2 * B, *key_begin = ids + 3 * B, *key_end = ids + 4 * B;
  int32_t* table = ids + 5 * B;
  for (int64_t i = 0; i < B; ++i) {
    if (i < P) {
      ids[i] = tokens[i];
      positions[i] = r.positions[i];
      slots[i] = r.slots[i];
      key_begin[i] = r.key_begin[i];
      key_end[i] = r.key_end[i];
      std::copy_n(r.page_table.begin() + i * r.max_pages, std::min(r.max_pages, M), table + i * M);
    } else {  // padding: token 0 at position 0 of the reserved page, attending to itself
      slots[i] = static_cast<int32_t>(pad_page * ps);
      key_end[i] = 1;
      table[i * M] = static_cast<int32_t>(pad_page);
    }
  }
  backend_.copy_i32(in, g.inputs);
  if (!g.graph) {
    // One eager run of the same pass first: it sizes the arena, makes the GEMM plans and
    // scratch, sets NCCL up and agrees the collectives' counts; the recording reruns
    // nothing (the replay below writes the same K/V again).
    const size_t before = backend_.allocated_bytes();
    decode_graph_pass(g);
    backend_.begin_capture(backend_.allocated_bytes() - before);
    try {
      decode_graph_pass(g);
    } catch (...) {
      try {
        backend_.end_capture();
      } catch (...) {  // the first error is the one to report
      }
      throw;
    }
    g.graph = backend_.end_capture();
  }
  backend_.replay(*g.graph);
  ++graph_replays_;
  std::vector<float> recv(static_cast<size_t>(g.gathered.numel()));
  backend_.to_host(g.gathered, recv.data());
  return unpack_logits(recv, B, P);
}

}  // namespace linnet
