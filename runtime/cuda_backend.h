// The CUDA backend's entry points, declared without CUDA types so every build can call
// them: with LINNET_HAVE_CUDA they are runtime/cuda_backend.cpp, without it
// runtime/cuda_stub.cpp (no devices; making one throws "built without CUDA").
#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "runtime/backend.h"

namespace linnet {

/// Visible CUDA devices; 0 on any error of the device query (no driver, no device,
/// a build without CUDA), so callers fall back to the CPU backend.
int cuda_device_count();

/// Why cuda_device_count() is 0, for messages and test skips: the device query's CUDA
/// error name and text ("cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device
/// is detected"), "cudaGetDeviceCount: 0 devices", or "linnet-tp was built without
/// CUDA"; empty when devices are visible.
std::string cuda_device_error();

/// A backend on CUDA device `device`: one non-blocking stream, memory from the
/// device's stream-ordered pool (cudaMallocAsync), bf16 weight matrices, cuBLASLt GEMMs.
/// Makes `device` current on the calling thread; use the backend from that thread.
/// @throws Error when the device cannot be used, or in a build without CUDA.
std::unique_ptr<Backend> make_cuda_backend(int device);

/// The communicator for collectives over `group` on a CUDA `backend` (device buffers):
/// NCCL on the backend's stream when each of the node's `local_size` ranks has its own
/// GPU and NCCL was built in, else host-staged MPI; LINNET_COMM=nccl|mpi overrides.
/// Made once per backend and owned by it (it must outlive the Engine using it); later
/// calls return the same object. A group of one rank gets a SelfCommunicator (no NCCL,
/// no MPI: all_gather is a device copy on the stream) unless LINNET_COMM=nccl. Not a collective call: the communicator bootstraps
/// (MPI duplicate, NCCL unique id) at its first collective; `group` must outlive it.
/// @throws Error when `backend` is not a CUDA backend or LINNET_COMM=nccl is
///   unavailable.
Communicator& cuda_communicator(Backend& backend, MpiCommunicator& group, int local_size);

}  // namespace linnet
