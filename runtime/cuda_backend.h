// The CUDA backend's entry points, declared without CUDA types so every build can call
// them: with LINNET_HAVE_CUDA they are runtime/cuda_backend.cpp, without it
// runtime/cuda_stub.cpp (no devices; making one throws "built without CUDA").
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "parallel/tp_comm_choice.h"
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

/// What cudaMemGetInfo and cudaGetDeviceProperties tell of CUDA device `device`.
struct CudaDeviceMemory {
  int64_t free_bytes = -1;   ///< free now; -1 when unknown
  int64_t total_bytes = -1;  ///< the device's memory; -1 when unknown
  std::array<uint8_t, 16> uuid{};  ///< cudaDeviceProp::uuid: tells ranks sharing a GPU apart
};

/// The memory and UUID of device `device` (makes its CUDA context on the calling thread).
/// All -1 / zeros in a build without CUDA or when the query fails.
CudaDeviceMemory cuda_device_memory(int device);

/// Whether this build has NCCL (a build with CUDA found NCCL's header and library).
bool cuda_has_nccl();

/// A backend on CUDA device `device`: one non-blocking stream, memory from the
/// device's stream-ordered pool (cudaMallocAsync), bf16 weight matrices, cuBLASLt GEMMs,
/// a KV cache in `kv_cache_dtype` (kBF16, the default, or kF32; attention math is f32).
/// Makes `device` current on the calling thread; use the backend from that thread.
/// @throws Error when the device cannot be used, or in a build without CUDA; naming
///   --kv-cache-dtype for a dtype other than bf16 / f32.
std::unique_ptr<Backend> make_cuda_backend(int device, DType kv_cache_dtype = DType::kBF16);

/// The communicator for collectives over `group` on a CUDA `backend` (device buffers),
/// chosen by choose_tp_comm (parallel/tp_comm_choice.h) from every rank's GPU UUID, NCCL
/// build and LINNET_COMM, gathered once over the group so every rank chooses alike: NCCL
/// on the backend's stream when each rank has its own GPU (also when a launcher shows each
/// rank one device through CUDA_VISIBLE_DEVICES), host-staged MPI when ranks share a GPU;
/// a group of one rank gets a SelfCommunicator (no NCCL, no MPI: all_gather is a device
/// copy on the stream) unless LINNET_COMM=nccl. Made once per backend and owned by it (it
/// must outlive the Engine using it); later calls return the same object. `reports`: the
/// group's reports in group rank order, as start_engine_run gathered them (then no
/// collective call here); when empty, the first call gathers them over `group` itself
/// (a collective; none for one rank). NCCL itself starts at the first NCCL collective.
/// `group` must outlive it.
/// @throws Error when `backend` is not a CUDA backend, LINNET_COMM is unknown or differs
///   between ranks, or LINNET_COMM=nccl cannot be served (choose_tp_comm).
Communicator& cuda_communicator(Backend& backend, MpiCommunicator& group,
                                std::span<const TpCommReport> reports = {});

}  // namespace linnet
