// Every CUDA kernel (kernels/cuda) against its CPU twin (kernels/cpu) or a naive host
// reference, on random inputs, with dtype-aware tolerances (atol + |ref| * rtol): f32
// kernels to f32 rounding, bf16 storage to bf16 rounding. Skips with "no CUDA device"
// where no device is visible.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "common/random_normal.h"
#include "kernels/cpu/ops.h"
#include "common/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "runtime/exp_sum.h"

namespace linnet {
namespace {

// Why no device is usable ("" when one is): the query's CUDA error name and text.
std::string no_device_reason() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
  }
  return n > 0 ? "" : "0 devices";
}

bool have_device() {
  static const std::string reason = no_device_reason();
  return reason.empty();
}

// A device copy of a host vector, freed on scope exit.
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    void* p = nullptr;
    LINNET_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    p_ = static_cast<T*>(p);
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    if (!h.empty()) LINNET_CUDA_CHECK(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() { return p_; }
  std::vector<T> host() const {
    LINNET_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(n_);
    if (n_ > 0) LINNET_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// Host bf16 round to nearest even (finite inputs).
float bf16_round(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  u &= 0xFFFF0000u;
  float y = 0;
  std::memcpy(&y, &u, 4);
  return y;
}

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16_rn(v[i]);
  return out;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, float atol, float rtol,
                  const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!(std::fabs(got[i] - ref[i]) <= atol + std::fabs(ref[i]) * rtol)) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << ref[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

class CudaKernels : public testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device (" << no_device_reason() << ")";
    LINNET_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaKernels, Bf16ConversionRoundsToNearestEven) {
  const auto x = randn(1000, 1, 3.0f);
  Dev<float> in(x), back(x.size());
  Dev<__nv_bfloat16> b(x.size());
  cuda::launch_f32_to_bf16(in.get(), b.get(), 1000, stream_);
  cuda::launch_bf16_to_f32(b.get(), back.get(), 1000, stream_);
  std::vector<float> ref(x.size());
  std::transform(x.begin(), x.end(), ref.begin(), bf16_round);
  expect_close(back.host(), ref, 0.0f, 0.0f, "bf16 round trip");
}

TEST_F(CudaKernels, FillNormalMatchesTheHostGenerator) {
  const int64_t n = 1 << 16;
  Dev<__nv_bfloat16> b(n);
  Dev<float> f(n);
  cuda::launch_fill_normal_bf16(b.get(), n, 42, 0.5f, stream_);
  cuda::launch_bf16_to_f32(b.get(), f.get(), n, stream_);
  std::vector<float> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = 0.5f * random_normal(42, static_cast<uint64_t>(i));
  expect_close(f.host(), ref, 1e-4f, 1e-2f, "fill_normal");
  double mean = 0, var = 0;
  for (float v : ref) mean += v;
  mean /= n;
  for (float v : ref) var += (v - mean) * (v - mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(var / n), 0.5, 0.01);
}

TEST_F(CudaKernels, EmbeddingLookupOfTheVocabSlice) {
  const int64_t vocab_local = 50, hidden = 96, begin = 100;
  const auto table = randn(vocab_local * hidden, 2);
  std::vector<float> table_r(table.size());
  std::transform(table.begin(), table.end(), table_r.begin(), bf16_round);
  const std::vector<int32_t> ids = {100, 149, 99, 150, 120, 0, 125};
  Dev<__nv_bfloat16> t(to_bf16(table));
  Dev<int32_t> d_ids(ids);
  Dev<float> out(ids.size() * hidden);
  cuda::launch_embedding_lookup(t.get(), begin, vocab_local, hidden, d_ids.get(), 7, out.get(), stream_);
  std::vector<float> ref(ids.size() * hidden);
  cpu::embedding_lookup(table_r.data(), begin, vocab_local, hidden, ids.data(), 7, ref.data());
  expect_close(out.host(), ref, 0.0f, 0.0f, "embedding");
}

TEST_F(CudaKernels, RmsNormRowsAndHeads) {
  for (int64_t dim : {64, 4096, 5000}) {
    const int64_t rows = 5;
    const auto x = randn(rows * dim, 3, 2.0f), w = randn(dim, 4);
    Dev<float> dx(x), dw(w), out(x.size());
    cuda::launch_rmsnorm(dx.get(), dw.get(), out.get(), rows, dim, 1e-5f, stream_);
    std::vector<float> ref(x.size());
    cpu::rmsnorm(x.data(), w.data(), ref.data(), rows, dim, 1e-5f);
    expect_close(out.host(), ref, 1e-5f, 1e-4f, "rmsnorm");
  }
  for (int64_t head_dim : {16, 128}) {  // the Qwen3 fixture's and Qwen3's
    const int64_t rows = 3, n_heads = 6, stride = n_heads * head_dim + 64;
    auto x = randn(rows * stride, 5), w = randn(head_dim, 6);
    Dev<float> dx(x), dw(w);
    cuda::launch_rmsnorm_heads(dx.get(), rows, stride, n_heads, head_dim, dw.get(), 1e-6f, stream_);
    cpu::rmsnorm_heads(x.data(), rows, stride, n_heads, head_dim, w.data(), 1e-6f);
    expect_close(dx.host(), x, 1e-5f, 1e-4f, "rmsnorm_heads");
  }
}

TEST_F(CudaKernels, RopePlainAndLlama3Scaled) {
  for (int64_t head_dim : {8, 96, 128}) {  // the fixtures', Phi-3's, Llama's
    for (bool scaled : {false, true}) {
      const int64_t rows = 6, n_heads = 4, stride = 8 * head_dim;
      std::vector<float> inv(head_dim / 2);
      cpu::rope_inv_freq(500000.0, head_dim, inv.data());
      if (scaled) cpu::rope_scale_llama3(inv.data(), head_dim / 2, 8.0, 1.0, 4.0, 8192.0);
      const std::vector<int32_t> pos = {0, 1, 17, 1000, 65000, 131000};
      auto x = randn(rows * stride, 7);
      Dev<float> dx(x), dinv(inv);
      Dev<int32_t> dpos(pos);
      cuda::launch_rope(dx.get(), rows, stride, n_heads, head_dim, dpos.get(), dinv.get(), stream_);
      cpu::rope(x.data(), rows, stride, n_heads, head_dim, pos.data(), inv.data());
      expect_close(dx.host(), x, 1e-5f, 1e-5f, scaled ? "rope llama3" : "rope");
    }
  }
}

TEST_F(CudaKernels, SwigluAddStoreAndGatherRows) {
  const int64_t rows = 7, inter = 300;
  const auto gu = randn(rows * 2 * inter, 8, 3.0f);
  Dev<float> dgu(gu), out(rows * inter);
  cuda::launch_swiglu(dgu.get(), out.get(), rows, inter, stream_);
  std::vector<float> ref(rows * inter);
  cpu::swiglu(gu.data(), ref.data(), rows, inter);
  expect_close(out.host(), ref, 1e-6f, 1e-5f, "swiglu");

  auto x = randn(1000, 9);
  const auto y = randn(1000, 10);
  Dev<float> dx(x), dy(y);
  cuda::launch_add_inplace(dx.get(), dy.get(), 1000, stream_);
  cpu::add_inplace(x.data(), y.data(), 1000);
  expect_close(dx.host(), x, 0.0f, 0.0f, "add_inplace");

  const int64_t row_elems = 40, src_stride = 100;
  const auto src = randn(4 * src_stride, 11);
  const std::vector<int32_t> slots = {9, 2, 5, 0};
  std::vector<float> cache(10 * row_elems, 0.0f);
  Dev<float> dsrc(src), dcache(cache);
  Dev<int32_t> dslots(slots);
  cuda::launch_store_rows(dsrc.get(), src_stride, dcache.get(), row_elems, dslots.get(), 4, stream_);
  cpu::store_rows(src.data(), src_stride, cache.data(), row_elems, slots.data(), 4);
  expect_close(dcache.host(), cache, 0.0f, 0.0f, "store_rows");
  // Into a bf16 cache: the same bits as the CPU kernel's round to nearest even.
  std::vector<uint16_t> cache_b(10 * row_elems, 0);
  Dev<__nv_bfloat16> dcache_b(std::vector<__nv_bfloat16>(10 * row_elems, __float2bfloat16_rn(0.0f)));
  cuda::launch_store_rows(dsrc.get(), src_stride, dcache_b.get(), row_elems, dslots.get(), 4, stream_);
  cpu::store_rows(src.data(), src_stride, cache_b.data(), row_elems, slots.data(), 4);
  const auto got_b = dcache_b.host();
  ASSERT_EQ(got_b.size(), cache_b.size());
  EXPECT_EQ(std::memcmp(got_b.data(), cache_b.data(), cache_b.size() * 2), 0) << "store_rows into bf16";

  const std::vector<int32_t> index = {3, 0, 3, 9};
  Dev<int32_t> dindex(index);
  Dev<float> gathered(4 * row_elems);
  cuda::launch_gather_rows(dcache.get(), row_elems, dindex.get(), 4, gathered.get(), stream_);
  std::vector<float> gref(4 * row_elems);
  cpu::gather_rows(cache.data(), row_elems, index.data(), 4, gref.data());
  expect_close(gathered.host(), gref, 0.0f, 0.0f, "gather_rows");
}

// Paged GQA attention on random pages: prefill-like (many rows, causal and windowed
// ranges) and decode-like (few rows, long ranges), with one split and with several.
struct AttnCase {
  int64_t rows, n_heads, n_kv_heads, head_dim, page_size, max_pages;
  int splits;
  bool window;
};

class CudaAttention : public CudaKernels, public testing::WithParamInterface<AttnCase> {};

TEST_P(CudaAttention, MatchesTheCpuKernel) {
  const AttnCase c = GetParam();
  const int64_t num_pages = c.rows * c.max_pages + 3;
  const int64_t kv_row = c.n_kv_heads * c.head_dim;
  const int64_t q_stride = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim;
  const auto q = randn(c.rows * q_stride, 20);
  const auto k = randn(num_pages * c.page_size * kv_row, 21);
  const auto v = randn(num_pages * c.page_size * kv_row, 22);
  std::mt19937 g(23);
  std::vector<int32_t> pages(static_cast<size_t>(num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), g);
  std::vector<int32_t> table(c.rows * c.max_pages), begin(c.rows), end(c.rows);
  const int64_t capacity = c.max_pages * c.page_size;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t p = 0; p < c.max_pages; ++p) table[r * c.max_pages + p] = pages[r * c.max_pages + p];
    end[r] = static_cast<int32_t>(1 + (r * 7919 + 13) % capacity);
    begin[r] = c.window ? std::max(0, end[r] - 37) : 0;
  }
  Dev<float> dq(q), dk(k), dv(v), out(c.rows * c.n_heads * c.head_dim);
  Dev<int32_t> dt(table), db(begin), de(end);
  Dev<float> ws(std::max<size_t>(1, cuda::attention_workspace_floats(c.rows, c.n_heads, c.head_dim, c.splits)));
  cuda::launch_attention(dq.get(), q_stride, dk.get(), dv.get(), out.get(), c.rows, c.n_heads, c.n_kv_heads,
                         c.head_dim, dt.get(), c.max_pages, c.page_size, db.get(), de.get(), c.splits, ws.get(),
                         stream_);
  std::vector<float> ref(c.rows * c.n_heads * c.head_dim);
  cpu::attention(q.data(), q_stride, k.data(), v.data(), ref.data(), c.rows, c.n_heads, c.n_kv_heads, c.head_dim,
                 table.data(), c.max_pages, c.page_size, begin.data(), end.data());
  expect_close(out.host(), ref, 2e-5f, 2e-4f, "attention");

  // The same over a bf16 cache (--kv-cache-dtype bf16, CUDA's default) against the CPU
  // kernel over the same bf16 bits.
  const auto kb = to_bf16(k), vb = to_bf16(v);
  Dev<__nv_bfloat16> dkb(kb), dvb(vb);
  Dev<float> out_b(c.rows * c.n_heads * c.head_dim);
  cuda::launch_attention(dq.get(), q_stride, dkb.get(), dvb.get(), out_b.get(), c.rows, c.n_heads, c.n_kv_heads,
                         c.head_dim, dt.get(), c.max_pages, c.page_size, db.get(), de.get(), c.splits, ws.get(),
                         stream_);
  std::vector<uint16_t> kbits(kb.size()), vbits(vb.size());
  std::memcpy(kbits.data(), kb.data(), kb.size() * 2);
  std::memcpy(vbits.data(), vb.data(), vb.size() * 2);
  cpu::attention(q.data(), q_stride, kbits.data(), vbits.data(), ref.data(), c.rows, c.n_heads, c.n_kv_heads,
                 c.head_dim, table.data(), c.max_pages, c.page_size, begin.data(), end.data());
  expect_close(out_b.host(), ref, 2e-5f, 2e-4f, "attention over a bf16 cache");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttention,
    testing::Values(AttnCase{40, 8, 2, 64, 16, 4, 1, false}, AttnCase{40, 8, 2, 64, 16, 4, 1, true},
                    AttnCase{3, 32, 8, 128, 64, 20, 1, false}, AttnCase{3, 32, 8, 128, 64, 20, 7, false},
                    AttnCase{2, 16, 1, 128, 16, 30, 5, true}, AttnCase{5, 4, 4, 256, 8, 9, 3, false},
                    // the fixtures' head_dim 8 and 16, Phi-3's 96 (no power of two)
                    AttnCase{9, 8, 2, 8, 16, 3, 1, false}, AttnCase{9, 4, 2, 16, 64, 2, 2, true},
                    AttnCase{4, 32, 32, 96, 64, 6, 4, false}, AttnCase{7, 12, 4, 96, 16, 9, 1, true}));

TEST_F(CudaKernels, AttentionSplitsFillTheMachineOnlyWhenRowsAreFew) {
  EXPECT_EQ(cuda::attention_num_splits(4096, 8, 8192, 132), 1);
  EXPECT_GT(cuda::attention_num_splits(1, 8, 8192, 132), 1);
  EXPECT_EQ(cuda::attention_num_splits(1, 8, 10, 132), 1);
  EXPECT_LE(cuda::attention_num_splits(1, 1, 1 << 20, 132), 64);
}

TEST_F(CudaKernels, CublasLtGemmMatchesCpuOnBf16Inputs) {
  cuda::CublasLtGemm gemm(stream_);
  // n = 301: an odd vocabulary slice (the fixtures' lm_head), so out's rows are only
  // 4-byte aligned; k = 112: the fixtures' intermediate size.
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 96, 200}, {7, 96, 200}, {64, 96, 200},
                         {1, 112, 301}, {40, 64, 301}}) {
    const auto x = randn(m * k, 30), w = randn(n * k, 31);
    std::vector<float> xr(x.size()), wr(w.size());
    std::transform(x.begin(), x.end(), xr.begin(), bf16_round);
    std::transform(w.begin(), w.end(), wr.begin(), bf16_round);
    Dev<float> dx(x), out(m * n);
    Dev<__nv_bfloat16> dw(to_bf16(w));
    gemm.matmul_nt(dx.get(), dw.get(), out.get(), m, k, n);
    gemm.matmul_nt(dx.get(), dw.get(), out.get(), m, k, n);  // the cached plan
    std::vector<float> ref(m * n);
    cpu::matmul_nt(xr.data(), wr.data(), ref.data(), m, k, n);
    expect_close(out.host(), ref, 1e-3f, 1e-3f, "gemm");
  }
  // Buffers inside bigger ones (16-byte aligned, as a row of a tensor can be): the plan
  // must be chosen for that alignment, not cuBLASLt's default assumption of 256 bytes.
  const int64_t m = 3, k = 64, n = 40;
  const auto x = randn(m * k, 32), w = randn(n * k + 8, 33);
  std::vector<float> xr(x.size()), wr(w.size());
  std::transform(x.begin(), x.end(), xr.begin(), bf16_round);
  std::transform(w.begin(), w.end(), wr.begin(), bf16_round);
  Dev<float> dx(x), out(m * n + 4);
  Dev<__nv_bfloat16> dw(to_bf16(w));
  gemm.matmul_nt(dx.get(), dw.get() + 8, out.get() + 4, m, k, n);
  std::vector<float> ref(m * n);
  cpu::matmul_nt(xr.data(), wr.data() + 8, ref.data(), m, k, n);
  auto got = out.host();
  got.erase(got.begin(), got.begin() + 4);  // never written
  expect_close(got, ref, 1e-3f, 1e-3f, "gemm, offset buffers");
}

TEST_F(CudaKernels, ArgmaxTopKAndTopP) {
  const int64_t rows = 3, ld = 1000, n_valid = 990, k = 8;
  auto logits = randn(rows * ld, 40, 3.0f);
  for (int64_t r = 0; r < rows; ++r) logits[r * ld + 995] = 100.0f;  // padding: never chosen
  logits[1 * ld + 10] = logits[1 * ld + 20] = 50.0f;                  // tie: lower index wins
  Dev<float> dl(logits), val(rows), tv(rows * k), ws(rows * n_valid), probs(rows * k);
  Dev<int32_t> idx(rows), ti(rows * k);
  cuda::launch_argmax(dl.get(), rows, ld, n_valid, val.get(), idx.get(), stream_);
  cuda::launch_topk(dl.get(), rows, ld, n_valid, k, ws.get(), tv.get(), ti.get(), stream_);
  cuda::launch_top_p(tv.get(), rows, k, 0.7f, 0.9f, probs.get(), stream_);
  const auto hidx = idx.host(), hti = ti.host();
  const auto htv = tv.host(), hp = probs.host();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> order(n_valid);
    std::iota(order.begin(), order.end(), 0);
    const float* row = logits.data() + r * ld;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    EXPECT_EQ(hidx[r], order[0]) << "row " << r;
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(hti[r * k + j], order[j]) << "row " << r << " rank " << j;
      EXPECT_EQ(htv[r * k + j], row[order[j]]);
    }
    // Top-p reference over the k candidates.
    std::vector<double> e(k);
    double total = 0;
    for (int64_t j = 0; j < k; ++j) total += e[j] = std::exp((htv[r * k + j] - htv[r * k]) / 0.7);
    double kept = 0, z = 0;
    int64_t n = 0;
    while (n < k) {
      kept += e[n] / total;
      z += e[n];
      ++n;
      if (kept >= 0.9) break;
    }
    for (int64_t j = 0; j < k; ++j) EXPECT_NEAR(hp[r * k + j], j < n ? e[j] / z : 0.0, 1e-5) << r << "," << j;
  }
  EXPECT_EQ(hidx[1], 10);
}

// The shard sampling's check (Engine::step_paged_top): the first NaN / +-inf column below
// n_valid of each row, -1 when none; padding columns past n_valid are not looked at.
TEST_F(CudaKernels, FirstNonFiniteColumnOfEachRow) {
  const int64_t rows = 5, ld = 2000, n_valid = 1990;
  auto logits = randn(rows * ld, 41);
  logits[0 * ld + 1500] = NAN;
  logits[0 * ld + 700] = INFINITY;  // the first of row 0
  logits[1 * ld + 3] = -INFINITY;
  logits[2 * ld + 1995] = NAN;      // padding: not seen
  logits[3 * ld + 1989] = NAN;      // the last valid column
  Dev<float> dl(logits);
  Dev<int32_t> out(rows);
  cuda::launch_first_nonfinite(dl.get(), rows, ld, n_valid, out.get(), stream_);
  const auto got = out.host();
  for (int64_t r = 0; r < rows; ++r) {
    int32_t want = -1;
    for (int64_t j = 0; j < n_valid && want < 0; ++j) {
      if (!std::isfinite(logits[r * ld + j])) want = static_cast<int32_t>(j);
    }
    EXPECT_EQ(got[r], want) << "row " << r;
  }
  EXPECT_EQ(got[0], 700);
  EXPECT_EQ(got[2], -1);
}

// The sampler's penalties on a logits slice (Backend::apply_penalties): bit-equal to the
// host's f32 operations, ids outside [vocab_begin, vocab_begin + n_valid) left alone.
TEST_F(CudaKernels, ApplyPenaltiesAsTheSamplerDoes) {
  const int64_t rows = 3, ld = 300, n_valid = 290, vocab_begin = 1000;
  auto logits = randn(rows * ld, 42, 4.0f);
  struct E { int32_t row, id; float rep, sub; };
  const std::vector<E> entries = {{0, 1000, 1.3f, 0.0f},  {0, 1005, 0.7f, 0.5f}, {1, 1289, 1.0f, -0.25f},
                                  {1, 1290, 2.0f, 1.0f},  {2, 999, 2.0f, 1.0f},  {2, 1100, 1.7f, 0.1f},
                                  {2, 1101, 1.0f, 0.0f}};
  std::vector<int32_t> packed;
  auto want = logits;
  for (const E& e : entries) {
    int32_t rep = 0, sub = 0;
    std::memcpy(&rep, &e.rep, 4);
    std::memcpy(&sub, &e.sub, 4);
    packed.insert(packed.end(), {e.row, e.id, rep, sub});
    const int64_t col = e.id - vocab_begin;
    if (col < 0 || col >= n_valid) continue;
    float& l = want[e.row * ld + col];
    if (e.rep != 1.0f) l = l < 0.0f ? l * e.rep : l / e.rep;
    if (e.sub != 0.0f) l -= e.sub;
  }
  Dev<float> dl(logits);
  Dev<int32_t> de(packed);
  cuda::launch_apply_penalties(dl.get(), ld, vocab_begin, n_valid, de.get(), static_cast<int64_t>(entries.size()),
                               stream_);
  const auto got = dl.host();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
}

// The softmax normalizers of a logits slice (Backend::exp_sums): the host's ExpSum of
// exp((l - max) / divisor) over columns < n_valid. Exact where every term is (a flat
// row: n_valid terms of 1; -inf: 0); elsewhere within 1e-13 (CUDA's f64 exp may differ
// from the host's in the last bit, which the 2^-62 fixed point keeps).
TEST_F(CudaKernels, ExpSumsAsTheHost) {
  const int64_t rows = 3, ld = 3000, n_valid = 2990;
  auto logits = randn(rows * ld, 77, 3.0f);
  for (int64_t j = 0; j < ld; ++j) logits[2 * ld + j] = 1.5f;  // row 2: flat
  logits[2 * ld + 10] = -INFINITY;
  logits[0 * ld + 2995] = 1e30f;  // padding: not seen
  struct Q { int32_t row; double divisor; };
  const std::vector<Q> qs = {{0, 1.0}, {0, 0.7}, {1, 2.5}, {2, 1.0}, {1, 1e-3}};
  std::vector<int32_t> packed;
  std::vector<double> want;
  for (const Q& q : qs) {
    const float* row = logits.data() + q.row * ld;
    const double mx = *std::max_element(row, row + n_valid);
    int32_t words[4];
    std::memcpy(words, &mx, 8);
    std::memcpy(words + 2, &q.divisor, 8);
    packed.insert(packed.end(), {q.row, words[0], words[1], words[2], words[3]});
    ExpSum s;
    for (int64_t j = 0; j < n_valid; ++j) s.add(exp_sum_term(std::exp((static_cast<double>(row[j]) - mx) / q.divisor)));
    want.push_back(s.value());
  }
  Dev<float> dl(logits);
  Dev<int32_t> dq(packed);
  Dev<unsigned long long> out(2 * qs.size());
  cuda::launch_exp_sums(dl.get(), ld, n_valid, dq.get(), static_cast<int64_t>(qs.size()), out.get(), stream_);
  const auto got = out.host();
  for (size_t j = 0; j < qs.size(); ++j) {
    const double g = ExpSum{got[2 * j], got[2 * j + 1]}.value();
    EXPECT_NEAR(g, want[j], 1e-13 * want[j]) << "request " << j;
  }
  const ExpSum flat{got[6], got[7]};
  EXPECT_EQ(flat.value(), static_cast<double>(n_valid - 1));  // the flat row: one -inf, the rest 1
}

TEST_F(CudaKernels, CrossEntropyPiecesOfAVocabSlice) {
  const int64_t rows = 4, ld = 512, n_valid = 500, vocab_begin = 1000;
  const auto logits = randn(rows * ld, 50, 4.0f);
  const std::vector<int32_t> targets = {1000, 1499, 999, 1250};
  Dev<float> dl(logits), m(rows), s(rows), t(rows);
  Dev<int32_t> dt(targets);
  cuda::launch_cross_entropy_pieces(dl.get(), rows, ld, n_valid, vocab_begin, dt.get(), m.get(), s.get(), t.get(),
                                    stream_);
  std::vector<float> rm(rows), rs(rows), rt(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * ld;
    rm[r] = *std::max_element(row, row + n_valid);
    double sum = 0;
    for (int64_t i = 0; i < n_valid; ++i) sum += std::exp(static_cast<double>(row[i]) - rm[r]);
    rs[r] = static_cast<float>(sum);
    const int64_t c = targets[r] - vocab_begin;
    rt[r] = c >= 0 && c < n_valid ? row[c] : 0.0f;
  }
  expect_close(m.host(), rm, 0.0f, 0.0f, "row_max");
  expect_close(s.host(), rs, 1e-5f, 1e-5f, "sum_exp");
  expect_close(t.host(), rt, 0.0f, 0.0f, "target_logit");
}

}  // namespace
}  // namespace linnet
