// The portable GEMM path over packed panels (gemm.h): each output element one f32 chain
// over ascending k, multiply then add, R <= 6 rows x one panel of 16 columns per tile;
// int8 / int4 weights: a partial sum over each group's x * q (int4: q - 8), times the
// group's scale (int4: plus the group's sum of x times its offset).
#include <cstring>

#include "kernels/cpu/gemm.h"

namespace linnet::cpu::detail {

float load_weight(const void* w, DType wt, int64_t i) {
  switch (wt) {
    case DType::kF32: return static_cast<const float*>(w)[i];
    case DType::kBF16: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kF16: {
      const uint16_t h = static_cast<const uint16_t*>(w)[i];
      const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
      uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
      if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
      } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
      } else if (man == 0) {
        bits = sign;
      } else {  // subnormal half: normalize
        int e = -1;
        do {
          man <<= 1;
          ++e;
        } while ((man & 0x400u) == 0);
        bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
      }
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kI32:
    case DType::kI64:
    case DType::kF8E4M3:
    case DType::kI8:
    case DType::kI4: break;  // not element arrays: i32 / i64 are no weights; int8 / int4 carry scales (quant_view)
  }
  return 0.0f;
}

void gemm_panels_generic(const float* x, const void* packed, DType wt, float* out, int64_t m, int64_t k,
                         int64_t n, int64_t p0, int64_t p1) {
  const int64_t mb = row_block(k);
  const QuantView q = is_quantized(wt) ? quant_view(packed) : QuantView{};
  const auto* nib = reinterpret_cast<const uint8_t*>(q.values);
  float wrow[kPanel];
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t base = p * kPanel * k;
      const int64_t cols = n - p * kPanel < kPanel ? n - p * kPanel : kPanel;
      for (int64_t r = r0; r < r1; r += 6) {
        const int64_t R = r1 - r < 6 ? r1 - r : 6;
        float acc[6][kPanel] = {};
        if (is_quantized(wt)) {  // per group: a chain over x * q from zero, then + part * s (gemm.h)
          float xs[6] = {};  // int4: the rows' sums over the group's x
          for (int64_t g = 0; g < q.groups; ++g) {
            float part[6][kPanel] = {};
            if (wt == DType::kI4) {
              for (int64_t i = 0; i < R; ++i) group_sums(x + (r + i) * k + g * q.group_size, 1, q.group_size, q.group_size, &xs[i]);
            }
            for (int64_t c = g * q.group_size; c < (g + 1) * q.group_size; ++c) {
              if (wt == DType::kI4) {
                for (int64_t l = 0; l < kPanel; ++l)
                  wrow[l] = static_cast<float>(((nib[p * kPanel * k / 2 + (c / 2) * kPanel + l] >> (4 * (c % 2))) & 15) - 8);
              } else {
                for (int64_t l = 0; l < kPanel; ++l) wrow[l] = static_cast<float>(q.values[base + c * kPanel + l]);
              }
              for (int64_t i = 0; i < R; ++i) {
                const float xv = x[(r + i) * k + c];
                for (int64_t l = 0; l < kPanel; ++l) part[i][l] = part[i][l] + xv * wrow[l];
              }
            }
            const float* s = q.scales + (p * q.groups + g) * kPanel;
            for (int64_t i = 0; i < R; ++i)
              for (int64_t l = 0; l < kPanel; ++l) acc[i][l] = acc[i][l] + part[i][l] * s[l];
            if (wt == DType::kI4) {
              const float* mn = q.mins + (p * q.groups + g) * kPanel;
              for (int64_t i = 0; i < R; ++i)
                for (int64_t l = 0; l < kPanel; ++l) acc[i][l] = acc[i][l] + xs[i] * mn[l];
            }
          }
        } else {
          for (int64_t c = 0; c < k; ++c) {
            for (int64_t l = 0; l < kPanel; ++l) wrow[l] = load_weight(packed, wt, base + c * kPanel + l);
            for (int64_t i = 0; i < R; ++i) {
              const float xv = x[(r + i) * k + c];
              for (int64_t l = 0; l < kPanel; ++l) acc[i][l] = acc[i][l] + xv * wrow[l];
            }
          }
        }
        for (int64_t i = 0; i < R; ++i) std::memcpy(out + (r + i) * n + p * kPanel, acc[i], cols * sizeof(float));
      }
    }
  }
}

}  // namespace linnet::cpu::detail

namespace linnet::cpu::detail {

// int8 activations for int4 weights (gemm.h): per block an exact integer sum, then the
// f32 steps of gemm.h, each a multiply then an add (this file is built without FMA).
void gemm_panels_q4a8_generic(const ActView& a, const void* packed, float* out, int64_t m, int64_t k, int64_t n,
                              int64_t p0, int64_t p1) {
  const QuantView q = quant_view(packed);
  const auto* nib = reinterpret_cast<const uint8_t*>(q.values);
  const int64_t blocks = k / kActBlock, per_group = q.group_size / kActBlock;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t cols = n - p * kPanel < kPanel ? n - p * kPanel : kPanel;
    const uint8_t* panel = nib + p * kPanel * k / 2;
    for (int64_t r = 0; r < m; ++r) {
      float acc[kPanel] = {};
      for (int64_t g = 0; g < q.groups; ++g) {
        float part[kPanel] = {};
        for (int64_t b = g * per_group; b < (g + 1) * per_group; ++b) {
          int32_t t[kPanel];
          for (int64_t l = 0; l < kPanel; ++l) t[l] = -a.t8[r * blocks + b];
          for (int64_t c = b * kActBlock; c < (b + 1) * kActBlock; ++c) {
            const int32_t xv = a.xq[r * k + c];
            for (int64_t l = 0; l < kPanel; ++l) t[l] += ((panel[(c / 2) * kPanel + l] >> (4 * (c % 2))) & 15) * xv;
          }
          const float d = a.d[r * blocks + b];
          for (int64_t l = 0; l < kPanel; ++l) part[l] = part[l] + static_cast<float>(t[l]) * d;
        }
        const float* s = q.scales + (p * q.groups + g) * kPanel;
        const float* mn = q.mins + (p * q.groups + g) * kPanel;
        const float xs = a.xs[r * q.groups + g];
        for (int64_t l = 0; l < kPanel; ++l) acc[l] = acc[l] + part[l] * s[l];
        for (int64_t l = 0; l < kPanel; ++l) acc[l] = acc[l] + xs * mn[l];
      }
      std::memcpy(out + r * n + p * kPanel, acc, static_cast<size_t>(cols) * sizeof(float));
    }
  }
}

}  // namespace linnet::cpu::detail
