// LINNET_CUDA_CHECK: every CUDA runtime call of the CUDA backend goes through it, so a
// failure surfaces as linnet::Error naming the call, file:line and CUDA's own message.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "common/error.h"

namespace linnet::cuda_detail {
/// Throws Error("<expr> failed: <cudaGetErrorString>", "<file>:<line>") unless rc is
/// cudaSuccess.
inline void cuda_check(cudaError_t rc, const char* expr, const char* file, int line) {
  if (rc == cudaSuccess) return;
  throw Error(std::string(expr) + " failed: " + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc),
              std::string(file) + ":" + std::to_string(line));
}
}  // namespace linnet::cuda_detail

/// Throws linnet::Error with the expression, file:line and cudaGetErrorString when `call`
/// does not return cudaSuccess.
#define LINNET_CUDA_CHECK(call) ::linnet::cuda_detail::cuda_check((call), #call, __FILE__, __LINE__)

/// Checks the launch of the kernel just queued (bad configuration, missing image).
#define LINNET_CUDA_CHECK_LAUNCH() LINNET_CUDA_CHECK(cudaGetLastError())
