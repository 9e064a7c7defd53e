#include "runtime/backend_factory.h"

#include <cstdlib>
#include <filesystem>

#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/threads.h"
#include "runtime/cuda_backend.h"
#include "runtime/weights.h"

namespace linnet {

std::string default_backend_kind() { return cuda_device_count() > 0 ? "cuda" : "cpu"; }

std::string cuda_fallback_warning(const std::string& error, bool driver_present, const char* visible_devices) {
  if (error.empty() || !driver_present) return "";
  if (visible_devices != nullptr) {
    const std::string v = visible_devices;
    if (v.empty() || v == "-1") return "";
  }
  return "no usable CUDA device (" + error + "); running on the CPU backend (--backend cpu silences this)";
}

bool nvidia_driver_present() { return std::filesystem::exists("/proc/driver/nvidia/version"); }

std::unique_ptr<Backend> make_backend(const std::string& kind_in, int threads, int local_rank, int local_size,
                                      DType weight_dtype, DType kv_cache_dtype, int64_t weight_group_size) {
  const std::string kind = kind_in.empty() ? default_backend_kind() : kind_in;
  if (kind_in.empty() && kind == "cpu" && local_rank == 0) {
    const std::string w =
        cuda_fallback_warning(cuda_device_error(), nvidia_driver_present(), std::getenv("CUDA_VISIBLE_DEVICES"));
    if (!w.empty()) warn(w);
  }
  if (kind == "cpu") {
    const int n = kernel_threads_per_rank(threads, local_size);
    auto backend = make_cpu_backend(n, weight_dtype, kv_cache_dtype, weight_group_size);
    const cpu::Placement placement = cpu::pin_threads(local_rank, local_size);
    info("cpu backend: " + std::to_string(n) + " threads, " + placement.where + ", " +
         cpu::isa_name(cpu::active_isa()) + " kernels");
    if (local_rank == 0 && !placement.launcher_warning.empty()) warn("cpu backend: " + placement.launcher_warning);
    return backend;
  }
  if (kind == "cuda") {
    const int n = cuda_device_count();
    if (n == 0) {
      throw Error("no CUDA device (" + cuda_device_error() + ")", "--backend cuda", "a visible CUDA device",
                  "none (use --backend cpu)");
    }
    return make_cuda_backend(local_rank % n, kv_cache_dtype);
  }
  throw Error("unknown backend", "--backend", "cpu or cuda", kind);
}

DType held_weight_dtype(const std::string& flag, const std::string& backend_kind, DType auto_dtype) {
  const std::string kind = backend_kind.empty() ? default_backend_kind() : backend_kind;
  if (flag != "auto" && !flag.empty() && flag != "f32" && flag != "bf16" && flag != "f16" && flag != "int8" &&
      flag != "int4") {
    throw Error("unknown weight dtype", "--weight-dtype", "auto, f32, bf16, f16, int8 or int4", flag);
  }
  if (kind == "cuda") {
    if (flag == "f32" || flag == "f16" || flag == "int8" || flag == "int4") {
      throw Error("the CUDA backend holds weight matrices in bf16", "--weight-dtype",
                  "auto or bf16 with --backend cuda", flag);
    }
    return DType::kBF16;
  }
  if (flag == "f32") return DType::kF32;
  if (flag == "bf16") return DType::kBF16;
  if (flag == "f16") return DType::kF16;
  if (flag == "int8") return DType::kI8;
  if (flag == "int4") return DType::kI4;
  return auto_dtype;
}

DType held_kv_cache_dtype(const std::string& flag, const std::string& backend_kind) {
  if (!flag.empty() && flag != "auto" && flag != "f32" && flag != "bf16") {
    throw Error("unknown KV cache dtype", "--kv-cache-dtype", "auto, f32 or bf16", flag);
  }
  if (flag == "f32") return DType::kF32;
  if (flag == "bf16") return DType::kBF16;
  const std::string kind = backend_kind.empty() ? default_backend_kind() : backend_kind;
  return kind == "cuda" ? DType::kBF16 : DType::kF32;
}

Communicator& tp_communicator(Backend& backend, MpiCommunicator& tp, std::span<const TpCommReport> reports) {
  if (backend.device() == Device::kCpu) return tp;
  return cuda_communicator(backend, tp, reports);
}

}  // namespace linnet
