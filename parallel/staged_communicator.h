// HostStagedCommunicator: the collectives on device buffers through host memory and MPI
// (device -> pinned host -> MPI collective -> device), for tp > 1 without NCCL or with
// several ranks sharing one GPU (where NCCL refuses two ranks on one device). Host
// pointers skip the staging. Design choice: the staging waits for the compute stream, so
// each collective costs a host round trip; it exists for correctness and tests, NCCL is
// the fast path. The MPI communicator is duplicated at the first collective, not in the
// constructor, so constructing one is no collective call (it may sit in a load phase).
#pragma once

#include <cstddef>
#include <memory>

#include <mpi.h>
#include <cuda_runtime_api.h>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"

namespace linnet {

/// True when `p` is device (or managed) memory, false for host memory, pinned or not.
/// @throws Error when CUDA cannot classify the pointer.
bool is_device_pointer(const void* p);

/// Collectives over an MPI group whose buffers may live on the current CUDA device.
class HostStagedCommunicator final : public Communicator {
 public:
  /// Collectives over `comm` (which must outlive this object; duplicated at the first
  /// collective); device buffers are staged on `stream` (the compute stream of the CUDA
  /// backend, so staging follows the work that filled them).
  HostStagedCommunicator(MPI_Comm comm, cudaStream_t stream);
  ~HostStagedCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* data, std::size_t count) override;
  void all_reduce_sum(double* data, std::size_t count) override;
  void all_reduce_max(float* data, std::size_t count) override;
  void all_gather(const float* send, std::size_t count, float* recv) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override { mpi().barrier(); }

 private:
  // Pinned host buffer of at least `bytes`.
  void* host(std::size_t bytes);
  // Runs `op` on a host copy of device buffer `data` (`bytes`), then copies it back.
  template <typename Op>
  void staged_in_place(void* data, std::size_t bytes, Op op);

  MpiCommunicator& mpi();

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<MpiCommunicator> mpi_;
  cudaStream_t stream_;
  void* pinned_ = nullptr;
  std::size_t pinned_bytes_ = 0;
};

}  // namespace linnet
