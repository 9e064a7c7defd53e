// The portable GEMM path: the fixed reduction order of gemm.h (eight lane sums over k,
// the same pairwise combine, then the k % 8 tail), in plain C++ with separate multiply
// and add, one output element at a time over 4-column groups that share the x row.
#include <cstring>

#include "kernels/cpu/gemm.h"

namespace linnet::cpu::detail {

inline float load_weight(const void* w, WeightType wt, int64_t i) {
  switch (wt) {
    case WeightType::kF32: return static_cast<const float*>(w)[i];
    case WeightType::kBF16: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case WeightType::kF16: {
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
  }
  return 0.0f;
}

namespace {

float dot(const float* x, const void* w, WeightType wt, int64_t w_off, int64_t k) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t kv = k / 8 * 8;
  for (int64_t kk = 0; kk < kv; kk += 8) {
    for (int l = 0; l < 8; ++l) lane[l] = lane[l] + x[kk + l] * load_weight(w, wt, w_off + kk + l);
  }
  float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (int64_t kk = kv; kk < k; ++kk) s = s + x[kk] * load_weight(w, wt, w_off + kk);
  return s;
}

}  // namespace

void gemm_columns_generic(const float* x, const void* w, WeightType wt, float* out, int64_t m, int64_t k, int64_t n,
                          int64_t j_begin, int64_t j_end) {
  const int64_t mb = row_block(k);
  for (int64_t r0 = 0; r0 < m; r0 += mb) {
    const int64_t r1 = r0 + mb < m ? r0 + mb : m;
    for (int64_t j = j_begin; j < j_end; ++j) {
      for (int64_t r = r0; r < r1; ++r) out[r * n + j] = dot(x + r * k, w, wt, j * k, k);
    }
  }
}

}  // namespace linnet::cpu::detail

namespace linnet::cpu {

void widen_to_f32(const void* w, WeightType wt, int64_t n, float* out) {
  if (wt == WeightType::kF32) {
    std::memcpy(out, w, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = detail::load_weight(w, wt, i);
}

void embedding_lookup_typed(const void* table, WeightType wt, int64_t vocab_begin, int64_t vocab_local,
                            int64_t hidden, const int32_t* ids, int64_t n, float* out) {
  const int64_t elem = weight_type_size(wt);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = static_cast<int64_t>(ids[i]) - vocab_begin;
    float* dst = out + i * hidden;
    if (row >= 0 && row < vocab_local) {
      widen_to_f32(static_cast<const char*>(table) + row * hidden * elem, wt, hidden, dst);
    } else {
      std::memset(dst, 0, sizeof(float) * static_cast<size_t>(hidden));
    }
  }
}

}  // namespace linnet::cpu
