// matmul_nt: splits the output columns over the rank's OpenMP threads and runs the
// active ISA path's column kernel on each share (see gemm.h for the design and the
// fixed reduction order). Why OpenMP and not a pool of our own: it comes with the
// compiler (libgomp, no extra package), its parallel regions cost ~1 us, and
// OMP_PROC_BIND / OMP_PLACES pin threads as users of other runtimes already know.
#include "kernels/cpu/gemm.h"

#include <algorithm>

#include <cblas.h>
#include <omp.h>

#include "common/error.h"

namespace linnet::cpu {
namespace {
int g_threads = 1;
}  // namespace

int weight_type_size(WeightType t) { return t == WeightType::kF32 ? 4 : 2; }

void set_num_threads(int n) {
  g_threads = std::max(1, n);
  omp_set_num_threads(g_threads);
  // The GEMMs no longer use OpenBLAS; one thread keeps its pool from spinning beside ours.
  openblas_set_num_threads(1);
}

int num_threads() { return g_threads; }

void matmul_nt_isa(Isa isa, const float* x, const void* w, WeightType wt, float* out, int64_t m, int64_t k,
                   int64_t n) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    std::fill(out, out + m * n, 0.0f);
    return;
  }
  auto columns = isa == Isa::kAvx2 ? detail::gemm_columns_avx2 : detail::gemm_columns_generic;
  // Shares of whole 12-column groups (4 micro-tiles); small GEMMs stay on one thread.
  const int64_t flops = 2 * m * k * n;
  const int threads = flops < (int64_t{1} << 17) ? 1 : static_cast<int>(std::min<int64_t>(g_threads, (n + 11) / 12));
  if (threads <= 1) {
    columns(x, w, wt, out, m, k, n, 0, n);
    return;
  }
  const int64_t groups = (n + 11) / 12;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t g0 = groups * t / T, g1 = groups * (t + 1) / T;
    const int64_t j0 = std::min(n, g0 * 12), j1 = std::min(n, g1 * 12);
    if (j1 > j0) columns(x, w, wt, out, m, k, n, j0, j1);
  }
}

void matmul_nt(const float* x, const void* w, WeightType wt, float* out, int64_t m, int64_t k, int64_t n) {
  matmul_nt_isa(active_isa(), x, w, wt, out, m, k, n);
}

}  // namespace linnet::cpu
