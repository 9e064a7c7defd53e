// GEMM / GEMV through OpenBLAS (row-major, weights in nn.Linear [out, in] layout).
#include <cblas.h>

#include "kernels/cpu/ops.h"

namespace linnet::cpu {

void set_num_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

void matmul_nt(const float* x, const float* w, float* out, int64_t m, int64_t k, int64_t n) {
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, w,
                static_cast<int>(k), x, 1, 0.0f, out, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x, static_cast<int>(k), w, static_cast<int>(k), 0.0f, out,
              static_cast<int>(n));
}

}  // namespace linnet::cpu
