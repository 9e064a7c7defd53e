// Communicator: the collectives the tensor-parallel forward pass needs, over one
// group of ranks (a tp group or a dp group). The MPI implementation works on host
// memory; the NCCL one (CUDA backend) on device memory.
#pragma once

#include <cstddef>
#include <cstdint>

namespace linnet {

/// Collectives over a fixed group of ranks. Every rank of the group must call the same
/// collective with the same count; an implementation that can detect a mismatch throws
/// Error rather than hang.
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This rank's index in the group, in [0, size()).
  virtual int rank() const = 0;
  /// Number of ranks in the group.
  virtual int size() const = 0;

  /// In place: data[i] = sum over ranks of data[i]. `count` floats.
  virtual void all_reduce_sum(float* data, std::size_t count) = 0;
  /// In place: data[i] = sum over ranks of data[i]. `count` doubles (loss accumulation).
  virtual void all_reduce_sum(double* data, std::size_t count) = 0;
  /// In place: data[i] = max over ranks of data[i]. `count` floats.
  virtual void all_reduce_max(float* data, std::size_t count) = 0;
  /// recv[r * count + i] = send_r[i]: each rank's `count` floats, rank-major.
  /// `recv` holds size() * count floats.
  virtual void all_gather(const float* send, std::size_t count, float* recv) = 0;
  /// Copies `bytes` bytes from `root`'s buffer into every rank's buffer.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  /// Returns when every rank of the group has called it.
  virtual void barrier() = 0;

  /// True when the collectives on device buffers only queue work on the compute stream
  /// (never wait on the host), so a CUDA graph can record them: NCCL. Default false.
  virtual bool capturable() const { return false; }
};

}  // namespace linnet
