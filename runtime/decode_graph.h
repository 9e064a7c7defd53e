// Engine::DecodeGraph, private to the Engine's two files: runtime/engine.cpp (the passes)
// and runtime/engine_graphs.cpp (recording and replaying decode passes as CUDA graphs).
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/backend.h"
#include "runtime/engine.h"
#include "runtime/tensor.h"

namespace linnet {

// One bucket of the CUDA graphs (Engine::cuda_graphs): a pass of `rows` tokens.
struct Engine::DecodeGraph {
  int64_t rows = 0;
  // i32 [rows * (5 + max_pages)]: ids, positions, slots, key_begin, key_end [rows each],
  // then the page table [rows, max_pages]; copied in before each replay.
  Tensor inputs;
  Tensor gathered;                        // f32 [tp, rows, vocab_local]: all_gather's output
  std::unique_ptr<Backend::Graph> graph;  // null until recorded
};

}  // namespace linnet
