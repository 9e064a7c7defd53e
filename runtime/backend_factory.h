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

/// The warning make_backend prints when no --backend was given and the CUDA runtime
/// could not start although this machine has an NVIDIA driver, naming CUDA's error:
/// "no usable CUDA device (<error>); running on the CPU backend (--backend cpu silences
/// this)". Empty, so nothing is printed, on a machine without an NVIDIA driver
/// (`driver_present` false: the CPU machine this is the normal case for), when `error` is
/// empty, or when CUDA_VISIBLE_DEVICES (`visible_devices`, nullptr when unset) hides
/// every device on purpose ("" or "-1").
std::string cuda_fallback_warning(const std::string& error, bool driver_present, const char* visible_devices);

/// Whether this machine has the NVIDIA kernel driver loaded (/proc/driver/nvidia/version).
bool nvidia_driver_present();

/// The backend `kind` ("cpu", "cuda", or "" for default_backend_kind()) for the rank
/// `local_rank` of the `local_size` ranks on this node: cpu with `threads` threads pinned
/// to the rank's share of the cores (kernels/cpu/threads.h; LINNET_PIN=0 leaves them)
/// (kernel_threads_per_rank(threads, local_size)); cuda on device local_rank %
/// cuda_device_count() (ranks share GPUs round-robin when there are fewer GPUs).
/// With `kind` "" and no usable device, the CPU backend is made and cuda_fallback_warning
/// is printed (once per node: local_rank 0). `weight_dtype`: the CPU backend's weight matrices (held_weight_dtype); the CUDA
/// backend always holds bf16 and ignores it (and `weight_group_size`, the int8 groups:
/// make_cpu_backend). `kv_cache_dtype`: the KV cache's dtype (held_kv_cache_dtype).
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

/// The dtype of the KV cache: --kv-cache-dtype `flag` "f32", "bf16" (half the bytes;
/// attention widens each element exactly) or "auto" / "" (not given): the backend's
/// default, bf16 on CUDA (the dtype its weights are held in, as vLLM's "auto" follows the
/// model's) and f32 on the CPU.
/// @throws Error naming --kv-cache-dtype for an unknown value.
DType held_kv_cache_dtype(const std::string& flag, const std::string& backend_kind);

/// The communicator an Engine on `backend` uses for the tp group `tp`: `tp` itself on
/// the CPU backend; on CUDA, cuda_communicator(backend, tp, reports) (self, NCCL or
/// host-staged, agreed over the group from `reports`, or gathered over `tp` when they are
/// empty: then a collective; owned by the backend).
Communicator& tp_communicator(Backend& backend, MpiCommunicator& tp, std::span<const TpCommReport> reports = {});

}  // namespace linnet
