// The CUDA entry points of a build without CUDA (LINNET_CUDA=OFF or no nvcc).
#include "common/error.h"
#include "runtime/cuda_backend.h"

namespace linnet {

int cuda_device_count() { return 0; }

std::string cuda_device_error() { return "linnet-tp was built without CUDA"; }

CudaDeviceMemory cuda_device_memory(int) { return {}; }

std::unique_ptr<Backend> make_cuda_backend(int, DType) {
  throw Error("linnet-tp was built without CUDA", "--backend cuda", "a build with LINNET_CUDA=ON", "no CUDA");
}

bool cuda_has_nccl() { return false; }

Communicator& cuda_communicator(Backend&, MpiCommunicator&, std::span<const TpCommReport>) {
  throw Error("linnet-tp was built without CUDA", "cuda_communicator");
}

}  // namespace linnet
