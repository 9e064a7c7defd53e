#include "parallel/staged_communicator.h"

#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/cuda_check.h"

namespace linnet {

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  const cudaError_t rc = cudaPointerGetAttributes(&a, p);
  if (rc == cudaErrorInvalidValue) {  // a host pointer CUDA has never seen (older runtimes)
    (void)cudaGetLastError();
    return false;
  }
  LINNET_CUDA_CHECK(rc);
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

HostStagedCommunicator::HostStagedCommunicator(MPI_Comm comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
  LINNET_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  LINNET_MPI_CHECK(MPI_Comm_size(comm, &size_));
}

MpiCommunicator& HostStagedCommunicator::mpi() {
  if (!mpi_) mpi_ = std::make_unique<MpiCommunicator>(comm_);
  return *mpi_;
}

HostStagedCommunicator::~HostStagedCommunicator() {
  if (pinned_) cudaFreeHost(pinned_);
}

void* HostStagedCommunicator::host(std::size_t bytes) {
  if (bytes > pinned_bytes_) {
    if (pinned_) LINNET_CUDA_CHECK(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    LINNET_CUDA_CHECK(cudaHostAlloc(&pinned_, bytes, cudaHostAllocDefault));
    pinned_bytes_ = bytes;
  }
  return pinned_;
}

template <typename Op>
void HostStagedCommunicator::staged_in_place(void* data, std::size_t bytes, Op op) {
  if (!is_device_pointer(data)) {
    op(data);
    return;
  }
  void* h = host(bytes);
  LINNET_CUDA_CHECK(cudaMemcpyAsync(h, data, bytes, cudaMemcpyDeviceToHost, stream_));
  LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  op(h);
  LINNET_CUDA_CHECK(cudaMemcpyAsync(data, h, bytes, cudaMemcpyHostToDevice, stream_));
  // The next collective reuses the pinned buffer: the copy must have read it by then.
  LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void HostStagedCommunicator::all_reduce_sum(float* data, std::size_t count) {
  staged_in_place(data, count * sizeof(float), [&](void* p) { mpi().all_reduce_sum(static_cast<float*>(p), count); });
}

void HostStagedCommunicator::all_reduce_sum(double* data, std::size_t count) {
  staged_in_place(data, count * sizeof(double),
                  [&](void* p) { mpi().all_reduce_sum(static_cast<double*>(p), count); });
}

void HostStagedCommunicator::all_reduce_max(float* data, std::size_t count) {
  staged_in_place(data, count * sizeof(float), [&](void* p) { mpi().all_reduce_max(static_cast<float*>(p), count); });
}

void HostStagedCommunicator::all_gather(const float* send, std::size_t count, float* recv) {
  const bool dev_send = is_device_pointer(send), dev_recv = is_device_pointer(recv);
  if (!dev_send && !dev_recv) {
    mpi().all_gather(send, count, recv);
    return;
  }
  const std::size_t n = static_cast<std::size_t>(size());
  float* h = static_cast<float*>(host((n + 1) * count * sizeof(float)));
  float* h_send = h + n * count;
  if (dev_send) {
    LINNET_CUDA_CHECK(cudaMemcpyAsync(h_send, send, count * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } else if (count > 0) {
    std::memcpy(h_send, send, count * sizeof(float));
  }
  mpi().all_gather(h_send, count, h);
  if (dev_recv) {
    LINNET_CUDA_CHECK(cudaMemcpyAsync(recv, h, n * count * sizeof(float), cudaMemcpyHostToDevice, stream_));
    LINNET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } else if (count > 0) {
    std::memcpy(recv, h, n * count * sizeof(float));
  }
}

void HostStagedCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  staged_in_place(data, bytes, [&](void* p) { mpi().broadcast(p, bytes, root); });
}

}  // namespace linnet
