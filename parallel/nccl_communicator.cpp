#include "parallel/nccl_communicator.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/cuda_check.h"
#include "common/error.h"
#include "parallel/comm_watch.h"
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

void NcclCommunicator::note(const char* op, std::size_t count) {
  ++enqueued_;
  last_op_ = std::string(op) + " of " + std::to_string(count) + " elements (NCCL collective #" +
             std::to_string(enqueued_) + " of this group)";
}

void NcclCommunicator::fail(const std::string& why) {
  aborted_ = true;
  if (comm_ != nullptr) ncclCommAbort(comm_);
  throw Error(why + "; the NCCL communicator was aborted (last collective enqueued: " + last_op_ + ")",
              "NcclCommunicator rank " + std::to_string(rank_) + " of " + std::to_string(size_));
}

void NcclCommunicator::settle(const char* what) {
  WaitClock clock;
  PollBackoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    LINNET_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail(std::string(what) + " failed: " + ncclGetErrorString(state));
    const double waited = clock.seconds();
    if (comm_timeout() > 0 && waited > comm_timeout()) {
      fail(std::string(what) + " has not completed after " + std::to_string(static_cast<int64_t>(waited)) +
           " s (--comm-timeout " + std::to_string(static_cast<int64_t>(comm_timeout())) + " s)");
    }
    backoff.pause();
  }
}

ncclComm_t NcclCommunicator::nccl() {
  check_usable();
  if (comm_ == nullptr) {
    ncclUniqueId id{};
    if (rank_ == 0) LINNET_NCCL_CHECK(ncclGetUniqueId(&id));
    mpi().broadcast(&id, sizeof id, 0);  // watched, under --comm-timeout
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    // Non-blocking: every call returns at once and settle() polls it with a deadline.
    // LINNET_NCCL_BLOCKING=1 makes a blocking communicator (the stream waits stay
    // watched; the start-up and enqueues are not), to measure what non-blocking costs.
    const char* blocking = std::getenv("LINNET_NCCL_BLOCKING");
    config.blocking = blocking && std::string(blocking) == "1" ? 1 : 0;
    LINNET_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
    settle("ncclCommInitRankConfig (NCCL start-up)");
  }
  return comm_;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr || aborted_) return;
  // Drain the stream, then finalize (non-blocking: polled) and destroy, all within
  // --comm-timeout; a peer that died without NCCL noticing would otherwise hold this rank
  // here forever: past the deadline the communicator is aborted instead.
  const double limit = comm_timeout();
  WaitClock clock;
  PollBackoff backoff;
  ncclResult_t state = ncclSuccess;
  bool healthy = ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess;
  while (healthy) {
    const cudaError_t rc = cudaStreamQuery(stream_);
    if (rc == cudaSuccess) break;
    if (rc != cudaErrorNotReady || (limit > 0 && clock.seconds() > limit)) healthy = false;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      healthy = false;
    }
    backoff.pause();
  }
  if (healthy && ncclCommFinalize(comm_) != ncclSuccess) {
    // ncclInProgress (non-blocking) is polled below; anything else is a failure
    healthy = ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress;
  }
  while (healthy) {
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) healthy = false;
    else if (state == ncclSuccess) break;
    else if (state != ncclInProgress || (limit > 0 && clock.seconds() > limit)) healthy = false;
    if (healthy) backoff.pause();
  }
  if (healthy) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
}

void NcclCommunicator::check_usable() const {
  if (aborted_) throw Error("the NCCL communicator was aborted after an earlier error", "NcclCommunicator");
}

void NcclCommunicator::poll(double waited_seconds) {
  if (aborted_) check_usable();
  if (comm_ == nullptr) return;
  ncclResult_t async = ncclSuccess;
  LINNET_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
  if (async != ncclSuccess && async != ncclInProgress) {
    fail(std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async));
  }
  if (comm_timeout() > 0 && waited_seconds > comm_timeout()) {
    fail("the stream has waited " + std::to_string(static_cast<int64_t>(waited_seconds)) +
         " s for a collective (--comm-timeout " + std::to_string(static_cast<int64_t>(comm_timeout())) +
         " s): a peer rank has stalled or died");
  }
}

void NcclCommunicator::agree_on_count(std::size_t count, const char* op) {
  check_usable();
  if (!check_counts_ || size() == 1) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LINNET_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  int64_t v[2] = {static_cast<int64_t>(count), -static_cast<int64_t>(count)};
  MpiCommunicator& m = mpi();
  m.collective(op, [&](MPI_Request* request) {
    return MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MAX, m.comm(), request);
  });
  if (v[0] != -v[1]) {
    throw Error("ranks disagree on the element count of a collective", op, "the same count on every rank",
                "counts from " + std::to_string(-v[1]) + " to " + std::to_string(v[0]) + " (this rank: " +
                    std::to_string(count) + ")");
  }
}

void NcclCommunicator::all_reduce_sum(float* data, std::size_t count) {
  if (!is_device_pointer(data)) return mpi().all_reduce_sum(data, count);
  agree_on_count(count, "all_reduce_sum");
  ncclComm_t c = nccl();
  note("all_reduce_sum", count);
  LINNET_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, c, stream_));
  settle("ncclAllReduce (enqueue)");
}

void NcclCommunicator::all_reduce_sum(double* data, std::size_t count) {
  if (!is_device_pointer(data)) return mpi().all_reduce_sum(data, count);
  agree_on_count(count, "all_reduce_sum");
  ncclComm_t c = nccl();
  note("all_reduce_sum (f64)", count);
  LINNET_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat64, ncclSum, c, stream_));
  settle("ncclAllReduce (enqueue)");
}

void NcclCommunicator::all_reduce_max(float* data, std::size_t count) {
  if (!is_device_pointer(data)) return mpi().all_reduce_max(data, count);
  agree_on_count(count, "all_reduce_max");
  ncclComm_t c = nccl();
  note("all_reduce_max", count);
  LINNET_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat32, ncclMax, c, stream_));
  settle("ncclAllReduce (enqueue)");
}

void NcclCommunicator::all_gather(const float* send, std::size_t count, float* recv) {
  const bool dev_send = is_device_pointer(send), dev_recv = is_device_pointer(recv);
  if (!dev_send && !dev_recv) return mpi().all_gather(send, count, recv);
  if (dev_send != dev_recv) {
    throw Error("all_gather needs both buffers on the device or both on the host", "NcclCommunicator");
  }
  agree_on_count(count, "all_gather");
  ncclComm_t c = nccl();
  note("all_gather", count);
  LINNET_NCCL_CHECK(ncclAllGather(send, recv, count, ncclFloat32, c, stream_));
  settle("ncclAllGather (enqueue)");
}

void NcclCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  if (!is_device_pointer(data)) return mpi().broadcast(data, bytes, root);
  agree_on_count(bytes, "broadcast");
  ncclComm_t c = nccl();
  note("broadcast (bytes)", bytes);
  LINNET_NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, c, stream_));
  settle("ncclBroadcast (enqueue)");
}

void NcclCommunicator::barrier() {
  check_usable();
  mpi().barrier();
}

}  // namespace linnet
