// A real NCCL communicator on one GPU: the engine gives a tp group of one rank a
// SelfCommunicator, so without this suite a one-GPU machine would never run NCCL. Here
// NcclCommunicator over a one-rank group issues real ncclAllReduce / ncclAllGather
// calls on a stream, eagerly and recorded into a CUDA graph that is replayed on new
// inputs. A sum or max over one rank is the identity and a gather is a copy, so the
// expected values are the inputs themselves. Skips with "no CUDA device" where none is
// visible (the reason is printed).
#include <mpi.h>

#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "common/cuda_check.h"
#include "parallel/nccl_communicator.h"
#include "runtime/cuda_backend.h"

namespace linnet {
namespace {

class NcclTest : public testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (" << cuda_device_error() << ")";
    LINNET_CUDA_CHECK(cudaSetDevice(0));
    LINNET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LINNET_CUDA_CHECK(cudaMalloc(&a_, kN * sizeof(float)));
    LINNET_CUDA_CHECK(cudaMalloc(&b_, kN * sizeof(float)));
    LINNET_CUDA_CHECK(cudaMalloc(&d_, kN * sizeof(double)));
  }
  void TearDown() override {
    if (stream_ == nullptr) return;
    cudaStreamSynchronize(stream_);
    cudaFree(a_);
    cudaFree(b_);
    cudaFree(d_);
    cudaStreamDestroy(stream_);
  }
  std::vector<float> values(float scale) const {
    std::vector<float> v(kN);
    for (size_t i = 0; i < kN; ++i) v[i] = scale * (static_cast<float>(i % 97) - 48.5f);
    return v;
  }
  void put(float* dst, const std::vector<float>& v) {
    LINNET_CUDA_CHECK(cudaMemcpyAsync(dst, v.data(), kN * sizeof(float), cudaMemcpyHostToDevice, stream_));
  }
  std::vector<float> get(const float* src) {
    std::vector<float> v(kN);
    LINNET_CUDA_CHECK(cudaMemcpyAsync(v.data(), src, kN * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return v;
  }

  static constexpr size_t kN = 4099;  // not a multiple of any vector width
  cudaStream_t stream_ = nullptr;
  float *a_ = nullptr, *b_ = nullptr;
  double* d_ = nullptr;
};

TEST_F(NcclTest, AllReduceAndAllGatherEagerly) {
  NcclCommunicator comm(MPI_COMM_SELF, stream_);
  ASSERT_EQ(comm.size(), 1);
  const auto v = values(0.25f);
  put(a_, v);
  comm.all_reduce_sum(a_, kN);
  EXPECT_EQ(get(a_), v);
  comm.all_reduce_max(a_, kN);
  EXPECT_EQ(get(a_), v);
  comm.all_gather(a_, kN, b_);
  EXPECT_EQ(get(b_), v);
  std::vector<double> dv(kN);
  for (size_t i = 0; i < kN; ++i) dv[i] = 1e-3 * static_cast<double>(i);
  LINNET_CUDA_CHECK(cudaMemcpyAsync(d_, dv.data(), kN * sizeof(double), cudaMemcpyHostToDevice, stream_));
  comm.all_reduce_sum(d_, kN);
  std::vector<double> dg(kN);
  LINNET_CUDA_CHECK(cudaMemcpyAsync(dg.data(), d_, kN * sizeof(double), cudaMemcpyDeviceToHost, stream_));
  LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(dg, dv);
  comm.poll();  // no asynchronous error
}

TEST_F(NcclTest, AllReduceAndAllGatherInsideACapturedGraph) {
  NcclCommunicator comm(MPI_COMM_SELF, stream_);
  put(a_, values(1.0f));
  comm.all_reduce_sum(a_, kN);  // bootstraps NCCL outside the capture
  LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  ASSERT_TRUE(comm.capturable());

  cudaGraph_t graph = nullptr;
  LINNET_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  comm.all_reduce_sum(a_, kN);
  comm.all_gather(a_, kN, b_);
  LINNET_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  LINNET_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (float scale : {2.0f, -0.5f, 3.0f}) {  // each replay reads the new inputs
    const auto v = values(scale);
    put(b_, std::vector<float>(kN, 0.0f));
    put(a_, v);
    LINNET_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    EXPECT_EQ(get(b_), v) << "replay with scale " << scale;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  comm.poll();
}

}  // namespace
}  // namespace linnet
