#include "runtime/backend_factory.h"

#include "common/error.h"
#include "runtime/cuda_backend.h"

namespace linnet {

std::string default_backend_kind() { return cuda_device_count() > 0 ? "cuda" : "cpu"; }

std::unique_ptr<Backend> make_backend(const std::string& kind_in, int threads, int local_rank, int local_size) {
  const std::string kind = kind_in.empty() ? default_backend_kind() : kind_in;
  if (kind == "cpu") return make_cpu_backend(blas_threads_per_rank(threads, local_size));
  if (kind == "cuda") {
    const int n = cuda_device_count();
    if (n == 0) {
      throw Error("no CUDA device (" + cuda_device_error() + ")", "--backend cuda", "a visible CUDA device",
                  "none (use --backend cpu)");
    }
    return make_cuda_backend(local_rank % n);
  }
  throw Error("unknown backend", "--backend", "cpu or cuda", kind);
}

Communicator& tp_communicator(Backend& backend, MpiCommunicator& tp, int local_size) {
  if (backend.device() == Device::kCpu) return tp;
  return cuda_communicator(backend, tp, local_size);
}

}  // namespace linnet
