// The element types of tensors: one enum for every layer. The loader reads them from
// safetensors headers (loader/safetensors.h), the runtime holds tensors in them
// (runtime/tensor.h), and the CPU kernels are instantiated per weight dtype
// (kernels/cpu/gemm.h: dispatch_weight_dtype, the one place a run-time dtype becomes a
// kernel instantiation).
#pragma once

#include <cstddef>

namespace linnet {

/// An element type: kF32, kBF16, kF16 for weights, activations and the KV cache; kI32
/// for token ids and positions.
enum class DType { kF32, kBF16, kF16, kI32 };

/// Bytes per element: 4, 2, 2, 4.
std::size_t dtype_size(DType t);

/// "f32", "bf16", "f16", "i32": the spelling of the flags (--weight-dtype) and messages.
const char* dtype_name(DType t);

/// "F32", "BF16", "F16", "I32": safetensors' spelling.
const char* safetensors_dtype_name(DType t);

}  // namespace linnet
