// CPU kernels against naive double-precision references written from the formulas in
// modeling_llama.py (tolerance atol + |ref| * rtol, as llm.c compares kernels).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops.h"

namespace linnet::cpu {
namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& ref, double atol = 1e-5,
                  double rtol = 1e-5) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], ref[i], atol + std::fabs(ref[i]) * rtol) << "at " << i;
  }
}

// softmax(q k^T / sqrt(head_dim)) v in double for each (row, head) pair: q is
// [rows][heads][head_dim]; row r sees positions [begin[r], end[r]); position t's K and V
// values for KV head g start at cache_at(t) + g * head_dim in k and v.
template <typename CacheAt>
std::vector<double> reference_attention(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t rows, int64_t heads, int64_t kv_heads,
                                        int64_t hd, const std::vector<int32_t>& begin, const std::vector<int32_t>& end,
                                        CacheAt cache_at) {
  std::vector<double> ref(rows * heads * hd, 0.0);
  const int64_t group = heads / kv_heads;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      std::vector<double> s;
      double mx = -1e300, sum = 0;
      for (int64_t t = begin[r]; t < end[r]; ++t) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += double(q[(r * heads + h) * hd + i]) * k[cache_at(t) + g * hd + i];
        s.push_back(d / std::sqrt(double(hd)));
        mx = std::max(mx, s.back());
      }
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int64_t t = begin[r]; t < end[r]; ++t)
        for (int64_t i = 0; i < hd; ++i)
          ref[(r * heads + h) * hd + i] += s[t - begin[r]] / sum * v[cache_at(t) + g * hd + i];
    }
  return ref;
}

TEST(Kernels, MatmulNtGemmAndGemv) {
  for (int64_t m : {1, 5}) {
    const int64_t k = 37, n = 23;
    auto x = randn(m * k, 1), w = randn(n * k, 2);
    std::vector<float> out(m * n);
    matmul_nt(x.data(), w.data(), out.data(), m, k, n);
    std::vector<double> ref(m * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t t = 0; t < k; ++t) ref[i * n + j] += double(x[i * k + t]) * w[j * k + t];
    expect_close(out, ref, 1e-4);
  }
}

TEST(Kernels, EmbeddingLookupZeroesRowsOfOtherRanks) {
  const int64_t hidden = 4, vocab_local = 3, vocab_begin = 6;
  auto table = randn(vocab_local * hidden, 3);
  const std::vector<int32_t> ids = {5, 6, 8, 9};
  std::vector<float> out(ids.size() * hidden, 7.0f);
  embedding_lookup(table.data(), vocab_begin, vocab_local, hidden, ids.data(), 4, out.data());
  std::vector<double> ref(out.size(), 0.0);
  for (int i = 0; i < hidden; ++i) {
    ref[1 * hidden + i] = table[0 * hidden + i];
    ref[2 * hidden + i] = table[2 * hidden + i];
  }
  expect_close(out, ref, 0.0, 0.0);
}

TEST(Kernels, RmsNorm) {
  const int64_t rows = 3, dim = 64;
  auto x = randn(rows * dim, 4), w = randn(dim, 5);
  std::vector<float> out(rows * dim);
  rmsnorm(x.data(), w.data(), out.data(), rows, dim, 1e-5f);
  std::vector<double> ref(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int64_t i = 0; i < dim; ++i) ref[r * dim + i] = w[i] * x[r * dim + i] * inv;
  }
  expect_close(out, ref);
}

TEST(Kernels, RopeRotatesHalfSplitPairs) {
  const int64_t rows = 3, heads = 2, hd = 8, stride = 20;
  auto x = randn(rows * stride, 6);
  const auto x0 = x;
  std::vector<float> inv(hd / 2);
  rope_inv_freq(10000.0, hd, inv.data());
  for (int64_t i = 0; i < hd / 2; ++i) EXPECT_NEAR(inv[i], std::pow(10000.0, -2.0 * i / hd), 1e-7);
  const std::vector<int32_t> pos = {0, 7, 300};
  rope(x.data(), rows, stride, heads, hd, pos.data(), inv.data());
  std::vector<double> ref(x0.begin(), x0.end());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double a = pos[r] * std::pow(10000.0, -2.0 * i / hd);
        const double x1 = x0[r * stride + h * hd + i], x2 = x0[r * stride + h * hd + i + hd / 2];
        ref[r * stride + h * hd + i] = x1 * std::cos(a) - x2 * std::sin(a);
        ref[r * stride + h * hd + i + hd / 2] = x2 * std::cos(a) + x1 * std::sin(a);
      }
  expect_close(x, ref, 1e-4);  // f32 angles at position 300
}

TEST(Kernels, SwiGlu) {
  const int64_t rows = 2, inter = 5;
  auto gu = randn(rows * 2 * inter, 7);
  std::vector<float> out(rows * inter);
  swiglu(gu.data(), out.data(), rows, inter);
  std::vector<double> ref(rows * inter);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      const double g = gu[r * 2 * inter + i], u = gu[r * 2 * inter + inter + i];
      ref[r * inter + i] = g / (1 + std::exp(-g)) * u;
    }
  expect_close(out, ref);
}

// Window 0: plain causal; window 4: each query sees itself and the 3 keys before it.
class AttentionTest : public testing::TestWithParam<int64_t> {};

TEST_P(AttentionTest, CausalGqaAttention) {
  const int64_t window = GetParam();
  const int64_t heads = 4, kv_heads = 2, hd = 8, len = 9, rows = 3;
  const std::vector<int32_t> pos = {6, 7, 8};  // the last three positions of the cache
  auto q = randn(rows * heads * hd, 8), k = randn(len * kv_heads * hd, 9), v = randn(len * kv_heads * hd, 10);
  std::vector<float> out(rows * heads * hd);
  std::vector<int32_t> begin(rows), end(rows);
  for (int64_t r = 0; r < rows; ++r) {
    end[r] = pos[r] + 1;
    begin[r] = window > 0 ? std::max<int32_t>(0, end[r] - static_cast<int32_t>(window)) : 0;
  }
  const std::vector<int32_t> one_page(rows, 0);  // contiguous: one page of len rows
  attention(q.data(), heads * hd, k.data(), v.data(), out.data(), rows, heads, kv_heads, hd, one_page.data(), 1, len,
            begin.data(), end.data());
  std::vector<double> ref(out.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / kv_heads);
      std::vector<double> s(pos[r] + 1, -1e300);
      double mx = -1e300, sum = 0;
      for (int64_t t = 0; t <= pos[r]; ++t) {
        if (window > 0 && pos[r] - t >= window) continue;
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += double(q[r * heads * hd + h * hd + i]) * k[(t * kv_heads + g) * hd + i];
        s[t] = d / std::sqrt(double(hd));
        mx = std::max(mx, s[t]);
      }
      for (auto& e : s) sum += (e = std::exp(e - mx));  // masked keys give exp(-huge) = 0
      for (int64_t t = 0; t <= pos[r]; ++t)
        for (int64_t i = 0; i < hd; ++i) ref[r * heads * hd + h * hd + i] += s[t] / sum * v[(t * kv_heads + g) * hd + i];
    }
  expect_close(out, ref);
}

// The same keys scattered over pages of 4 rows in a shuffled pool give the same output
// as the contiguous layout, bit for bit (same visiting order).
TEST_P(AttentionTest, PagedLayoutMatchesContiguous) {
  const int64_t window = GetParam();
  const int64_t heads = 4, kv_heads = 2, hd = 8, len = 11, rows = 4, page = 4, pages = 3;
  const int64_t kvw = kv_heads * hd;
  auto q = randn(rows * heads * hd, 21), k = randn(len * kvw, 22), v = randn(len * kvw, 23);
  const std::vector<int32_t> table = {5, 0, 3};  // logical page i -> pool page table[i]
  std::vector<float> kp(6 * page * kvw, 7.0f), vp(6 * page * kvw, 7.0f);  // 6-page pool, junk elsewhere
  for (int64_t p = 0; p < len; ++p) {
    const int64_t row = table[p / page] * page + p % page;
    std::copy(k.begin() + p * kvw, k.begin() + (p + 1) * kvw, kp.begin() + row * kvw);
    std::copy(v.begin() + p * kvw, v.begin() + (p + 1) * kvw, vp.begin() + row * kvw);
  }
  std::vector<int32_t> begin(rows), end(rows), paged_tables, flat(rows, 0);
  const std::vector<int32_t> pos = {0, 5, 8, 10};
  for (int64_t r = 0; r < rows; ++r) {
    end[r] = pos[r] + 1;
    begin[r] = window > 0 ? std::max<int32_t>(0, end[r] - static_cast<int32_t>(window)) : 0;
    paged_tables.insert(paged_tables.end(), table.begin(), table.end());
  }
  std::vector<float> want(rows * heads * hd), got(rows * heads * hd);
  attention(q.data(), heads * hd, k.data(), v.data(), want.data(), rows, heads, kv_heads, hd, flat.data(), 1, len,
            begin.data(), end.data());
  attention(q.data(), heads * hd, kp.data(), vp.data(), got.data(), rows, heads, kv_heads, hd, paged_tables.data(),
            pages, page, begin.data(), end.data());
  EXPECT_EQ(got, want);
}

// Long key ranges cross several key blocks of the online softmax and, past 1024 keys,
// several key splits (flash-decoding): still the double reference; and the thread
// count, the ISA path and the rows beside a query change no bit.
TEST(Kernels, AttentionOverManyKeyBlocksIsExactAndInvariant) {
  struct Case {
    int64_t hd, len;
    std::vector<int32_t> begin, end;
  };
  for (const Case& cs : {Case{64, 300, {0, 0, 70, 0, 10}, {300, 1, 199, 129, 300}},
                         Case{12, 300, {0, 0, 70, 0, 10}, {300, 1, 199, 129, 300}},
                         Case{64, 2600, {0, 0, 5, 1024, 1500}, {2600, 1025, 2053, 2048, 1600}}}) {
    const int64_t hd = cs.hd, len = cs.len;
    const int64_t heads = 6, kv_heads = 2, rows = 5;
    const int64_t kvw = kv_heads * hd;
    auto q = randn(rows * heads * hd, 31), k = randn(len * kvw, 32), v = randn(len * kvw, 33);
    for (auto& x : q) x *= 2.0f;  // peaked softmax: the running max moves between blocks
    const std::vector<int32_t>& begin = cs.begin;
    const std::vector<int32_t>& end = cs.end;
    const std::vector<int32_t> one_page(rows, 0);
    auto run = [&](int threads, int64_t n_rows, int64_t first) {
      set_num_threads(threads);
      std::vector<float> out(n_rows * heads * hd);
      attention(q.data() + first * heads * hd, heads * hd, k.data(), v.data(), out.data(), n_rows, heads, kv_heads,
                hd, one_page.data(), 1, len, begin.data() + first, end.data() + first);
      set_num_threads(1);
      return out;
    };
    const auto one = run(1, rows, 0), two = run(2, rows, 0);
    EXPECT_EQ(one, two) << "head_dim " << hd;
    const Isa active = active_isa();
    // The AVX paths (fused multiply-adds) give the same bits as each other; the generic
    // one (multiply, then add) its own, also the same with 1 or 2 threads and row alone.
    std::vector<float> fused;
    for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_supported(isa)) continue;
      set_isa(isa);
      const auto got = run(1, rows, 0);
      EXPECT_EQ(run(2, rows, 0), got) << isa_name(isa) << " head_dim " << hd;
      const auto row3 = run(1, 1, 3);
      EXPECT_TRUE(std::equal(row3.begin(), row3.end(), got.begin() + 3 * heads * hd)) << isa_name(isa) << " head_dim " << hd;
      if (isa == Isa::kGeneric) {
        expect_close(got, reference_attention(q, k, v, rows, heads, kv_heads, hd, begin, end, [&](int64_t t) { return t * kvw; }),
                     2e-5, 2e-5);
      } else if (fused.empty()) {
        fused = got;
      } else {
        EXPECT_EQ(got, fused) << isa_name(isa) << " head_dim " << hd;
      }
    }
    set_isa(active);
    const auto alone = run(2, 1, 3);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), one.begin() + 3 * heads * hd)) << "head_dim " << hd;
    expect_close(one, reference_attention(q, k, v, rows, heads, kv_heads, hd, begin, end, [&](int64_t t) { return t * kvw; }),
                 2e-5, 2e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Windows, AttentionTest, testing::Values(int64_t{0}, int64_t{4}));

TEST(Kernels, RmsNormHeadsNormalizesEachHeadSlice) {
  const int64_t rows = 2, heads = 3, hd = 4, stride = 20;
  auto x = randn(rows * stride, 11), w = randn(hd, 12);
  const auto x0 = x;
  rmsnorm_heads(x.data(), rows, stride, heads, hd, w.data(), 1e-6f);
  std::vector<double> ref(x0.begin(), x0.end());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      double ss = 0;
      for (int64_t i = 0; i < hd; ++i) ss += double(x0[r * stride + h * hd + i]) * x0[r * stride + h * hd + i];
      for (int64_t i = 0; i < hd; ++i)
        ref[r * stride + h * hd + i] = w[i] * x0[r * stride + h * hd + i] / std::sqrt(ss / hd + 1e-6);
    }
  expect_close(x, ref);
}

TEST(Kernels, Llama3RopeScalingBands) {
  // theta 500000, head_dim 16: wavelengths 6.3, 32, 167, 862 (< high = 8192 / 4 = 2048:
  // unchanged), 4443 (between: blended), then > 8192 (divided by factor 8).
  std::vector<float> f(8), plain(8);
  rope_inv_freq(500000.0, 16, plain.data());
  f = plain;
  rope_scale_llama3(f.data(), 8, 8.0, 1.0, 4.0, 8192.0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f[i], plain[i]) << i;
  const double w4 = 2 * M_PI / plain[4], s = (8192.0 / w4 - 1.0) / 3.0;
  EXPECT_NEAR(f[4], (1 - s) * plain[4] / 8 + s * plain[4], 1e-6 * plain[4]);
  EXPECT_GT(s, 0.0);
  EXPECT_LT(s, 1.0);
  for (int i = 5; i < 8; ++i) EXPECT_NEAR(f[i], plain[i] / 8.0, 1e-6 * plain[i]) << i;
}

TEST(Kernels, StoreRowsScattersByPosition) {
  const std::vector<float> src = {1, 2, 9, 3, 4, 9};  // 2 rows of stride 3, 2 elements used
  std::vector<float> cache(8, 0.0f);
  const std::vector<int32_t> pos = {3, 1};
  store_rows(src.data(), 3, cache.data(), 2, pos.data(), 2);
  EXPECT_EQ(cache, (std::vector<float>{0, 0, 3, 4, 0, 0, 1, 2}));
}

// Query tiles: consecutive rows of one sequence (same key_begin, same pages) and a KV
// group's heads are computed together; each row must still equal itself computed
// alone, bit for bit, on every ISA path and thread count: head dims with and without an
// 8-float tail, groups of 1, 3, 4 and 20 heads (more than one tile's 16 pairs), key
// ranges across blocks, pages and splits, causal and packed (a second segment with its
// own key_begin), and the double reference.
TEST(Kernels, AttentionTiledRowsEqualRowsAlone) {
  struct Case {
    int64_t hd, heads, kv_heads, len, page;
  };
  for (const Case& cs : {Case{64, 9, 3, 300, 16}, Case{96, 8, 2, 150, 64}, Case{12, 4, 4, 90, 7},
                         Case{128, 20, 1, 70, 32}, Case{64, 8, 2, 1300, 64}}) {
    const int64_t hd = cs.hd, heads = cs.heads, kv_heads = cs.kv_heads, len = cs.len, page = cs.page;
    const int64_t kvw = kv_heads * hd, pages = (len + page - 1) / page;
    // Rows: a causal run at the end of segment one [0, len - 20), then segment two [len - 20, len).
    std::vector<int32_t> begin, end;
    const int64_t seg = len - 20;
    for (int64_t p = seg - 23; p < seg; ++p) {
      begin.push_back(0);
      end.push_back(static_cast<int32_t>(p + 1));
    }
    for (int64_t p = seg; p < len; ++p) {
      begin.push_back(static_cast<int32_t>(seg));
      end.push_back(static_cast<int32_t>(p + 1));
    }
    const int64_t rows = static_cast<int64_t>(begin.size());
    auto q = randn(rows * heads * hd, 51), k = randn(len * kvw, 52), v = randn(len * kvw, 53);
    for (auto& x : q) x *= 2.0f;
    std::vector<int32_t> table(pages);
    for (int64_t i = 0; i < pages; ++i) table[i] = static_cast<int32_t>((i * 5 + 3) % pages);  // a permutation
    std::vector<float> kp(pages * page * kvw, 0.0f), vp(kp.size(), 0.0f);
    for (int64_t p = 0; p < len; ++p) {
      const int64_t row = table[p / page] * page + p % page;
      std::copy(k.begin() + p * kvw, k.begin() + (p + 1) * kvw, kp.begin() + row * kvw);
      std::copy(v.begin() + p * kvw, v.begin() + (p + 1) * kvw, vp.begin() + row * kvw);
    }
    std::vector<int32_t> tables;
    for (int64_t r = 0; r < rows; ++r) tables.insert(tables.end(), table.begin(), table.end());
    auto run = [&](int64_t first, int64_t n) {
      std::vector<float> out(n * heads * hd);
      attention(q.data() + first * heads * hd, heads * hd, kp.data(), vp.data(), out.data(), n, heads, kv_heads, hd,
                tables.data() + first * pages, pages, page, begin.data() + first, end.data() + first);
      return out;
    };
    const std::string what = "head_dim " + std::to_string(hd) + ", heads " + std::to_string(heads) + "/" +
                             std::to_string(kv_heads) + ", len " + std::to_string(len);
    set_num_threads(2);
    const auto all = run(0, rows);
    set_num_threads(1);
    EXPECT_EQ(run(0, rows), all) << what;
    const Isa active = active_isa();
    for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_supported(isa)) continue;
      set_isa(isa);
      const auto all = run(0, rows);  // each path's own bits (generic: no fma)
      for (int64_t r : {int64_t{0}, int64_t{5}, rows - 21, rows - 20, rows - 1}) {
        const auto alone = run(r, 1);
        EXPECT_TRUE(std::equal(alone.begin(), alone.end(), all.begin() + r * heads * hd))
            << isa_name(isa) << ", row " << r << ", " << what;
      }
      const auto three = run(rows - 22, 3);  // a tile that straddles the two segments
      EXPECT_TRUE(std::equal(three.begin(), three.end(), all.begin() + (rows - 22) * heads * hd))
          << isa_name(isa) << ", " << what;
    }
    set_isa(active);
    SCOPED_TRACE(what);
    expect_close(all, reference_attention(q, k, v, rows, heads, kv_heads, hd, begin, end, [&](int64_t t) { return t * kvw; }),
                 2e-5, 2e-5);
  }
}

// Random shapes (head_dim 4-200, groups 1-9, pages of 1-40 keys shuffled in the pool,
// runs of rows sharing a key_begin with random ends, up to 2500 keys): each row alone
// equals itself among the others, bit for bit, and every output is within 3e-5 of the
// double reference. Fixed seed, so a failure reproduces.
TEST(Kernels, AttentionRandomShapesMatchReferenceAndRowsAlone) {
  std::mt19937 gen(7);
  auto uni = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(gen); };
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int hds[] = {4, 8, 12, 16, 24, 64, 80, 96, 128, 200};
  set_num_threads(2);
  for (int it = 0; it < 150; ++it) {
    const int kvh = uni(1, 4), grp = uni(1, 9), heads = kvh * grp, hd = hds[uni(0, 9)];
    const int page = uni(1, 40), len = uni(1, it % 10 == 0 ? 2500 : 300), pages = (len + page - 1) / page;
    const int rows = uni(1, 20);
    const int64_t kvw = int64_t{kvh} * hd;
    std::vector<float> q(rows * heads * hd), k(pages * page * kvw), v(k.size());
    for (auto& x : q) x = 2.0f * normal(gen);
    for (auto& x : k) x = normal(gen);
    for (auto& x : v) x = normal(gen);
    std::vector<int32_t> perm(pages);
    for (int i = 0; i < pages; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), gen);
    std::vector<int32_t> tables, begin(rows), end(rows);
    for (int r = 0; r < rows;) {
      const int run = uni(1, 6), kb = uni(0, 3) == 0 ? 0 : uni(0, len - 1);
      for (int i = 0; i < run && r < rows; ++i, ++r) {
        begin[r] = kb;
        end[r] = uni(0, 1) ? std::min(len, kb + 1 + i + uni(0, 3)) : std::min(len, kb + uni(1, len - kb));
      }
    }
    for (int i = 0; i < rows; ++i) tables.insert(tables.end(), perm.begin(), perm.end());
    auto run = [&](int first, int n) {
      std::vector<float> out(n * heads * hd, -7.0f);
      attention(q.data() + first * heads * hd, heads * hd, k.data(), v.data(), out.data(), n, heads, kvh, hd,
                tables.data() + first * pages, pages, page, begin.data() + first, end.data() + first);
      return out;
    };
    const auto all = run(0, rows);
    for (int r = 0; r < rows; ++r) {
      const auto alone = run(r, 1);
      ASSERT_TRUE(std::equal(alone.begin(), alone.end(), all.begin() + r * heads * hd)) << "case " << it << " row " << r;
    }
    SCOPED_TRACE("case " + std::to_string(it) + ", head_dim " + std::to_string(hd));
    const auto cache_at = [&](int64_t t) { return (int64_t{perm[t / page]} * page + t % page) * kvw; };
    expect_close(all, reference_attention(q, k, v, rows, heads, kvh, hd, begin, end, cache_at), 3e-5, 3e-5);
    if (HasFatalFailure()) return;
  }
  set_num_threads(1);
}

// A bf16 cache rounds each K/V element to nearest even as it is stored (torch's
// .to(torch.bfloat16): ties go to the even mantissa, NaN stays NaN).
TEST(Kernels, StoreRowsIntoBf16CacheRoundsToNearestEven) {
  const float tie_down = 1.0f + 0x1p-8f;           // halfway between 1 and 1 + 2^-7: to 1 (even)
  const float tie_up = 1.0f + 3 * 0x1p-8f;         // halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6
  const float above = 1.0f + 0x1p-8f + 0x1p-20f;   // just above a tie: up
  const std::vector<float> src = {tie_down, tie_up, above, -2.5f, std::nanf(""), 1e-40f};
  std::vector<uint16_t> cache(12, 0xffff);
  const std::vector<int32_t> pos = {1};
  store_rows(src.data(), 6, cache.data(), 6, pos.data(), 1);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(cache[i], 0xffff) << "row 0 untouched";
  EXPECT_EQ(cache[6], 0x3f80);  // 1.0
  EXPECT_EQ(cache[7], 0x3f82);  // 1 + 2^-6
  EXPECT_EQ(cache[8], 0x3f81);  // 1 + 2^-7
  EXPECT_EQ(cache[9], 0xc020);  // -2.5 exactly
  EXPECT_EQ(cache[10] & 0x7f80, 0x7f80);
  EXPECT_NE(cache[10] & 0x007f, 0);  // still a NaN
  EXPECT_EQ(cache[11], 0x0001);      // 1e-40 = 1.09 x 2^-133: bf16 keeps f32's subnormals, not flushed to 0
}

// Attention over a bf16 cache equals, bit for bit, attention over an f32 cache holding
// the same (bf16-rounded) values, on every ISA path, in the paged layout and across
// several key blocks; and the bf16 values stay within bf16's rounding of the f32 result.
TEST(Kernels, AttentionOverBf16CacheEqualsF32OverRoundedValues) {
  for (int64_t hd : {64, 12}) {
    const int64_t heads = 6, kv_heads = 2, len = 300, rows = 4, page = 64, pool_pages = 6;
    const int64_t kvw = kv_heads * hd;
    auto q = randn(rows * heads * hd, 41), k = randn(len * kvw, 42), v = randn(len * kvw, 43);
    const std::vector<int32_t> table = {4, 1, 5, 0, 2};  // logical page -> pool page
    std::vector<float> k32(pool_pages * page * kvw, 0.0f), v32(k32.size(), 0.0f);
    std::vector<uint16_t> k16(k32.size(), 0), v16(k32.size(), 0);
    std::vector<int32_t> slots(len);
    for (int64_t p = 0; p < len; ++p) slots[p] = table[p / page] * page + p % page;
    store_rows(k.data(), kvw, k16.data(), kvw, slots.data(), len);
    store_rows(v.data(), kvw, v16.data(), kvw, slots.data(), len);
    for (size_t i = 0; i < k16.size(); ++i) {  // the f32 cache of the bf16 values
      k32[i] = std::bit_cast<float>(static_cast<uint32_t>(k16[i]) << 16);
      v32[i] = std::bit_cast<float>(static_cast<uint32_t>(v16[i]) << 16);
    }
    const std::vector<int32_t> begin = {0, 0, 70, 200}, end = {300, 1, 199, 263};
    std::vector<int32_t> tables;
    for (int64_t r = 0; r < rows; ++r) tables.insert(tables.end(), table.begin(), table.end());
    const Isa active = active_isa();
    for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_supported(isa)) continue;
      set_isa(isa);
      std::vector<float> want(rows * heads * hd);  // this path's bits over the f32 cache
      attention(q.data(), heads * hd, k32.data(), v32.data(), want.data(), rows, heads, kv_heads, hd, tables.data(),
                5, page, begin.data(), end.data());
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        std::vector<float> got(want.size());
        attention(q.data(), heads * hd, k16.data(), v16.data(), got.data(), rows, heads, kv_heads, hd,
                  tables.data(), 5, page, begin.data(), end.data());
        EXPECT_EQ(got, want) << isa_name(isa) << ", " << threads << " threads, head_dim " << hd;
      }
      set_num_threads(1);
    }
    set_isa(active);
  }
}

// The element-wise ops split rows / column chunks over the threads once the work is
// large (threads_for): the same bits with 1 and 2 threads, on sizes above and below the
// threshold.
TEST(Kernels, ElementwiseOpsDoNotDependOnTheThreadCount) {
  for (int64_t rows : {1, 3, 70}) {
    const int64_t dim = 576, inter = 1536, heads = 9, hd = 64;
    const auto x = randn(rows * dim, 51), w = randn(dim, 52), gu = randn(rows * 2 * inter, 53);
    const auto qk = randn(rows * heads * hd, 54), hw = randn(hd, 55);
    std::vector<int32_t> pos(rows);
    for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<int32_t>(1000 + 7 * r);
    std::vector<float> inv_freq(hd / 2);
    rope_inv_freq(10000.0, hd, inv_freq.data());
    auto run = [&](int threads) {
      set_num_threads(threads);
      std::vector<float> norm(rows * dim), act(rows * inter), sum = x, rot = qk, qn = qk;
      rmsnorm(x.data(), w.data(), norm.data(), rows, dim, 1e-5f);
      swiglu(gu.data(), act.data(), rows, inter);
      add_inplace(sum.data(), norm.data(), rows * dim);
      rope(rot.data(), rows, heads * hd, heads, hd, pos.data(), inv_freq.data());
      rmsnorm_heads(qn.data(), rows, heads * hd, heads, hd, hw.data(), 1e-6f);
      set_num_threads(1);
      return std::vector<std::vector<float>>{norm, act, sum, rot, qn};
    };
    EXPECT_EQ(run(1), run(2)) << rows << " rows";
  }
}

// The cross-entropy's row statistics against log-sum-exp in long double, over lengths
// with every tail (n mod 16) and logits of a real head's spread (tens of units); every
// ISA path this CPU runs gives the same bits; NaN propagates; an empty row is (-inf, 0).
TEST(Kernels, SoftmaxStatsMatchesLongDoubleAndIsTheSameOnEveryIsa) {
  std::mt19937 gen(11);
  const Isa saved = active_isa();
  for (const int64_t n : {1, 5, 15, 16, 17, 31, 100, 1000, 49152, 50257}) {
    std::vector<float> l(n);
    std::normal_distribution<float> normal(0.0f, 4.0f);
    for (auto& x : l) x = normal(gen);
    if (n > 3) l[n / 3] = 30.0f;  // one dominant logit, as a confident prediction has
    long double mx = -INFINITY, sum = 0;
    for (const float x : l) mx = std::max<long double>(mx, x);
    for (const float x : l) sum += std::exp(static_cast<long double>(x) - mx);
    double first = 0;
    float first_max = 0;
    bool have = false;
    for (const Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_supported(isa)) continue;
      set_isa(isa);
      float m = 0;
      const double s = softmax_stats(l.data(), n, &m);
      EXPECT_EQ(m, static_cast<float>(mx)) << "n " << n << " " << isa_name(isa);
      EXPECT_NEAR(s, static_cast<double>(sum), 2e-7 * static_cast<double>(sum)) << "n " << n << " " << isa_name(isa);
      if (have) {
        EXPECT_EQ(std::bit_cast<uint64_t>(s), std::bit_cast<uint64_t>(first)) << "n " << n << " " << isa_name(isa);
        EXPECT_EQ(m, first_max);
      }
      first = s;
      first_max = m;
      have = true;
    }
  }
  set_isa(saved);
  std::vector<float> l = {1.0f, NAN, 2.0f};
  float m = 0;
  EXPECT_TRUE(std::isnan(softmax_stats(l.data(), 3, &m)));
  EXPECT_EQ(softmax_stats(l.data(), 0, &m), 0.0);
  EXPECT_EQ(m, -INFINITY);
}

TEST(Kernels, GatherRowsPicksRowsByIndex) {
  const std::vector<float> src = {1, 2, 3, 4, 5, 6};  // 3 rows of 2
  const std::vector<int32_t> index = {2, 0, 2};
  std::vector<float> out(6);
  gather_rows(src.data(), 2, index.data(), 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{5, 6, 1, 2, 5, 6}));
}

}  // namespace
}  // namespace linnet::cpu
