// matmul_nt_packed: splits the panels over the rank's OpenMP threads (GEMV-sized steps:
// one contiguous share each; more rows: chunks taken as threads free up) and runs the
// active ISA path's panel kernel on each share (see gemm.h for the layout, the design and the
// fixed reduction order). Why OpenMP and not a pool of our own: it comes with the
// compiler (libgomp, no extra package), a parallel region costs about a microsecond,
// and OMP_* settings work as users of other runtimes know them; threads.h pins it.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <cstring>
#include <vector>

#include <omp.h>

#include "common/error.h"

namespace linnet::cpu {

void pack_weight(const void* w, DType wt, int64_t n, int64_t k, void* packed) {
  if (is_quantized(wt)) throw Error("pack_weight takes f32, bf16 or f16 weights (int8: quantize_pack_weight)", "pack_weight");
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

int64_t quantized_matrix_bytes(int64_t n, int64_t k, int64_t group_size) {
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t value_bytes = (panels * kPanel * k + 63) / 64 * 64;
  return kQuantHeaderBytes + value_bytes + panels * (k / group_size) * kPanel * static_cast<int64_t>(sizeof(float));
}

void quantize_pack_weight(const float* w, int64_t n, int64_t k, int64_t group_size, void* packed) {
  if (group_size < 1 || k % group_size != 0) {
    throw Error("the weight group size must divide the matrix's input width", "quantize_pack_weight",
                "a divisor of " + std::to_string(k), std::to_string(group_size));
  }
  const int64_t panels = (n + kPanel - 1) / kPanel, groups = k / group_size;
  std::memset(packed, 0, static_cast<size_t>(quantized_matrix_bytes(n, k, group_size)));
  auto* h = static_cast<QuantHeader*>(packed);
  *h = QuantHeader{group_size, groups, k, panels};
  const detail::QuantView v = detail::quant_view(packed);
  auto* values = const_cast<int8_t*>(v.values);
  auto* scales = const_cast<float*>(v.scales);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    const float* row = w + j * k;
    const int64_t p = j / kPanel, lane = j % kPanel;
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0.0f;
      for (int64_t c = g * group_size; c < (g + 1) * group_size; ++c) amax = std::max(amax, std::fabs(row[c]));
      const float s = amax / 127.0f;
      scales[(p * groups + g) * kPanel + lane] = s;
      if (s == 0.0f) continue;
      for (int64_t c = g * group_size; c < (g + 1) * group_size; ++c) {
        const float q = std::nearbyint(row[c] / s);  // round half to even (the default mode)
        values[p * kPanel * k + c * kPanel + lane] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
      }
    }
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
  if (is_quantized(wt)) throw Error("matmul_nt takes f32, bf16 or f16 weights", "matmul_nt", "", dtype_name(wt));
  std::vector<char> packed(static_cast<size_t>(packed_elements(n, k) * static_cast<int64_t>(dtype_size(wt))));
  pack_weight(w, wt, n, k, packed.data());
  matmul_nt_packed(x, packed.data(), wt, out, m, k, n);
}

void widen_to_f32(const void* w, DType wt, int64_t n, float* out) {
  if (is_quantized(wt)) throw Error("widen_to_f32 takes f32, bf16 or f16 weights", "widen_to_f32", "", dtype_name(wt));
  if (wt == DType::kF32) {
    std::memcpy(out, w, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = detail::load_weight(w, wt, i);
}

void unpack_row(const void* packed, DType wt, int64_t k, int64_t row, float* out) {
  const int64_t base = (row / kPanel) * kPanel * k + row % kPanel;
  if (wt == DType::kI8) {
    const detail::QuantView v = detail::quant_view(packed);
    const float* s = v.scales + (row / kPanel) * v.groups * kPanel + row % kPanel;
    for (int64_t c = 0; c < k; ++c) out[c] = static_cast<float>(v.values[base + c * kPanel]) * s[c / v.group_size * kPanel];
    return;
  }
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
