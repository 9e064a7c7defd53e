// Choosing a backend by name for the subcommands: `--backend cpu|cuda`, defaulting to
// cuda where a device is visible, and the tp communicator that goes with it.
#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "runtime/backend.h"

namespace linnet {

/// "cuda" when cuda_device_count() > 0, else "cpu".
std::string default_backend_kind();

/// The backend `kind` ("cpu", "cuda", or "" for default_backend_kind()) for the rank
/// `local_rank` of the `local_size` ranks on this node: cpu with `threads` BLAS threads
/// (blas_threads_per_rank(threads, local_size)); cuda on device local_rank %
/// cuda_device_count() (ranks share GPUs round-robin when there are fewer GPUs).
/// @throws Error naming --backend on an unknown kind, or cuda without a device.
std::unique_ptr<Backend> make_backend(const std::string& kind, int threads, int local_rank, int local_size);

/// The communicator an Engine on `backend` uses for the tp group `tp`: `tp` itself on
/// the CPU backend; on CUDA, cuda_communicator(backend, tp, local_size) (NCCL or
/// host-staged; owned by the backend).
Communicator& tp_communicator(Backend& backend, MpiCommunicator& tp, int local_size);

}  // namespace linnet
