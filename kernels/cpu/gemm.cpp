// matmul_nt_packed: splits the panels over the rank's OpenMP threads (GEMV-sized steps:
// one contiguous share each; more rows: chunks taken as threads free up) and runs the
// active ISA path's panel kernel on each share (see gemm.h for the layout, the design and the
// fixed reduction order). Why OpenMP and not a pool of our own: it comes with the
// compiler (libgomp, no extra package), a parallel region costs about a microsecond,
// and OMP_* settings work as users of other runtimes know them; threads.h pins it.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <omp.h>

#include "common/error.h"

namespace linnet::cpu {

void pack_weight(const void* w, DType wt, int64_t n, int64_t k, void* packed) {
  const int64_t es = static_cast<int64_t>(dtype_size(wt));
  const auto* src = static_cast<const char*>(w);
  auto* dst = static_cast<char*>(packed);
  std::memset(dst, 0, static_cast<size_t>(packed_elements(n, k) * es));
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    char* panel = dst + (j / kPanel) * kPanel * k * es;
    const int64_t lane = j % kPanel;
    const char* row = src + j * k * es;
    for (int64_t c = 0; c < k; ++c) std::memcpy(panel + (c * kPanel + lane) * es, row + c * es, static_cast<size_t>(es));
  }
}

void matmul_nt_packed_isa(Isa isa, const float* x, const void* packed, DType wt, float* out, int64_t m,
                          int64_t k, int64_t n) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    std::fill(out, out + m * n, 0.0f);
    return;
  }
  if (!isa_supported(isa)) throw Error("this CPU cannot run the kernel path", "matmul_nt", "generic", isa_name(isa));
  auto panels_fn = isa == Isa::kAvx512 ? detail::gemm_panels_avx512
                   : isa == Isa::kAvx2 ? detail::gemm_panels_avx2
                                       : detail::gemm_panels_generic;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  // Small GEMMs stay on one thread (a parallel region costs more than they do).
  const int64_t flops = 2 * m * k * n;
  const int threads = flops < (int64_t{1} << 17) ? 1 : static_cast<int>(std::min<int64_t>(num_threads(), panels));
  if (threads <= 1) {
    panels_fn(x, packed, wt, out, m, k, n, 0, panels);
    return;
  }
  if (m <= 2) {
    // GEMV-sized: one contiguous run of panels per thread, streamed front to back.
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num(), T = omp_get_num_threads();
      const int64_t p0 = panels * t / T, p1 = panels * (t + 1) / T;
      if (p1 > p0) panels_fn(x, packed, wt, out, m, k, n, p0, p1);
    }
    return;
  }
  // More rows: chunks of an even number of panels (about 8 per thread) handed out as
  // threads free up, so a thread that lost its core for a while (a shared machine) is
  // not waited for over half the GEMM. A chunk is computed whole by one thread, so the
  // split changes no bit.
  const int64_t chunk = std::max<int64_t>(2, panels / (int64_t{8} * threads) / 2 * 2);
  const int64_t chunks = (panels + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c)
    panels_fn(x, packed, wt, out, m, k, n, c * chunk, std::min(panels, (c + 1) * chunk));
}

void matmul_nt_packed(const float* x, const void* packed, DType wt, float* out, int64_t m, int64_t k,
                      int64_t n) {
  matmul_nt_packed_isa(active_isa(), x, packed, wt, out, m, k, n);
}

void matmul_nt(const float* x, const void* w, DType wt, float* out, int64_t m, int64_t k, int64_t n) {
  std::vector<char> packed(static_cast<size_t>(packed_elements(n, k) * static_cast<int64_t>(dtype_size(wt))));
  pack_weight(w, wt, n, k, packed.data());
  matmul_nt_packed(x, packed.data(), wt, out, m, k, n);
}

void widen_to_f32(const void* w, DType wt, int64_t n, float* out) {
  if (wt == DType::kF32) {
    std::memcpy(out, w, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = detail::load_weight(w, wt, i);
}

void unpack_row(const void* packed, DType wt, int64_t k, int64_t row, float* out) {
  const int64_t base = (row / kPanel) * kPanel * k + row % kPanel;
  for (int64_t c = 0; c < k; ++c) out[c] = detail::load_weight(packed, wt, base + c * kPanel);
}

void embedding_lookup_packed(const void* table, DType wt, int64_t vocab_begin, int64_t vocab_local,
                             int64_t hidden, const int32_t* ids, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = static_cast<int64_t>(ids[i]) - vocab_begin;
    float* dst = out + i * hidden;
    if (row >= 0 && row < vocab_local) {
      unpack_row(table, wt, hidden, row, dst);
    } else {
      std::memset(dst, 0, sizeof(float) * static_cast<size_t>(hidden));
    }
  }
}

}  // namespace linnet::cpu
