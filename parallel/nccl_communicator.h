// NcclCommunicator: the collectives on device memory through NCCL, one rank per GPU.
// Bootstrapped by MPI: rank 0 of the group makes the ncclUniqueId and a watched MPI
// broadcast sends it. Collectives are queued on the CUDA backend's compute stream, so
// they order with the kernels around them and the host never waits per collective.
//
// Failure handling, under --comm-timeout (parallel/comm_watch.h) like the MPI path:
// - the communicator is made non-blocking (ncclConfig_t::blocking = 0), so neither
//   ncclCommInitRankConfig nor an enqueue can block the host: each returns at once and
//   its completion is polled (ncclCommGetAsyncError) with a deadline;
// - poll(waited) (called by the backend while it waits on the stream) reads NCCL's
//   asynchronous error state; on an error, or when the wait has lasted comm_timeout(),
//   it aborts the communicator (ncclCommAbort, so the stream's pending collectives
//   return) and throws naming the last collective enqueued: a stalled or dead peer ends
//   every rank within the timeout plus a poll;
// - the element-count agreement before each collective and the unique-id broadcast are
//   MPI collectives of the group, watched like every other.
// Host pointers (the generation loop's token broadcast, the loss sums) go through an
// MpiCommunicator on the same group. The bootstrap (MPI duplicate, unique id, NCCL
// init) runs at the first collective, which every rank reaches together, so
// constructing one is no collective call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <mpi.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"

/// Throws linnet::Error with the expression, file:line and ncclGetErrorString when
/// `call` does not return ncclSuccess.
#define LINNET_NCCL_CHECK(call) ::linnet::detail::nccl_check((call), #call, __FILE__, __LINE__)

namespace linnet {

namespace detail {
void nccl_check(ncclResult_t rc, const char* expr, const char* file, int line);
}  // namespace detail

/// NCCL collectives over an MPI group, on the current CUDA device and `stream`.
class NcclCommunicator final : public Communicator {
 public:
  /// Collectives over `comm` (which must outlive this object), each rank on its own GPU
  /// (the current device at the first collective). Errors of the bootstrap are thrown by
  /// the first collective, naming the NCCL or MPI call that failed.
  NcclCommunicator(MPI_Comm comm, cudaStream_t stream);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* data, std::size_t count) override;
  void all_reduce_sum(double* data, std::size_t count) override;
  void all_reduce_max(float* data, std::size_t count) override;
  void all_gather(const float* send, std::size_t count, float* recv) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override;
  /// NCCL collectives can be recorded into a CUDA graph.
  bool capturable() const override { return true; }

  /// Checks NCCL's asynchronous error state, `waited_seconds` into a wait on the stream;
  /// on an error, or when waited_seconds exceeds comm_timeout() (> 0), aborts the
  /// communicator and throws Error naming the last collective enqueued and the timeout
  /// (every later collective throws too).
  void poll(double waited_seconds = 0);

 private:
  // Agrees on the element count across the group over MPI (LINNET_SKIP_COUNT_CHECK=1
  // skips it), so mismatched shapes fail instead of hanging inside NCCL. Skipped while
  // the stream is being recorded into a CUDA graph: the Engine runs every recorded pass
  // eagerly first, with the same counts, so they were agreed on just before.
  void agree_on_count(std::size_t count, const char* op);
  void check_usable() const;
  // After an NCCL call on the non-blocking communicator: waits (polling, under
  // comm_timeout()) until NCCL has finished it, i.e. the async state is no longer
  // ncclInProgress. `what` names the call in errors.
  void settle(const char* what);
  // Aborts and throws Error with `why` and the last collective.
  [[noreturn]] void fail(const std::string& why);
  // Records the collective about to be enqueued, for messages.
  void note(const char* op, std::size_t count);
  // The MPI duplicate and the NCCL communicator, made at the first use.
  MpiCommunicator& mpi();
  ncclComm_t nccl();

  MPI_Comm group_;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<MpiCommunicator> mpi_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  bool check_counts_ = true;
  std::string last_op_ = "none yet";  // the last collective enqueued, for messages
  int64_t enqueued_ = 0;
};

}  // namespace linnet
