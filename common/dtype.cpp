#include "common/dtype.h"

namespace linnet {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
    case DType::kI8: return 1;
    case DType::kI4: return 1;
    case DType::kI64: return 8;
    case DType::kF8E4M3: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kI8: return "int8";
    case DType::kI4: return "int4";
    case DType::kI64: return "i64";
    case DType::kF8E4M3: return "fp8_e4m3";
  }
  return "?";
}

bool is_quantized(DType t) { return t == DType::kI8 || t == DType::kI4; }

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kI8: return "I8";
    case DType::kI4: return "I4";
    case DType::kI64: return "I64";
    case DType::kF8E4M3: return "F8_E4M3";
  }
  return "?";
}

}  // namespace linnet
