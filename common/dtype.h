// The element types of tensors: one enum for every layer. The loader reads them from
// safetensors headers (loader/safetensors.h), the runtime holds tensors in them
// (runtime/tensor.h), and the CPU kernels are instantiated per weight dtype
// (kernels/cpu/gemm.h: dispatch_weight_dtype, the one place a run-time dtype becomes a
// kernel instantiation).
#pragma once

#include <cstddef>

namespace linnet {

/// An element type: kF32, kBF16, kF16 for weights, activations and the KV cache; kI32
/// for token ids and positions; kI8 and kI4 for weight matrices quantized group-wise
/// (at load, --weight-dtype int8 / int4, or read from a pre-quantized checkpoint: integer
/// values with f32 scales, and for int4 f32 offsets, kernels/cpu/gemm.h); kI64 and
/// kF8E4M3 only as a checkpoint stores them (compressed-tensors' weight_shape, and FP8
/// e4m3 weights, widened at load; the packed int4 / int8 words of such a checkpoint are
/// kI32).
enum class DType { kF32, kBF16, kF16, kI32, kI8, kI4, kI64, kF8E4M3 };

/// Bytes per element: 4, 2, 2, 4, 1, 1, 8, 1 (kI8 / kI4: a placeholder; a quantized matrix's
/// size is quantized_matrix_bytes in kernels/cpu/gemm.h: kI4 packs two values a byte,
/// and the scales come on top).
std::size_t dtype_size(DType t);

/// "f32", "bf16", "f16", "i32", "int8", "int4", "i64", "fp8_e4m3": the spelling of the flags
/// (--weight-dtype) and messages.
const char* dtype_name(DType t);

/// Whether `t` is a quantized weight dtype (kI8, kI4): values plus per-group scales.
bool is_quantized(DType t);

/// "F32", "BF16", "F16", "I32", "I8", "I4", "I64", "F8_E4M3": safetensors' spelling (I4 is not one of
/// safetensors' dtypes; it appears in messages only).
const char* safetensors_dtype_name(DType t);

}  // namespace linnet
