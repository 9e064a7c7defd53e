#include "parallel/nccl_communicator.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "parallel/staged_communicator.h"

namespace linnet {
namespace detail {
void nccl_check(ncclResult_t rc, const char* expr, const char* file, int line) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  throw Error(std::string(expr) + " failed: " + ncclGetErrorString(rc), std::string(file) + ":" + std::to_string(line));
}
}  // namespace detail

NcclCommunicator::NcclCommunicator(MPI_Comm comm, cudaStream_t stream) : group_(comm), stream_(stream) {
  const char* skip = std::getenv("LINNET_SKIP_COUNT_CHECK");
  check_counts_ = !(skip && std::string(skip) == "1");
  LINNET_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  LINNET_MPI_CHECK(MPI_Comm_size(comm, &size_));
}

MpiCommunicator& NcclCommunicator::mpi() {
  if (!mpi_) mpi_ = std::make_unique<MpiCommunicator>(group_);
  return *mpi_;
}

ncclComm_t NcclCommunicator::nccl() {
  check_usable();
  if (comm_ == nullptr) {
    ncclUniqueId id{};
    if (rank_ == 0) LINNET_NCCL_CHECK(ncclGetUniqueId(&id));
    LINNET_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi().comm()));
    LINNET_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  }
  return comm_;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  if (aborted_) return;
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async == ncclSuccess) {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
}

void NcclCommunicator::check_usable() const {
  if (aborted_) throw Error("the NCCL communicator was aborted after an earlier error", "NcclCommunicator");
}

void NcclCommunicator::poll() {
  if (aborted_) check_usable();
  if (comm_ == nullptr) return;
  ncclResult_t async = ncclSuccess;
  LINNET_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
  if (async == ncclSuccess || async == ncclInProgress) return;
  aborted_ = true;
  ncclCommAbort(comm_);
  throw Error(std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async) +
                  " (communicator aborted)",
              "NcclCommunicator rank " + std::to_string(rank()));
}

void NcclCommunicator::agree_on_count(std::size_t count, const char* op) {
  check_usable();
  if (!check_counts_ || size() == 1) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LINNET_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  int64_t v[2] = {static_cast<int64_t>(count), -static_cast<int64_t>(count)};
  LINNET_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MAX, mpi().comm()));
  if (v[0] != -v[1]) {
    throw Error("ranks disagree on the element count of a collective", op, "the same count on every rank",
                "counts from " + std::to_string(-v[1]) + " to " + std::to_string(v[0]) + " (this rank: " +
                    std::to_string(count) + ")");
  }
}

void NcclCommunicator::all_reduce_sum(float* data, std::size_t count) {
  if (!is_device_pointer(data)) return mpi().all_reduce_sum(data, count);
  agree_on_count(count, "all_reduce_sum");
  LINNET_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, nccl(), stream_));
}

void NcclCommunicator::all_reduce_sum(double* data, std::size_t count) {
  if (!is_device_pointer(data)) return mpi().all_reduce_sum(data, count);
  agree_on_count(count, "all_reduce_sum");
  LINNET_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat64, ncclSum, nccl(), stream_));
}

void NcclCommunicator::all_reduce_max(float* data, std::size_t count) {
  if (!is_device_pointer(data)) return mpi().all_reduce_max(data, count);
  agree_on_count(count, "all_reduce_max");
  LINNET_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat32, ncclMax, nccl(), stream_));
}

void NcclCommunicator::all_gather(const float* send, std::size_t count, float* recv) {
  const bool dev_send = is_device_pointer(send), dev_recv = is_device_pointer(recv);
  if (!dev_send && !dev_recv) return mpi().all_gather(send, count, recv);
  if (dev_send != dev_recv) {
    throw Error("all_gather needs both buffers on the device or both on the host", "NcclCommunicator");
  }
  agree_on_count(count, "all_gather");
  LINNET_NCCL_CHECK(ncclAllGather(send, recv, count, ncclFloat32, nccl(), stream_));
}

void NcclCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  if (!is_device_pointer(data)) return mpi().broadcast(data, bytes, root);
  agree_on_count(bytes, "broadcast");
  LINNET_NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, nccl(), stream_));
}

void NcclCommunicator::barrier() {
  check_usable();
  mpi().barrier();
}

}  // namespace linnet
