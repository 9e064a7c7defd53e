// Vocab-parallel embedding lookup from a bf16 table: one block per token, rows this rank
// does not own are zero (the all_reduce after it fills them in).
#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace linnet::cuda {
namespace {

__global__ void embedding_lookup_kernel(const __nv_bfloat16* table, int64_t vocab_begin, int64_t vocab_local,
                                        int64_t hidden, const int32_t* ids, float* out) {
  const int64_t i = blockIdx.x;
  const int64_t row = static_cast<int64_t>(ids[i]) - vocab_begin;
  const bool mine = row >= 0 && row < vocab_local;
  float* dst = out + i * hidden;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    dst[c] = mine ? __bfloat162float(table[row * hidden + c]) : 0.0f;
  }
}

}  // namespace

void launch_embedding_lookup(const __nv_bfloat16* table, int64_t vocab_begin, int64_t vocab_local, int64_t hidden,
                             const int32_t* ids, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  embedding_lookup_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(table, vocab_begin, vocab_local, hidden, ids,
                                                                         out);
  LINNET_CUDA_CHECK_LAUNCH();
}

}  // namespace linnet::cuda
