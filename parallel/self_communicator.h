// SelfCommunicator: the collectives of a group of one rank (tp = 1). Every sum, max and
// broadcast over one rank is the identity, and an all_gather is a copy of the rank's own
// block, so nothing here talks to another process: a tp = 1 engine on a GPU runs without
// NCCL (which may fail to start on a machine where one rank needs none) and without MPI.
// Copies go through a copy function the owner supplies (the CUDA backend queues a
// cudaMemcpyAsync on its compute stream, so the copy orders with the kernels around it
// and a CUDA graph can record it); the default is std::memcpy for host memory.
#pragma once

#include <cstddef>
#include <functional>

#include "parallel/communicator.h"

namespace linnet {

/// Collectives over a group of exactly one rank: rank() 0, size() 1.
class SelfCommunicator final : public Communicator {
 public:
  /// `copy(dst, src, bytes)` copies between buffers of this communicator's memory kind
  /// (host or device); it must order with the caller's work. Default: std::memcpy.
  /// `capturable`: whether `copy` may be recorded into a CUDA graph (what capturable()
  /// reports).
  explicit SelfCommunicator(std::function<void(void*, const void*, std::size_t)> copy = {}, bool capturable = false);

  int rank() const override { return 0; }
  int size() const override { return 1; }
  /// The identity (one rank's sum); `data` is untouched.
  void all_reduce_sum(float* data, std::size_t count) override;
  /// The identity (one rank's sum); `data` is untouched.
  void all_reduce_sum(double* data, std::size_t count) override;
  /// The identity (one rank's max); `data` is untouched.
  void all_reduce_max(float* data, std::size_t count) override;
  /// recv[0, count) = send[0, count) (nothing when they are the same buffer).
  void all_gather(const float* send, std::size_t count, float* recv) override;
  /// Nothing to send; @throws Error when `root` is not 0.
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override {}
  bool capturable() const override { return capturable_; }

 private:
  std::function<void(void*, const void*, std::size_t)> copy_;
  bool capturable_;
};

}  // namespace linnet
