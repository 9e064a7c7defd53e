// cuBLASLt in the row-major convention: cuBLAS is column-major, and a row-major out[m, n]
// is the column-major out^T[n, m] = w[n, k] * x^T[k, m]; w row-major [n, k] is
// column-major [k, n] (ld k) taken transposed, x row-major [m, k] is column-major [k, m]
// (ld k) taken as is.
#include "kernels/cuda/gemm.h"

#include <string>
#include <utility>

#include <cublasLt.h>

#include "common/error.h"
#include "common/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace linnet::cuda {
namespace {

void cublas_check(cublasStatus_t rc, const char* expr, const char* file, int line) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string(expr) + " failed: " + cublasLtGetStatusName(rc) + ": " + cublasLtGetStatusString(rc),
              std::string(file) + ":" + std::to_string(line));
}

#define LINNET_CUBLAS_CHECK(call) cublas_check((call), #call, __FILE__, __LINE__)

cublasLtHandle_t as_handle(void* h) { return static_cast<cublasLtHandle_t>(h); }

// The largest power of two up to 256 dividing the address (cuBLASLt's preference
// attributes take the alignment each buffer is known to have; the default is 256).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

}  // namespace

struct CublasLtGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

CublasLtGemm::CublasLtGemm(cudaStream_t stream) : stream_(stream) {
  cublasLtHandle_t h = nullptr;
  LINNET_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  try {
    LINNET_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  } catch (...) {
    cublasLtDestroy(h);
    throw;
  }
}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();
  if (scratch_) cudaFreeAsync(scratch_, stream_);
  for (void* p : outgrown_) cudaFreeAsync(p, stream_);
  if (workspace_) {
    cudaStreamSynchronize(stream_);
    cudaFree(workspace_);
  }
  if (handle_) cublasLtDestroy(as_handle(handle_));
}

const CublasLtGemm::Plan& CublasLtGemm::plan(int64_t m, int64_t n, int64_t k, uint32_t align_w, uint32_t align_x,
                                              uint32_t align_out) {
  const auto key = std::make_tuple(m, n, k, align_w, align_x, align_out);
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  LINNET_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LINNET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LINNET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  LINNET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, u(k), u(n), k));  // w as [k, n], used ^T
  LINNET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, u(k), u(m), k));  // x^T [k, m]
  LINNET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, u(n), u(m), n));   // out^T [n, m]

  cublasLtMatmulPreference_t pref = nullptr;
  LINNET_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kWorkspaceBytes;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t rc = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_w},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_x},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_out},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_out}};
  for (const auto& [attr, value] : aligns) {
    if (rc == CUBLAS_STATUS_SUCCESS) rc = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value);
  }
  if (rc == CUBLAS_STATUS_SUCCESS) {
    rc = cublasLtMatmulAlgoGetHeuristic(as_handle(handle_), p->op, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  LINNET_CUBLAS_CHECK(rc);
  if (found == 0) {
    throw Error("cuBLASLt has no algorithm for this GEMM", "CublasLtGemm",
                "a bf16 x bf16 -> f32 kernel", "m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " +
                                                   std::to_string(k));
  }
  p->algo = result.algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

void CublasLtGemm::matmul_nt(const float* x, const __nv_bfloat16* w, float* out, int64_t m, int64_t k, int64_t n) {
  if (m <= 0 || n <= 0) return;
  if (m * k > scratch_elems_) {
    // Growing inside a graph recording would record an allocation: the eager pass run
    // before each recording sizes the scratch.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    LINNET_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    if (capture != cudaStreamCaptureStatusNone) {
      throw Error("the GEMM scratch must not grow while a CUDA graph is recorded", "CublasLtGemm",
                  "a scratch of " + std::to_string(m * k) + " elements",
                  std::to_string(scratch_elems_) + " elements");
    }
    if (scratch_ && keep_outgrown_) {
      outgrown_.push_back(scratch_);
    } else if (scratch_) {
      LINNET_CUDA_CHECK(cudaFreeAsync(scratch_, stream_));
    }
    scratch_ = nullptr;
    scratch_elems_ = 0;
    void* s = nullptr;
    LINNET_CUDA_CHECK(cudaMallocAsync(&s, static_cast<size_t>(m * k) * sizeof(__nv_bfloat16), stream_));
    scratch_ = static_cast<__nv_bfloat16*>(s);
    scratch_elems_ = m * k;
  }
  launch_f32_to_bf16(x, scratch_, m * k, stream_);
  matmul_nt_bf16(scratch_, w, out, m, k, n);
}

void CublasLtGemm::matmul_nt_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, float* out, int64_t m, int64_t k,
                                  int64_t n) {
  if (m <= 0 || n <= 0) return;
  const Plan& p = plan(m, n, k, alignment_of(w), alignment_of(x), alignment_of(out));
  const float alpha = 1.0f, beta = 0.0f;
  LINNET_CUBLAS_CHECK(cublasLtMatmul(as_handle(handle_), p.op, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c,
                                     &p.algo, workspace_, kWorkspaceBytes, stream_));
}

}  // namespace linnet::cuda
