// CudaBackend: the Backend ops on one CUDA device, forwarding to kernels/cuda.
// Design choice: everything runs on one non-blocking stream with memory from the
// device's stream-ordered pool (cudaMallocAsync / cudaFreeAsync, release threshold
// raised so freed blocks stay cached): the Engine allocates its activations every pass,
// and this keeps that a pool lookup instead of a cudaMalloc. Small i32 inputs go
// through a pinned staging arena, so their copies are truly asynchronous; the arena is
// recycled whenever the stream is known idle. Waiting on the stream polls the
// communicator's asynchronous error state (NCCL), so a failed peer ends the wait.
// CUDA graphs (Backend::begin_capture): stream capture in thread-local mode; while
// recording, alloc() carves tensors from the graph's own arena (one device block), so
// no allocation is recorded and every recorded address lives as long as the graph.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/error.h"
#include "common/cuda_check.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "parallel/comm_watch.h"
#include "parallel/self_communicator.h"
#include "parallel/staged_communicator.h"
#include "parallel/tp_comm_choice.h"
#include "common/log.h"
#include "runtime/block_cache.h"
#include "runtime/cuda_backend.h"
#include "runtime/weights.h"
#ifdef LINNET_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace linnet {
namespace {

// Owns the stream and the cache of freed blocks; shared by every tensor's deleter, so
// tensors that outlive the backend still give their blocks back to a live cache.
struct StreamOwner {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<BlockCache> cache;
  ~StreamOwner() {
    if (stream) {
      cudaSetDevice(device);
      cudaStreamSynchronize(stream);
      cache.reset();  // cudaFreeAsync of every cached block, on the stream
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }
};

// A recorded graph: its executable and the arena its recorded ops use.
struct CudaGraph final : Backend::Graph {
  std::shared_ptr<StreamOwner> owner;
  std::shared_ptr<void> arena;
  cudaGraphExec_t exec = nullptr;
  ~CudaGraph() override {
    if (exec) {
      cudaSetDevice(owner->device);
      cudaStreamSynchronize(owner->stream);  // no launch of it still queued
      cudaGraphExecDestroy(exec);
    }
  }
};

constexpr size_t kAllocAlign = 256;
size_t aligned(size_t bytes) { return (bytes + kAllocAlign - 1) / kAllocAlign * kAllocAlign; }

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, DType kv_cache_dtype) : owner_(std::make_shared<StreamOwner>()), kv_dtype_(kv_cache_dtype) {
    if (kv_cache_dtype != DType::kF32 && kv_cache_dtype != DType::kBF16) {
      throw Error("the CUDA KV cache is bf16 or f32", "--kv-cache-dtype", "bf16 or f32", dtype_name(kv_cache_dtype));
    }
    owner_->device = device;
    LINNET_CUDA_CHECK(cudaSetDevice(device));
    LINNET_CUDA_CHECK(cudaStreamCreateWithFlags(&owner_->stream, cudaStreamNonBlocking));
    stream_ = owner_->stream;
    cudaStream_t stream = stream_;
    owner_->cache = std::make_unique<BlockCache>(
        [stream](size_t bytes) -> void* {
          void* p = nullptr;
          const cudaError_t rc = cudaMallocAsync(&p, bytes, stream);
          if (rc == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return nullptr;
          }
          LINNET_CUDA_CHECK(rc);
          return p;
        },
        [stream](void* p) { cudaFreeAsync(p, stream); });
    LINNET_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
    int pools = 0;
    LINNET_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
    if (pools == 0) {
      throw Error("this CUDA device has no stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported = 0), "
                  "which the CUDA backend allocates from",
                  "--backend cuda (device " + std::to_string(device) + ")", "CUDA 11.2+ driver on a device with pools",
                  "unsupported (use --backend cpu)");
    }
    cudaMemPool_t pool = nullptr;
    LINNET_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = UINT64_MAX;
    LINNET_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    LINNET_CUDA_CHECK(cudaHostAlloc(&pinned_, kPinnedBytes, cudaHostAllocDefault));
    gemm_ = std::make_unique<cuda::CublasLtGemm>(stream_);
    device_ = device;
  }

  ~CudaBackend() override {
    if (capture_) {  // a recording left open by an error: end it, drop the graph
      cudaGraph_t g = nullptr;
      if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g) cudaGraphDestroy(g);
      (void)cudaGetLastError();
    }
    comm_.reset();
    gemm_.reset();
    if (owner_->stream) cudaStreamSynchronize(owner_->stream);
    if (pinned_) cudaFreeHost(pinned_);
  }

  Device device() const override { return Device::kCuda; }
  DType kv_cache_dtype() const override { return kv_dtype_; }
  std::string name() const override { return "cuda:" + std::to_string(device_); }

  Tensor zeros(std::vector<int64_t> shape, DType dtype) override {
    Tensor t = alloc(std::move(shape), dtype);
    LINNET_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, static_cast<size_t>(t.bytes()), stream_));
    return t;
  }

  Tensor empty(std::vector<int64_t> shape, DType dtype) override { return alloc(std::move(shape), dtype); }

  Tensor upload_matrix(const Tensor& host) override {
    if (host.device() == Device::kCuda && host.dtype() == DType::kBF16) return host;
    if (host.device() == Device::kCpu && is_quantized(host.dtype())) {
      // A pre-quantized checkpoint's packed matrix (load_weights): dequantized on the
      // host to f32, row by row (cpu::unpack_row: (q - z) s in f32), then held in bf16
      // like any other matrix. No int4 / int8 CUDA kernel yet.
      const int64_t n = host.dim(0), k = host.dim(1);
      Tensor wide = Tensor::zeros({n, k}, DType::kF32);
      for (int64_t j = 0; j < n; ++j) cpu::unpack_row(host.raw(), host.dtype(), k, j, wide.data() + j * k);
      return upload_matrix(wide);
    }
    if (host.dtype() != DType::kF32) {
      throw Error("a weight matrix must be f32 (or bf16 already on the device)", "CudaBackend::upload_matrix");
    }
    Tensor out = alloc(host.shape(), DType::kBF16);
    auto* dst = static_cast<__nv_bfloat16*>(out.raw());
    if (host.device() == Device::kCuda) {
      cuda::launch_f32_to_bf16(host.data(), dst, host.numel(), stream_);
      return out;
    }
    // Host f32 in chunks through one device f32 buffer, converted on the device.
    constexpr int64_t kChunk = int64_t{16} << 20;  // elements
    const int64_t n = host.numel();
    Tensor staging = alloc({std::min(n, kChunk)}, DType::kF32);
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t m = std::min(kChunk, n - i);
      LINNET_CUDA_CHECK(cudaMemcpyAsync(staging.data(), host.data() + i, static_cast<size_t>(m) * sizeof(float),
                                        cudaMemcpyHostToDevice, stream_));
      cuda::launch_f32_to_bf16(staging.data(), dst + i, m, stream_);
    }
    return out;
  }

  Tensor upload_vector(const Tensor& host) override {
    if (host.device() == Device::kCuda) return host;
    if (host.dtype() != DType::kF32) throw Error("a weight vector must be f32", "CudaBackend::upload_vector");
    Tensor out = alloc(host.shape(), DType::kF32);
    LINNET_CUDA_CHECK(cudaMemcpyAsync(out.raw(), host.raw(), static_cast<size_t>(host.bytes()),
                                      cudaMemcpyHostToDevice, stream_));
    return out;
  }

  Tensor upload_i32(std::span<const int32_t> values) override {
    Tensor out = alloc({static_cast<int64_t>(values.size())}, DType::kI32);
    const size_t bytes = values.size() * sizeof(int32_t);
    if (bytes == 0) return out;
    if (bytes > kPinnedBytes) {  // rare: straight from pageable memory (the copy stages it)
      LINNET_CUDA_CHECK(cudaMemcpyAsync(out.raw(), values.data(), bytes, cudaMemcpyHostToDevice, stream_));
      return out;
    }
    LINNET_CUDA_CHECK(cudaMemcpyAsync(out.raw(), stage(values), bytes, cudaMemcpyHostToDevice, stream_));
    return out;
  }

  void to_host(const Tensor& t, float* out) override {
    if (t.numel() == 0) return;
    if (t.device() == Device::kCpu) {
      std::memcpy(out, t.raw(), static_cast<size_t>(t.numel()) * sizeof(float));
      return;
    }
    const float* src = t.data();
    Tensor converted;
    if (t.dtype() == DType::kBF16) {
      converted = alloc(t.shape(), DType::kF32);
      cuda::launch_bf16_to_f32(static_cast<const __nv_bfloat16*>(t.raw()), converted.data(), t.numel(), stream_);
      src = converted.data();
    } else if (t.dtype() != DType::kF32) {
      throw Error("to_host copies f32 (or bf16) tensors", "CudaBackend::to_host");
    }
    // Wait first (polling the communicator), so a copy into pageable memory, which blocks
    // the host until done, never waits on a collective whose peer has failed.
    synchronize();
    LINNET_CUDA_CHECK(cudaMemcpyAsync(out, src, static_cast<size_t>(t.numel()) * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_));
    LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  int64_t host_waits() const override { return waits_; }
  double wait_seconds() const override { return wait_s_; }

  void synchronize() override {
    ++waits_;
    const auto t0 = std::chrono::steady_clock::now();
    wait_stream();
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void wait_stream() {
    if (watchers_.empty()) {
      LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
    } else {
      // Poll so that an aborted peer (NCCL async error) or a stalled one (no progress
      // within --comm-timeout) ends the wait with an error naming the collective.
      WaitClock clock;
      PollBackoff backoff;
      for (;;) {
        const cudaError_t rc = cudaStreamQuery(stream_);
        if (rc == cudaSuccess) break;
        if (rc != cudaErrorNotReady) LINNET_CUDA_CHECK(rc);
        const double waited = clock.seconds();
        for (auto& w : watchers_) w(waited);
        backoff.pause();
      }
    }
    pinned_used_ = 0;
  }

  void matmul_nt(const float* x, const Tensor& w, float* out, int64_t m, int64_t k, int64_t n) override {
    gemm_->matmul_nt(x, bf16(w, "matmul_nt"), out, m, k, n);
  }
  void embedding_lookup(const Tensor& table, int64_t vocab_begin, int64_t vocab_local, int64_t hidden,
                        const int32_t* ids, int64_t n, float* out) override {
    cuda::launch_embedding_lookup(bf16(table, "embedding_lookup"), vocab_begin, vocab_local, hidden, ids, n, out,
                                  stream_);
  }
  void rmsnorm(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps) override {
    cuda::launch_rmsnorm(x, weight, out, rows, dim, eps, stream_);
  }
  void rope(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim, const int32_t* positions,
            const float* inv_freq) override {
    cuda::launch_rope(x, rows, row_stride, n_heads, head_dim, positions, inv_freq, stream_);
  }
  void swiglu(const float* gate_up, float* out, int64_t rows, int64_t inter) override {
    cuda::launch_swiglu(gate_up, out, rows, inter, stream_);
  }
  void attention(const float* q, int64_t q_stride, const Tensor& k_cache_t, const Tensor& v_cache_t, float* out,
                 int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const int32_t* page_table,
                 int64_t max_pages, int64_t page_size, const int32_t* key_begin, const int32_t* key_end) override {
    check_cache(k_cache_t, "attention");
    check_cache(v_cache_t, "attention");
    const int splits = cuda::attention_num_splits(rows, n_kv_heads, max_pages * page_size, num_sms_);
    const size_t ws = cuda::attention_workspace_floats(rows, n_heads, head_dim, splits);
    Tensor workspace;
    if (ws > 0) workspace = alloc({static_cast<int64_t>(ws)}, DType::kF32);
    float* wsp = ws > 0 ? workspace.data() : nullptr;
    if (kv_dtype_ == DType::kBF16) {
      cuda::launch_attention(q, q_stride, static_cast<const __nv_bfloat16*>(k_cache_t.raw()),
                             static_cast<const __nv_bfloat16*>(v_cache_t.raw()), out, rows, n_heads, n_kv_heads,
                             head_dim, page_table, max_pages, page_size, key_begin, key_end, splits, wsp, stream_);
    } else {
      cuda::launch_attention(q, q_stride, k_cache_t.data(), v_cache_t.data(), out, rows, n_heads, n_kv_heads,
                             head_dim, page_table, max_pages, page_size, key_begin, key_end, splits, wsp, stream_);
    }
  }
  void rmsnorm_heads(float* x, int64_t rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                     const float* weight, float eps) override {
    cuda::launch_rmsnorm_heads(x, rows, row_stride, n_heads, head_dim, weight, eps, stream_);
  }
  void add_inplace(float* x, const float* y, int64_t n) override { cuda::launch_add_inplace(x, y, n, stream_); }
  void store_rows(const float* src, int64_t src_stride, Tensor& cache_t, int64_t row_elems, const int32_t* slots,
                  int64_t rows) override {
    check_cache(cache_t, "store_rows");
    if (kv_dtype_ == DType::kBF16) {
      cuda::launch_store_rows(src, src_stride, static_cast<__nv_bfloat16*>(cache_t.raw()), row_elems, slots, rows,
                              stream_);
    } else {
      cuda::launch_store_rows(src, src_stride, cache_t.data(), row_elems, slots, rows, stream_);
    }
  }
  void gather_rows(const float* src, int64_t cols, const int32_t* index, int64_t n, float* out) override {
    cuda::launch_gather_rows(src, cols, index, n, out, stream_);
  }

  Tensor random_matrix(std::vector<int64_t> shape, float stddev, uint64_t seed, bool /*vocab*/) override {
    Tensor t = alloc(std::move(shape), DType::kBF16);
    cuda::launch_fill_normal_bf16(static_cast<__nv_bfloat16*>(t.raw()), t.numel(), seed, stddev, stream_);
    return t;
  }

  bool supports_graphs() const override { return true; }
  size_t allocated_bytes() const override { return allocated_; }

  void begin_capture(size_t arena_bytes) override {
    if (capture_) throw Error("already recording a graph", "CudaBackend::begin_capture");
    auto g = std::make_unique<CudaGraph>();
    g->owner = owner_;
    void* p = nullptr;
    LINNET_CUDA_CHECK(cudaMallocAsync(&p, std::max<size_t>(arena_bytes, kAllocAlign), stream_));
    std::shared_ptr<StreamOwner> owner = owner_;
    g->arena = std::shared_ptr<void>(p, [owner](void* q) { cudaFreeAsync(q, owner->stream); });
    arena_bytes_ = arena_bytes;
    arena_used_ = 0;
    gemm_->keep_outgrown_scratch();  // the graph records the GEMM scratch's address
    LINNET_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capture_ = std::move(g);
  }

  std::unique_ptr<Graph> end_capture() override {
    if (!capture_) throw Error("not recording a graph", "CudaBackend::end_capture");
    std::unique_ptr<CudaGraph> g = std::move(capture_);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (ended != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      LINNET_CUDA_CHECK(ended);
    }
    const cudaError_t made = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    LINNET_CUDA_CHECK(made);
    return g;
  }

  void replay(Graph& graph) override {
    auto* g = dynamic_cast<CudaGraph*>(&graph);
    if (g == nullptr || g->owner != owner_) throw Error("not a graph of this backend", "CudaBackend::replay");
    LINNET_CUDA_CHECK(cudaGraphLaunch(g->exec, stream_));
  }

  void copy_i32(std::span<const int32_t> values, Tensor& dst) override {
    if (dst.device() != Device::kCuda || dst.dtype() != DType::kI32 ||
        dst.numel() < static_cast<int64_t>(values.size())) {
      throw Error("the destination is not a large enough i32 device tensor", "CudaBackend::copy_i32");
    }
    const size_t bytes = values.size() * sizeof(int32_t);
    if (bytes == 0) return;
    if (bytes > kPinnedBytes) {
      LINNET_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), values.data(), bytes, cudaMemcpyHostToDevice, stream_));
      return;
    }
    LINNET_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), stage(values), bytes, cudaMemcpyHostToDevice, stream_));
  }

  void cross_entropy_rows(const Tensor& logits, int64_t ld, int64_t n_valid, int64_t vocab_begin,
                          std::span<const int32_t> targets, float* row_max, float* sum_exp,
                          float* target_logit) override {
    const int64_t rows = static_cast<int64_t>(targets.size());
    if (rows == 0) return;
    LINNET_CHECK(logits.device() == Device::kCuda && logits.numel() >= rows * ld, "cross_entropy_rows: logits");
    const Tensor t = upload_i32(targets);
    Tensor out = alloc({3 * rows}, DType::kF32);
    cuda::launch_cross_entropy_pieces(logits.data(), rows, ld, n_valid, vocab_begin, t.i32(), out.data(),
                                      out.data() + rows, out.data() + 2 * rows, stream_);
    std::vector<float> h(static_cast<size_t>(3 * rows));
    to_host(out, h.data());
    std::copy(h.begin(), h.begin() + rows, row_max);
    std::copy(h.begin() + rows, h.begin() + 2 * rows, sum_exp);
    std::copy(h.begin() + 2 * rows, h.end(), target_logit);
  }

  void apply_penalties(Tensor& logits, int64_t ld, int64_t vocab_begin, int64_t n_valid,
                       std::span<const Penalty> penalties) override {
    if (penalties.empty()) return;
    if (logits.device() == Device::kCpu) return Backend::apply_penalties(logits, ld, vocab_begin, n_valid, penalties);
    std::vector<int32_t> packed(4 * penalties.size());
    for (size_t i = 0; i < penalties.size(); ++i) {
      packed[4 * i] = penalties[i].row;
      packed[4 * i + 1] = penalties[i].id;
      std::memcpy(&packed[4 * i + 2], &penalties[i].repetition, 4);
      std::memcpy(&packed[4 * i + 3], &penalties[i].subtract, 4);
    }
    const Tensor entries = upload_i32(packed);
    cuda::launch_apply_penalties(logits.data(), ld, vocab_begin, n_valid, entries.i32(),
                                 static_cast<int64_t>(penalties.size()), stream_);
  }

  void exp_sums(const Tensor& logits, int64_t ld, int64_t n_valid, std::span<const ExpSumRequest> requests,
                ExpSum* out) override {
    if (requests.empty()) return;
    if (logits.device() == Device::kCpu) return Backend::exp_sums(logits, ld, n_valid, requests, out);
    LINNET_CHECK(n_valid >= 0 && n_valid <= ld, "exp_sums shape");
    const int64_t n = static_cast<int64_t>(requests.size());
    std::vector<int32_t> packed(static_cast<size_t>(5 * n));
    for (int64_t j = 0; j < n; ++j) {
      const ExpSumRequest& q = requests[static_cast<size_t>(j)];
      LINNET_CHECK(q.row >= 0 && (q.row + 1) * ld <= logits.numel(), "exp_sums row");
      packed[5 * j] = q.row;
      std::memcpy(&packed[5 * j + 1], &q.max, 8);
      std::memcpy(&packed[5 * j + 3], &q.divisor, 8);
    }
    const Tensor entries = upload_i32(packed);
    Tensor sums = alloc({4 * n}, DType::kF32);  // u64 [2 n], copied out as bits
    cuda::launch_exp_sums(logits.data(), ld, n_valid, entries.i32(), n,
                          static_cast<unsigned long long*>(sums.raw()), stream_);
    std::vector<uint64_t> h(static_cast<size_t>(2 * n));
    to_host(sums, reinterpret_cast<float*>(h.data()));  // waits (polling the communicator)
    for (int64_t j = 0; j < n; ++j) out[j] = ExpSum{h[2 * j], h[2 * j + 1]};
  }

  void argmax_rows(const Tensor& logits, int64_t rows, int64_t ld, int64_t n_valid, float* value, int32_t* index,
                   int32_t* bad) override {
    if (rows <= 0) return;
    if (logits.device() == Device::kCpu) return Backend::argmax_rows(logits, rows, ld, n_valid, value, index, bad);
    LINNET_CHECK(logits.numel() >= rows * ld && n_valid <= ld, "argmax_rows shape");
    Tensor vals = alloc({rows}, DType::kF32);
    Tensor ints = alloc({2 * rows}, DType::kI32);  // [index | bad]
    if (n_valid > 0) {
      cuda::launch_argmax(logits.data(), rows, ld, n_valid, vals.data(), ints.i32(), stream_);
    }
    cuda::launch_first_nonfinite(logits.data(), rows, ld, n_valid, ints.i32() + rows, stream_);
    to_host(vals, value);  // waits (polling the communicator)
    std::vector<int32_t> h(static_cast<size_t>(2 * rows));
    LINNET_CUDA_CHECK(cudaMemcpyAsync(h.data(), ints.raw(), h.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                      stream_));
    LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int64_t r = 0; r < rows; ++r) {
      index[r] = n_valid > 0 ? h[r] : -1;
      bad[r] = h[rows + r];
    }
  }

  void top_k_rows(const Tensor& logits, int64_t ld, int64_t n_valid, int64_t k, float* values,
                  int32_t* index) override {
    if (logits.device() == Device::kCpu) return Backend::top_k_rows(logits, ld, n_valid, k, values, index);
    const int64_t rows = logits.dim(0);
    if (k <= 0 || k > n_valid) {
      throw Error("top-k outside the vocabulary slice", "CudaBackend::top_k_rows", "(0, " + std::to_string(n_valid) + "]",
                  std::to_string(k));
    }
    Tensor work = alloc({rows * n_valid}, DType::kF32);
    Tensor vals = alloc({rows * k}, DType::kF32);
    Tensor idx = alloc({rows * k}, DType::kI32);
    cuda::launch_topk(logits.data(), rows, ld, n_valid, k, work.data(), vals.data(), idx.i32(), stream_);
    to_host(vals, values);
    LINNET_CUDA_CHECK(cudaMemcpyAsync(index, idx.raw(), static_cast<size_t>(rows * k) * sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, stream_));
    LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  Communicator& communicator(MpiCommunicator& group, std::span<const TpCommReport> given) {
    if (comm_) {
      if (comm_group_ != group.comm()) {
        throw Error("a CUDA backend serves one tp group", "cuda_communicator");
      }
      return *comm_;
    }
    std::vector<TpCommReport> reports(given.begin(), given.end());
    if (reports.size() != static_cast<size_t>(group.size())) {
      TpCommReport mine;
      mine.wish = parse_comm_wish(std::getenv("LINNET_COMM"));
      mine.nccl_built = cuda_has_nccl() ? 1 : 0;
      mine.gpu_uuid = cuda_device_memory(device_).uuid;  // as start_engine_run reports it
      // Every rank's report, gathered once (a collective of the group; none for one
      // rank), so every rank makes the same choice (tp_comm_choice.h).
      reports.assign(static_cast<size_t>(group.size()), mine);
      if (group.size() > 1) {
        group.collective("all_gather (tp communicator choice)", [&](MPI_Request* request) {
          return MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, reports.data(), sizeof mine, MPI_BYTE, group.comm(),
                                request);
        });
      }
    }
    const TpCommChoice choice = choose_tp_comm(reports);
    info("tp communicator: " + std::string(tp_comm_kind_name(choice.kind)) + " (" + choice.reason + ")");
    if (choice.kind == TpCommKind::kSelf) {
      // tp = 1: nothing to exchange, so no NCCL (nor MPI) to start; all_gather is a copy
      // on the compute stream, which a CUDA graph records like any kernel.
      cudaStream_t stream = stream_;
      comm_ = std::make_unique<SelfCommunicator>(
          [stream](void* dst, const void* src, size_t bytes) {
            if (!is_device_pointer(dst) && !is_device_pointer(src)) {
              std::memcpy(dst, src, bytes);
              return;
            }
            LINNET_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
          },
          /*capturable=*/true);
      comm_group_ = group.comm();
      return *comm_;
    }
#ifdef LINNET_HAVE_NCCL
    if (choice.kind == TpCommKind::kNccl) {
      auto c = std::make_unique<NcclCommunicator>(group.comm(), stream_);
      NcclCommunicator* raw = c.get();
      watchers_.push_back([raw](double waited) { raw->poll(waited); });
      comm_ = std::move(c);
    }
#endif
    if (!comm_) comm_ = std::make_unique<HostStagedCommunicator>(group.comm(), stream_);
    comm_group_ = group.comm();
    return *comm_;
  }

 private:
  static constexpr size_t kPinnedBytes = size_t{1} << 20;

  // A KV cache tensor of this backend: on the device, in kv_cache_dtype().
  void check_cache(const Tensor& cache, const char* op) const {
    if (cache.device() != Device::kCuda || cache.dtype() != kv_dtype_) {
      throw Error(std::string("the KV cache is not a ") + dtype_name(kv_dtype_) + " device tensor",
                  std::string("CudaBackend::") + op, dtype_name(kv_dtype_), dtype_name(cache.dtype()));
    }
  }

  // `values` copied into the pinned arena (at most kPinnedBytes); returns where.
  const void* stage(std::span<const int32_t> values) {
    const size_t bytes = values.size() * sizeof(int32_t);
    if (pinned_used_ + bytes > kPinnedBytes) synchronize();  // every earlier copy has read the arena
    char* src = static_cast<char*>(pinned_) + pinned_used_;
    std::memcpy(src, values.data(), bytes);
    pinned_used_ += (bytes + 255) / 256 * 256;
    return src;
  }

  Tensor alloc(std::vector<int64_t> shape, DType dtype) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n * element_size(dtype), 4));
    if (capture_) {  // recording: from the graph's arena, never freed before the graph
      if (arena_used_ + aligned(bytes) > arena_bytes_) {
        throw Error("the graph's arena is too small (the recorded pass allocates more than its eager run)",
                    "CudaBackend::alloc", std::to_string(arena_bytes_) + " bytes",
                    std::to_string(arena_used_ + aligned(bytes)) + " bytes");
      }
      void* p = static_cast<char*>(capture_->arena.get()) + arena_used_;
      arena_used_ += aligned(bytes);
      std::shared_ptr<void> arena = capture_->arena;
      std::shared_ptr<void> storage(p, [arena](void*) {});
      return Tensor::wrap(std::move(shape), dtype, Device::kCuda, std::move(storage), p);
    }
    allocated_ += aligned(bytes);
    // From the cache of freed blocks (runtime/block_cache.h): after the first steps no
    // pass allocates; the pool behind it is only asked for new shapes.
    void* p = nullptr;
    try {
      p = owner_->cache->take(bytes);
    } catch (const std::bad_alloc&) {
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error("out of GPU memory allocating " + std::to_string(bytes) + " bytes (" + std::to_string(free_b >> 20) +
                      " MiB free of " + std::to_string(total_b >> 20) + " MiB)",
                  name(), "a smaller --kv-cache-memory-fraction, --max-batch or --max-seq-len");
    }
    std::shared_ptr<StreamOwner> owner = owner_;
    std::shared_ptr<void> storage(p, [owner](void* q) { owner->cache->give(q); });
    return Tensor::wrap(std::move(shape), dtype, Device::kCuda, std::move(storage), p);
  }

  static const __nv_bfloat16* bf16(const Tensor& w, const char* op) {
    if (w.device() != Device::kCuda || w.dtype() != DType::kBF16) {
      throw Error("weight matrix is not a bf16 device tensor (use upload_matrix)", std::string("CudaBackend::") + op);
    }
    return static_cast<const __nv_bfloat16*>(w.raw());
  }

  std::shared_ptr<StreamOwner> owner_;
  DType kv_dtype_ = DType::kBF16;
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  int num_sms_ = 1;
  void* pinned_ = nullptr;
  size_t pinned_used_ = 0;
  std::unique_ptr<cuda::CublasLtGemm> gemm_;
  std::unique_ptr<Communicator> comm_;
  MPI_Comm comm_group_ = MPI_COMM_NULL;
  std::vector<std::function<void(double)>> watchers_;  // called with the seconds waited
  size_t allocated_ = 0;                 // allocated_bytes()
  int64_t waits_ = 0;                    // host_waits()
  double wait_s_ = 0;                    // wait_seconds()
  std::unique_ptr<CudaGraph> capture_;   // the graph being recorded
  size_t arena_bytes_ = 0, arena_used_ = 0;
};

}  // namespace

namespace {
// The first device query's outcome, kept: CUDA's answer does not change within a process.
struct DeviceQuery {
  int count = 0;
  std::string error;
};
const DeviceQuery& device_query() {
  static const DeviceQuery q = [] {
    DeviceQuery r;
    const cudaError_t rc = cudaGetDeviceCount(&r.count);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();  // clear the error so later calls start clean
      r.count = 0;
      r.error = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc);
    } else if (r.count == 0) {
      r.error = "cudaGetDeviceCount: 0 devices";
    }
    return r;
  }();
  return q;
}
}  // namespace

int cuda_device_count() { return device_query().count; }

std::string cuda_device_error() { return device_query().error; }

CudaDeviceMemory cuda_device_memory(int device) {
  CudaDeviceMemory m;
  if (device < 0 || device >= cuda_device_count()) return m;
  // `device` stays current: restoring another would make a context there (on GPU 0 for
  // every rank), and make_cuda_backend takes this device anyway.
  size_t free_b = 0, total_b = 0;
  cudaDeviceProp prop{};
  if (cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess &&
      cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    m.free_bytes = static_cast<int64_t>(free_b);
    m.total_bytes = static_cast<int64_t>(total_b);
    static_assert(sizeof prop.uuid.bytes == 16);
    std::memcpy(m.uuid.data(), prop.uuid.bytes, 16);
  } else {
    (void)cudaGetLastError();
  }
  return m;
}

std::unique_ptr<Backend> make_cuda_backend(int device, DType kv_cache_dtype) {
  const int n = cuda_device_count();
  if (device < 0 || device >= n) {
    throw Error("no such CUDA device", "--backend cuda", "a device in [0, " + std::to_string(n) + ")",
                std::to_string(device));
  }
  return std::make_unique<CudaBackend>(device, kv_cache_dtype);
}

bool cuda_has_nccl() {
#ifdef LINNET_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

Communicator& cuda_communicator(Backend& backend, MpiCommunicator& group, std::span<const TpCommReport> reports) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) throw Error("not a CUDA backend", "cuda_communicator", "cuda", backend.name());
  return cuda->communicator(group, reports);
}

}  // namespace linnet
