// Choosing a backend by name for the subcommands: `--backend cpu|cuda`, defaulting to
// cuda where a device is visible, and the tp communicator that goes with it.
#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "runtime/backend.h"
#include "runtime/tensor.h"

namespace linnet {

/// "cuda" when cuda_device_count() > 0, else "cpu".
std::string default_backend_kind();

/// The backend `kind` ("cpu", "cuda", or "" for default_backend_kind()) for the rank
/// `local_rank` of the `local_size` ranks on this node: cpu with `threads` threads pinned
/// to the rank's share of the cores (kernels/cpu/threads.h; LINNET_PIN=0 leaves them)
/// (kernel_threads_per_rank(threads, local_size)); cuda on device local_rank %
/// cuda_device_count() (ranks share GPUs round-robin when there are fewer GPUs).
/// `weight_dtype`: the CPU backend's weight matrices (held_weight_dtype); the CUDA
/// backend always holds bf16 and ignores it (and `weight_group_size`, the int8 groups:
/// make_cpu_backend). `kv_cache_dtype`: the CPU backend's KV
/// cache (held_kv_cache_dtype); CUDA keeps f32.
/// @throws Error naming --backend on an unknown kind, or cuda without a device.
std::unique_ptr<Backend> make_backend(const std::string& kind, int threads, int local_rank, int local_size,
                                      DType weight_dtype = DType::kF32,
                                      DType kv_cache_dtype = DType::kF32,
                                      int64_t weight_group_size = kDefaultWeightGroupSize);

/// The dtype a rank holds weight matrices in: on the CPU backend --weight-dtype `flag`
/// ("auto" or "": `auto_dtype`, the checkpoint's own or config.json's torch_dtype for
/// random weights; "f32", "bf16", "f16", "int8", "int4": quantized at load); on CUDA ("cuda", or "" with a visible device)
/// bf16, which "auto" and "bf16" name.
/// @throws Error naming --weight-dtype for an unknown value, or f32 / f16 / int8 / int4 on CUDA.
DType held_weight_dtype(const std::string& flag, const std::string& backend_kind, DType auto_dtype);

/// The dtype of the KV cache: --kv-cache-dtype `flag` "f32" (or "": the default) or
/// "bf16" (half the bytes; CPU backend only, where attention widens each element exactly).
/// @throws Error naming --kv-cache-dtype for an unknown value, or bf16 on CUDA.
DType held_kv_cache_dtype(const std::string& flag, const std::string& backend_kind);

/// The communicator an Engine on `backend` uses for the tp group `tp`: `tp` itself on
/// the CPU backend; on CUDA, cuda_communicator(backend, tp, local_size) (NCCL or
/// host-staged; owned by the backend).
Communicator& tp_communicator(Backend& backend, MpiCommunicator& tp, int local_size);

}  // namespace linnet
