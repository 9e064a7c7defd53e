// CublasLtGemm: the one GEMM of the CUDA backend, nn.Linear without bias, through
// cuBLASLt: out f32 [m, n] = x [m, k] * w[n, k]^T with x converted to a bf16 scratch
// copy, w bf16, f32 accumulation (CUBLAS_COMPUTE_32F; A/B CUDA_R_16BF, C/D CUDA_R_32F).
// Design choice: one object per stream, owning that stream's 32 MiB workspace and bf16
// scratch; matmul descriptors, layouts and the heuristic's algorithm are built once per
// (m, n, k, alignment of the three buffers) and cached, so a decode step does no
// descriptor work. The alignments are part of the key because cuBLASLt's heuristic
// otherwise assumes 256-byte aligned buffers and may pick a kernel that needs them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace linnet::cuda {

/// cuBLASLt GEMMs queued on one stream of the current device. Not thread-safe.
class CublasLtGemm {
 public:
  /// Bytes of the cuBLASLt workspace kept per stream.
  static constexpr size_t kWorkspaceBytes = 32u << 20;

  /// @throws Error when cuBLASLt cannot be initialized or the workspace allocated.
  explicit CublasLtGemm(cudaStream_t stream);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  /// out[m, n] = x[m, k] * w[n, k]^T; x, out f32 row-major, w bf16 row-major (device).
  /// x is rounded to bf16 (as transformers' bf16 nn.Linear sees its input).
  /// @throws Error naming cuBLASLt's status when no algorithm fits or the call fails.
  void matmul_nt(const float* x, const __nv_bfloat16* w, float* out, int64_t m, int64_t k, int64_t n);

  /// Same with x already bf16 [m, k].
  void matmul_nt_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, float* out, int64_t m, int64_t k, int64_t n);

  /// From now on a bf16 scratch outgrown by a larger GEMM is kept (freed by the
  /// destructor) instead of freed: CUDA graphs recorded earlier still use its address.
  void keep_outgrown_scratch() { keep_outgrown_ = true; }

 private:
  struct Plan;
  const Plan& plan(int64_t m, int64_t n, int64_t k, uint32_t align_w, uint32_t align_x, uint32_t align_out);

  cudaStream_t stream_;
  void* handle_ = nullptr;     // cublasLtHandle_t
  void* workspace_ = nullptr;  // kWorkspaceBytes
  __nv_bfloat16* scratch_ = nullptr;
  int64_t scratch_elems_ = 0;
  bool keep_outgrown_ = false;
  std::vector<void*> outgrown_;  // scratches kept for recorded graphs
  std::map<std::tuple<int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t>, std::unique_ptr<Plan>> plans_;
};

}  // namespace linnet::cuda
