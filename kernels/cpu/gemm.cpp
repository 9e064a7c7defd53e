// matmul_nt_packed: splits the panels over the rank's OpenMP threads (GEMV-sized steps:
// one contiguous share each; more rows: chunks taken as threads free up) and runs the
// active ISA path's panel kernel on each share (see gemm.h for the layout, the design and the
// fixed reduction order). Why OpenMP and not a pool of our own: it comes with the
// compiler (libgomp, no extra package), a parallel region costs about a microsecond,
// and OMP_* settings work as users of other runtimes know them; threads.h pins it.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <omp.h>

#include "common/error.h"

namespace linnet::cpu {

void pack_weight(const void* w, DType wt, int64_t n, int64_t k, void* packed) {
  if (is_quantized(wt)) throw Error("pack_weight takes f32, bf16 or f16 weights (int8 / int4: quantize_pack_weight)", "pack_weight");
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

int64_t quantized_matrix_bytes(int64_t n, int64_t k, int64_t group_size, DType wt) {
  const int64_t bits = wt == DType::kI4 ? 4 : 8;
  const int64_t panels = (n + kPanel - 1) / kPanel;
  const int64_t value_bytes = (panels * kPanel * k * bits / 8 + 63) / 64 * 64;
  const int64_t per_group = bits == 4 ? 2 : 1;  // scale (+ min)
  return kQuantHeaderBytes + value_bytes +
         per_group * panels * (k / group_size) * kPanel * static_cast<int64_t>(sizeof(float));
}

namespace {

// int4, one group of g values (gemm.h): the (s, m, q) of least squared error among
// round-to-nearest over [min, max] and 20 rescalings of it, each refit by least squares.
// All of it in double with sums in ascending order, so a sequential reference (the
// numpy one in scripts/make_quant_fixtures.py) reproduces it exactly.
void quantize_group_int4(const float* w, int64_t g, uint8_t* q, float& s_out, float& m_out) {
  for (int64_t i = 0; i < g; ++i) {
    if (!std::isfinite(w[i])) {  // NaN or inf: the group's outputs become NaN, as in f32
      for (int64_t j = 0; j < g; ++j) q[j] = 0;
      s_out = m_out = std::numeric_limits<float>::quiet_NaN();
      return;
    }
  }
  double mn = w[0], mx = w[0];
  for (int64_t i = 1; i < g; ++i) {
    mn = std::min(mn, static_cast<double>(w[i]));
    mx = std::max(mx, static_cast<double>(w[i]));
  }
  if (!(mx > mn)) {  // constant: q = 0, m = the value
    for (int64_t i = 0; i < g; ++i) q[i] = 0;
    s_out = 0.0f;
    m_out = static_cast<float>(mn);  // q - 8 times 0, plus the value
    return;
  }
  const double n = static_cast<double>(g);
  uint8_t cand[1024];
  double sw = 0, sww = 0;
  for (int64_t i = 0; i < g; ++i) {
    const double wi = w[i];
    sw += wi;
    sww += wi * wi;
  }
  double best_err = 0, best_s = 0, best_m = 0;
  for (int step = -1; step <= 20; ++step) {
    // step -1: round to nearest with s = (max - min) / 15, m = min; else iscale =
    // (15 + (step - 10) / 10) / (max - min) and the least-squares (s, m) for its q.
    const double iscale = step < 0 ? 15.0 / (mx - mn) : (15.0 + (step - 10) * 0.1) / (mx - mn);
    double sq = 0, sqq = 0, sqw = 0;
    for (int64_t i = 0; i < g; ++i) {
      const double wi = w[i];
      const double v = std::min(15.0, std::max(0.0, std::nearbyint(iscale * (wi - mn))));
      cand[i] = static_cast<uint8_t>(v);
      sq += v;
      sqq += v * v;
      sqw += v * wi;
    }
    double s = 0, m = 0;
    if (step < 0) {
      s = (mx - mn) / 15.0;
      m = mn;
    } else {
      const double det = n * sqq - sq * sq;
      if (!(det > 0)) continue;
      s = (n * sqw - sq * sw) / det;
      m = (sqq * sw - sq * sqw) / det;
      if (!(s > 0)) continue;
    }
    // sum (s q + m - w)^2 from the sums, in this order (the numpy reference's too).
    const double err = sww - 2.0 * s * sqw - 2.0 * m * sw + s * s * sqq + 2.0 * s * m * sq + n * m * m;
    if (step < 0 || err < best_err) {
      best_err = err;
      best_s = s;
      best_m = m;
      std::memcpy(q, cand, static_cast<size_t>(g));
    }
  }
  // Stored as the offset of q - 8 (w = (q - 8) s + m'), so the kernels' two sums,
  // s * sum(x (q - 8)) and m' * sum(x), are centred and cancel less in f32.
  s_out = static_cast<float>(best_s);
  m_out = static_cast<float>(best_m + 8.0 * best_s);
}

}  // namespace

namespace {

// The packed form of an [n, k] int8 / int4 matrix being written (gemm.h's layout): the
// constructor checks `wt` and the group size (int4: even, at most `max_int4_group`),
// zeroes the buffer and writes the header; then each output column's group scales
// (int4: and offsets) and values go to their places. `where` names the caller in errors.
class QuantWriter {
 public:
  QuantWriter(void* packed, int64_t n, int64_t k, int64_t group_size, DType wt, const char* where,
              int64_t max_int4_group)
      : k_(k), int4_(wt == DType::kI4) {
    if (wt != DType::kI8 && wt != DType::kI4) {
      throw Error(std::string(where) + " makes int8 or int4", where, "", dtype_name(wt));
    }
    const bool bounded = max_int4_group < std::numeric_limits<int64_t>::max();
    if (group_size < 1 || k % group_size != 0 ||
        (int4_ && (group_size % 2 != 0 || group_size > max_int4_group))) {
      throw Error("the weight group size must divide the matrix's input width" +
                      std::string(int4_ ? " and be even (int4 packs two k steps a byte)" : "") +
                      (int4_ && bounded ? ", at most " + std::to_string(max_int4_group) : std::string()),
                  where, "a divisor of " + std::to_string(k), std::to_string(group_size));
    }
    groups_ = k / group_size;
    std::memset(packed, 0, static_cast<size_t>(quantized_matrix_bytes(n, k, group_size, wt)));
    *static_cast<QuantHeader*>(packed) = QuantHeader{group_size, groups_, k, (n + kPanel - 1) / kPanel, int4_ ? 4 : 8};
    const detail::QuantView v = detail::quant_view(packed);
    values_ = reinterpret_cast<uint8_t*>(const_cast<int8_t*>(v.values));
    scales_ = const_cast<float*>(v.scales);
    mins_ = const_cast<float*>(v.mins);
  }
  int64_t groups() const { return groups_; }
  // Column j's group g: scale s and, for int4, offset m (ignored for int8).
  void set_group(int64_t j, int64_t g, float s, float m) const {
    const int64_t at = ((j / kPanel) * groups_ + g) * kPanel + j % kPanel;
    scales_[at] = s;
    if (int4_) mins_[at] = m;
  }
  // Column j's value at input c: int8 its q (two's complement), int4 its q in [0, 15]
  // (pair c / 2, byte j % kPanel, nibble c % 2).
  void set_value(int64_t j, int64_t c, uint8_t code) const {
    const int64_t p = j / kPanel, lane = j % kPanel;
    if (int4_) {
      values_[p * kPanel * k_ / 2 + (c / 2) * kPanel + lane] |= static_cast<uint8_t>((code & 15) << (4 * (c % 2)));
    } else {
      values_[p * kPanel * k_ + c * kPanel + lane] = code;
    }
  }

 private:
  int64_t k_, groups_ = 0;
  bool int4_;
  uint8_t* values_ = nullptr;
  float* scales_ = nullptr;
  float* mins_ = nullptr;
};

}  // namespace

void quantize_pack_weight(const float* w, int64_t n, int64_t k, int64_t group_size, void* packed, DType wt) {
  const QuantWriter out(packed, n, k, group_size, wt, "quantize_pack_weight", 1024);  // 1024: q4's size below
  const bool int4 = wt == DType::kI4;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    const float* row = w + j * k;
    uint8_t q4[1024];
    for (int64_t g = 0; g < out.groups(); ++g) {
      const int64_t c0 = g * group_size;
      if (int4) {
        float s = 0, m = 0;
        quantize_group_int4(row + c0, group_size, q4, s, m);
        out.set_group(j, g, s, m);
        for (int64_t c = c0; c < c0 + group_size; ++c) out.set_value(j, c, q4[c - c0]);
        continue;
      }
      float amax = 0.0f;
      bool finite = true;
      for (int64_t c = c0; c < c0 + group_size; ++c) {
        amax = std::max(amax, std::fabs(row[c]));
        finite = finite && std::isfinite(row[c]);
      }
      // A NaN or inf weight makes its group's scale NaN (q = 0), so the outputs it feeds
      // are NaN, as they are in f32, wherever it sits in the group.
      const float s = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
      out.set_group(j, g, s, 0.0f);
      if (!(s > 0.0f)) continue;
      for (int64_t c = c0; c < c0 + group_size; ++c) {
        const float q = std::nearbyint(row[c] / s);  // round half to even (the default mode)
        out.set_value(j, c, static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f))));
      }
    }
  }
}

void pack_quantized_weight(const uint8_t* codes, const float* scales, const float* offsets, int64_t n, int64_t k,
                           int64_t group_size, void* packed, DType wt) {
  const QuantWriter out(packed, n, k, group_size, wt, "pack_quantized_weight", std::numeric_limits<int64_t>::max());
  if (wt == DType::kI4 && offsets == nullptr) throw Error("int4 needs its offsets", "pack_quantized_weight");
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t g = 0; g < out.groups(); ++g)
      out.set_group(j, g, scales[j * out.groups() + g], offsets ? offsets[j * out.groups() + g] : 0.0f);
    for (int64_t c = 0; c < k; ++c) out.set_value(j, c, codes[j * k + c]);
  }
}

namespace {

std::atomic<int> g_int4_activations{static_cast<int>(DType::kF32)};

// The int8-activation mode's x, quantized once a call (over the threads for many rows)
// and read by every thread.
struct ActScratch {
  std::vector<int8_t> xq;
  std::vector<float> d, xs;
  std::vector<int32_t> t8;
};
thread_local ActScratch t_act;
// x packed by tile for the AVX-512 blocked path (detail::pack_x_by_tile).
thread_local std::vector<float> t_xpack;

// The int8-activation mode's kernel on `isa`'s path, and its name.
struct Q4A8Kernel {
  decltype(&detail::gemm_panels_q4a8_generic) fn;
  const char* name;
};
Q4A8Kernel q4a8_kernel(Isa isa) {
  static const bool vnni = detail::has_avx512_vnni();
  if (isa == Isa::kGeneric) return {detail::gemm_panels_q4a8_generic, "generic"};
  if (isa == Isa::kAvx512 && vnni) return {detail::gemm_panels_q4a8_avx512_vnni, "avx512 vnni"};
  return {detail::gemm_panels_q4a8_avx2, "avx2"};
}

// Splits an [m, k] x [k, n] product over the rank's threads and runs
// `share(r0, r1, p0, p1)` (rows [r0, r1), panels [p0, p1)) on each share (see the file
// comment). With `row_chunks`, a step of at least two row blocks (detail::row_block: a
// block's x stays in L2) is also cut into row chunks of one block (the last takes the
// remainder, so every chunk has more than 2 rows and runs the blocked path), taken
// chunk row by chunk row: a tall, narrow product (down_proj over a long pack) then reads
// each row's x once per chunk row instead of once per panel chunk.
template <class Share>
void split_panels(int64_t m, int64_t k, int64_t n, bool row_chunks, const Share& share) {
  const int64_t panels = (n + kPanel - 1) / kPanel;
  // Small GEMMs stay on one thread (a parallel region costs more than they do).
  const int64_t flops = 2 * m * k * n;
  const int threads = flops < (int64_t{1} << 17) ? 1 : static_cast<int>(std::min<int64_t>(num_threads(), panels));
  if (threads <= 1) {
    share(0, m, 0, panels);
    return;
  }
  if (m <= 2) {
    // GEMV-sized: one contiguous run of panels per thread, streamed front to back.
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num(), T = omp_get_num_threads();
      const int64_t p0 = panels * t / T, p1 = panels * (t + 1) / T;
      if (p1 > p0) share(0, m, p0, p1);
    }
    return;
  }
  // More rows: chunks of an even number of panels (about 8 per thread) handed out as
  // threads free up, so a thread that lost its core for a while (a shared machine) is
  // not waited for over half the GEMM. A chunk is computed whole by one thread, so the
  // split changes no bit.
  const int64_t rb = detail::row_block(k);
  const int64_t rchunks = row_chunks && m >= 2 * rb ? m / rb : 1;
  const int64_t chunk = std::max<int64_t>(2, panels / (int64_t{8} * threads) / 2 * 2);
  const int64_t pchunks = (panels + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t c = 0; c < rchunks * pchunks; ++c) {
    const int64_t rc = c / pchunks, pc = c % pchunks;
    const int64_t r0 = rc * rb, r1 = rc + 1 == rchunks ? m : r0 + rb;
    share(r0, r1, pc * chunk, std::min(panels, (pc + 1) * chunk));
  }
}

}  // namespace

void detail::pack_x_by_tile(const float* x, int64_t m, int64_t k, float* xp) {
  constexpr int64_t T = kAvx512TileRows;
  const int64_t tiles = (m + T - 1) / T;
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (m * k >= (int64_t{1} << 16))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t rows = std::min(T, m - t * T);
    float* dst = xp + t * T * k;
    for (int64_t i = 0; i < rows; ++i) {
      const float* src = x + (t * T + i) * k;
      for (int64_t c = 0; c < k; ++c) dst[c * T + i] = src[c];
    }
  }
}

void set_int4_activation_dtype(DType dt) {
  if (dt != DType::kF32 && dt != DType::kI8) {
    throw Error("int4 weights multiply f32 or int8 activations", "set_int4_activation_dtype", "f32 or i8", dtype_name(dt));
  }
  g_int4_activations.store(static_cast<int>(dt));
}

DType int4_activation_dtype() { return static_cast<DType>(g_int4_activations.load()); }

const char* int8_activation_kernel(Isa isa) { return q4a8_kernel(isa).name; }

void matmul_nt_packed_isa(Isa isa, const float* x, const void* packed, DType wt, float* out, int64_t m,
                          int64_t k, int64_t n) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    std::fill(out, out + m * n, 0.0f);
    return;
  }
  if (!isa_supported(isa)) throw Error("this CPU cannot run the kernel path", "matmul_nt", "generic", isa_name(isa));
  if (wt == DType::kI4 && int4_activation_dtype() == DType::kI8) {
    const detail::QuantView qv = detail::quant_view(packed);
    if (qv.group_size % kActBlock != 0) {
      throw Error("int8 activations need int4 groups of a multiple of " + std::to_string(kActBlock) + " inputs",
                  "--activation-dtype int8", "a group size divisible by 32", std::to_string(qv.group_size));
    }
    ActScratch& a = t_act;
    const auto blocks = static_cast<size_t>(m * (k / kActBlock));
    a.xq.resize(static_cast<size_t>(m * k));
    a.d.resize(blocks);
    a.t8.resize(blocks);
    a.xs.resize(static_cast<size_t>(m * qv.groups));
    // Row by row (the same bits however the rows are split); many rows over the threads.
    const int64_t blocks_per_row = k / kActBlock;
#pragma omp parallel for schedule(static) num_threads(num_threads()) if (m >= 8 && m * k >= (int64_t{1} << 16))
    for (int64_t r = 0; r < m; ++r) {
      detail::quantize_activations(x + r * k, k, a.xq.data() + r * k, a.d.data() + r * blocks_per_row,
                                   a.t8.data() + r * blocks_per_row);
      detail::group_sums(x + r * k, 1, k, qv.group_size, a.xs.data() + r * qv.groups);
    }
    const detail::ActView av{a.xq.data(), a.d.data(), a.t8.data(), a.xs.data()};
    const auto fn = q4a8_kernel(isa).fn;
    split_panels(m, k, n, false, [&](int64_t, int64_t, int64_t p0, int64_t p1) { fn(av, packed, out, m, k, n, p0, p1); });
    return;
  }
  if (isa == Isa::kAvx512 && detail::avx512_packs_x(wt, m)) {
    // The AVX-512 tiles read x packed by tile: once a call, shared by the threads.
    std::vector<float>& xp = t_xpack;
    const int64_t tiles = (m + detail::kAvx512TileRows - 1) / detail::kAvx512TileRows;
    if (xp.size() < static_cast<size_t>(tiles * detail::kAvx512TileRows * k)) {
      xp.resize(static_cast<size_t>(tiles * detail::kAvx512TileRows * k));
    }
    detail::pack_x_by_tile(x, m, k, xp.data());
    split_panels(m, k, n, true, [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
      // Row chunks start at multiples of row_block (of 12): tile r0 / 12 of the packing.
      detail::gemm_panels_avx512(xp.data() + r0 * k, packed, wt, out + r0 * n, r1 - r0, k, n, p0, p1);
    });
    return;
  }
  auto panels_fn = isa == Isa::kAvx512 ? detail::gemm_panels_avx512
                   : isa == Isa::kAvx2 ? detail::gemm_panels_avx2
                                       : detail::gemm_panels_generic;
  split_panels(m, k, n, true, [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1) {
    panels_fn(x + r0 * k, packed, wt, out + r0 * n, r1 - r0, k, n, p0, p1);
  });
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
  if (wt == DType::kI8 || wt == DType::kI4) {
    const detail::QuantView v = detail::quant_view(packed);
    const int64_t at = (row / kPanel) * v.groups * kPanel + row % kPanel;
    for (int64_t c = 0; c < k; ++c) {
      const int64_t g = at + c / v.group_size * kPanel;
      if (wt == DType::kI8) {
        out[c] = static_cast<float>(v.values[base + c * kPanel]) * v.scales[g];
      } else {  // (q - 8) s + m, one rounding each (the embedding lookup; GEMMs fold differently, gemm.h)
        const auto* b = reinterpret_cast<const uint8_t*>(v.values) + (row / kPanel) * kPanel * k / 2 + (c / 2) * kPanel + row % kPanel;
        out[c] = static_cast<float>(((*b >> (4 * (c % 2))) & 15) - 8) * v.scales[g] + v.mins[g];
      }
    }
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
