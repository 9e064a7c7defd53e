// The CPU GEMM (kernels/cpu/gemm.h) on every ISA path this machine runs, plus generic:
// each weight storage type (f32, bf16, f16) against a double-precision reference on the
// same weights, over odd shapes (m = 1..33; k, n not multiples of the vector width, the
// 16-column panel or the 6-row tile; x, the packed weight and out starting one element
// past an aligned address); and the invariances the engine's batch and tp tests rely
// on: a row alone equals the same row among others bit for bit, and the thread count
// changes no bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "kernels/cpu/gemm.h"

namespace linnet::cpu {
namespace {

std::vector<Isa> paths() {
  std::vector<Isa> out = {Isa::kGeneric};
  if (isa_supported(Isa::kAvx2)) out.push_back(Isa::kAvx2);
  if (isa_supported(Isa::kAvx512)) out.push_back(Isa::kAvx512);
  return out;
}

uint16_t to_bf16(float f) {  // round to nearest even, as torch's .to(bfloat16)
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Weights of one storage type, with the exact f32 values they stand for.
struct Weights {
  std::vector<uint16_t> half;  // bf16 / f16 bits, or empty
  std::vector<float> f32;      // f32 storage, or empty
  std::vector<double> value;   // what each element is
};

Weights make_weights(DType wt, size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Weights w;
  w.value.resize(n + 1);
  if (wt == DType::kF32) {
    w.f32.resize(n + 1);
    for (size_t i = 0; i < n + 1; ++i) w.value[i] = w.f32[i] = d(g);
  } else if (wt == DType::kBF16) {
    w.half.resize(n + 1);
    for (size_t i = 0; i < n + 1; ++i) w.value[i] = from_bf16(w.half[i] = to_bf16(d(g)));
  } else {
    // f16: values k / 1024 for small integers k are exact halves; include a subnormal.
    w.half.resize(n + 1);
    std::uniform_int_distribution<int> e(-2048, 2048);
    for (size_t i = 0; i < n + 1; ++i) {
      const int q = e(g);
      // q / 1024 as IEEE half: build it through float and a reference conversion below.
      const float f = static_cast<float>(q) / 1024.0f;
      uint32_t b;
      std::memcpy(&b, &f, 4);
      const uint32_t sign = (b >> 16) & 0x8000u;
      const int exp = static_cast<int>((b >> 23) & 0xff) - 127 + 15;
      uint16_t h = static_cast<uint16_t>(sign);
      if (q != 0) h = static_cast<uint16_t>(sign | (exp << 10) | ((b >> 13) & 0x3ffu));
      w.half[i] = h;
      w.value[i] = f;
    }
    w.half[3] = 0x0001;  // the smallest subnormal, 2^-24
    w.value[3] = std::ldexp(1.0, -24);
    w.half[5] = 0x8200;  // -2^-15 (subnormal)
    w.value[5] = -std::ldexp(1.0, -15);
  }
  return w;
}

const void* data_at(const Weights& w, DType wt, size_t offset) {
  return wt == DType::kF32 ? static_cast<const void*>(w.f32.data() + offset)
                                : static_cast<const void*>(w.half.data() + offset);
}

// matmul_nt_packed_isa over a copy of row-major `w` packed one element past an aligned
// start (so no panel is aligned).
void matmul_nt_isa(Isa isa, const float* x, const void* w, DType wt, float* out, int64_t m, int64_t k,
                   int64_t n) {
  const int64_t es = static_cast<int64_t>(dtype_size(wt));
  std::vector<char> buf(static_cast<size_t>((packed_elements(n, k) + 1) * es));
  pack_weight(w, wt, n, k, buf.data() + es);
  matmul_nt_packed_isa(isa, x, buf.data() + es, wt, out, m, k, n);
}

const char* name(DType wt) { return wt == DType::kF32 ? "f32" : wt == DType::kBF16 ? "bf16" : "f16"; }

TEST(Gemm, MatchesADoubleReferenceOnOddShapes) {
  for (Isa isa : paths()) {
    for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 13, 31, 32, 33}) {
        for (auto [k, n] : {std::pair<int64_t, int64_t>{37, 23}, {64, 12}, {7, 5}, {129, 40}, {16, 33}}) {
          std::mt19937 g(static_cast<uint32_t>(m * 1000 + k));
          std::normal_distribution<float> d(0.0f, 1.0f);
          std::vector<float> x(static_cast<size_t>(m * k) + 1), out(static_cast<size_t>(m * n) + 1, 99.0f);
          for (auto& v : x) v = d(g);
          const Weights w = make_weights(wt, static_cast<size_t>(n * k), static_cast<uint32_t>(k * 7 + n));
          // One element past the start: no row is aligned to the vector width.
          matmul_nt_isa(isa, x.data() + 1, data_at(w, wt, 1), wt, out.data() + 1, m, k, n);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double ref = 0, mag = 0;
              for (int64_t t = 0; t < k; ++t) {
                const double p = double(x[1 + i * k + t]) * w.value[1 + j * k + t];
                ref += p;
                mag += std::fabs(p);
              }
              // f32 error bound of one chain of k multiply-adds.
              const double bound = (double(k) + 2) * std::ldexp(1.0, -24) * mag + 1e-30;
              ASSERT_NEAR(out[1 + i * n + j], ref, bound)
                  << isa_name(isa) << " " << name(wt) << " m " << m << " k " << k << " n " << n << " at " << i
                  << "," << j;
            }
          }
          EXPECT_EQ(out[0], 99.0f) << "wrote before out";
        }
      }
    }
  }
}

TEST(Gemm, ARowAloneEqualsTheSameRowAmongOthersAndThreadsChangeNoBit) {
  const int64_t k = 203, n = 77, m = 32;
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(m * k);
  for (auto& v : x) v = d(g);
  for (Isa isa : paths()) {
    for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
      const Weights w = make_weights(wt, n * k, 9);
      set_num_threads(1);
      std::vector<float> all(m * n), all2(m * n);
      matmul_nt_isa(isa, x.data(), data_at(w, wt, 0), wt, all.data(), m, k, n);
      set_num_threads(2);
      matmul_nt_isa(isa, x.data(), data_at(w, wt, 0), wt, all2.data(), m, k, n);
      EXPECT_EQ(0, std::memcmp(all.data(), all2.data(), all.size() * 4)) << isa_name(isa) << " " << name(wt);
      for (int64_t r : {0, 5, 30, 31}) {
        std::vector<float> one(n);
        matmul_nt_isa(isa, x.data() + r * k, data_at(w, wt, 0), wt, one.data(), 1, k, n);
        EXPECT_EQ(0, std::memcmp(one.data(), all.data() + r * n, n * 4)) << isa_name(isa) << " " << name(wt)
                                                                         << " row " << r;
      }
      set_num_threads(1);
    }
  }
}

// A GEMM big enough to be split over threads (the small ones stay on one): the split
// changes no bit either.
TEST(Gemm, ThreadSplitOfALargeGemmChangesNoBit) {
  const int64_t k = 576, n = 1536, m = 9;
  std::mt19937 g(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(m * k), w(n * k);
  for (auto& v : x) v = d(g);
  for (auto& v : w) v = d(g);
  for (Isa isa : paths()) {
    std::vector<float> a(m * n), b(m * n);
    set_num_threads(1);
    matmul_nt_isa(isa, x.data(), w.data(), DType::kF32, a.data(), m, k, n);
    set_num_threads(3);
    matmul_nt_isa(isa, x.data(), w.data(), DType::kF32, b.data(), m, k, n);
    set_num_threads(1);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << isa_name(isa);
  }
}

// Long k with many rows: the AVX-512 path cuts k into blocks (of at most 256) and
// carries each partial sum through out, which must stay one chain in ascending k: the
// result matches the double reference, and each row equals the same row computed alone
// (m = 1 runs the unblocked GEMV kernel) bit for bit, for every weight type.
TEST(Gemm, KBlocksKeepOneChainPerElement) {
  const int64_t k = 601, n = 70, m = 30;
  std::mt19937 g(17);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(m * k);
  for (auto& v : x) v = d(g);
  for (Isa isa : paths()) {
    for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
      const Weights w = make_weights(wt, n * k, 21);
      std::vector<float> all(m * n);
      matmul_nt_isa(isa, x.data(), data_at(w, wt, 0), wt, all.data(), m, k, n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0, mag = 0;
          for (int64_t t = 0; t < k; ++t) {
            const double p = double(x[i * k + t]) * w.value[j * k + t];
            ref += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(all[i * n + j], ref, (double(k) + 2) * std::ldexp(1.0, -24) * mag + 1e-30)
              << isa_name(isa) << " " << name(wt) << " at " << i << "," << j;
        }
      }
      for (int64_t r : {0, 11, 12, 29}) {
        std::vector<float> one(n);
        matmul_nt_isa(isa, x.data() + r * k, data_at(w, wt, 0), wt, one.data(), 1, k, n);
        EXPECT_EQ(0, std::memcmp(one.data(), all.data() + r * n, n * 4)) << isa_name(isa) << " " << name(wt)
                                                                         << " row " << r;
      }
    }
  }
}

// The packed layout: unpack_row and the embedding lookup read back each row exactly.
TEST(Gemm, PackedRowsReadBackExactly) {
  for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int64_t n = 37, k = 11;
    const Weights w = make_weights(wt, n * k, 3);
    const int64_t es = static_cast<int64_t>(dtype_size(wt));
    std::vector<char> packed(static_cast<size_t>(packed_elements(n, k) * es));
    pack_weight(data_at(w, wt, 0), wt, n, k, packed.data());
    std::vector<float> row(k);
    for (int64_t j = 0; j < n; ++j) {
      unpack_row(packed.data(), wt, k, j, row.data());
      for (int64_t c = 0; c < k; ++c) ASSERT_EQ(row[c], w.value[j * k + c]) << name(wt) << " " << j << "," << c;
    }
    const std::vector<int32_t> ids = {9, 40, 10, 46};  // outside, then rows 30, 0, 36 of a slice at 10
    std::vector<float> out(4 * k, 7.0f);
    embedding_lookup_packed(packed.data(), wt, 10, n, k, ids.data(), 4, out.data());
    for (int64_t c = 0; c < k; ++c) {
      EXPECT_EQ(out[c], 0.0f);
      EXPECT_EQ(out[k + c], w.value[30 * k + c]);
      EXPECT_EQ(out[2 * k + c], w.value[c]);
      EXPECT_EQ(out[3 * k + c], w.value[36 * k + c]);
    }
  }
}

// --- int8 weights (gemm.h: group-wise absmax, dequantized q * s in f32) ---

// The scheme, written out from its definition (not with the kernels' code): per row j
// and group g, s = max |w| / 127 (f32), q = round-half-even(w / s) clamped to
// [-127, 127]; the weight stands for float(q) * s (one f32 product).
std::vector<float> dequantized_reference(const std::vector<float>& w, int64_t n, int64_t k, int64_t group) {
  std::vector<float> out(w.size());
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t g0 = 0; g0 < k; g0 += group) {
      float amax = 0.0f;
      for (int64_t c = g0; c < g0 + group; ++c) amax = std::max(amax, std::fabs(w[j * k + c]));
      const float s = amax / 127.0f;
      for (int64_t c = g0; c < g0 + group; ++c) {
        float q = s == 0.0f ? 0.0f : std::nearbyint(w[j * k + c] / s);
        q = std::min(127.0f, std::max(-127.0f, q));
        out[j * k + c] = q * s;
      }
    }
  }
  return out;
}

// quantize_pack_weight into an 8-byte aligned buffer (the header's alignment).
std::vector<uint64_t> quantize(const std::vector<float>& w, int64_t n, int64_t k, int64_t group,
                               DType wt = DType::kI8) {
  std::vector<uint64_t> buf(static_cast<size_t>((quantized_matrix_bytes(n, k, group, wt) + 7) / 8));
  quantize_pack_weight(w.data(), n, k, group, buf.data(), wt);
  return buf;
}

TEST(GemmInt8, DequantizedRowsMatchTheSchemeAndEachWeightIsWithinHalfAStep) {
  for (auto [n, k, group] : {std::tuple<int64_t, int64_t, int64_t>{37, 64, 16}, {16, 96, 32}, {5, 12, 12}, {20, 10, 1}}) {
    std::mt19937 g(static_cast<uint32_t>(n * k + group));
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(n * k));
    for (auto& v : w) v = d(g);
    for (int64_t c = 0; c < group; ++c) w[static_cast<size_t>(2 * k + c)] = 0.0f;  // an all-zero group: scale 0
    const auto packed = quantize(w, n, k, group);
    const std::vector<float> ref = dequantized_reference(w, n, k, group);
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t j = 0; j < n; ++j) {
      unpack_row(packed.data(), DType::kI8, k, j, row.data());
      for (int64_t c = 0; c < k; ++c) {
        ASSERT_EQ(row[c], ref[j * k + c]) << "n " << n << " k " << k << " G " << group << " at " << j << "," << c;
        float amax = 0.0f;
        for (int64_t t = c / group * group; t < (c / group + 1) * group; ++t) amax = std::max(amax, std::fabs(w[j * k + t]));
        ASSERT_LE(std::fabs(row[c] - w[j * k + c]), amax / 127.0f * 0.5f * (1 + 1e-5f) + 1e-30f);
      }
    }
    EXPECT_EQ(row.size(), static_cast<size_t>(k));
  }
  std::vector<float> w(6 * 10, 1.0f);
  std::vector<uint64_t> buf(64);
  EXPECT_THROW(quantize_pack_weight(w.data(), 6, 10, 4, buf.data()), Error);  // 4 does not divide 10
  EXPECT_THROW(quantize_pack_weight(w.data(), 6, 10, 0, buf.data()), Error);
}

TEST(GemmInt8, MatchesADoubleReferenceOnTheDequantizedWeights) {
  for (Isa isa : paths()) {
    for (int64_t m : {1, 2, 3, 5, 12, 13, 31, 40}) {
      for (auto [k, n, group] : {std::tuple<int64_t, int64_t, int64_t>{64, 23, 16}, {96, 40, 32}, {7, 5, 7}, {600, 33, 8}, {48, 70, 48}, {600, 33, 300}}) {
        std::mt19937 g(static_cast<uint32_t>(m * 1000 + k + n));
        std::normal_distribution<float> d(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(m * k) + 1), w(static_cast<size_t>(n * k)),
            out(static_cast<size_t>(m * n) + 1, 99.0f);
        for (auto& v : x) v = d(g);
        for (auto& v : w) v = d(g);
        const auto packed = quantize(w, n, k, group);
        const std::vector<float> wd = dequantized_reference(w, n, k, group);
        matmul_nt_packed_isa(isa, x.data() + 1, packed.data(), DType::kI8, out.data() + 1, m, k, n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double ref = 0, mag = 0;
            for (int64_t t = 0; t < k; ++t) {
              const double p = double(x[1 + i * k + t]) * double(wd[j * k + t]);
              ref += p;
              mag += std::fabs(p);
            }
            // One chain per group plus one product and sum per group, and the dequantized
            // weights' own rounding (q * s in f32).
            ASSERT_NEAR(out[1 + i * n + j], ref, (double(k) + double(k / group) + 4) * std::ldexp(1.0, -24) * mag + 1e-30)
                << isa_name(isa) << " m " << m << " k " << k << " n " << n << " G " << group << " at " << i << "," << j;
          }
        }
        EXPECT_EQ(out[0], 99.0f) << "wrote before out";
      }
    }
  }
}

// The invariances of the f32 path hold for int8: a row alone (the GEMV kernel, in
// registers) equals the same row among others (the blocked kernel, widened into a
// buffer, k blocks of whole groups) bit for bit, threads change no bit, and the AVX2 and
// AVX-512 paths agree bit for bit (the same partial chains, the same fused scaling).
TEST(GemmInt8, ARowAloneEqualsItsRowInABatchAndPathsAgree) {
  const int64_t k = 640, n = 77, m = 32, group = 64;
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(m * k), w(n * k);
  for (auto& v : x) v = d(g);
  for (auto& v : w) v = d(g);
  for (DType wt : {DType::kI8, DType::kI4}) {
    const auto packed = quantize(w, n, k, group, wt);
    std::vector<std::vector<float>> by_path;
    for (Isa isa : paths()) {
      std::vector<float> all(m * n), all2(m * n);
      set_num_threads(1);
      matmul_nt_packed_isa(isa, x.data(), packed.data(), wt, all.data(), m, k, n);
      set_num_threads(2);
      matmul_nt_packed_isa(isa, x.data(), packed.data(), wt, all2.data(), m, k, n);
      EXPECT_EQ(0, std::memcmp(all.data(), all2.data(), all.size() * 4)) << isa_name(isa) << " " << dtype_name(wt);
      for (int64_t r : {0, 5, 12, 30, 31}) {
        for (int64_t rows : {1, 2, 3}) {
          const int64_t mm = r + rows <= m ? rows : 1;
          std::vector<float> one(mm * n);
          matmul_nt_packed_isa(isa, x.data() + r * k, packed.data(), wt, one.data(), mm, k, n);
          EXPECT_EQ(0, std::memcmp(one.data(), all.data() + r * n, mm * n * 4))
              << isa_name(isa) << " " << dtype_name(wt) << " rows " << r << " + " << mm;
        }
      }
      set_num_threads(1);
      if (isa != Isa::kGeneric) by_path.push_back(all);
    }
    for (size_t i = 1; i < by_path.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(by_path[0].data(), by_path[i].data(), m * n * 4)) << dtype_name(wt);
    }
  }
}

// int4: every group's (s, m, q) is at least as close to the weights, in squared error,
// as plain round-to-nearest over [min, max] (the search's first candidate); q in
// [0, 15]; a constant group is exact; odd group sizes are refused.
TEST(GemmInt4, TheSearchIsNeverWorseThanRoundToNearestAndOftenBetter) {
  const int64_t n = 37, k = 128, group = 32;
  std::mt19937 g(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> w(n * k);
  for (auto& v : w) v = d(g);
  for (int64_t c = 0; c < group; ++c) w[static_cast<size_t>(k + c)] = 0.25f;  // a constant group
  const auto packed = quantize(w, n, k, group, DType::kI4);
  std::vector<float> row(k);
  int better = 0, groups = 0;
  for (int64_t j = 0; j < n; ++j) {
    unpack_row(packed.data(), DType::kI4, k, j, row.data());
    for (int64_t g0 = 0; g0 < k; g0 += group) {
      double mn = w[j * k + g0], mx = mn;
      for (int64_t c = g0; c < g0 + group; ++c) {
        mn = std::min<double>(mn, w[j * k + c]);
        mx = std::max<double>(mx, w[j * k + c]);
      }
      double rtn = 0, got = 0;
      for (int64_t c = g0; c < g0 + group; ++c) {
        const double v = w[j * k + c];
        const double s = (mx - mn) / 15;
        const double q = s > 0 ? std::min(15.0, std::max(0.0, std::nearbyint((v - mn) / s))) : 0.0;
        rtn += (q * s + mn - v) * (q * s + mn - v);
        got += (row[c] - v) * (row[c] - v);
      }
      if (mx == mn) {
        EXPECT_EQ(got, 0.0) << "constant group " << j << "," << g0;
        continue;
      }
      ++groups;
      EXPECT_LE(got, rtn * (1 + 1e-5) + 1e-12) << "row " << j << " group " << g0 / group;
      if (got < rtn * 0.98) ++better;
    }
  }
  EXPECT_GT(better, groups / 2) << better << " of " << groups << " groups improved by 2% or more";
  std::vector<uint64_t> buf(1024);
  EXPECT_THROW(quantize_pack_weight(w.data(), 4, 12, 3, buf.data(), DType::kI4), Error);  // odd group
}

TEST(GemmInt4, MatchesADoubleReferenceOnTheDequantizedWeights) {
  for (Isa isa : paths()) {
    for (int64_t m : {1, 2, 3, 7, 13, 40}) {
      for (auto [k, n, group] : {std::tuple<int64_t, int64_t, int64_t>{64, 23, 16}, {96, 40, 32}, {600, 33, 8}, {48, 70, 48}, {640, 17, 2}, {576, 40, 64}, {1536, 20, 64}}) {
        std::mt19937 g(static_cast<uint32_t>(m * 1000 + k + n));
        std::normal_distribution<float> d(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(m * k) + 1), w(static_cast<size_t>(n * k)),
            out(static_cast<size_t>(m * n) + 1, 99.0f), wd(static_cast<size_t>(n * k));
        for (auto& v : x) v = d(g);
        for (auto& v : w) v = d(g) + 0.5f;  // off-centre: the minimum matters
        const auto packed = quantize(w, n, k, group, DType::kI4);
        for (int64_t j = 0; j < n; ++j) unpack_row(packed.data(), DType::kI4, k, j, wd.data() + j * k);
        matmul_nt_packed_isa(isa, x.data() + 1, packed.data(), DType::kI4, out.data() + 1, m, k, n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            // The kernel sums x * q s and x * m apart (|q s|, |m| <= about 2 max |w|).
            double rowmax = 0;
            for (int64_t t = 0; t < k; ++t) rowmax = std::max(rowmax, std::fabs(double(wd[j * k + t])));
            double ref = 0, mag = 0;
            for (int64_t t = 0; t < k; ++t) {
              ref += double(x[1 + i * k + t]) * double(wd[j * k + t]);
              mag += std::fabs(double(x[1 + i * k + t])) * (std::fabs(double(wd[j * k + t])) + 4 * rowmax);
            }
            ASSERT_NEAR(out[1 + i * n + j], ref, (double(k) + 2.0 * double(k / group) + 4) * std::ldexp(1.0, -24) * mag + 1e-30)
                << isa_name(isa) << " m " << m << " k " << k << " n " << n << " G " << group << " at " << i << "," << j;
          }
        }
        EXPECT_EQ(out[0], 99.0f) << "wrote before out";
      }
    }
  }
}

// A NaN or inf weight makes the outputs its group feeds NaN, as an f32 weight would,
// wherever it sits in its group (not read as 0 or as the group's minimum); the other
// output columns stay finite.
TEST(GemmQuantized, ANonFiniteWeightMakesItsColumnNaNWhereverItSits) {
  const int64_t n = 20, k = 64, group = 16;
  for (DType wt : {DType::kI8, DType::kI4}) {
    for (int64_t at : {0, 5, 15}) {
      for (float bad : {std::nanf(""), INFINITY}) {
        std::vector<float> w(n * k, 0.5f), x(k, 1.0f), out(n);
        for (int64_t i = 0; i < n * k; ++i) w[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
        w[3 * k + 16 + at] = bad;  // row 3, group 1
        const auto packed = quantize(w, n, k, group, wt);
        for (Isa isa : paths()) {
          matmul_nt_packed_isa(isa, x.data(), packed.data(), wt, out.data(), 1, k, n);
          for (int64_t j = 0; j < n; ++j) {
            if (j == 3) {
              EXPECT_TRUE(std::isnan(out[j])) << dtype_name(wt) << " " << isa_name(isa) << " at " << at;
            } else {
              EXPECT_TRUE(std::isfinite(out[j])) << dtype_name(wt) << " " << isa_name(isa) << " column " << j;
            }
          }
        }
      }
    }
  }
}

// --- int8 activations for int4 weights (gemm.h: --activation-dtype int8) ---

// Sets the mode for one test and puts f32 back.
struct Int8Activations {
  Int8Activations() { set_int4_activation_dtype(DType::kI8); }
  ~Int8Activations() { set_int4_activation_dtype(DType::kF32); }
};

// A pre-quantized int4 matrix: codes q in [0, 15], scales s > 0 and offsets m' per
// (row, group), packed as a checkpoint's would be; w = (q - 8) s + m'.
struct Int4Matrix {
  std::vector<uint8_t> q;
  std::vector<float> s, off;
  std::vector<uint64_t> packed;
};
Int4Matrix make_int4(int64_t n, int64_t k, int64_t group, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> scale(0.01f, 0.2f), offset(-0.3f, 0.3f);
  Int4Matrix w;
  w.q.resize(static_cast<size_t>(n * k));
  for (auto& v : w.q) v = static_cast<uint8_t>(code(g));
  w.s.resize(static_cast<size_t>(n * (k / group)));
  w.off.resize(w.s.size());
  for (auto& v : w.s) v = scale(g);
  for (auto& v : w.off) v = offset(g);
  w.packed.resize(static_cast<size_t>(quantized_matrix_bytes(n, k, group, DType::kI4) / 8 + 1));
  pack_quantized_weight(w.q.data(), w.s.data(), w.off.data(), n, k, group, w.packed.data(), DType::kI4);
  return w;
}

// The activation scheme of gemm.h, written out again: per block of 32, d = max |x| / 127
// and xq = round-half-even(x * (127 / max |x|)), in f32 as specified.
void reference_activations(const std::vector<float>& x, int64_t m, int64_t k, std::vector<int>& xq,
                           std::vector<float>& d) {
  xq.assign(static_cast<size_t>(m * k), 0);
  d.assign(static_cast<size_t>(m * k / 32), 0.0f);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < k / 32; ++b) {
      float amax = 0;
      for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[r * k + b * 32 + i]));
      if (!(127.0f / amax <= 3.4028235e38f)) continue;  // zero, or so small that 127 / max overflows
      const float inv = 127.0f / amax;
      for (int64_t i = 0; i < 32; ++i) {
        xq[r * k + b * 32 + i] = static_cast<int>(std::clamp(std::nearbyint(x[r * k + b * 32 + i] * inv), -127.0f, 127.0f));
      }
      d[r * (k / 32) + b] = amax / 127.0f;
    }
  }
}

TEST(GemmInt4Int8Activations, MatchesADoubleReferenceOfTheScheme) {
  Int8Activations mode;
  for (auto [k, n, group] : {std::tuple<int64_t, int64_t, int64_t>{64, 23, 32}, {96, 40, 32}, {640, 33, 64},
                             {576, 40, 576}, {1536, 20, 128}, {256, 100, 32}}) {
    const Int4Matrix w = make_int4(n, k, group, static_cast<uint32_t>(k + n));
    for (int64_t m : {1, 2, 3, 5, 9, 40}) {
      std::mt19937 g(static_cast<uint32_t>(m * 7 + k));
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(m * k));
      for (auto& v : x) v = dist(g) * (1.0f + 3.0f * static_cast<float>(&v - x.data()) / static_cast<float>(x.size()));
      std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
      if (k >= 96) {  // ties: max |x| = 127, so x * 127 / max |x| = x; halves round to even
        const float ties[] = {127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 126.5f, -126.5f};
        std::copy(std::begin(ties), std::end(ties), x.begin() + 64);
        std::fill(x.begin() + 74, x.begin() + 96, 1.0f);
        std::fill(x.begin() + 32, x.begin() + 64, 1e-38f);  // below 127 / FLT_MAX: a zero block
      }
      std::vector<int> xq;
      std::vector<float> d;
      reference_activations(x, m, k, xq, d);
      {  // the kernels' quantizer is the scheme exactly
        std::vector<int8_t> kq(static_cast<size_t>(m * k));
        std::vector<float> kd(static_cast<size_t>(m * k / 32));
        std::vector<int32_t> t8(kd.size());
        for (int64_t r = 0; r < m; ++r)
          detail::quantize_activations(x.data() + r * k, k, kq.data() + r * k, kd.data() + r * (k / 32),
                                       t8.data() + r * (k / 32));
        for (size_t i = 0; i < kq.size(); ++i) ASSERT_EQ(kq[i], xq[i]) << "xq at " << i;
        if (k >= 96) {
          const int8_t even[] = {127, 2, 4, -2, -4, 0, 0, 2, 126, -126};
          for (int i = 0; i < 10; ++i) ASSERT_EQ(kq[64 + i], even[i]) << "tie " << i;
          for (int i = 32; i < 64; ++i) ASSERT_EQ(kq[i], 0) << "tiny block at " << i;
        }
        for (size_t i = 0; i < kd.size(); ++i) ASSERT_EQ(kd[i], d[i]) << "d at " << i;
      }
      for (Isa isa : paths()) {
        std::vector<float> out(static_cast<size_t>(m * n) + 1, 99.0f);
        matmul_nt_packed_isa(isa, x.data(), w.packed.data(), DType::kI4, out.data(), m, k, n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double ref = 0, mag = 0;
            for (int64_t g0 = 0; g0 < k / group; ++g0) {
              const double s = w.s[j * (k / group) + g0], off = w.off[j * (k / group) + g0];
              double part = 0, part_mag = 0, xs = 0, xs_mag = 0;
              for (int64_t b = g0 * group / 32; b < (g0 + 1) * group / 32; ++b) {
                long t = 0, t_mag = 0;
                for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
                  t += (w.q[j * k + c] - 8L) * xq[i * k + c];
                  t_mag += std::labs((w.q[j * k + c] - 8L) * xq[i * k + c]);
                }
                part += double(t) * d[i * (k / 32) + b];
                part_mag += double(t_mag) * d[i * (k / 32) + b];
              }
              for (int64_t c = g0 * group; c < (g0 + 1) * group; ++c) {
                xs += x[i * k + c];
                xs_mag += std::fabs(x[i * k + c]);
              }
              ref += s * part + off * xs;
              mag += s * part_mag + std::fabs(off) * xs_mag;
            }
            ASSERT_NEAR(out[i * n + j], ref, double(k + 8) * std::ldexp(1.0, -24) * mag + 1e-30)
                << isa_name(isa) << " m " << m << " k " << k << " n " << n << " G " << group << " at " << i << "," << j;
          }
        }
        EXPECT_EQ(out[m * n], 99.0f) << "wrote past out";
      }
    }
  }
}

// The invariances of gemm.h hold in the mode: a row alone equals the same row in a
// batch and the thread count changes no bit, on every path; the integer sums are exact,
// so AVX2 and AVX-512 (VNNI where this CPU has it) give the same bits.
TEST(GemmInt4Int8Activations, ARowAloneEqualsItsRowInABatchAndPathsAgree) {
  Int8Activations mode;
  const int64_t k = 1024, n = 150, m = 33, group = 64;
  const Int4Matrix w = make_int4(n, k, group, 9);
  std::mt19937 g(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(m * k);
  for (auto& v : x) v = dist(g);
  std::vector<std::vector<float>> by_path;
  for (Isa isa : paths()) {
    std::vector<float> all(m * n), all2(m * n);
    set_num_threads(1);
    matmul_nt_packed_isa(isa, x.data(), w.packed.data(), DType::kI4, all.data(), m, k, n);
    set_num_threads(2);
    matmul_nt_packed_isa(isa, x.data(), w.packed.data(), DType::kI4, all2.data(), m, k, n);
    EXPECT_EQ(0, std::memcmp(all.data(), all2.data(), all.size() * 4)) << isa_name(isa);
    for (int64_t r : {0, 4, 13, 31, 32}) {
      for (int64_t rows : {1, 2, 3, 5}) {
        const int64_t mm = r + rows <= m ? rows : 1;
        std::vector<float> one(mm * n);
        matmul_nt_packed_isa(isa, x.data() + r * k, w.packed.data(), DType::kI4, one.data(), mm, k, n);
        EXPECT_EQ(0, std::memcmp(one.data(), all.data() + r * n, mm * n * 4)) << isa_name(isa) << " rows " << r << " + " << mm;
      }
    }
    set_num_threads(1);
    if (isa != Isa::kGeneric) by_path.push_back(all);
  }
  for (size_t i = 1; i < by_path.size(); ++i) EXPECT_EQ(0, std::memcmp(by_path[0].data(), by_path[i].data(), m * n * 4));
}

// What the mode costs against f32 activations on the same weights (random normal x; the
// model-level figure is in docs/cpu-kernels.md): small but not zero, so the mode is on.
TEST(GemmInt4Int8Activations, StaysNearTheF32ActivationsAndDiffersFromThem) {
  const int64_t k = 2048, n = 64, m = 4, group = 32;
  const Int4Matrix w = make_int4(n, k, group, 21);
  std::mt19937 g(23);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(m * k), f32(m * n), i8(m * n);
  for (auto& v : x) v = dist(g);
  for (Isa isa : paths()) {
    matmul_nt_packed_isa(isa, x.data(), w.packed.data(), DType::kI4, f32.data(), m, k, n);
    {
      Int8Activations mode;
      matmul_nt_packed_isa(isa, x.data(), w.packed.data(), DType::kI4, i8.data(), m, k, n);
    }
    double err = 0, norm = 0;
    for (size_t i = 0; i < f32.size(); ++i) {
      err += (i8[i] - f32[i]) * double(i8[i] - f32[i]);
      norm += double(f32[i]) * f32[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 0.01) << isa_name(isa);
    EXPECT_GT(std::sqrt(err / norm), 1e-5) << isa_name(isa);
  }
}

// A NaN or inf activation makes its row's outputs NaN (as in f32) and no other row's;
// a group size that is not a multiple of 32 is refused naming the flag.
TEST(GemmInt4Int8Activations, NonFiniteActivationsAndGroupSizesAreHandled) {
  Int8Activations mode;
  const int64_t k = 128, n = 20, m = 3;
  const Int4Matrix w = make_int4(n, k, 32, 5);
  for (float bad : {std::nanf(""), INFINITY}) {
    std::vector<float> x(m * k, 0.5f), out(m * n);
    x[k + 70] = bad;
    for (Isa isa : paths()) {
      matmul_nt_packed_isa(isa, x.data(), w.packed.data(), DType::kI4, out.data(), m, k, n);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          EXPECT_EQ(std::isnan(out[i * n + j]), i == 1) << isa_name(isa) << " at " << i << "," << j;
    }
  }
  const Int4Matrix w16 = make_int4(n, k, 16, 5);
  std::vector<float> x(k, 1.0f), out(n);
  try {
    matmul_nt_packed(x.data(), w16.packed.data(), DType::kI4, out.data(), 1, k, n);
    ADD_FAILURE() << "groups of 16 were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--activation-dtype"), std::string::npos) << e.what();
  }
}

TEST(Gemm, UnknownIsaPathsAreRefusedByName) {
  if (!isa_supported(Isa::kAvx2)) {
    EXPECT_THROW(set_isa(Isa::kAvx2), std::exception);
  }
  set_isa(Isa::kGeneric);
  EXPECT_EQ(active_isa(), Isa::kGeneric);
  std::vector<float> x(8, 1.0f), w(16, 0.5f), out(2);
  matmul_nt(x.data(), w.data(), out.data(), 1, 8, 2);
  EXPECT_EQ(out[0], 4.0f);
}

}  // namespace
}  // namespace linnet::cpu
